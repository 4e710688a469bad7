-- scripts/lab/decode_epilogue.lua -- where a persistent decode block's
-- cycles go between its stages: clock64 sums per block, written by a patched
-- copy of decode_mma.cu over the call's lse (so its lse is not attention;
-- the library is not changed):
--   mkdir -p /tmp/ke && git archive 2cdc757 kernels | tar -x -C /tmp/ke
--   git show 2cdc757:scripts/micro/decode_epilogue.patch | patch -d /tmp/ke/kernels -p0
-- (the patch lives in git history, applied to 2cdc757's kernels, whose
-- machine code is today's; it may need its hunks redone after a kernel
-- change. scripts/lab/README.md)
--   TRACE_DIR=/tmp/ke/kernels TRACE_WORKLOADS=256x1024,128x2048 luajit scripts/lab/decode_epilogue.lua
-- Per workload (page 16 in random order, "/s": sequential pages): the call's
-- event time with the normal and the patched kernel, then over the blocks
-- (warp 0's clock) the p10 / p50 / p90 of each sum and its median per unit,
-- in cycles and in us at the clock that the longest block implies: the
-- stage-top waits (the cp.async wait and the barrier after it; a unit's
-- first stage apart), the epilogue in three parts (the barrier after the
-- last stage; the stores of the warps' o, m and l and the barrier after
-- them; the output loop) and what follows it up to the next unit's stage
-- loop. The lse holds 8 floats a block: workloads of at least 8 x blocks / H
-- sequences (B >= 66 at 264 blocks and 32 heads). docs/decode.md, measured
-- on the H200: 1.2 us a unit between two units' stages, 0.5 of it the output loop.
local pa = require "pagedattn"
local sweep = require "pagedattn.sweep"
local trace = require "scripts.lab.trace"
local dev, pct = trace.dev, trace.pct
local H, HK, D = 32, 8, 128
local names = { "stage waits (not first)", "first-stage waits", "epi barrier1", "epi smem+barrier2",
  "epi output loop", "epi end->next loop", "block total", "units" }
for wl in (os.getenv("TRACE_WORKLOADS") or "256x1024,128x2048,1024x1024"):gmatch("([%dx/s]+)") do
  local B, L, sq = wl:match("(%d+)x(%d+)(/?s?)")
  B, L = tonumber(B), tonumber(L)
  local kc, vc, bt = sweep.make_cache(pa, dev, B, L, HK, D, 16, "bf16", sq == "/s" and "sequential" or nil)
  local q = assert(pa.randn({ B, 1, H, D }, "bf16", dev, 3))
  local out = assert(pa.tensor({ B, 1, H, D }, "bf16", dev))
  local opts = { block_table = bt, cache_seqlens = L, out = out, return_softmax_lse = true }
  local lse_t
  local call = function()
    local _, l = assert(pa.attention_with_kvcache(q, kc, vc, opts))
    lse_t = l
  end
  local tn, tt = trace.run(call, out, 21)
  local n = lse_t.numel
  local v = lse_t:to_table(0, n)
  -- a block's record ends with its unit count: a whole number from 1 on
  local recs = {}
  for b = 0, math.floor(n / 8) - 1 do
    local u = v[b * 8 + 8]
    if u == nil or u < 1 or u ~= math.floor(u) or u > 1e4 then break end
    local r = {}
    for k = 1, 8 do r[k] = v[b * 8 + k] end
    recs[#recs + 1] = r
  end
  assert(#recs > 0, "no records: not the patched persistent kernel, or the lse too small for the grid")
  local maxtot = 0
  for _, r in ipairs(recs) do maxtot = math.max(maxtot, r[7]) end
  local ghz = maxtot / (tt * 1e9)
  print(string.format("== %s: event us normal %.1f patched %.1f; %d blocks; longest block %.0f cycles (%.2f GHz if it spans the call)",
    wl, tn * 1e6, tt * 1e6, #recs, maxtot, ghz))
  for k = 1, 8 do
    local a, pu = {}, {}
    for _, r in ipairs(recs) do
      a[#a + 1] = r[k]
      pu[#pu + 1] = r[k] / r[8]
    end
    table.sort(a)
    table.sort(pu)
    print(string.format("  %-26s block p10 %9.0f p50 %9.0f p90 %9.0f | per unit p50 %8.0f cycles = %.3f us",
      names[k], pct(a, .1), pct(a, .5), pct(a, .9), pct(pu, .5), pct(pu, .5) / ghz / 1e3))
  end
  kc, vc, bt, q, out = nil, nil, nil, nil, nil
  collectgarbage(); collectgarbage()
end
