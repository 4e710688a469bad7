-- scripts/lab/cpu_decode_ratio.lua [B] [L] [PAGE] [ROUNDS] -- CPU decode
-- against the streaming-read ceiling measured right before and right after
-- it, round by round: on a shared host (a VM) the read rate moves between two
-- states within minutes (docs/cpu.md), so a ratio to one
-- ceiling taken at the start says as much about the host as the kernel.
-- Defaults: 8 x 4096 keys, page 16 (random order), bf16, 32 / 8 heads, D 128;
-- 5 rounds of 0.3 s of calls (median).
--   scripts/run scripts/lab/cpu_decode_ratio.lua 8 4096 16 6
local pa = require "pagedattn"
local sweep = require "pagedattn.sweep"
local dev = assert(pa.device("cpu"))
local B, L, page = tonumber(arg[1] or 8), tonumber(arg[2] or 4096), tonumber(arg[3] or 16)
local f, _, bytes = sweep.decode_batch(pa, dev, B .. "x" .. L, { H = 32, Hk = 8, D = 128, dtype = "bf16", page = page })
for r = 1, tonumber(arg[4] or 5) do
  local c = assert(dev:ceilings(0.3))
  f()
  local ts, t0 = {}, pa.clock()
  repeat
    local a = pa.clock()
    f()
    ts[#ts + 1] = pa.clock() - a
  until pa.clock() - t0 > 0.3 and #ts >= 3
  local g = bytes / sweep.stats(ts).median / 1e9
  local c2 = assert(dev:ceilings(0.3))
  print(string.format("round %d: read %.1f GB/s before, %.1f after; decode %.1f GB/s, %.2f of the read before (%.2f of the mean)",
    r, c.read_gbps, c2.read_gbps, g, g / c.read_gbps, g / ((c.read_gbps + c2.read_gbps) / 2)))
end
