-- scripts/bench.lua [--quick] -- CUDA decode and rotary append against the
-- GPU's streaming-read rate, measured in the same run (DESIGN.md workloads:
-- bf16, 32 query / 8 kv heads, head dim 128; page 16 in random page order,
-- page 256, and contiguous caches).
--   GB/s = bytes of K/V read (decode) or of k/v read + written (append) per
--   second of kernel time: device events around each call's kernels, with the
--   call's kernels held until all are queued (pa_device_timing), median of many
--   calls after warm-up. "wall" is the whole call seen from Lua (validation,
--   the block table's download, launches) for comparison.
--   PAGEDATTN_BENCH_CONFIGS="A=1,B=2|C=3": extra runs of the page-16 decode
--   workloads with those environment variables set (kernel tuning sweeps).
--   scripts/run scripts/bench.lua
local ffi = require "ffi"
local pa = require "pagedattn"
local core = require "pagedattn.core"
local sweep = require "pagedattn.sweep" -- shared: make_cache, stats

pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite); int unsetenv(const char *name);")

local quick = arg[1] == "--quick"
local dev, err = pa.device("cuda")
if not dev then
  print("bench: no CUDA device: " .. tostring(err))
  os.exit(0)
end
local C, ctx = core.C, core.ctx
local secs = ffi.new("double[1]")

-- Median kernel seconds and median wall seconds of fn over `iters` calls.
local function time_calls(fn, iters)
  assert(C.pa_device_timing(ctx, dev.handle, 1) == 0, core.last_error())
  for _ = 1, 3 do fn() end -- warm-up: compilation, module load, scratch
  local kt, wt = {}, {}
  for i = 1, iters do
    local t0 = pa.clock()
    fn()
    assert(C.pa_device_timing_last(ctx, dev.handle, secs) == 0, core.last_error()) -- waits
    wt[i] = pa.clock() - t0
    kt[i] = secs[0]
  end
  assert(C.pa_device_timing(ctx, dev.handle, 0) == 0)
  return sweep.stats(kt).median, sweep.stats(wt).median, kt
end

local H, HK, D, DT = 32, 8, 128, "bf16"
local ESZ = 2

-- K/V caches for B sequences of L keys: paged (random page order) or contiguous (page 0).
local function make_cache(B, L, page)
  return sweep.make_cache(pa, dev, B, L, HK, D, page, DT)
end

local rows = {}
local function row(name, layout, bytes, kernel_s, wall_s, read_gbps)
  local gbps = bytes / kernel_s / 1e9
  local r = string.format("%-34s %-10s %8.3f %10.1f %9.1f %7.3f %10.1f", name, layout, bytes / 1e9,
    kernel_s * 1e6, gbps, gbps / read_gbps, wall_s * 1e6)
  rows[#rows + 1] = r
  print(r)
  io.stdout:flush()
end
local header = string.format("%-34s %-10s %8s %10s %9s %7s %10s", "workload", "layout", "GB", "kernel us",
  "GB/s", "x read", "wall us")

print(string.format("pagedattn %s bench on %s", pa.version, dev.description))
local ceil = assert(dev:ceilings(quick and 0.3 or 1.0))
print(string.format("ceilings: streaming read %.1f GB/s; device copy %.1f GB/s (read + write); read/copy %.3f",
  ceil.read_gbps, ceil.copy_gbps, ceil.read_gbps / ceil.copy_gbps))
local read = ceil.read_gbps
print()
print(header)

local iters = quick and 10 or 40
local workloads = { { 64, 4096 }, { 8, 32768 }, { 256, 1024 } }

local function decode(B, L, page, label)
  local kc, vc, bt = make_cache(B, L, page)
  local q = assert(pa.randn({ B, 1, H, D }, DT, dev, 3))
  local out = assert(pa.tensor({ B, 1, H, D }, DT, dev))
  local opts = { block_table = bt, cache_seqlens = L, out = out }
  local k, w = time_calls(function() assert(pa.attention_with_kvcache(q, kc, vc, opts)) end, iters)
  local bytes = 2 * B * L * HK * D * ESZ
  row(string.format("decode %dx%d%s", B, L, label or ""), page == 0 and "unpaged" or ("page " .. page), bytes, k, w, read)
  kc, vc, bt, q, out = nil, nil, nil, nil, nil
  collectgarbage()
  collectgarbage()
end

for _, wl in ipairs(workloads) do
  for _, page in ipairs({ 16, 256, 0 }) do decode(wl[1], wl[2], page) end
end

-- rotary append: B sequences x n new tokens (k rotated, k and v written into
-- their pages), no queries
local function append(B, n, page)
  local L = 4096
  local kc, vc, bt = make_cache(B, L, page)
  local k = assert(pa.randn({ B, n, HK, D }, DT, dev, 4))
  local v = assert(pa.randn({ B, n, HK, D }, DT, dev, 5))
  local half = D / 2
  local cs, sn = {}, {}
  for pos = 0, L - 1 do
    for j = 0, half - 1 do
      local th = pos * 10000 ^ (-j / half)
      cs[pos * half + j + 1], sn[pos * half + j + 1] = math.cos(th), math.sin(th)
    end
  end
  local rc = assert(pa.from_table(cs, { L, half }, DT, dev))
  local rs = assert(pa.from_table(sn, { L, half }, DT, dev))
  local q = assert(pa.tensor({ B, 0, H, D }, DT, dev))
  local opts = { block_table = bt, cache_seqlens = L - n, k = k, v = v, rotary_cos = rc, rotary_sin = rs,
    rotary_interleaved = false }
  local kt, w = time_calls(function() assert(pa.attention_with_kvcache(q, kc, vc, opts)) end, iters)
  row(string.format("rotary append %dx%d tokens", B, n), "page " .. page, 4 * B * n * HK * D * ESZ, kt, w, read)
  collectgarbage()
end
append(64, 512, 16)
append(256, 1, 16)

-- tuning sweeps
local configs = os.getenv("PAGEDATTN_BENCH_CONFIGS")
if configs and configs ~= "" then
  for config in configs:gmatch("[^|]+") do
    local set = {}
    for kv in config:gmatch("[^,]+") do
      local k, v = kv:match("^%s*([%w_]+)=(.*)$")
      if k then ffi.C.setenv(k, v, 1); set[#set + 1] = k end
    end
    for _, wl in ipairs(workloads) do decode(wl[1], wl[2], 16, " [" .. config .. "]") end
    for _, k in ipairs(set) do ffi.C.unsetenv(k) end
  end
end

print()
print("summary (kernel time; x read = GB/s over the streaming-read rate of this run)")
print(string.format("ceilings: read %.1f GB/s, copy %.1f GB/s", ceil.read_gbps, ceil.copy_gbps))
print(header)
for _, r in ipairs(rows) do print(r) end
