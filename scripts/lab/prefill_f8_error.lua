-- scripts/lab/prefill_f8_error.lua -- the error of the e4m3 tensor-core
-- prefill (tuning prefill_fp8 = 2: Q and P in e4m3) at the bench's shapes,
-- where the float64 reference in Lua would take hours: against the same call
-- over the 16-bit copy (prefill_fp8 = 1, within the tolerance rule of the
-- reference), over an e4m3 cache of randn keys and values, page 16, 32 / 8
-- heads of 128. Prints, for each workload, the largest and the mean
-- |difference| and the mean |out| (the size of what is compared).
--   . .gpu-deps/env.sh && . scripts/env.sh && luajit scripts/lab/prefill_f8_error.lua
local pa = require "pagedattn"
local sweep = require "pagedattn.sweep"
local dev = assert(pa.device("cuda"))
local H, HK, D = 32, 8, 128
for _, wl in ipairs({ { 1, 8192, 0, true }, { 4, 1024, 8192, true }, { 2, 2048, 0, false } }) do
  local B, S, Cc, causal = wl[1], wl[2], wl[3], wl[4]
  local kc, vc, bt = sweep.make_cache(pa, dev, B, S + Cc, HK, D, 16, "fp8_e4m3")
  local q = assert(pa.randn({ B, S, H, D }, "bf16", dev, 3))
  local outs = {}
  for i, mode in ipairs({ 1, 2 }) do
    outs[i] = assert(pa.tensor({ B, S, H, D }, "bf16", dev))
    dev:with_tuning({ prefill_fp8 = mode }, function()
      assert(pa.attention_with_kvcache(q, kc, vc, { block_table = bt, cache_seqlens = S + Cc, causal = causal,
        out = outs[i], k_scale = 0.5, v_scale = 0.25 }))
    end)
    if mode == 2 then assert(dev:last_plan():find("| pa_prefill_f8 ", 1, true), dev:last_plan()) end
  end
  local a, b = outs[1]:to_table(), outs[2]:to_table()
  local worst, sum, mag = 0, 0, 0
  for i = 1, #a do
    local d = math.abs(a[i] - b[i])
    if d ~= d then d = math.huge end
    worst = math.max(worst, d)
    sum, mag = sum + d, mag + math.abs(a[i])
  end
  print(string.format("f8err %dx%d+%d %s: max |diff| %.4g, mean |diff| %.4g, mean |out| %.4g (ratio %.4f)", B, S, Cc,
    causal and "causal" or "full", worst, sum / #a, mag / #a, sum / mag))
end
