-- scripts/lab/prefill_timeline.lua -- where a prefill block's time goes
-- (the warp-specialised kernel, prefill_ws.cu), from %globaltimer stamps that
-- a patched copy of the kernel writes into the first output row of each
-- block (so its results are not attention; the library is not changed):
--   mkdir -p /tmp/kp && git archive 2cdc757 kernels | tar -x -C /tmp/kp
--   git show 2cdc757:scripts/micro/prefill_timeline.patch | patch -d /tmp/kp/kernels -p0
-- (the patch lives in git history, applied to 2cdc757's kernels, whose
-- machine code is today's; it may need its hunks redone after a kernel
-- change. scripts/lab/README.md)
--   TRACE_DIR=/tmp/kp/kernels TRACE_WORKLOADS=4x2048,1x8192,4x1024+8192 scripts/run scripts/lab/prefill_timeline.lua
-- A workload BxS is S causal new tokens per sequence on an empty cache,
-- BxS+C the same after C cached keys; page 16 in random order (TRACE_PAGE=N:
-- page N, 0: a contiguous cache; TRACE_ORDER below), bf16, 32 / 8 heads,
-- head dim 128. Per workload: the call's event time with the normal and the
-- patched kernel, then the spread over the blocks of each phase:
--   T0 start, T1 roles part (work item read, barrier), T2 producer issued tile
--   0's K boxes, T3 consumer 0 has Q, T4 consumer 0 has K(0), T5 / T6
--   consumer 0 / 1 past their loop, T15 consumer 0 past its last P V, T8 /
--   T7 consumer 0 / 1 has written its rows, T14 both have (the block's end);
-- the gap on each SM between a block's T14 and the next block's T0, and the
-- per-block cost c from a fit of T14 - T0 against the tiles the block ran.
local pa = require "pagedattn"
local sweep = require "pagedattn.sweep"
local trace = require "scripts.lab.trace"
local dev, pct = trace.dev, trace.pct
local H, HK, D, QT = 32, 8, 128, 32
-- TRACE_PAGE: the cache's page size (default 16; 0: a contiguous cache);
-- TRACE_ORDER=sequential: pages in order (block table = 0, 1, 2, ...; the
-- boxes of a paged cache over contiguous memory), default random
local page = tonumber(os.getenv("TRACE_PAGE") or "16")
local order = os.getenv("TRACE_ORDER")
local function line(name, a)
  table.sort(a)
  local s = 0
  for _, x in ipairs(a) do s = s + x end
  print(string.format("  %-26s mean %7.2f min %7.2f p10 %7.2f p50 %7.2f p90 %7.2f max %7.2f", name, s / #a, a[1],
    pct(a, .1), pct(a, .5), pct(a, .9), a[#a]))
end
for wl in (os.getenv("TRACE_WORKLOADS") or "4x2048,1x8192,4x1024+8192"):gmatch("[^,]+") do
  local B, S, Cx = wl:match("^(%d+)x(%d+)%+?(%d*)$")
  B, S, Cx = tonumber(B), tonumber(S), tonumber(Cx) or 0
  local Sk = S + Cx
  local kc, vc, bt = sweep.make_cache(pa, dev, B, Sk, HK, D, page, "bf16", order)
  local q = assert(pa.randn({ B, S, H, D }, "bf16", dev, 3))
  local out = assert(pa.tensor({ B, S, H, D }, "bf16", dev))
  local opts = { block_table = bt, cache_seqlens = Sk, out = out, causal = true }
  local call = function() assert(pa.attention_with_kvcache(q, kc, vc, opts)) end
  local tn, tt = trace.run(call, out, 11)
  local recs = {}
  for b = 0, B - 1 do
    for i0 = 0, S - 1, QT do
      for hk = 0, HK - 1 do
        local v = out:to_table(((b * S + i0) * H + hk * (H / HK)) * D, 16 * 8)
        local rec = {}
        for k = 0, 15 do rec[k] = trace.u64(v, k * 8) end
        assert(rec[12] == b and rec[13] == i0, "trace record out of place: is TRACE_DIR the patched kernel?")
        recs[#recs + 1] = rec
      end
    end
  end
  local t0, tend = math.huge, 0
  for _, r in ipairs(recs) do t0, tend = math.min(t0, r[0]), math.max(tend, r[14]) end
  local sms = {}
  for _, r in ipairs(recs) do
    sms[r[9]] = sms[r[9]] or {}
    table.insert(sms[r[9]], r)
  end
  local nsm, gaps, firsts = 0, {}, {}
  for _, a in pairs(sms) do
    nsm = nsm + 1
    table.sort(a, function(x, y) return x[0] < y[0] end)
    firsts[#firsts + 1] = (a[1][0] - t0) / 1e3
    for i = 2, #a do gaps[#gaps + 1] = (a[i][0] - a[i - 1][14]) / 1e3 end
  end
  local layout = page > 0 and "page " .. page .. (order == "sequential" and " in order" or "") or "unpaged"
  print(string.format("== %s %s: event us normal %.1f, trace variant %.1f; blocks %d on %d SMs; span %.1f us",
    wl, layout, tn * 1e6, tt * 1e6, #recs, nsm, (tend - t0) / 1e3))
  local function phase(name, i, j)
    local a = {}
    for _, r in ipairs(recs) do a[#a + 1] = (r[j] - r[i]) / 1e3 end
    line(name, a)
  end
  phase("roles T1-T0", 0, 1)
  phase("K(0) issued T2-T1", 1, 2)
  phase("Q at consumer T3-T1", 1, 3)
  phase("K(0) at consumer T4-T1", 1, 4)
  phase("loop c0 T5-T4", 4, 5)
  phase("c1 after c0 T6-T5", 5, 6)
  phase("c0 last P V T15-T5", 5, 15)
  phase("c0 rows T8-T15", 15, 8)
  phase("c1 last P V + rows T7-T6", 6, 7)
  phase("end after c1 T14-T7", 7, 14)
  phase("block T14-T0", 0, 14)
  line("SM gap (T0 - previous T8)", gaps)
  line("SM first start", firsts)
  -- least squares of block time against its tiles: c + n tau
  local sn, st, snn, snt, n = 0, 0, 0, 0, 0
  for _, r in ipairs(recs) do
    local x, y = r[10], (r[14] - r[0]) / 1e3
    sn, st, snn, snt, n = sn + x, st + y, snn + x * x, snt + x * y, n + 1
  end
  local tau = (n * snt - sn * st) / (n * snn - sn * sn)
  local c = (st - tau * sn) / n
  print(string.format("  fit block = c + n tau: c %.2f us, tau %.3f us per tile (mean tiles %.2f); per block + gap: %.2f us",
    c, tau, sn / n, c + (function() local s = 0; for _, g in ipairs(gaps) do s = s + g end; return s / math.max(1, #gaps) end)()))
  kc, vc, bt, q, out = nil, nil, nil, nil, nil
  collectgarbage(); collectgarbage()
end
