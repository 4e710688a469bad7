-- FP8 KV caches (issue 49) on the CPU: the two formats' conversions against
-- pagedattn.reference's own (every byte, ties, saturation, subnormals), the
-- attention paths with fp8 caches against the float64 reference (the
-- DESIGN tolerance rule, the naive computation dequantizing as PyTorch
-- would), the scales (per tensor and per kv head), their errors, and the
-- pool, batches and pagedattn.serve over fp8 caches.
local ffi = require "ffi"
local pa = require "pagedattn"
local core = require "pagedattn.core"
local ref = require "pagedattn.reference"
local check = require "pagedattn.check"
local H = require "helpers"

local SPEC = "spec/fp8_spec.lua"
local cpu = assert(pa.device("cpu"))
local staged = assert(pa.device("cpu:staged"))
local FORMATS = check.FP8_DTYPES
local MAX = { fp8_e4m3 = 448, fp8_e5m2 = 57344 }
local EMIN = { fp8_e4m3 = -6, fp8_e5m2 = -14 } -- the smallest normal's exponent
local MBITS = { fp8_e4m3 = 3, fp8_e5m2 = 2 }

-- The raw bytes of a tensor.
local function bytes_of(t)
  local buf = ffi.new("uint8_t[?]", math.max(t.nbytes, 1))
  assert(core.C.pa_tensor_read(core.ctx, t.handle, 0, buf, t.numel) == 0, core.last_error())
  local out = {}
  for i = 1, t.nbytes do out[i] = buf[i - 1] end
  return out
end

local function same_value(a, b) return (a ~= a and b ~= b) or a == b end

local function run(name, i, want, dev)
  local seed = H.seed(name, i)
  local rng = ref.rng(seed)
  local case = check.random_case(rng, want)
  local r = check.run(case, dev or cpu, rng)
  H.assert_check(r, seed, SPEC)
  return r, case
end

