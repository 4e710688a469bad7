-- scripts/micro/decode_ab.lua "CFG|CFG|..." [WORKLOADS] [ROUNDS] -- an A/B of
-- decode kernels or settings in one process (kernels/NOTES.md sessions
-- 22-25: the method of every decode A/B since). A CFG is VAR=VALUE settings
-- of the environment separated by commas ("-" for none), e.g.
-- "-|PAGEDATTN_DECODE_TAIL=0|PAGEDATTN_KERNEL_DIR=/tmp/k_old".
-- WORKLOADS: B x L, comma separated (default 256x1024,128x2048,64x4096);
-- a "+" joins two into one batch (64x4096+512x64); a suffix "/s" makes the
-- pages sequential, "/u" the cache unpaged (else page 16 in random order).
-- ROUNDS: default 3. Each round runs every workload under every config in
-- turn: 0.05 s of untimed calls, then the median of 15 timed calls (device
-- events around the call's kernels) with 1 ms of sleep after each (calls
-- back to back drove some boards to their power limit: 250 -> 275 us over
-- seconds, kernels/NOTES.md session 22). The table gives each round's
-- median, the median of the rounds, and max |d| of each config's output
-- against the first config's, each written over NaN (bit-for-bit changes
-- say 0, an unwritten output inf; a config that should change nothing and
-- does is caught here). On the GPU machine:
--   . .gpu-deps/env.sh && . scripts/env.sh
--   luajit scripts/micro/decode_ab.lua "-|PAGEDATTN_DECODE_TAIL=0" 256x1024,64x4096
local ffi = require "ffi"
local pa = require "pagedattn"
local core = require "pagedattn.core"
local sweep = require "pagedattn.sweep"

pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite); int unsetenv(const char *name);")
pcall(ffi.cdef, "int usleep(unsigned int usec);")

local cfg_arg = arg[1] or "-"
local wl_arg = arg[2] or "256x1024,128x2048,64x4096"
local rounds = tonumber(arg[3] or "3")

local dev = assert(pa.device(os.getenv("PAGEDATTN_AB_DEVICE")))
local C, ctx = core.C, core.ctx
local gpu = dev.kind == "cuda" and C.pa_device_timing(ctx, dev.handle, 1) == 0
if gpu then C.pa_device_timing(ctx, dev.handle, 0) end
local secs = ffi.new("double[1]")
local H, HK, D, DT = 32, 8, 128, "bf16"

local configs = {}
for c in cfg_arg:gmatch("[^|]+") do
  local set = {}
  if c ~= "-" then
    for kv in c:gmatch("[^,]+") do
      local k, v = kv:match("^%s*([%w_]+)=(.*)$")
      assert(k, "decode_ab: a config's setting is VAR=VALUE: '" .. kv .. "'")
      set[#set + 1] = { k, v }
    end
  end
  configs[#configs + 1] = { name = c, set = set }
end
local function with_config(cfg, fn)
  for _, kv in ipairs(cfg.set) do ffi.C.setenv(kv[1], kv[2], 1) end
  local ok, e = pcall(fn)
  for _, kv in ipairs(cfg.set) do ffi.C.unsetenv(kv[1]) end
  if not ok then error(e, 0) end
end

-- A workload's call: its tensors live as long as the closure.
local function make_workload(name)
  local spec, mode = name:match("^([%dx+]+)/?(%a?)$")
  assert(spec, "decode_ab: a workload is BxL[+BxL][/s|/u]: '" .. name .. "'")
  local lens = {}
  for b, l in spec:gmatch("(%d+)x(%d+)") do
    for _ = 1, tonumber(b) do lens[#lens + 1] = tonumber(l) end
  end
  require("pagedattn.reference").rng(11):shuffle(lens)
  local B, L = #lens, 0
  for _, l in ipairs(lens) do L = math.max(L, l) end
  local page = mode == "u" and 0 or 16
  local kc, vc, bt = sweep.make_cache(pa, dev, B, L, HK, D, page, DT, mode == "s" and "sequential" or nil)
  local q = assert(pa.randn({ B, 1, H, D }, DT, dev, 3))
  local out = assert(pa.tensor({ B, 1, H, D }, DT, dev))
  local seqlens = assert(pa.from_table(lens, { B }, "i32", dev))
  local opts = { block_table = bt, cache_seqlens = seqlens, out = out }
  return { name = name, out = out, call = function() assert(pa.attention_with_kvcache(q, kc, vc, opts)) end }
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

local function max_diff(a, b)
  local m = 0
  for i = 1, #a do
    local d = math.abs(a[i] - b[i])
    if d ~= d then return math.huge end
    if d > m then m = d end
  end
  return m
end

print(string.format("decode_ab on %s: %d configs, %d rounds (kernel us%s)", dev.description, #configs, rounds,
  gpu and "" or "; wall time: not a GPU"))
local rows = {}
for w in wl_arg:gmatch("[^,]+") do
  local wl = make_workload(w)
  local times, diffs, ref = {}, {}, nil
  for ci, cfg in ipairs(configs) do
    times[ci] = {}
    with_config(cfg, function()
      wl.out:fill(0 / 0) -- (an output the config leaves unwritten shows as NaN)
      wl.call()
      dev:synchronize()
      local o = wl.out:to_table()
      if ci == 1 then ref = o end
      diffs[ci] = max_diff(o, ref)
    end)
  end
  for _ = 1, rounds do
    for ci, cfg in ipairs(configs) do
      with_config(cfg, function() times[ci][#times[ci] + 1] = timed(wl) end)
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
