-- spec/gpu_cascade_spec.lua -- merge_spec's and cascade_spec's cases on the
-- GPU (spec/cascade_cases.lua: kernels/merge.cu's merge and row copy with
-- rotary, the two levels through the CUDA attention kernels), and the
-- issue's workload (decodes sharing a 4096-token prefix, 512 tokens of their
-- own each, bf16, 32/8 heads, D 128, page 16, rotary) against the plain call
-- and the float64 reference on a slice. Tagged #gpu; pending without a CUDA
-- device; scripts/gpu-run.sh runs it under compute-sanitizer too.
--   PAGEDATTN_GPU_SPEC_DEVICE=cpu PAGEDATTN_GPU_SPEC_SMALL=1: a dry run on the CPU, small.
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local G = require "gpu_helpers"
local H = require "helpers"
local cases = require "cascade_cases"

local SPEC = "spec/gpu_cascade_spec.lua"
local dev, why = G.device()

describe("#gpu shared prefixes read once (cascade) on the GPU", function()
  if G.pending_without(pending, dev, why) then return end

  it("#gpu merges states as the float64 reference does (random, in place, near the largest float)", function()
    cases.merge_random(dev, "gpu", H.scale(40), SPEC)
    cases.merge_inplace(dev, "gpu", SPEC)
    cases.merge_near_max(dev)
  end)

  it("#gpu merges attention over split keys into the reference's attention over all of them", function()
    cases.merge_split(dev, "gpu", H.scale(12), SPEC)
  end)

  it("#gpu gives the plain call's results on random sharing structures", function()
    cases.cascade_random(dev, "gpu", H.scale(36), SPEC)
  end)

  it("#gpu gives the plain call's results on each kernel the levels run on (forced), their rows in f32, on one stream or two", function()
    -- the levels write f32 rows for 16-bit q (the kernels' out_f32): each
    -- kernel's own store of them, prefill_ws's from its registers among them
    local forced = { { prefill_kernel = "mma" }, { decode_kernel = "simt" }, { fallback = 1 }, { cascade_overlap = 0 } }
    if G.cc_major(dev) >= 9 then
      table.insert(forced, 1, { prefill_kernel = "ws" })
      table.insert(forced, 2, { prefill_kernel = "wgmma" })
    end
    local shape = { dtypes = { "bf16", "f16" }, pages = { 16 }, dims = { 64, 128 } }
    if dev.kind ~= "cuda" then -- (the CPU dry run: no kernels to force)
      return cases.cascade_random(dev, "gpu forced", H.scale(6), SPEC, shape)
    end
    for _, t in ipairs(forced) do
      local k, v = next(t)
      local t0 = pa.clock()
      dev:with_tuning(t, cases.cascade_random, dev, "gpu forced " .. k .. "=" .. v, H.scale(6), SPEC, shape)
      io.stderr:write(string.format("  (cascade, %s=%s forced: %d cases in %.1f s)\n", k, v, H.scale(6), pa.clock() - t0))
    end
  end)

  it("#gpu rotates q where the plain call does", function()
    cases.cascade_rotary(dev, SPEC)
  end)

  it("#gpu the issue's workload: decodes sharing a 4096-token prefix, 512 own tokens each, with rotary", function()
    local B, P, S = 256, 4096, 512
    if G.small then B, P, S = 8, 256, 40 end
    local ps, Hq, Hk, D, dtype = 16, 32, 8, 128, "bf16"
    local seed = H.seed("gpu-cascade-workload")
    local cache = assert(pa.kv_cache { num_pages = P / ps + B * (math.ceil(S / ps) + 1) + 8, page_size = ps,
      kv_heads = Hk, head_dim = D, dtype = dtype, device = dev })
    cache.k_cache:copy_from(pa.randn(cache.k_cache.shape, dtype, dev, seed))
    cache.v_cache:copy_from(pa.randn(cache.v_cache.shape, dtype, dev, seed + 1))
    local prompt = cache:sequence()
    assert(prompt:append(P))
    local b = cache:batch { capacity = B, cascade = true }
    for i = 1, B do
      local s = assert(prompt:fork())
      assert(s:append(S - 1 - (i % 7))) -- suffixes of a few lengths, partial pages among them
      b:add(s, 1)
    end
    assert(b:stage())
    local ci = b:cascade_info()
    assert.equal(1, ci.groups)
    assert.equal(B, ci.grouped)
    local cos, sin = cases.rotary_tables(P + S + 1, D, dev)
    local q = pa.randn({ B, Hq, D }, dtype, dev, seed + 2)
    local k, v = pa.randn({ B, Hk, D }, dtype, dev, seed + 3), pa.randn({ B, Hk, D }, dtype, dev, seed + 4)
    local o = { rotary_cos = cos, rotary_sin = sin, return_softmax_lse = true }
    local out_c, lse_c = assert(b:attention(q, k, v, o))
    assert.equal("used", b:cascade_info().last)
    -- the plain call (its append writes what the cascade's wrote)
    local out_p, lse_p = assert(pa.attention_varlen(q, cache.k_cache, cache.v_cache, { k = k, v = v,
      block_table = b.block_table, cu_seqlens_q = b.cu_seqlens_q, seqused_k = b.seqused_k, causal = true,
      rotary_cos = cos, rotary_sin = sin, return_softmax_lse = true }))
    -- the rule on a slice: sequence 0's query heads of kv head 0 over all its keys
    local keys = b.seqused_k:to_table()[1]
    local pages = b.block_table:to_table(0, b.max_pages)
    local function offset_of(tok) return (pages[math.floor(tok / ps) + 1] * ps + tok % ps) * Hk * D end
    local t = { q = q, k_cache = cache.k_cache, v_cache = cache.v_cache }
    local rq, rk, rv, ro = G.slice(t, Hq, Hk, D, 0, 1, keys, offset_of, { causal = true })
    -- q rotated as the calls rotate it (at its position, keys - 1)
    local rc, rs = cases.to_ref(cos), cases.to_ref(sin)
    local Gq = Hq / Hk
    for g = 0, Gq - 1 do
      local x = {}
      for d = 1, D do x[d] = rq.data[g * D + d] end
      local y = ref.apply_rotary(x, keys - 1, rc, rs, true)
      for d = 1, D do rq.data[g * D + d] = y[d] end
    end
    local tol, naive = G.naive_tolerance(dtype, rq, rk, rv, ro)
    local exact, exact_lse = ref.attention_with_kvcache(rq, ref.copy(rk), ref.copy(rv),
      { cache_seqlens = ref.tensor({ 1 }, { keys }), causal = true })
    local _, naive_lse = ref.attention_with_kvcache(rq, ref.copy(rk), ref.copy(rv),
      { cache_seqlens = ref.tensor({ 1 }, { keys }), causal = true, precision = dtype })
    local ltol = ref.tolerance("f32", ref.max_abs_diff(naive_lse.data, exact_lse.data))
    local got = G.read(out_c, 0, Gq * D)
    local err = ref.max_abs_diff(got, exact.data)
    assert(err <= tol, string.format("slice: cascade err %g > tolerance %g (naive %g) (%s)", err, tol, naive,
      H.rerun(SPEC)))
    local got_lse = {} -- lse [H, B]: heads 0 .. Gq - 1 of row 0
    for g = 0, Gq - 1 do got_lse[g + 1] = G.read(lse_c, g * B, 1)[1] end
    local lerr = ref.max_abs_diff(got_lse, exact_lse.data)
    assert(lerr <= ltol, string.format("slice: cascade lse err %g > tolerance %g (%s)", lerr, ltol, H.rerun(SPEC)))
    -- everywhere: the plain call's results, each within the rule of the other
    local diff = G.max_diff(out_c:to_table(), out_p:to_table())
    assert(diff <= 2 * tol, string.format("cascade vs plain: max |diff| %g > 2 x tolerance %g (%s)", diff, tol,
      H.rerun(SPEC)))
    local ldiff = G.max_diff(lse_c:to_table(), lse_p:to_table())
    assert(ldiff <= 2 * ltol, string.format("lse: cascade vs plain %g > 2 x tolerance %g (%s)", ldiff, ltol,
      H.rerun(SPEC)))
    b:close()
    cache:close()
  end)
end)