describe("fp8 tensors", function()
  for _, fmt in ipairs(FORMATS) do
    it(fmt .. ": one byte an element; every byte reads back as its value", function()
      local t = pa.tensor({ 256 }, fmt, cpu)
      assert.equal(256, t.nbytes)
      local raw = ffi.new("uint8_t[256]")
      for b = 0, 255 do raw[b] = b end
      assert.equal(0, core.C.pa_tensor_write(core.ctx, t.handle, 0, raw, 256))
      local got = t:to_table()
      local nans = 0
      for b = 0, 255 do
        local want = ref.fp8_decode(b, fmt)
        if want ~= want then nans = nans + 1 end
        assert(same_value(got[b + 1], want), string.format("%s byte 0x%02x: %s, expected %s", fmt, b, got[b + 1], want))
      end
      assert.equal(fmt == "fp8_e4m3" and 2 or 6, nans) -- S.1111.111 / S.11111.{01,10,11}
      -- the definitions: the largest finite value, the smallest subnormal
      assert.equal(MAX[fmt], ref.fp8_decode(fmt == "fp8_e4m3" and 0x7e or 0x7b, fmt))
      assert.equal(2 ^ (EMIN[fmt] - MBITS[fmt]), ref.fp8_decode(1, fmt))
      if fmt == "fp8_e5m2" then assert.equal(math.huge, ref.fp8_decode(0x7c, fmt)) end
    end)

    it(fmt .. ": writes round to nearest even, saturate (infinities too), keep NaN and -0", function()
      local rng = H.rng("fp8-encode-" .. fmt)
      local vals = { 0, -0.0, 1, -1, MAX[fmt], -MAX[fmt], MAX[fmt] * 1.01, MAX[fmt] * 1e6, -1e30, math.huge,
                     -math.huge, 0 / 0, 2 ^ (EMIN[fmt] - MBITS[fmt] - 1), 3 * 2 ^ (EMIN[fmt] - MBITS[fmt] - 1),
                     2 ^ (EMIN[fmt] - MBITS[fmt] - 2), 1e-30 }
      -- every midpoint between neighbours (ties), and a hair either side
      for b = 0, 126 do
        local a, c = ref.fp8_decode(b, fmt), ref.fp8_decode(b + 1, fmt)
        if a == a and c == c and c < math.huge then
          local mid = (a + c) / 2
          vals[#vals + 1] = mid
          vals[#vals + 1] = -mid
          vals[#vals + 1] = mid * (1 + 2 ^ -40)
          vals[#vals + 1] = mid * (1 - 2 ^ -40)
        end
      end
      for _ = 1, 400 do vals[#vals + 1] = rng:normal() * 2 ^ rng:int(EMIN[fmt] - 4, 17) end
      local t = assert(pa.from_table(vals, { #vals }, fmt, cpu))
      local got = bytes_of(t)
      for i, x in ipairs(vals) do
        local want = ref.fp8_encode(x, fmt)
        if x ~= x then
          assert(got[i] % 128 == 127, string.format("%s: NaN wrote 0x%02x", fmt, got[i]))
        else
          assert(got[i] == want, string.format("%s: %.17g wrote 0x%02x, expected 0x%02x", fmt, x, got[i], want))
        end
      end
      -- the reference's encoder is the decoder's inverse on every finite byte
      for b = 0, 255 do
        local v = ref.fp8_decode(b, fmt)
        if v == v and math.abs(v) < math.huge then assert.equal(b, ref.fp8_encode(v, fmt)) end
      end
    end)

    it(fmt .. ": fill, copy, clone, randn; every device the same bytes", function()
      local t = pa.tensor({ 40000 }, fmt, cpu):fill(1000)
      for _, v in ipairs(t:to_table(0, 10)) do assert.equal(fmt == "fp8_e4m3" and 448 or 1024, v) end
      t:fill(-0.3)
      assert.equal(ref.round(-0.3, fmt), t:to_table(39999, 1)[1])
      local c = t:clone()
      assert.same(bytes_of(t), bytes_of(c))
      local r = pa.randn({ 1000 }, fmt, cpu, 5)
      local r32 = pa.randn({ 1000 }, "f32", cpu, 5)
      local a, b = r:to_table(), r32:to_table()
      for i = 1, 1000 do
        -- the fp8 value of the normal number (rounded once from double; via
        -- the f32 value it is at most one rounding step away)
        assert(math.abs(a[i] - b[i]) <= math.abs(b[i]) * 2 ^ -MBITS[fmt] + 2 ^ (EMIN[fmt] - MBITS[fmt]),
          string.format("randn %d: %s vs f32 %s", i, a[i], b[i]))
        assert.equal(a[i], ref.round(a[i], fmt))
      end
      local s = assert(pa.from_table({ 1, 2, 3, 500 }, { 4 }, fmt, staged))
      assert.same({ 1, 2, 3, ref.round(500, fmt) }, s:to_table())
    end)
  end

  it("dtype names and errors", function()
    assert.equal("fp8_e4m3", pa.tensor({ 1 }, "fp8_e4m3", cpu).dtype)
    local err = H.error_of(pa.tensor, { 1 }, "fp8", cpu)
    assert.truthy(err:find("fp8_e4m3, fp8_e5m2", 1, true), err)
    assert.equal(1, tonumber(core.C.pa_dtype_size(core.dtypes.fp8_e5m2)))
  end)
end)

describe("attention with fp8 caches on the CPU against the reference", function()
  for _, fmt in ipairs(FORMATS) do
    describe(fmt, function()
      it("page sizes 1, 3, 16, 256 and a contiguous cache, in every mode", function()
        for _, ps in ipairs({ 1, 3, 16, 256, 0 }) do
          for m, mode in ipairs({ "decode", "prefill", "chunked", "read" }) do
            run(fmt .. "ps" .. ps, m, { cache_dtype = fmt, dtype = "bf16", page_size = ps, mode = mode })
          end
        end
      end)

      it("q, k, v and out in f16, bf16 and f32, with lse", function()
        for i, dt in ipairs({ "f16", "bf16", "f32" }) do
          run(fmt .. "dt", i, { cache_dtype = fmt, dtype = dt, lse = true })
        end
      end)

      it("values past the largest finite one saturate (append and cache)", function()
        for i, mode in ipairs({ "decode", "chunked", "prefill" }) do
          run(fmt .. "sat", i, { cache_dtype = fmt, dtype = "bf16", mode = mode, fp8_range = "saturate", lse = true })
        end
      end)

      it("subnormal values (append and cache)", function()
        for i, mode in ipairs({ "decode", "chunked", "read" }) do
          run(fmt .. "sub", i, { cache_dtype = fmt, dtype = "f16", mode = mode, fp8_range = "subnormal", lse = true })
        end
      end)

      it("query rows of any magnitude (2^-60 to 2^60, zeros, elements far below their row's largest)", function()
        for i, dt in ipairs({ "bf16", "f16", "bf16", "bf16" }) do
          run(fmt .. "qrange", i, { cache_dtype = fmt, dtype = dt, mode = ({ "decode", "decode", "read", "chunked" })[i],
                                    q_range = "wide", group = 4, D = 128, lse = true })
        end
      end)

      it("a scale per kv head, for keys and values", function()
        for i = 1, 3 do
          run(fmt .. "head", i, { cache_dtype = fmt, dtype = "bf16", Hk = 2, k_scale = "head", v_scale = "head",
                                  fp8_range = ({ "normal", "saturate", "subnormal" })[i] })
        end
      end)

      it("decode: GQA 1, 4, 8; split-KV; head dims 64, 128, 256, 40", function()
        for i, g in ipairs({ 1, 4, 8 }) do
          run(fmt .. "gqa", i, { cache_dtype = fmt, dtype = "bf16", mode = "decode", group = g, cached = 290 })
        end
        for i = 1, 2 do
          run(fmt .. "split", i, { cache_dtype = fmt, dtype = "bf16", mode = "decode", num_splits = i + 2, cached = 250 })
        end
        for i, d in ipairs({ 64, 128, 256, 40 }) do
          run(fmt .. "hd", i, { cache_dtype = fmt, dtype = "bf16", D = d })
        end
      end)

      it("varlen: prefill chunks next to decodes", function()
        for i, mode in ipairs({ "chunked", "decode", "read", "prefill" }) do
          run(fmt .. "varlen", i, { cache_dtype = fmt, form = "varlen", B = 4, mode = mode })
        end
      end)

      it("every masking option: causal, window, softcap, alibi; rotary append", function()
        run(fmt .. "mask", 1, { cache_dtype = fmt, causal = true, window = { 5, -1 }, lse = true })
        run(fmt .. "mask", 2, { cache_dtype = fmt, causal = false, window = { 3, 2 }, lse = true })
        run(fmt .. "mask", 3, { cache_dtype = fmt, softcap = 5, alibi = "BH", lse = true })
        run(fmt .. "mask", 4, { cache_dtype = fmt, causal = true, alibi = "H", softcap = 30, lse = true })
        run(fmt .. "rope", 1, { cache_dtype = fmt, mode = "chunked", rotary = { dim = 64, interleaved = true }, D = 64 })
        run(fmt .. "rope", 2, { cache_dtype = fmt, mode = "decode", rotary = { dim = 32, interleaved = false }, D = 128,
                               causal = true })
      end)

      it("random block tables with duplicate pages, empty caches, a partial last page", function()
        for i = 1, 3 do
          run(fmt .. "dup", i, { cache_dtype = fmt, mode = "read", page_size = ({ 1, 3, 16 })[i], duplicates = true, B = 4 })
        end
        run(fmt .. "empty", 1, { cache_dtype = fmt, mode = "read", cached = 0, lse = true, form = "kvcache" })
        run(fmt .. "partial", 1, { cache_dtype = fmt, page_size = 16, mode = "read", cached = { 37, 17, 1, 31 }, B = 4 })
      end)

      it("the staged CPU (a GPU's paths: per-head scales from their host mirror, no download)", function()
        local C = core.C
        for i = 1, 3 do
          local before = tonumber(C.pa_debug_index_downloads())
          run(fmt .. "staged", i, { cache_dtype = fmt, k_scale = "head", v_scale = i == 1 and 0.5 or "head" }, staged)
          assert.equal(before, tonumber(C.pa_debug_index_downloads()))
        end
      end)

      it("random cases", function()
        for i = 1, H.scale(12) do run(fmt .. "random", i, { cache_dtype = fmt }) end
      end)
    end)
  end

  it("the tolerance rule tells a wrong scale apart; the reference's store saturates", function()
    local rng = ref.rng(H.seed("fp8-can-fail"))
    local inputs
    local function ref_run(precision, v_scale)
      local o = { cache_dtype = "fp8_e4m3", precision = precision }
      for k, v in pairs(inputs.opts) do o[k] = v end
      o.v_scale = v_scale or o.v_scale
      return (ref.attention_with_kvcache(inputs.q, ref.copy(inputs.k_cache), ref.copy(inputs.v_cache), o))
    end
    -- a case whose outputs stand well above the tolerance (32x: a scale
    -- 1/16 off moves them by 2x the tolerance), so that a wrong scale can
    -- show (a draw of empty sequences outputs zeros whatever the scale: seed
    -- 7005000 drew one)
    local exact, naive, tol, peak
    for _ = 1, 50 do
      local case = check.random_case(rng, { cache_dtype = "fp8_e4m3", dtype = "bf16", mode = "read",
        form = "kvcache", k_scale = 0.5, v_scale = 0.5, fp8_range = "normal" })
      inputs = check.build(case, rng)
      exact, naive = ref_run("f64"), ref_run("bf16")
      tol = ref.tolerance("bf16", ref.max_abs_diff(naive, exact))
      peak = ref.max_abs_diff(exact, ref.tensor(exact.shape)) -- (max |out|)
      if peak > 32 * tol then break end
    end
    assert(peak > 32 * tol, "no case with outputs in 50 draws")
    assert.is_true(ref.max_abs_diff(naive, exact) <= tol)
    assert.is_true(ref.max_abs_diff(ref_run("f64", 0.25), exact) > 10 * tol)
    assert.is_true(ref.max_abs_diff(ref_run("f64", 0.5 * (1 + 2 ^ -4)), exact) > tol)
    assert.equal(448, ref.round(1e6, "fp8_e4m3"))
    assert.equal(57344, ref.round(1e6, "fp8_e5m2"))
    assert.equal(-448, ref.round(-math.huge, "fp8_e4m3"))
  end)

  -- The append's bytes (docs/fp8.md, "The append's value"): x times its kv
  -- head's 1 / scale (rounded to f32) rounded to f32, then to fp8; keys
  -- rotated in f32 (x1 s and x1 c rounded, then one fused multiply-add).
  -- A Lua model of that, byte for byte, on both formats, non-power-of-two
  -- scales per head, both rotary layouts (one with dims past rotary_dim),
  -- and values that saturate, underflow, or are not finite.
  -- The checker of the e4m3 tensor-core prefill (tuning prefill_fp8 = 2,
  -- CUDA only; spec/gpu_fp8_spec.lua): q as that path rounds it, and a bound
  -- that an exact-q computation (the CPU's) breaks, so it can fail.
  it("check.q_e4m3 rounds rows as the e4m3 prefill does; check.run_e4m3 rejects an exact q", function()
    local D = 128
    local q = {}
    for i = 1, D do q[i] = i == 1 and 3 or 0.01 * i end -- amax 3: times 2^6 into [128, 256)
    for i = 1, D do q[D + i] = 0 end
    for i = 1, D do q[2 * D + i] = (i % 2 == 0 and -1 or 1) * 2 ^ -130 * i end -- tiny: E clamped to 8, times 2^126
    local e = check.q_e4m3(q, D)
    assert.are.equal(3, e[1])
    assert.are.equal(1.25 / 64, e[2]) -- 1.28 -> 1.25 (e4m3 steps of 1/8 in [1, 2))
    assert.are.equal(1, e[100])
    assert.are.equal(80 / 64, e[128]) -- 81.92 -> 80 (steps of 8 in [64, 128))
    assert.are.equal(0, e[D + 1])
    assert.are.equal(-2 ^ -129, e[2 * D + 2]) -- 2^-3 after the factor: exact
    local failed = 0
    for seed = 1, 4 do
      local rng = ref.rng(seed)
      local case = check.random_case(rng, { cache_dtype = "fp8_e4m3", form = "kvcache", mode = "prefill",
        dtype = "bf16", D = 128, page_size = 16, B = 2, group = 4, causal = true, new = 40,
        softcap = false, alibi = false, rotary = false, q_e4m3 = true, lse = true })
      local r = check.run(case, cpu, rng)
      assert.truthy(r.report:find("out (q in e4m3)", 1, true), r.report)
      if not r.ok then failed = failed + 1 end
    end
    assert.are.equal(4, failed)
  end)

  -- The bound is sound for P in e4m3 (the rest of check.run_e4m3's bound,
  -- the scores' own error, is the GPU's): the reference's model of the
  -- kernel's P (opts.p_e4m3: each p times 2^8 rounded to e4m3) stays within
  -- it on random cases, the caches' ranges (saturating, subnormal), scales,
  -- windows, GQA, pages and both formats included.
  it("check.run_e4m3's bound holds for the reference's model of P in e4m3", function()
    for i = 1, H.scale(12) do
      local seed = H.seed("e4m3 bound", i)
      local rng = ref.rng(seed)
      local case = check.random_case(rng, { cache_dtype = i % 2 == 0 and "fp8_e5m2" or "fp8_e4m3", form = "kvcache",
        mode = i % 3 == 0 and "chunked" or "prefill", dtype = i % 4 < 2 and "bf16" or "f16", D = 128,
        page_size = ({ 16, 1, 5, 256 })[i % 4 + 1], B = rng:int(1, 2), group = ({ 1, 4 })[i % 2 + 1],
        new = rng:int(9, 60), max_keys = 160, softcap = false, alibi = false, rotary = false, q_e4m3 = "emulate" })
      local r = check.run(case, cpu, rng)
      assert(r.ok, string.format("%s\n  case: %s\n  seed: %d", r.report, check.describe(case), seed))
    end
  end)

  it("the append stores the f32 definition, byte for byte (a Lua model)", function()
    local f32 = ref.rounder("f32")
    -- a * b + c rounded once to f32: a * b is exact in double (a bf16 times
    -- an f32); the sum rounded to double is off by err (TwoSum), which
    -- decides the f32 rounding only where the sum is an f32 midpoint: there
    -- one double step towards err settles it
    local function fma32(a, b, c)
      local prod = a * b
      local sum = prod + c
      local bb = sum - prod
      local err = (prod - (sum - bb)) + (c - bb)
      if err ~= 0 then
        local _, e = math.frexp(sum)
        local q = sum / 2 ^ (e - 25) -- (odd: halfway between two f32s)
        if q == math.floor(q) and q % 2 == 1 then sum = sum + (err > 0 and 2 ^ (e - 53) or -2 ^ (e - 53)) end
      end
      return f32(sum)
    end
    for _, fmt in ipairs(FORMATS) do
      for li, lay in ipairs({ { il = false, rd = 8 }, { il = true, rd = 4 } }) do
        local rng = H.rng("fp8-append-model-" .. fmt, li)
        local B, S, Hk, D, ps = 2, 3, 2, 8, 4
        local seqlens = { 0, 5 }
        local bt = { { 0, 1 }, { 3, 2 } }
        local scales_k, scales_v = { 0.3, 1.7 }, { 0.45, 3 }
        local half, npos = lay.rd / 2, S + seqlens[2]
        local cs, sn = {}, {}
        for i = 1, npos * half do
          cs[i] = f32((0.25 + 0.75 * rng:uniform()) * (rng:uniform() < 0.5 and -1 or 1))
          sn[i] = f32((0.25 + 0.75 * rng:uniform()) * (rng:uniform() < 0.5 and -1 or 1))
        end
        local kv, vv = {}, {}
        for i = 1, B * S * Hk * D do
          kv[i] = ref.round(rng:normal() * 2 ^ rng:int(-3, 3), "bf16")
          vv[i] = ref.round(rng:normal() * 2 ^ rng:int(-3, 3), "bf16")
        end
        -- v: past the range, below it, not finite, signed zero; k past the rotary dims
        local specials = { 0 / 0, math.huge, -math.huge, 1e30, -1e30, -0.0, 2 ^ -130, -2 ^ -60, 3e38 }
        for j, x in ipairs(specials) do vv[j * 5] = ref.round(x, "bf16") end
        -- a double rounding the definition makes: x inv rounds to an fp8
        -- midpoint in f32 (then to the even side) where x inv itself lies on
        -- the odd side (rounded once from double, it would go there): head
        -- 1's v scale and x found so, x in every token's first v element
        local found
        for k = 4, 15 do
          local x = k / 16
          for n = 0, 2 ^ MBITS[fmt] - 1 do
            local lo, hi = 1 + n * 2 ^ -MBITS[fmt], 1 + (n + 1) * 2 ^ -MBITS[fmt]
            local m = (lo + hi) / 2
            local inv = f32(m / x)
            local sc = f32(1 / inv)
            if not found and f32(1 / sc) == inv and f32(x * inv) == m and x * inv ~= m
               and ((x * inv > m) == (n % 2 == 0)) then
              found = { x = x, scale = sc, want = ref.fp8_encode(n % 2 == 0 and lo or hi, fmt),
                        once = ref.fp8_encode(x * inv > m and hi or lo, fmt) }
            end
          end
        end
        assert(found and found.want ~= found.once, "no double-rounding case found")
        scales_v[1] = found.scale
        for b = 0, B - 1 do
          for i = 0, S - 1 do vv[((b * S + i) * Hk) * D + 1] = found.x end
        end
        if lay.rd < D then kv[D - 1], kv[2 * D] = 0 / 0, -math.huge end
        local kc = pa.tensor({ 4, ps, Hk, D }, fmt, cpu)
        local vc = pa.tensor({ 4, ps, Hk, D }, fmt, cpu)
        local q = pa.tensor({ B, 0, 2 * Hk, D }, "bf16", cpu)
        assert(pa.attention_with_kvcache(q, kc, vc, {
          k = pa.from_table(kv, { B, S, Hk, D }, "bf16", cpu), v = pa.from_table(vv, { B, S, Hk, D }, "bf16", cpu),
          block_table = pa.from_table({ bt[1][1], bt[1][2], bt[2][1], bt[2][2] }, { 2, 2 }, "i32", cpu),
          cache_seqlens = seqlens, k_scale = scales_k, v_scale = scales_v,
          rotary_cos = pa.from_table(cs, { npos, half }, "f32", cpu),
          rotary_sin = pa.from_table(sn, { npos, half }, "f32", cpu), rotary_interleaved = lay.il }))
        local kb, vb = bytes_of(kc), bytes_of(vc)
        local checked = 0
        local function expect(got, x, inv, what)
          local want = ref.fp8_encode(f32(x * inv), fmt)
          if x ~= x then
            assert(got % 128 == 127, string.format("%s: NaN wrote 0x%02x", what, got))
          else
            assert(got == want, string.format("%s %s: %.17g / scale wrote 0x%02x, the definition 0x%02x",
              fmt, what, x, got, want))
          end
          checked = checked + 1
        end
        for b = 1, B do
          for i = 0, S - 1 do
            local pos = seqlens[b] + i
            local page, slot = bt[b][math.floor(pos / ps) + 1], pos % ps
            for hk = 0, Hk - 1 do
              local src = (((b - 1) * S + i) * Hk + hk) * D -- (0-based element of the row)
              local dst = ((page * ps + slot) * Hk + hk) * D
              local inv_k, inv_v = f32(1 / f32(scales_k[hk + 1])), f32(1 / f32(scales_v[hk + 1]))
              local y = {}
              for d = 0, D - 1 do y[d] = kv[src + d + 1] end
              for j = 0, half - 1 do
                local i0, i1 = lay.il and 2 * j or j, lay.il and 2 * j + 1 or j + half
                local x0, x1, c, s_ = y[i0], y[i1], cs[pos * half + j + 1], sn[pos * half + j + 1]
                y[i0] = fma32(x0, c, -f32(x1 * s_))
                y[i1] = fma32(x0, s_, f32(x1 * c))
              end
              for d = 0, D - 1 do
                local at = string.format("(b %d token %d head %d elem %d)", b, i, hk, d)
                expect(kb[dst + d + 1], y[d], inv_k, "k " .. at)
                expect(vb[dst + d + 1], vv[src + d + 1], inv_v, "v " .. at)
              end
            end
          end
        end
        assert.equal(B * S * Hk * D * 2, checked, fmt .. " layout " .. li)
        assert.equal(found.want, vb[(bt[1][1] * ps * Hk) * D + 1], "the double-rounding case")
      end
    end
  end)
end)

describe("fp8 scales and dtypes: errors name the argument and change nothing", function()
  local SPEC_FILE = "fp8_spec.lua"
  local function setup(fmt)
    local s = {}
    s.q = pa.randn({ 2, 1, 4, 8 }, "bf16", cpu, 1)
    s.k_cache = pa.randn({ 6, 4, 2, 8 }, fmt or "fp8_e4m3", cpu, 2)
    s.v_cache = pa.randn({ 6, 4, 2, 8 }, fmt or "fp8_e4m3", cpu, 3)
    s.opts = {
      k = pa.randn({ 2, 1, 2, 8 }, "bf16", cpu, 4), v = pa.randn({ 2, 1, 2, 8 }, "bf16", cpu, 5),
      block_table = pa.from_table({ 0, 1, 2, 3, 4, 5 }, { 2, 3 }, "i32", cpu), cache_seqlens = { 5, 2 },
      k_scale = 0.5, v_scale = { 0.25, 2 },
    }
    return s
  end
  local function call(s)
    local out = pa.attention_with_kvcache(s.q, s.k_cache, s.v_cache, s.opts)
    return out
  end
  local function expect_error(s, arg, pattern)
    local bk, bv = bytes_of(s.k_cache), bytes_of(s.v_cache)
    local err = H.error_of(call, s)
    assert.truthy(err:find(SPEC_FILE, 1, true), "error does not point at the caller: " .. err)
    assert.truthy(err:find("attention_with_kvcache: " .. arg .. ":", 1, true), "error does not name " .. arg .. ": " .. err)
    if pattern then assert.truthy(err:find(pattern, 1, true), "error '" .. err .. "' lacks " .. pattern) end
    assert.same(bk, bytes_of(s.k_cache), "k_cache changed by a failed call")
    assert.same(bv, bytes_of(s.v_cache), "v_cache changed by a failed call")
  end

  it("the valid setup works and appends (so the checks below can fail)", function()
    local s = setup()
    local before = bytes_of(s.k_cache)
    assert.truthy(call(s))
    assert.are_not.same(before, bytes_of(s.k_cache))
  end)

  it("a scale that is zero, negative, NaN, infinite, or beyond an f32", function()
    for _, bad in ipairs({ 0, -1, 0 / 0, math.huge, 1e39, 1e-50 }) do
      local s = setup()
      s.opts.k_scale = bad
      expect_error(s, "k_scale", "positive finite")
      s = setup()
      s.opts.v_scale = bad
      expect_error(s, "v_scale", "positive finite")
    end
  end)

  it("per-head scales: an entry that is not positive, the wrong shape, dtype or device; not a number", function()
    local s = setup()
    s.opts.v_scale = { 0.5, 0 }
    expect_error(s, "v_scale", "entry 1 (kv head 1) is 0")
    s = setup()
    s.opts.k_scale = { 1, 2, 3 }
    expect_error(s, "k_scale", "[Hk]")
    s = setup()
    s.opts.k_scale = pa.from_table({ 1, 2 }, { 2 }, "f16", cpu)
    expect_error(s, "k_scale", "dtype f16")
    s = setup()
    s.opts.k_scale = pa.from_table({ 1, 2 }, { 2 }, "f32", staged)
    expect_error(s, "k_scale", "on device cpu:staged")
    s = setup()
    s.opts.k_scale = "one"
    expect_error(s, "k_scale", "expected a number, a tensor or a table")
  end)

  it("scales on caches that are not fp8", function()
    local s = setup("bf16")
    s.opts.v_scale = nil
    expect_error(s, "k_scale", "scales apply to fp8 caches")
    s = setup("bf16")
    s.opts.k_scale = nil
    expect_error(s, "v_scale", "scales apply to fp8 caches")
    s = setup("bf16")
    s.opts.k_scale, s.opts.v_scale = 1, nil -- the default is fine
    assert.truthy(call(s))
  end)

  it("caches of two dtypes; an fp8 q, k or out", function()
    local s = setup()
    s.v_cache = pa.tensor({ 6, 4, 2, 8 }, "fp8_e5m2", cpu)
    expect_error(s, "v_cache", "dtype fp8_e5m2, expected fp8_e4m3 (k_cache's)")
    s = setup()
    s.v_cache = pa.tensor({ 6, 4, 2, 8 }, "bf16", cpu)
    expect_error(s, "v_cache", "expected fp8_e4m3")
    s = setup()
    s.q = pa.tensor({ 2, 1, 4, 8 }, "fp8_e4m3", cpu)
    expect_error(s, "q", "expected f32, f16 or bf16")
    s = setup()
    s.opts.k = pa.tensor({ 2, 1, 2, 8 }, "fp8_e4m3", cpu)
    expect_error(s, "k", "expected bf16")
  end)

  it("in C: a number and a tensor at once; the default from pa_attention_params_init", function()
    local C = core.C
    local s = setup()
    local p = ffi.new("pa_attention_params")
    C.pa_attention_params_init(p)
    assert.equal(1, p.k_scale)
    assert.equal(1, p.v_scale)
    local out = pa.tensor(s.q.shape, "bf16", cpu)
    local scales = pa.from_table({ 1, 2 }, { 2 }, "f32", cpu)
    p.q, p.k_cache, p.v_cache, p.out = s.q.handle, s.k_cache.handle, s.v_cache.handle, out.handle
    p.block_table, p.cache_seqlen = s.opts.block_table.handle, 3
    p.k_scale, p.k_scales = 2, scales.handle
    assert.equal(1, C.pa_attention_with_kvcache(core.ctx, p))
    assert.truthy(core.last_error():find("k_scale: give one number or a tensor", 1, true), core.last_error())
    p.k_scale = 1
    assert.equal(0, C.pa_attention_with_kvcache(core.ctx, p))
  end)
end)

describe("the pool, batches and pagedattn.serve over fp8 caches", function()
  it("kv_cache{} takes fp8 dtypes and scales (every layer, or a layer each); a batch passes them", function()
    local cache = assert(pa.kv_cache{ num_pages = 16, page_size = 4, kv_heads = 2, head_dim = 8, dtype = "fp8_e5m2",
                                      device = cpu, layers = 2, k_scales = { 0.5, { 0.25, 4 } }, v_scale = 2 })
    assert.equal("fp8_e5m2", cache.k_caches[2].dtype)
    assert.equal(16 * 4 * 2 * 8, cache.k_cache.nbytes)
    local k1, v1 = cache:layer_scales(1)
    assert.equal(0.5, k1)
    assert.equal(2, v1)
    local k2 = cache:layer_scales(2)
    assert.same({ 0.25, 4 }, k2:to_table())
    -- a batch's attention with the layer's scales equals the call made by hand
    local seq = assert(cache:sequence())
    local b = assert(cache:batch())
    b:clear():add(seq, 6)
    assert(b:stage())
    local q = pa.randn({ 6, 4, 8 }, "bf16", cpu, 1)
    local k = pa.randn({ 6, 2, 8 }, "bf16", cpu, 2)
    local v = pa.randn({ 6, 2, 8 }, "bf16", cpu, 3)
    local out = assert(b:attention(q, k, v, { layer = 2 }))
    local again = assert(pa.attention_varlen(q, cache.k_caches[2], cache.v_caches[2], {
      block_table = b.block_table, cu_seqlens_q = b.cu_seqlens_q, seqused_k = b.seqused_k, causal = true,
      k_scale = k2, v_scale = 2 }))
    assert.same(out:to_table(), again:to_table())
    -- the stored keys are k / scale: head 1 at 4 holds a quarter of what head 0 at 0.25 holds, as a rule
    local err = H.error_of(b.attention, b, q, k, v, { layer = 2, k_scale = 1 })
    assert.truthy(err:find("k_scale: set by the cache", 1, true), err)
    cache:close()
  end)

  it("kv_cache{} scale errors", function()
    local base = { num_pages = 4, page_size = 4, kv_heads = 2, head_dim = 8, device = cpu }
    local function with(extra)
      local o = {}
      for k, v in pairs(base) do o[k] = v end
      for k, v in pairs(extra) do o[k] = v end
      return o
    end
    local err = H.error_of(pa.kv_cache, with { dtype = "bf16", k_scale = 2 })
    assert.truthy(err:find("kv_cache: k_scale: scales apply to fp8 caches", 1, true), err)
    err = H.error_of(pa.kv_cache, with { dtype = "fp8_e4m3", v_scale = { 1, 2, 3 } })
    assert.truthy(err:find("v_scale: 3 numbers for 2 kv heads", 1, true), err)
    err = H.error_of(pa.kv_cache, with { dtype = "fp8_e4m3", v_scale = -1 })
    assert.truthy(err:find("v_scale: expected a positive finite number", 1, true), err)
    err = H.error_of(pa.kv_cache, with { dtype = "fp8_e4m3", k_scale = 1, k_scales = { 1 } })
    assert.truthy(err:find("k_scales: give k_scale", 1, true), err)
    err = H.error_of(pa.kv_cache, with { dtype = "fp8_e4m3", k_scales = { 1, 2 } })
    assert.truthy(err:find("k_scales: expected a list of 1 scales", 1, true), err)
  end)

  it("copy-on-write copies fp8 pages byte for byte", function()
    local cache = assert(pa.kv_cache{ num_pages = 8, page_size = 4, kv_heads = 1, head_dim = 8, dtype = "fp8_e4m3",
                                      device = cpu })
    local raw = ffi.new("uint8_t[?]", cache.k_cache.numel)
    for i = 0, cache.k_cache.numel - 1 do raw[i] = (i * 37 + 11) % 256 end
    core.C.pa_tensor_write(core.ctx, cache.k_cache.handle, 0, raw, cache.k_cache.numel)
    local a = assert(cache:sequence())
    assert(a:append(6)) -- pages 0 and 1, the second partial
    local child = assert(a:fork())
    local before = child:pages()
    assert(child:append(1)) -- writes into the shared partial page: copied first
    local after = child:pages()
    assert.are_not.equal(before[2], after[2])
    local k = bytes_of(cache.k_cache)
    for i = 0, 2 * 8 - 1 do -- the page's two tokens
      assert.equal(k[before[2] * 32 + i + 1], k[after[2] * 32 + i + 1])
    end
    assert.equal(1, cache:stats().cow_copies)
    cache:close()
  end)

  for _, fmt in ipairs(FORMATS) do
    it("serve.run with an " .. fmt .. " cache, checked against the reference every step", function()
      local serve = require "pagedattn.serve"
      local res = serve.run{
        synthetic = { requests = 16, rate = 100, prompt = { 6, 30 }, output = { 4, 12 }, system = 10 },
        page_size = 4, pages = 40, model = "tiny", layers = 1, budget = 40, max_batch = 8, check = true,
        device = cpu, dtype = "bf16", kv_dtype = fmt, k_scale = 0.5, v_scale = 0.25, seed = H.seed("fp8serve" .. fmt) % 1000 + 1 }
      local c = res.report.check
      assert.is_nil(c.failed, "a step did not match: worst " .. tostring(c.worst))
      assert.is_true(c.steps > 10)
      assert.equal(fmt, res.report.model.kv_dtype)
    end)
  end

  it("serve: the model's KV bytes a token halve with an fp8 cache; kv_dtype errors", function()
    local serve = require "pagedattn.serve"
    local m = serve.clock.model("llama3-8b")
    local bf16 = serve.clock.kv_bytes_per_token(m)
    m.kv_dtype = "fp8_e4m3"
    assert.equal(bf16 / 2, serve.clock.kv_bytes_per_token(serve.clock.model(m)))
    local err = H.error_of(serve.run, { kv_dtype = "i32", layers = 1, device = cpu })
    assert.truthy(err:find("kv_dtype", 1, true), err)
    err = H.error_of(serve.run, { k_scale = 2, layers = 1, device = cpu })
    assert.truthy(err:find("k_scale: scales apply to fp8 caches", 1, true), err)
  end)
end)
