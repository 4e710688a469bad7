-- scripts/lab/append_ab.lua "CFG|CFG|..." [WORKLOADS] [ROUNDS] -- an A/B of
-- rotary append kernels or settings in one process, on the bench's append
-- workload (bf16 k/v of 8 kv heads x 128 into a page-16 cache in random page
-- order, GPT-NeoX rotary, no queries; scripts/bench.lua's "rotary append"
-- rows). A CFG is field=value settings of the device's tuning separated by
-- commas ("-" for none; pagedattn.tuning), e.g.
-- "-|nvrtc_options=-DPA_APPEND_MINB=4". WORKLOADS: B x n new tokens, comma
-- separated (default 64x512,256x1). ROUNDS: default 3. PAGEDATTN_AB_KV: the
-- caches' dtype (default fp8_e4m3; bf16, fp8_e5m2). Each round runs every
-- workload under every config in turn: 0.05 s of untimed calls, then the
-- median of 15 timed calls (device events around the call's kernels), 1 ms
-- of sleep after each. Prints each round's median, the median of the
-- rounds, GB/s (k/v read in bf16, written in the cache's dtype) and whether
-- the config's cache bytes equal the first config's. Two libraries (a
-- change of the host's side too): run it once per library, alternating,
-- with PAGEDATTN_LIB. On the GPU machine:
--   . .gpu-deps/env.sh && . scripts/env.sh
--   luajit scripts/lab/append_ab.lua "-|nvrtc_options=-DPA_APPEND_MINB=4" 64x512 3
local ffi = require "ffi"
local pa = require "pagedattn"
local core = require "pagedattn.core"
local sweep = require "pagedattn.sweep"

pcall(ffi.cdef, "int usleep(unsigned int usec);")

local cfg_arg = arg[1] or "-"
local wl_arg = arg[2] or "64x512,256x1"
local rounds = tonumber(arg[3] or "3")

local dev = assert(pa.device(os.getenv("PAGEDATTN_AB_DEVICE")))
local C, ctx = core.C, core.ctx
local gpu = dev.kind == "cuda"
local secs = ffi.new("double[1]")
local H, HK, D, DT, L = 32, 8, 128, "bf16", 4096
local KV = os.getenv("PAGEDATTN_AB_KV") or "fp8_e4m3"
local fp8 = KV:find("fp8", 1, true) ~= nil
local configs = require("pagedattn.tuning").parse_configs(cfg_arg)
-- (a config of no fields runs as the device is: the CPU has no tuning)
local function under(cfg, fn)
  if next(cfg.fields) == nil then return fn() end
  return dev:with_tuning(cfg.fields, fn)
end

local function make_workload(name)
  local B, n = name:match("^(%d+)x(%d+)$")
  assert(B, "append_ab: a workload is BxN: '" .. name .. "'")
  B, n = tonumber(B), tonumber(n)
  local kc, vc, bt = sweep.make_cache(pa, dev, B, L, HK, D, 16, KV)
  local k = assert(pa.randn({ B, n, HK, D }, DT, dev, 4))
  local v = assert(pa.randn({ B, n, HK, D }, DT, dev, 5))
  local rc, rs = sweep.rope_tables(pa, dev, L, D / 2, DT)
  local q = assert(pa.tensor({ B, 0, H, D }, DT, dev))
  local opts = { block_table = bt, cache_seqlens = L - n, k = k, v = v, rotary_cos = rc, rotary_sin = rs,
    rotary_interleaved = false, k_scale = fp8 and 0.5 or nil, v_scale = fp8 and 0.25 or nil }
  return { name = name, kc = kc, vc = vc, bytes = 2 * B * n * HK * D * (2 + (fp8 and 1 or 2)),
           call = function() assert(pa.attention_with_kvcache(q, kc, vc, opts)) end }
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

-- a checksum of the caches' contents (the same call into zeroed caches;
-- the caches are up to 2 GiB, past what a Lua string holds)
local function contents(wl)
  wl.kc:fill(0)
  wl.vc:fill(0)
  wl.call()
  dev:synchronize()
  local sum = ffi.new("uint64_t[1]", 0)
  for _, t in ipairs({ wl.kc, wl.vc }) do
    local buf = ffi.new("uint8_t[?]", t.nbytes + 8)
    assert(C.pa_tensor_read(ctx, t.handle, 0, buf, t.numel) == 0, core.last_error())
    local w = ffi.cast("const uint64_t *", buf)
    local acc = sum[0]
    for i = 0, math.floor(t.nbytes / 8) - 1 do acc = acc * 1099511628211ULL + w[i] end
    sum[0] = acc
  end
  return tostring(sum[0])
end

print(string.format("append_ab on %s, caches %s: %d configs, %d rounds (kernel us%s)", dev.description, KV,
  #configs, rounds, gpu and "" or "; wall time: not a GPU"))
local rows = {}
for w in wl_arg:gmatch("[^,]+") do
  local wl = make_workload(w)
  local times, same, first = {}, {}, nil
  for ci, cfg in ipairs(configs) do
    times[ci] = {}
    under(cfg, function()
      local c = contents(wl)
      first = first or c
      same[ci] = c == first
    end)
  end
  for _ = 1, rounds do
    for ci, cfg in ipairs(configs) do
      under(cfg, function() times[ci][#times[ci] + 1] = timed(wl) end)
    end
  end
  for ci, cfg in ipairs(configs) do
    local rs = {}
    for r, t in ipairs(times[ci]) do rs[r] = string.format("%.1f", t * 1e6) end
    local med = sweep.stats(times[ci]).median
    local row = string.format("%-10s %-8s %-40s %8.1f us %7.1f GB/s  [%s]  bytes %s", w, KV, cfg.name:sub(1, 40),
      med * 1e6, wl.bytes / med / 1e9, table.concat(rs, " "), same[ci] and "same" or "DIFFER")
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
