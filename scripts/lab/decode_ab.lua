-- scripts/lab/decode_ab.lua "CFG|CFG|..." [WORKLOADS] [ROUNDS] -- an A/B of
-- decode kernels or settings in one process (docs/measuring.md: the
-- method of every decode A/B). A CFG is field=value settings of the
-- device's tuning separated by commas ("-" for none; pagedattn.tuning),
-- e.g. "-|decode_wide=0|kernel_dir=/tmp/k_old".
-- WORKLOADS: B x L, comma separated (default 256x1024,128x2048,64x4096);
-- a "+" joins two into one batch (64x4096+512x64); a suffix "/s" makes the
-- pages sequential, "/u" the cache unpaged (else page 16 in random order).
-- ROUNDS: default 3. PAGEDATTN_AB_KV: the caches' dtype (default bf16, as
-- q; fp8_e4m3, fp8_e5m2). Each round runs every workload under every config in
-- turn: 0.05 s of untimed calls, then the median of 15 timed calls (device
-- events around the call's kernels) with 1 ms of sleep after each (calls
-- back to back drove some boards to their power limit: 250 -> 275 us over
-- seconds, docs/measuring.md). The table gives each round's
-- median, the median of the rounds, and max |d| of each config's output
-- against the first config's, each written over NaN (bit-for-bit changes
-- say 0, an unwritten output inf; a config that should change nothing and
-- does is caught here). On the GPU machine:
--   . .gpu-deps/env.sh && . scripts/env.sh
--   luajit scripts/lab/decode_ab.lua "-|decode_kpw=8" 256x1024,64x4096
local ffi = require "ffi"
local pa = require "pagedattn"
local core = require "pagedattn.core"
local sweep = require "pagedattn.sweep"
local ref = require "pagedattn.reference"

pcall(ffi.cdef, "int usleep(unsigned int usec);")

local cfg_arg = arg[1] or "-"
local wl_arg = arg[2] or "256x1024,128x2048,64x4096"
local rounds = tonumber(arg[3] or "3")

local dev = assert(pa.device(os.getenv("PAGEDATTN_AB_DEVICE")))
local C, ctx = core.C, core.ctx
local gpu = dev.kind == "cuda"
local secs = ffi.new("double[1]")
local H, HK, D, DT = 32, 8, 128, "bf16"
local KV = os.getenv("PAGEDATTN_AB_KV")

local configs = require("pagedattn.tuning").parse_configs(cfg_arg)

-- A workload ("BxL[+BxL...]", a suffix /s: sequential pages, /u: unpaged):
-- its call (its tensors live as long as it) and its out tensor.
local function make_workload(name)
  local spec, mode = name:match("^([%dx+]+)/?(%a?)$")
  assert(spec, "decode_ab: a workload is BxL[+BxL][/s|/u]: '" .. name .. "'")
  local call, out = sweep.decode_batch(pa, dev, spec, { H = H, Hk = HK, D = D, dtype = DT, kv_dtype = KV,
    page = mode == "u" and 0 or 16, order = mode == "s" and "sequential" or nil })
  return { name = name, out = out, call = call }
end

local function timed(wl)
  local t0 = pa.clock()
  repeat
    for _ = 1, 5 do wl.call() end
    dev:synchronize()
  until pa.clock() - t0 >= 0.05
  local ts = {}
  if gpu then assert(C.pa_device_timing(ctx, dev.handle, 1) == 0, core.last_error()) end
  for i = 1, 15 do
    local t1 = pa.clock()
    wl.call()
    if gpu then
      assert(C.pa_device_timing_last(ctx, dev.handle, secs) == 0, core.last_error())
      ts[i] = secs[0]
    else
      dev:synchronize()
      ts[i] = pa.clock() - t1
    end
    ffi.C.usleep(1000)
  end
  if gpu then C.pa_device_timing(ctx, dev.handle, 0) end
  return sweep.stats(ts).median
end

print(string.format("decode_ab on %s: %d configs, %d rounds (kernel us%s)", dev.description, #configs, rounds,
  gpu and "" or "; wall time: not a GPU"))
local rows = {}
for w in wl_arg:gmatch("[^,]+") do
  local wl = make_workload(w)
  local times, diffs, first = {}, {}, nil
  for ci, cfg in ipairs(configs) do
    times[ci] = {}
    dev:with_tuning(cfg.fields, function()
      wl.out:fill(0 / 0) -- (an output the config leaves unwritten shows as NaN)
      wl.call()
      dev:synchronize()
      local o = wl.out:to_table()
      if ci == 1 then first = o end
      diffs[ci] = ref.max_abs_diff(o, first)
    end)
  end
  for _ = 1, rounds do
    for ci, cfg in ipairs(configs) do
      dev:with_tuning(cfg.fields, function() times[ci][#times[ci] + 1] = timed(wl) end)
    end
  end
  for ci, cfg in ipairs(configs) do
    local rs = {}
    for r, t in ipairs(times[ci]) do rs[r] = string.format("%.1f", t * 1e6) end
    local row = string.format("%-22s %-44s %8.1f  [%s]  max|d| %.3g", w, cfg.name:sub(1, 44),
      sweep.stats(times[ci]).median * 1e6, table.concat(rs, " "), diffs[ci])
    rows[#rows + 1] = row
    print(row)
    io.stdout:flush()
  end
  wl = nil
  collectgarbage()
  collectgarbage()
end
print("summary")
for _, r in ipairs(rows) do print(r) end
