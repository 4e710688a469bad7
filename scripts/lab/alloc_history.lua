-- scripts/lab/alloc_history.lua [STEPS] [ROUNDS] -- does what was allocated
-- and freed before a decode's caches move its time? (docs/measuring.md:
-- once, after a row whose caches were 8.6 GB or more, 64 x 4096 took
-- 279 us against 246.) STEPS, comma separated, run in order in one process:
--   BxL[/s|/u]   time that decode workload (caches made now, freed after):
--                page 16 in random order, /s sequential pages, /u unpaged
--   churnG[xN]   allocate N (default 1) tensors of G GB, touch them, free
--                them all (G may be fractional: churn0.25x40)
--   read         the streaming-read ceiling (its own fresh 2 GiB buffer)
-- Default: a fresh baseline, that churn, the baseline again.
-- Kernel us: median of 15 timed calls (1 ms apart) per round, the median of
-- the rounds, the rounds in brackets.
--   . .gpu-deps/env.sh && . scripts/env.sh && luajit scripts/lab/alloc_history.lua
local pa = require "pagedattn"
local sweep = require "pagedattn.sweep"
local ab = require "scripts.lab.ab"

local steps_arg = arg[1]
  or "64x4096,64x4096/s,64x4096/u,read,churn8.9x2,64x4096,64x4096/s,64x4096/u,read,churn1.6x2,64x4096,64x4096/u"
local rounds = tonumber(arg[2] or "2")

local dev = assert(pa.device(os.getenv("PAGEDATTN_AB_DEVICE") or "cuda"))

print(string.format("alloc_history on %s, %d rounds (kernel us)", dev.description, rounds))
for step in steps_arg:gmatch("[^,]+") do
  local g, n = step:match("^churn([%d.]+)x?(%d*)$")
  if g then
    local t0, ts = pa.clock(), {}
    for i = 1, tonumber(n) or 1 do
      ts[i] = assert(pa.tensor({ math.floor(tonumber(g) * 1e9 / 4) }, "f32", dev))
      ts[i]:fill(1)
    end
    dev:synchronize()
    ts = nil
    collectgarbage()
    collectgarbage()
    dev:synchronize()
    print(string.format("%-16s %.2f s", step, pa.clock() - t0))
  elseif step == "read" then
    local c = assert(dev:ceilings(0.3))
    print(string.format("%-16s %.1f GB/s (copy %.1f)", step, c.read_gbps, c.copy_gbps))
  else
    local spec, mode = step:match("^([%dx+]+)/?(%a?)$")
    assert(spec, "alloc_history: a step is BxL[/s|/u], churnG[xN] or read: '" .. step .. "'")
    local call, _, bytes = sweep.decode_batch(pa, dev, spec, { H = 32, Hk = 8, D = 128, dtype = "bf16",
      page = mode == "u" and 0 or 16, order = mode == "s" and "sequential" or nil })
    local rs = {}
    for r = 1, rounds do rs[r] = ab.timed(dev, call) end
    local med = sweep.stats(rs).median
    local txt = {}
    for r, t in ipairs(rs) do txt[r] = string.format("%.1f", t * 1e6) end
    print(string.format("%-16s %8.1f us  %7.1f GB/s  [%s]", step, med * 1e6, bytes / med / 1e9,
      table.concat(txt, " ")))
    call = nil
    collectgarbage()
    collectgarbage()
  end
  io.stdout:flush()
end
