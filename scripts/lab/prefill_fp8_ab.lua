-- scripts/lab/prefill_fp8_ab.lua -- prefill over bf16 against fp8_e4m3
-- caches in one process: the event time (device timing, the median of 20
-- calls) and the wall time (median) of the bench's 8192 causal and chunked (4 x 1024
-- new on 8192) workloads, page 16, over bf16, over e4m3 widened into a
-- 16-bit copy (prefill_fp8 = 1, the default on Hopper) and over e4m3 read
-- by the mma.sync kernel (prefill_fp8 = 0). An argument "CFG|CFG|..."
-- (pagedattn.tuning's configs, e.g. "-|kernel_dir=/tmp/k2") repeats the
-- copy's row under each config, in turn, each workload. On the GPU machine:
--   . .gpu-deps/env.sh && . scripts/env.sh && luajit scripts/lab/prefill_fp8_ab.lua
-- PAGEDATTN_AB_COLD=1: a 256 MiB fill before each call (untimed), so that no
-- call finds the caches in L2 (the bench's repeated calls find bf16 K/V of
-- 8192 keys, 34 MB, there; a model's next layer would not).
local ffi = require "ffi"
local pa = require "pagedattn"
local core = require "pagedattn.core"
local sweep = require "pagedattn.sweep"
local dev = assert(pa.device("cuda"))
local C, ctx = core.C, core.ctx
local secs = ffi.new("double[1]")
local junk = os.getenv("PAGEDATTN_AB_COLD") == "1" and assert(pa.tensor({ 128 * 1024 * 1024 }, "bf16", dev)) or nil
local function time_calls(fn, n)
  assert(C.pa_device_timing(ctx, dev.handle, 1) == 0)
  for _ = 1, 3 do fn() end
  local kt, wt = {}, {}
  for i = 1, n do
    if junk then junk:fill(0); dev:synchronize() end
    local t0 = pa.clock(); fn(); assert(C.pa_device_timing_last(ctx, dev.handle, secs) == 0)
    wt[i] = pa.clock() - t0; kt[i] = secs[0]
  end
  assert(C.pa_device_timing(ctx, dev.handle, 0) == 0)
  return sweep.stats(kt).median, sweep.stats(wt).median
end
local configs = require("pagedattn.tuning").parse_configs(arg[1] or "-")
local H, HK, D = 32, 8, 128
for _, wl in ipairs({ { 1, 8192, 0 }, { 4, 1024, 8192 } }) do
  local B, S, Cc = wl[1], wl[2], wl[3]
  local rows = { { "bf16" } }
  for _, cfg in ipairs(configs) do rows[#rows + 1] = { "fp8_e4m3", cfg } end
  rows[#rows + 1] = { "fp8_e4m3/0" }
  for _, row in ipairs(rows) do
    local kv, cfg = row[1], row[2]
    local kvd = kv:match("^[^/]+")
    local kc, vc, bt = sweep.make_cache(pa, dev, B, S + Cc, HK, D, 16, kvd)
    local q = assert(pa.randn({ B, S, H, D }, "bf16", dev, 3))
    local out = assert(pa.tensor({ B, S, H, D }, "bf16", dev))
    local f8 = kvd ~= "bf16"
    local opts = { block_table = bt, cache_seqlens = S + Cc, causal = true, out = out, k_scale = f8 and 0.5 or nil,
      v_scale = f8 and 0.25 or nil }
    dev:set_tuning({ prefill_fp8 = kv:match("/0") and 0 or 1 })
    local k, w = dev:with_tuning(cfg and cfg.fields or {}, function()
      return time_calls(function() assert(pa.attention_with_kvcache(q, kc, vc, opts)) end, 20)
    end)
    print(string.format("pf %dx%d+%d %-12s event %8.1f us  wall %8.1f us%s%s", B, S, Cc, kv, k * 1e6, w * 1e6,
      cfg and "  [" .. cfg.name .. "]" or "", junk and " (cold L2)" or ""))
    kc, vc, bt, q, out = nil; collectgarbage(); collectgarbage()
  end
end
dev:set_tuning({ prefill_fp8 = 1 })
