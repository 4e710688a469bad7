-- scripts/bench_cpu.lua [--quick] -- CPU attention throughput against this
-- machine's ceilings, measured in the same run:
--   decode: GB/s of K/V read, over the streaming-read bandwidth;
--   prefill: GFLOP/s (4 * Sq * Sk * H * D, only unmasked pairs), over the fp32 FMA peak.
-- Each bf16 row is followed by the same workload over fp8 caches (e4m3, e5m2;
-- q and out bf16): decode's GB/s count fp8 bytes, and "x bf16" is the
-- speed against the bf16 row above (decode: tokens a second; prefill: GFLOP/s).
--   scripts/run scripts/bench_cpu.lua
local pa = require "pagedattn"
local sweep = require "pagedattn.sweep" -- shared: make_cache, stats

local quick = arg[1] == "--quick"
local dev = assert(pa.device("cpu"))
local now = pa.clock

-- Times fn: one warm-up call, then repeats for about `budget` seconds; median.
local function time_it(fn, budget)
  fn()
  local times, start = {}, now()
  repeat
    local t0 = now()
    fn()
    times[#times + 1] = now() - t0
  until (now() - start > budget and #times >= 3) or #times >= 200
  return sweep.stats(times).median, #times
end

-- A paged (page 16: random page order) or contiguous (page 0) KV cache of B x L keys.
local function make_cache(B, L, Hk, D, page, dtype)
  return sweep.make_cache(pa, dev, B, L, Hk, D, page, dtype)
end

print(string.format("device: %s", dev.description))
local ceil = assert(dev:ceilings(quick and 0.3 or 1.0))
print(string.format("ceilings: read %.1f GB/s, copy %.1f GB/s (read+write), fp32 FMA %.1f GFLOP/s",
  ceil.read_gbps, ceil.copy_gbps, ceil.fma_gflops))
print()

local budget = quick and 0.5 or 2.0
local rows = {}
local function row(...) rows[#rows + 1] = string.format(...) ; print(rows[#rows]) end
print(string.format("%-44s %10s %12s %8s %8s", "workload", "ms", "rate", "ratio", "x bf16"))
local FP8 = quick and { "fp8_e4m3" } or { "fp8_e4m3", "fp8_e5m2" }

-- decode: bf16, 32 query heads, 8 kv heads, head dim 128
local H, Hk, D = 32, 8, 128
local decode_cases = quick and { { 8, 2048, 16 } } or {
  { 8, 4096, 16 }, { 8, 4096, 256 }, { 8, 4096, 0 }, { 1, 32768, 16 }, { 64, 1024, 16 },
}
for _, c in ipairs(decode_cases) do
  local B, L, page = c[1], c[2], c[3]
  local q = pa.randn({ B, 1, H, D }, "bf16", dev, 3)
  local out = pa.tensor({ B, 1, H, D }, "bf16", dev)
  local t_bf16
  for _, cdt in ipairs({ "bf16", unpack(FP8) }) do
    local kc, vc, bt = make_cache(B, L, Hk, D, page, cdt)
    local opts = { cache_seqlens = L, block_table = bt, out = out }
    local t = time_it(function() assert(pa.attention_with_kvcache(q, kc, vc, opts)) end, budget)
    kc, vc = nil, nil
    collectgarbage()
    local bytes = 2.0 * B * L * Hk * D * (cdt == "bf16" and 2 or 1)
    local gbps = bytes / t / 1e9
    t_bf16 = t_bf16 or t
    row("%-44s %10.3f %8.1f GB/s %8.2f %8s", string.format("decode %s %d x %d keys, page %s", cdt, B, L,
      page == 0 and "none" or page), t * 1e3, gbps, gbps / ceil.read_gbps,
      cdt == "bf16" and "" or string.format("%.2f", t_bf16 / t))
  end
end

-- prefill: causal, bf16 and f32
local prefill_cases = quick and { { 1, 512, 16, "bf16" } } or {
  { 1, 2048, 16, "bf16" }, { 1, 2048, 0, "bf16" }, { 1, 2048, 16, "f32" }, { 4, 512, 16, "bf16" },
}
for _, c in ipairs(prefill_cases) do
  local B, S, page, dtype = c[1], c[2], c[3], c[4]
  local q = pa.randn({ B, S, H, D }, dtype, dev, 3)
  local out = pa.tensor({ B, S, H, D }, dtype, dev)
  local gf_first
  -- fp8 caches beside the bf16 rows (q bf16)
  local caches = { dtype }
  if dtype == "bf16" and page ~= 0 then for _, f in ipairs(FP8) do caches[#caches + 1] = f end end
  for _, cdt in ipairs(caches) do
    local kc, vc, bt = make_cache(B, S, Hk, D, page, cdt)
    local opts = { cache_seqlens = S, block_table = bt, out = out, causal = true }
    local t = time_it(function() assert(pa.attention_with_kvcache(q, kc, vc, opts)) end, budget)
    local flops = 4.0 * B * H * D * (S * (S + 1) / 2)
    local gf = flops / t / 1e9
    gf_first = gf_first or gf
    row("%-44s %10.3f %7.1f GFLOP/s %6.2f %8s", string.format("prefill %s %d x %d causal, page %s", cdt == dtype and
      dtype or ("bf16 / " .. cdt), B, S, page == 0 and "none" or page), t * 1e3, gf, gf / ceil.fma_gflops,
      cdt == dtype and "" or string.format("%.2f", gf / gf_first))
  end
end

-- The ceilings again: on a shared host (a VM) the read rate moves between runs
-- (34-59 GB/s on one 2-core VM within minutes), and the ratios with it.
local after = assert(dev:ceilings(quick and 0.3 or 1.0))
print()
print(string.format("ceilings after the table: read %.1f GB/s (%.1f before), fp32 FMA %.1f GFLOP/s (%.1f before)",
  after.read_gbps, ceil.read_gbps, after.fma_gflops, ceil.fma_gflops))
