-- scripts/lab/decode_timeline.lua -- when each block of the page-16 decode
-- kernel (decode_mma.cu) starts, has its first stage, ends its loop and ends,
-- from %globaltimer stamps that a patched copy of the kernel writes into `out`
-- (so its results are not attention; the library is not changed):
--   mkdir -p /tmp/kt && git archive 2cdc757 kernels | tar -x -C /tmp/kt
--   git show 2cdc757:scripts/micro/decode_timeline.patch | patch -d /tmp/kt/kernels -p0
-- (the patch lives in git history, applied to 2cdc757's kernels, whose
-- machine code is today's; it may need its hunks redone after a kernel
-- change. scripts/lab/README.md)
--   TRACE_DIR=/tmp/kt/kernels TRACE_WORKLOADS=64x4096,8x32768 scripts/run scripts/lab/decode_timeline.lua
-- Prints per workload: the call's event time with the normal and the patched
-- kernel, the span from the first block's start to the last one's end, the
-- spread of each phase over the blocks, and how many blocks are active in
-- each 5 us. (the tuning's decode_kernel "auto" where another decode kernel is
-- the default.) A persistent block has one record over all the
-- units it ran: its loop phase runs from its first stage to the end of its
-- last unit's loop (decode_persist=0 for one record per unit).
-- Splits that claim their keys (one block per unit): also the
-- cycles thread 0 waited for its claims' results.
-- H200 (docs/decode.md): blocks of equal work end up to 20 % apart;
-- each block spends ~4 us before its first stage.
local pa = require "pagedattn"
local sweep = require "pagedattn.sweep"
local trace = require "scripts.lab.trace"
local dev, pct = trace.dev, trace.pct
local H, HK, D = 32, 8, 128
for wl in (os.getenv("TRACE_WORKLOADS") or "64x4096,8x32768,256x1024,8x8192"):gmatch("(%d+x%d+)") do
  local B, L = wl:match("(%d+)x(%d+)"); B, L = tonumber(B), tonumber(L)
  local kc, vc, bt = sweep.make_cache(pa, dev, B, L, HK, D, 16, "bf16")
  local q = assert(pa.randn({ B, 1, H, D }, "bf16", dev, 3))
  local out = assert(pa.tensor({ B, 1, H, D }, "bf16", dev))
  local opts = { block_table = bt, cache_seqlens = L, out = out }
  local call = function() assert(pa.attention_with_kvcache(q, kc, vc, opts)) end
  local tn, tt = trace.run(call, out, 21)
  local n = math.min(out.numel, 64 * 8192)
  local v = out:to_table(0, n)
  local blocks = {}
  for b = 0, n / 64 - 1 do
    local rec = {}
    for k = 0, 7 do rec[k + 1] = trace.u64(v, b * 64 + k * 8) end
    if rec[1] == 0 then break end
    blocks[#blocks + 1] = rec
  end
  local t0 = math.huge
  for _, r in ipairs(blocks) do t0 = math.min(t0, r[1]) end
  local starts, pro, first, loop, ends, durs = {}, {}, {}, {}, {}, {}
  local tend = 0
  for _, r in ipairs(blocks) do
    starts[#starts + 1] = (r[1] - t0) / 1e3
    pro[#pro + 1] = (r[2] - r[1]) / 1e3
    first[#first + 1] = (r[3] - r[2]) / 1e3
    loop[#loop + 1] = (r[4] - r[3]) / 1e3
    ends[#ends + 1] = (r[5] - t0) / 1e3
    durs[#durs + 1] = (r[5] - r[1]) / 1e3
    tend = math.max(tend, r[5])
  end
  for _, a in ipairs({ starts, pro, first, loop, ends, durs }) do table.sort(a) end
  local sms = {}
  for _, r in ipairs(blocks) do sms[r[6]] = (sms[r[6]] or 0) + 1 end
  local nsm = 0
  for _ in pairs(sms) do nsm = nsm + 1 end
  print(string.format("== %s page 16: event us normal %.1f, trace variant %.1f; blocks %d on %d SMs; stages (block 0) %d; span (first start -> last end) %.1f us",
    wl, tn * 1e6, tt * 1e6, #blocks, nsm, blocks[1][7], (tend - t0) / 1e3))
  local function line(name, a) print(string.format("  %-22s min %7.2f p10 %7.2f p50 %7.2f p90 %7.2f max %7.2f", name, a[1], pct(a, .1), pct(a, .5), pct(a, .9), a[#a])) end
  line("start (us from first)", starts)
  line("prologue T1-T0", pro)
  line("first stage T2-T1", first)
  line("loop T3-T2", loop)
  line("block T4-T0", durs)
  line("end (us from first)", ends)
  -- claims (one block per unit): the cycles thread 0 waited for its claims'
  -- results (the record's last field above bit 20), in thousands of cycles
  local waits = {}
  for _, r in ipairs(blocks) do waits[#waits + 1] = math.floor(r[8] / 2 ^ 20) / 1000 end
  table.sort(waits)
  if waits[#waits] > 0 then line("claim waits (kcycles)", waits) end
  -- active blocks (between T0 and T4) per 5 us bin
  local bins = {}
  local nb = math.ceil((tend - t0) / 5e3)
  for i = 1, nb do bins[i] = 0 end
  for _, r in ipairs(blocks) do
    for i = math.floor((r[1] - t0) / 5e3) + 1, math.floor((r[5] - t0) / 5e3) + 1 do
      if i <= nb then bins[i] = bins[i] + 1 end
    end
  end
  print("  active blocks per 5 us: " .. table.concat(bins, " "))
  -- who ends late: by kv head (blockIdx % 8: one block per unit, head tile =
  -- kv head at 32 / 8 heads) and by SM (both blocks of an SM alike?)
  local byh, bysm = {}, {}
  for _, r in ipairs(blocks) do
    local e = (r[5] - t0) / 1e3
    local h = (r[8] % 2 ^ 20) % HK
    byh[h] = byh[h] or {}
    table.insert(byh[h], e)
    bysm[r[6]] = bysm[r[6]] or {}
    table.insert(bysm[r[6]], e)
  end
  local hs = {}
  for h = 0, HK - 1 do
    local a = byh[h] or {}
    local s = 0
    for _, e in ipairs(a) do s = s + e end
    hs[#hs + 1] = string.format("%d:%.1f", h, #a > 0 and s / #a or 0)
  end
  print("  mean end by kv head: " .. table.concat(hs, " "))
  local sml, pairs_n, diff = {}, 0, 0
  for sm, a in pairs(bysm) do
    table.sort(a)
    local s = 0
    for _, e in ipairs(a) do s = s + e end
    sml[#sml + 1] = { sm = sm, mean = s / #a, n = #a, a = a }
    if #a == 2 then pairs_n, diff = pairs_n + 1, diff + (a[2] - a[1]) end
  end
  table.sort(sml, function(x, y) return x.mean < y.mean end)
  local parts = {}
  for _, x in ipairs(sml) do parts[#parts + 1] = string.format("%d:%.0f%s", x.sm, x.mean, x.n == 1 and "*" or "") end
  print(string.format("  SMs by mean end (sm:us, * one block); mean |difference| of an SM's two blocks %.1f us over %d SMs",
    pairs_n > 0 and diff / pairs_n or 0, pairs_n))
  print("    " .. table.concat(parts, " "))
  kc, vc, bt, q, out = nil, nil, nil, nil, nil
  collectgarbage(); collectgarbage()
end
