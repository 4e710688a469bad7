-- Specs of the pure-Lua reference (lua/pagedattn/reference.lua). Expected values
-- are computed here by hand or by small independent code, never by the module.
-- Run: LUA_PATH="./lua/?.lua;./lua/?/init.lua;;" busted --lua=luajit spec/reference_spec.lua

local ref = require "pagedattn.reference"

local unpack = unpack or table.unpack

local huge = math.huge

local function T(shape, data) return ref.tensor(shape, data) end

local function near(a, b, tol, msg)
  local ok = (a == b) or math.abs(a - b) <= tol
  assert(ok, string.format("%s: got %.17g, expected %.17g (tol %g)", msg or "value", a, b, tol))
end

local function all_near(a, b, tol, msg)
  a = a.data or a
  b = b.data or b
  assert(#a == #b, string.format("%s: lengths %d vs %d", msg or "arrays", #a, #b))
  for i = 1, #a do
    local x, y = a[i], b[i]
    if not (x == y or math.abs(x - y) <= tol) then
      error(string.format("%s: element %d: got %.17g, expected %.17g (tol %g)",
        msg or "arrays", i, x, y, tol), 2)
    end
  end
end

local function errors_with(fn, pattern)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error matching '" .. pattern .. "'")
  assert(tostring(err):find(pattern, 1, true),
    "error '" .. tostring(err) .. "' does not contain '" .. pattern .. "'")
end

local function randn(rng, shape)
  local n = 1
  for i = 1, #shape do n = n * shape[i] end
  local d = {}
  for i = 1, n do d[i] = rng:normal() end
  return T(shape, d)
end

local function is_neg_zero(x) return x == 0 and 1 / x == -huge end
local function is_pos_zero(x) return x == 0 and 1 / x == huge end

-- independent decoders of the bit patterns
local function f16_value(bits)
  local sign = bits >= 0x8000 and -1 or 1
  local e = math.floor(bits / 1024) % 32
  local m = bits % 1024
  if e == 31 then return m == 0 and sign * huge or 0 / 0 end
  if e == 0 then return sign * m * 2 ^ -24 end
  return sign * (1024 + m) * 2 ^ (e - 25)
end

local function bf16_value(bits)
  local sign = bits >= 0x8000 and -1 or 1
  local e = math.floor(bits / 128) % 256
  local m = bits % 128
  if e == 255 then return m == 0 and sign * huge or 0 / 0 end
  if e == 0 then return sign * m * 2 ^ -133 end
  return sign * (128 + m) * 2 ^ (e - 134)
end

local function f32_value(bits)
  local sign = bits >= 2 ^ 31 and -1 or 1
  local e = math.floor(bits / 2 ^ 23) % 256
  local m = bits % 2 ^ 23
  if e == 255 then return m == 0 and sign * huge or 0 / 0 end
  if e == 0 then return sign * m * 2 ^ -149 end
  return sign * (2 ^ 23 + m) * 2 ^ (e - 150)
end

-- checks every consecutive pair of positive finite patterns [lo, hi) of a format:
-- exact values stay, the midpoint goes to the even pattern, a hair off the
-- midpoint goes to the nearer one.
local function check_all_patterns(dtype, value, lo, hi)
  for bits = lo, hi - 1 do
    local a, b = value(bits), value(bits + 1)
    local mid = (a + b) / 2
    local even = (bits % 2 == 0) and a or b
    local eps = (b - a) / 1024
    for _, sign in ipairs({ 1, -1 }) do
      local got = ref.round(sign * a, dtype)
      if got ~= sign * a then
        error(string.format("%s: %.17g (pattern 0x%x) rounds to %.17g", dtype, sign * a, bits, got))
      end
      got = ref.round(sign * mid, dtype)
      if got ~= sign * even then
        error(string.format("%s: midpoint %.17g of 0x%x/0x%x rounds to %.17g, expected %.17g",
          dtype, sign * mid, bits, bits + 1, got, sign * even))
      end
      if ref.round(sign * (mid - eps), dtype) ~= sign * a then
        error(string.format("%s: below midpoint of 0x%x should round down", dtype, bits))
      end
      if ref.round(sign * (mid + eps), dtype) ~= sign * b then
        error(string.format("%s: above midpoint of 0x%x should round up", dtype, bits))
      end
    end
  end
end

-- independent rotary of a 1-based vector
local function rotate(x, c, s, rotary_dim, interleaved)
  local y = {}
  for i = 1, #x do y[i] = x[i] end
  local half = rotary_dim / 2
  for j = 0, half - 1 do
    local i0, i1
    if interleaved then i0, i1 = 2 * j + 1, 2 * j + 2 else i0, i1 = j + 1, j + half + 1 end
    y[i0] = x[i0] * c[j + 1] - x[i1] * s[j + 1]
    y[i1] = x[i0] * s[j + 1] + x[i1] * c[j + 1]
  end
  return y
end

-- cos/sin tables [seqlen, half] with angle pos * theta_j
local function rope_tables(seqlen, half, base)
  local c, s = {}, {}
  for p = 0, seqlen - 1 do
    for j = 0, half - 1 do
      local ang = p / (base or 10000) ^ (j / half)
      c[p * half + j + 1] = math.cos(ang)
      s[p * half + j + 1] = math.sin(ang)
    end
  end
  return T({ seqlen, half }, c), T({ seqlen, half }, s)
end

-- turns a contiguous cache [B, S, Hk, D] into a paged one with shuffled pages,
-- unused pages of garbage and -1 entries past the last used page
local function paginate(rng, kc, vc, lens, page_size)
  local B, S, Hk, D = kc.shape[1], kc.shape[2], kc.shape[3], kc.shape[4]
  local tok = Hk * D
  local max_pages = math.ceil(S / page_size)
  local needed = {}
  local total = 0
  for b = 1, B do
    needed[b] = math.ceil(lens[b] / page_size)
    total = total + needed[b]
  end
  local num_pages = total + 3
  local ids = {}
  for i = 1, num_pages do ids[i] = i - 1 end
  rng:shuffle(ids)
  local kp, vp = {}, {}
  for i = 1, num_pages * page_size * tok do
    kp[i] = 1e6 + i
    vp[i] = -1e6 - i
  end
  local bt = {}
  local next_id = 1
  for b = 0, B - 1 do
    for pg = 0, max_pages - 1 do
      local id = -1
      if pg < needed[b + 1] then
        id = ids[next_id]
        next_id = next_id + 1
        for slot = 0, page_size - 1 do
          local t = pg * page_size + slot
          if t < lens[b + 1] then
            for e = 1, tok do
              kp[(id * page_size + slot) * tok + e] = kc.data[(b * S + t) * tok + e]
              vp[(id * page_size + slot) * tok + e] = vc.data[(b * S + t) * tok + e]
            end
          end
        end
      end
      bt[b * max_pages + pg + 1] = id
    end
  end
  return T({ num_pages, page_size, Hk, D }, kp), T({ num_pages, page_size, Hk, D }, vp),
    T({ B, max_pages }, bt)
end

describe("reference.round", function()
  it("f16 ties to even and rounds to the nearest", function()
    assert.are.equal(1, ref.round(1 + 2 ^ -11, "f16"))
    assert.are.equal(1 + 2 ^ -9, ref.round(1 + 3 * 2 ^ -11, "f16"))
    assert.are.equal(1 + 2 ^ -10, ref.round(1 + 2 ^ -11 + 2 ^ -30, "f16"))
    assert.are.equal(0.333251953125, ref.round(1 / 3, "f16")) -- 0x3555
    assert.are.equal(3.140625, ref.round(math.pi, "f16"))     -- 0x4248
    assert.are.equal(-2.001953125, ref.round(-2.0009765625 - 2 ^ -20, "f16"))
  end)

  it("f16 overflow, subnormals and special values", function()
    assert.are.equal(65504, ref.round(65504, "f16"))
    assert.are.equal(65504, ref.round(65519.99, "f16"))
    assert.are.equal(huge, ref.round(65520, "f16"))
    assert.are.equal(-huge, ref.round(-65520, "f16"))
    assert.are.equal(huge, ref.round(1e300, "f16"))
    assert.are.equal(huge, ref.round(huge, "f16"))
    assert.are.equal(-huge, ref.round(-huge, "f16"))
    assert.are.equal(2 ^ -14, ref.round(2 ^ -14, "f16"))
    assert.are.equal(2 ^ -24, ref.round(2 ^ -24, "f16"))
    assert.is_true(is_pos_zero(ref.round(2 ^ -25, "f16")))
    assert.is_true(is_neg_zero(ref.round(-2 ^ -25, "f16")))
    assert.are.equal(2 ^ -24, ref.round(3 * 2 ^ -26, "f16"))
    assert.are.equal(2 ^ -24, ref.round(2 ^ -25 + 2 ^ -40, "f16"))
    assert.are.equal(2 * 2 ^ -24, ref.round(2.5 * 2 ^ -24, "f16"))
    assert.are.equal(4 * 2 ^ -24, ref.round(3.5 * 2 ^ -24, "f16"))
    assert.are.equal(1023 * 2 ^ -24, ref.round(1023 * 2 ^ -24, "f16")) -- largest subnormal
    assert.are.equal(2 ^ -14, ref.round(1023.5 * 2 ^ -24, "f16"))     -- ties up into normals
    assert.is_true(is_pos_zero(ref.round(1e-320, "f16")))               -- double subnormal
    local nan = ref.round(0 / 0, "f16")
    assert.is_true(nan ~= nan)
    local zero = 0 -- a run-time -0 (Lua 5.1 can merge the constants 0 and -0)
    assert.is_true(is_neg_zero(-zero))
    assert.is_true(is_neg_zero(ref.round(-zero, "f16")))
    assert.is_true(is_neg_zero(ref.round(-zero, "bf16")))
    assert.is_true(is_neg_zero(ref.round(-zero, "f32")))
    assert.is_true(is_pos_zero(ref.round(0, "f16")))
  end)

  it("f16: every pattern, midpoint and near-midpoint (#slow)", function()
    check_all_patterns("f16", f16_value, 0, 0x7BFF) -- up to the largest finite
    -- the midpoint above 65504 (odd pattern 0x7BFF) ties to the even "0x7C00": inf
    assert.are.equal(huge, ref.round((65504 + 65536) / 2, "f16"))
    assert.are.equal(65504, ref.round((65504 + 65536) / 2 - 1e-9, "f16"))
  end)

  it("bf16 ties to even and rounds to the nearest", function()
    assert.are.equal(1, ref.round(1 + 2 ^ -8, "bf16"))
    assert.are.equal(1 + 2 ^ -6, ref.round(1 + 3 * 2 ^ -8, "bf16"))
    assert.are.equal(3.140625, ref.round(math.pi, "bf16"))     -- 0x4049
    assert.are.equal(0.333984375, ref.round(1 / 3, "bf16"))    -- 0x3EAB
    local maxv = bf16_value(0x7F7F)
    assert.are.equal((2 - 2 ^ -7) * 2 ^ 127, maxv)
    assert.are.equal(maxv, ref.round(maxv, "bf16"))
    assert.are.equal(huge, ref.round(maxv + 2 ^ 119, "bf16"))   -- midpoint to 2^128, ties to even
    assert.are.equal(maxv, ref.round(maxv + 2 ^ 119 - 2 ^ 100, "bf16"))
    assert.are.equal(2 ^ -133, ref.round(2 ^ -133, "bf16"))   -- smallest subnormal
    assert.is_true(is_neg_zero(ref.round(-2 ^ -134, "bf16")))
    assert.are.equal(2 ^ -133, ref.round(3 * 2 ^ -135, "bf16"))
    check_all_patterns("bf16", bf16_value, 0, 0x7F7F)
  end)

  it("f32 rounding, checked against bit patterns", function()
    assert.are.equal(1, ref.round(1 + 2 ^ -24, "f32"))
    assert.are.equal(1 + 2 ^ -22, ref.round(1 + 3 * 2 ^ -24, "f32"))
    assert.are.equal(3.1415927410125732, ref.round(math.pi, "f32"))
    assert.are.equal(0.10000000149011612, ref.round(0.1, "f32"))
    local fmax = f32_value(0x7F7FFFFF)
    assert.are.equal(3.4028234663852886e38, fmax)
    assert.are.equal(fmax, ref.round(fmax, "f32"))
    assert.are.equal(huge, ref.round(fmax + 2 ^ 103, "f32"))
    assert.are.equal(fmax, ref.round(fmax + 2 ^ 103 - 2 ^ 80, "f32"))
    assert.are.equal(2 ^ -149, ref.round(2 ^ -149, "f32"))
    assert.is_true(is_pos_zero(ref.round(2 ^ -150, "f32")))
    assert.are.equal(2 ^ -149, ref.round(3 * 2 ^ -151, "f32"))
    assert.is_true(is_pos_zero(ref.round(1e-310, "f32")))
    -- random patterns over the whole finite range, including subnormals
    local rng = ref.rng(7)
    local bits = {}
    for i = 1, 3000 do bits[i] = rng:int(0, 0x7F7FFFFE) end
    for i = 0, 20 do bits[#bits + 1] = i; bits[#bits + 1] = 0x00800000 - 1 - i end
    for _, b in ipairs(bits) do
      local a, c = f32_value(b), f32_value(b + 1)
      local mid = (a + c) / 2
      assert.are.equal(a, ref.round(a, "f32"))
      assert.are.equal(-a, ref.round(-a, "f32"))
      assert.are.equal(b % 2 == 0 and a or c, ref.round(mid, "f32"),
        string.format("pattern 0x%x midpoint", b))
      assert.are.equal(a, ref.round(mid - (c - a) / 4096, "f32"))
      assert.are.equal(c, ref.round(mid + (c - a) / 4096, "f32"))
    end
  end)

  it("f64 is the identity and unknown dtypes are refused", function()
    assert.are.equal(0.1, ref.round(0.1, "f64"))
    assert.are.equal(1e-310, ref.round(1e-310, "f64"))
    errors_with(function() ref.round(1, "f8") end, "dtype")
  end)
end)

describe("reference.rng", function()
  it("is deterministic and seed-dependent", function()
    local a, b, c = ref.rng(123), ref.rng(123), ref.rng(124)
    local differ = 0
    for _ = 1, 100 do
      local x, y, z = a:uniform(), b:uniform(), c:uniform()
      assert.are.equal(x, y)
      if x ~= z then differ = differ + 1 end
    end
    assert.is_true(differ > 95)
    assert.are.equal(123, a.seed)
  end)

  it("gives the same stream on every interpreter (known values)", function()
    -- recorded under LuaJIT 2.1 and Lua 5.2; arithmetic is exact in binary64
    local r = ref.rng(2024)
    local got = {}
    for i = 1, 3 do got[i] = string.format("%.17g", r:uniform()) end
    got[4] = string.format("%.17g", r:normal())
    got[5] = tostring(r:int(-1000000, 1000000))
    assert.are.same({ "0.56402811182612733", "0.10087410546415811", "0.66307223516493696",
      "-1.6608926602875054", "-868383" }, got)
  end)

  it("uniform is in (0, 1) with mean 1/2, normal has mean 0 and variance 1", function()
    local r = ref.rng(99)
    local n, su, sn, sn2 = 20000, 0, 0, 0
    for _ = 1, n do
      local u = r:uniform()
      assert.is_true(u > 0 and u < 1)
      su = su + u
      local z = r:normal()
      sn = sn + z
      sn2 = sn2 + z * z
    end
    near(su / n, 0.5, 0.01, "uniform mean")
    near(sn / n, 0, 0.03, "normal mean")
    near(sn2 / n, 1, 0.03, "normal variance")
  end)

  it("int covers [lo, hi] and nothing else", function()
    local r = ref.rng(5)
    local seen = {}
    for _ = 1, 2000 do
      local k = r:int(-3, 4)
      assert.is_true(k >= -3 and k <= 4 and k % 1 == 0)
      seen[k] = true
    end
    for k = -3, 4 do assert.is_true(seen[k], "value " .. k .. " never drawn") end
    assert.are.equal(7, r:int(7, 7))
  end)
end)

describe("reference tensors and helpers", function()
  it("tensor zero-fills, checks sizes; copy is deep", function()
    local t = ref.tensor({ 2, 3 })
    assert.are.same({ 2, 3 }, t.shape)
    assert.are.same({ 0, 0, 0, 0, 0, 0 }, t.data)
    errors_with(function() ref.tensor({ 2, 2 }, { 1, 2, 3 }) end, "needs 4")
    local u = ref.tensor({ 2 }, { 5, 6 })
    local c = ref.copy(u)
    c.data[1] = 9
    c.shape[1] = 7
    assert.are.equal(5, u.data[1])
    assert.are.equal(2, u.shape[1])
  end)

  it("max_abs_diff and tolerance", function()
    assert.are.equal(0.5, ref.max_abs_diff({ 1, 2, 3 }, { 1, 2.5, 3 }))
    assert.are.equal(0, ref.max_abs_diff({ -huge, huge }, { -huge, huge }))
    assert.are.equal(huge, ref.max_abs_diff({ 1, 0 / 0 }, { 1, 0 }))
    assert.are.equal(huge, ref.max_abs_diff({ 0 / 0 }, { 0 / 0 }))
    assert.are.equal(huge, ref.max_abs_diff({ -huge }, { 0 }))
    assert.are.equal(huge, ref.max_abs_diff({ huge }, { -huge }))
    assert.are.equal(2, ref.max_abs_diff(T({ 2 }, { 1, -1 }), T({ 2 }, { 1, 1 })))
    near(ref.tolerance("bf16", 0.01), 0.03001, 1e-15, "tolerance")
    assert.are.equal(1e-5, ref.tolerance("f32", 0))
  end)
end)

describe("reference.attention_with_kvcache", function()
  it("one key: out is v, lse is the score", function()
    local q = T({ 1, 1, 1, 4 }, { 1, 2, 3, 4 })
    local k = T({ 1, 1, 1, 4 }, { 0.5, -1, 2, 0.25 })
    local v = T({ 1, 1, 1, 4 }, { 7, -8, 9, 10 })
    local out, lse = ref.attention_with_kvcache(q, k, v, {})
    assert.are.same({ 1, 1, 1, 4 }, out.shape)
    assert.are.same({ 1, 1, 1 }, lse.shape)
    all_near(out, { 7, -8, 9, 10 }, 1e-15, "out")
    near(lse.data[1], (0.5 - 2 + 6 + 1) * 0.5, 1e-15, "lse") -- D^-0.5 = 1/2
  end)

  it("hand-computed 2 queries x 2 keys", function()
    local q = T({ 1, 2, 1, 2 }, { 1, 0, 0, 2 })
    local k = T({ 1, 2, 1, 2 }, { 1, 0, 0, 1 })
    local v = T({ 1, 2, 1, 2 }, { 1, 2, 3, 5 })
    local out, lse = ref.attention_with_kvcache(q, k, v, { softmax_scale = 1 })
    -- row 0: scores (1, 0); row 1: scores (0, 2)
    local e = math.exp
    local p0 = e(1) / (e(1) + 1)
    local p1 = 1 / (1 + e(2))
    all_near(out, { p0 * 1 + (1 - p0) * 3, p0 * 2 + (1 - p0) * 5,
      p1 * 1 + (1 - p1) * 3, p1 * 2 + (1 - p1) * 5 }, 1e-14, "out")
    all_near(lse, { math.log(e(1) + 1), math.log(1 + e(2)) }, 1e-14, "lse")
  end)

  it("uniform scores give the mean of v", function()
    local rng = ref.rng(11)
    local S, D = 9, 5
    local q = T({ 1, 3, 2, D })
    local k, v = randn(rng, { 1, S, 1, D }), randn(rng, { 1, S, 1, D })
    local out, lse = ref.attention_with_kvcache(q, k, v, {})
    for i = 0, 2 do
      for h = 0, 1 do
        for d = 0, D - 1 do
          local mean = 0
          for j = 0, S - 1 do mean = mean + v.data[j * D + d + 1] end
          near(out.data[((i * 2) + h) * D + d + 1], mean / S, 1e-14, "mean")
        end
        near(lse.data[h * 3 + i + 1], math.log(S), 1e-14, "lse")
      end
    end
  end)

  it("causal is bottom-right aligned; Sq > Sk leaves empty rows", function()
    local D, Sk, Sq = 2, 3, 5
    local q = T({ 1, Sq, 1, D })                     -- zero scores
    local v = T({ 1, Sk, 1, D }, { 1, 10, 2, 20, 3, 30 })
    local k = T({ 1, Sk, 1, D })
    local out, lse = ref.attention_with_kvcache(q, k, v, { causal = true })
    -- r = i + Sk - Sq = i - 2: rows 0, 1 see nothing, row 2 key 0, row 3 keys 0-1, row 4 all
    all_near(out, { 0, 0, 0, 0, 1, 10, 1.5, 15, 2, 20 }, 1e-14, "out")
    assert.are.equal(-huge, lse.data[1])
    assert.are.equal(-huge, lse.data[2])
    near(lse.data[3], 0, 1e-15, "lse row 2")
    near(lse.data[4], math.log(2), 1e-15, "lse row 3")
    near(lse.data[5], math.log(3), 1e-15, "lse row 4")
    -- Sq = 1 decode: causal sees every key
    local out1 = ref.attention_with_kvcache(T({ 1, 1, 1, D }), k, v, { causal = true })
    all_near(out1, { 2, 20 }, 1e-14, "decode")
    -- cache_seqlens shorter than the cache: the diagonal follows seqlen_k
    local out2, lse2 = ref.attention_with_kvcache(T({ 1, 2, 1, D }), k, v,
      { causal = true, cache_seqlens = 2 })
    all_near(out2, { 1, 10, 1.5, 15 }, 1e-14, "cache_seqlens")
    all_near(lse2, { 0, math.log(2) }, 1e-15, "cache_seqlens lse")
  end)

  it("window_size limits the keys on both sides", function()
    local D, Sk = 1, 10
    local vals = {}
    for j = 1, Sk do vals[j] = j * j end
    local v = T({ 1, Sk, 1, D }, vals)
    local k = T({ 1, Sk, 1, D })
    -- decode with left = 2: keys 7, 8, 9
    local out, lse = ref.attention_with_kvcache(T({ 1, 1, 1, D }), k, v,
      { window_size = { 2, -1 } })
    near(out.data[1], (64 + 81 + 100) / 3, 1e-12, "left window")
    near(lse.data[1], math.log(3), 1e-15, "left window lse")
    -- Sq = Sk = 6, window (1, 1): keys i-1 .. i+1
    local S = 6
    local v6 = T({ 1, S, 1, 1 }, { 1, 2, 4, 8, 16, 32 })
    local out6 = ref.attention_with_kvcache(T({ 1, S, 1, 1 }), T({ 1, S, 1, 1 }), v6,
      { window_size = { 1, 1 } })
    all_near(out6, { 1.5, 7 / 3, 14 / 3, 28 / 3, 56 / 3, 24 }, 1e-14, "(1,1) window")
    -- window (0, 2) with causal: causal wins on the right -> only the diagonal
    local outc = ref.attention_with_kvcache(T({ 1, S, 1, 1 }), T({ 1, S, 1, 1 }), v6,
      { window_size = { 0, 2 }, causal = true })
    all_near(outc, { 1, 2, 4, 8, 16, 32 }, 1e-14, "causal + left 0")
    -- right 0 only, Sq = 2, Sk = 6: r = i + 4, keys 0 .. r
    local outr = ref.attention_with_kvcache(T({ 1, 2, 1, 1 }), T({ 1, S, 1, 1 }), v6,
      { window_size = { -1, 0 } })
    all_near(outr, { 31 / 5, 63 / 6 }, 1e-14, "right 0")
  end)

  it("softcap bounds the scores", function()
    local rng = ref.rng(3)
    local D, S = 4, 8
    local q = randn(rng, { 1, 1, 1, D })
    for i = 1, D do q.data[i] = q.data[i] * 100 end
    local k, v = randn(rng, { 1, S, 1, D }), randn(rng, { 1, S, 1, D })
    local cap = 3
    local _, lse = ref.attention_with_kvcache(q, k, v, { softcap = cap })
    local _, lse_plain = ref.attention_with_kvcache(q, k, v, {})
    assert.is_true(lse.data[1] <= cap + math.log(S))
    assert.is_true(lse.data[1] >= -cap + math.log(S))
    assert.is_true(lse_plain.data[1] > cap + math.log(S), "test scores should be large")
    -- one key: lse = cap * tanh(s / cap)
    local k1 = T({ 1, 1, 1, D }, { 1, 1, 1, 1 })
    local s = 0
    for i = 1, D do s = s + q.data[i] end
    s = s / 2
    local _, l1 = ref.attention_with_kvcache(q, k1, T({ 1, 1, 1, D }), { softcap = cap })
    near(l1.data[1], cap * math.tanh(s / cap), 1e-14, "softcap one key")
  end)

  it("alibi adds -slope * distance, per head and per batch", function()
    local Sq, Sk = 2, 3
    local v = T({ 1, Sk, 1, 1 }, { 1, 2, 3 })
    local slopes = { 0.5, 0.25 }
    local out, lse = ref.attention_with_kvcache(T({ 1, Sq, 2, 1 }), T({ 1, Sk, 1, 1 }), v,
      { alibi_slopes = T({ 2 }, slopes) })
    for i = 0, Sq - 1 do
      for h = 0, 1 do
        local r = i + Sk - Sq
        local z, num = 0, 0
        for j = 0, Sk - 1 do
          local w = math.exp(-slopes[h + 1] * math.abs(r - j))
          z = z + w
          num = num + w * (j + 1)
        end
        near(out.data[i * 2 + h + 1], num / z, 1e-14, "alibi out")
        near(lse.data[h * Sq + i + 1], math.log(z), 1e-14, "alibi lse")
      end
    end
    -- row 0 (r = 1), head 0 by hand: weights e^-0.5, 1, e^-0.5
    local w = math.exp(-0.5)
    near(out.data[1], (w * 1 + 2 + w * 3) / (2 * w + 1), 1e-14, "hand alibi")
    -- [B, H] slopes: batch 1 uses its own row
    local q2 = T({ 2, 1, 1, 1 })
    local k2 = T({ 2, Sk, 1, 1 })
    local v2 = T({ 2, Sk, 1, 1 }, { 1, 2, 3, 1, 2, 3 })
    local out2 = ref.attention_with_kvcache(q2, k2, v2,
      { alibi_slopes = T({ 2, 1 }, { 0, 1 }), causal = true })
    near(out2.data[1], 2, 1e-14, "slope 0 gives the mean")
    local e1, e2 = math.exp(-1), math.exp(-2)
    near(out2.data[2], (e2 * 1 + e1 * 2 + 3) / (e2 + e1 + 1), 1e-14, "slope 1")
  end)

  for _, page_size in ipairs({ 1, 3, 16 }) do
    it("paged cache with shuffled and shared pages equals the contiguous cache, page "
      .. page_size, function()
      local seed = 100 + page_size
      local rng = ref.rng(seed)
      local B, S, H, Hk, D, Sq = 3, 37, 4, 2, 8, 3
      local kc, vc = randn(rng, { B, S, Hk, D }), randn(rng, { B, S, Hk, D })
      local lens = { 37, 20, 1 }
      local q = randn(rng, { B, Sq, H, D })
      for _, causal in ipairs({ false, true }) do
        local opts = { cache_seqlens = T({ B }, lens), causal = causal }
        local out_c, lse_c = ref.attention_with_kvcache(q, kc, vc, opts)
        local kp, vp, bt = paginate(rng, kc, vc, lens, page_size)
        opts.block_table = bt
        local out_p, lse_p = ref.attention_with_kvcache(q, kp, vp, opts)
        assert.are.equal(0, ref.max_abs_diff(out_c, out_p), "seed " .. seed)
        assert.are.equal(0, ref.max_abs_diff(lse_c, lse_p), "seed " .. seed)
      end
      -- sequence 1 shares sequence 0's full pages (duplicate ids in the table)
      local shared = math.floor(lens[2] / page_size)
      for t = 0, shared * page_size - 1 do
        for e = 1, Hk * D do
          kc.data[(1 * S + t) * Hk * D + e] = kc.data[t * Hk * D + e]
          vc.data[(1 * S + t) * Hk * D + e] = vc.data[t * Hk * D + e]
        end
      end
      local kp, vp, bt = paginate(rng, kc, vc, lens, page_size)
      local maxp = bt.shape[2]
      for pg = 0, shared - 1 do bt.data[maxp + pg + 1] = bt.data[pg + 1] end
      local opts = { cache_seqlens = T({ B }, lens), causal = true }
      local out_c = ref.attention_with_kvcache(q, kc, vc, opts)
      opts.block_table = bt
      local out_p = ref.attention_with_kvcache(q, kp, vp, opts)
      assert.are.equal(0, ref.max_abs_diff(out_c, out_p), "seed " .. seed)
    end)
  end

  it("default cache_seqlens is the capacity, contiguous and paged", function()
    local rng = ref.rng(17)
    local k, v = randn(rng, { 2, 6, 1, 2 }), randn(rng, { 2, 6, 1, 2 })
    local q = randn(rng, { 2, 1, 1, 2 })
    local a = ref.attention_with_kvcache(q, k, v, {})
    local b = ref.attention_with_kvcache(q, k, v, { cache_seqlens = 6 })
    assert.are.equal(0, ref.max_abs_diff(a, b))
    -- paged, 2 pages of 3 per sequence: capacity 6
    local bt = T({ 2, 2 }, { 0, 1, 2, 3 })
    local kp = T({ 4, 3, 1, 2 }, k.data)
    local vp = T({ 4, 3, 1, 2 }, v.data)
    local c = ref.attention_with_kvcache(q, kp, vp, { block_table = bt })
    assert.are.equal(0, ref.max_abs_diff(a, c))
  end)

  it("cache_batch_idx picks the cache rows", function()
    local rng = ref.rng(18)
    local k, v = randn(rng, { 3, 4, 1, 2 }), randn(rng, { 3, 4, 1, 2 })
    local q = randn(rng, { 2, 1, 1, 2 })
    local out = ref.attention_with_kvcache(q, k, v, { cache_batch_idx = T({ 2 }, { 2, 0 }) })
    local function row(t, r) return T({ 1, 4, 1, 2 }, { unpack(t.data, r * 8 + 1, r * 8 + 8) }) end
    local o0 = ref.attention_with_kvcache(T({ 1, 1, 1, 2 }, { q.data[1], q.data[2] }),
      row(k, 2), row(v, 2), {})
    local o1 = ref.attention_with_kvcache(T({ 1, 1, 1, 2 }, { q.data[3], q.data[4] }),
      row(k, 0), row(v, 0), {})
    all_near(out, { o0.data[1], o0.data[2], o1.data[1], o1.data[2] }, 0, "cache_batch_idx")
  end)

  it("append writes exactly the expected slots and nothing else", function()
    local rng = ref.rng(21)
    local B, Hk, D, ps, S_new = 2, 2, 3, 3, 4
    local num_pages = 7
    local kp, vp = randn(rng, { num_pages, ps, Hk, D }), randn(rng, { num_pages, ps, Hk, D })
    local k0, v0 = ref.copy(kp), ref.copy(vp)
    -- seq 0: 2 tokens cached, pages 5, 1, (-1); seq 1: 4 tokens, pages 0, 6, 3
    local bt = T({ B, 3 }, { 5, 1, -1, 0, 6, 3 })
    local cs = { 2, 4 }
    local knew, vnew = randn(rng, { B, S_new, Hk, D }), randn(rng, { B, S_new, Hk, D })
    ref.attention_with_kvcache(randn(rng, { B, 1, 2, D }), kp, vp,
      { block_table = bt, cache_seqlens = T({ B }, cs), k = knew, v = vnew })
    local expect_k, expect_v = ref.copy(k0), ref.copy(v0)
    local tok = Hk * D
    for b = 0, B - 1 do
      for i = 0, S_new - 1 do
        local t = cs[b + 1] + i
        local page = bt.data[b * 3 + math.floor(t / ps) + 1]
        local slot = t % ps
        for e = 1, tok do
          expect_k.data[(page * ps + slot) * tok + e] = knew.data[(b * S_new + i) * tok + e]
          expect_v.data[(page * ps + slot) * tok + e] = vnew.data[(b * S_new + i) * tok + e]
        end
      end
    end
    assert.are.equal(0, ref.max_abs_diff(expect_k, kp))
    assert.are.equal(0, ref.max_abs_diff(expect_v, vp))
    -- pages 2 and 4 were never named: untouched
    for e = 1, ps * tok do
      assert.are.equal(k0.data[2 * ps * tok + e], kp.data[2 * ps * tok + e])
      assert.are.equal(v0.data[4 * ps * tok + e], vp.data[4 * ps * tok + e])
    end
  end)

  it("append into a contiguous cache (with cache_batch_idx) then attention over it", function()
    local rng = ref.rng(22)
    local H, Hk, D, S, S_new = 2, 1, 4, 8, 3
    local kc, vc = randn(rng, { 3, S, Hk, D }), randn(rng, { 3, S, Hk, D })
    local k0, v0 = ref.copy(kc), ref.copy(vc)
    local knew, vnew = randn(rng, { 2, S_new, Hk, D }), randn(rng, { 2, S_new, Hk, D })
    local q = randn(rng, { 2, 2, H, D })
    local idx = T({ 2 }, { 2, 0 })
    local out = ref.attention_with_kvcache(q, kc, vc, { cache_batch_idx = idx,
      cache_seqlens = T({ 2 }, { 1, 5 }), k = knew, v = vnew, causal = true })
    -- by hand: rows 2 (positions 1..3) and 0 (positions 5..7) got the new tokens
    local ek, ev = ref.copy(k0), ref.copy(v0)
    local pos0 = { 1, 5 }
    local rows = { 2, 0 }
    for b = 0, 1 do
      for i = 0, S_new - 1 do
        for d = 1, D do
          ek.data[(rows[b + 1] * S + pos0[b + 1] + i) * D + d] = knew.data[(b * S_new + i) * D + d]
          ev.data[(rows[b + 1] * S + pos0[b + 1] + i) * D + d] = vnew.data[(b * S_new + i) * D + d]
        end
      end
    end
    assert.are.equal(0, ref.max_abs_diff(ek, kc))
    assert.are.equal(0, ref.max_abs_diff(ev, vc))
    -- attention equals reading the filled cache with the longer lengths
    local out2 = ref.attention_with_kvcache(q, ek, ev, { cache_batch_idx = idx,
      cache_seqlens = T({ 2 }, { 4, 8 }), causal = true })
    assert.are.equal(0, ref.max_abs_diff(out, out2))
  end)

  it("appended values are rounded to cache_dtype", function()
    local rng = ref.rng(23)
    local kc, vc = T({ 1, 4, 1, 4 }), T({ 1, 4, 1, 4 })
    local knew, vnew = randn(rng, { 1, 2, 1, 4 }), randn(rng, { 1, 2, 1, 4 })
    ref.attention_with_kvcache(T({ 1, 1, 1, 4 }), kc, vc,
      { cache_seqlens = 1, k = knew, v = vnew, cache_dtype = "f16" })
    for e = 1, 8 do
      local x, y = knew.data[e], kc.data[4 + e]
      assert.is_true(x ~= y, "value should have changed by rounding")
      assert.is_true(math.abs(x - y) <= math.abs(x) * 2 ^ -11, "f16 relative error")
      -- y is an f16 value: 11 significant bits
      local _, ex = math.frexp(math.abs(y))
      local scaled = math.abs(y) * 2 ^ (11 - ex)
      assert.are.equal(math.floor(scaled), scaled)
      assert.are.equal(ref.round(vnew.data[e], "f16"), vc.data[4 + e])
    end
    assert.are.equal(0, kc.data[1])
    assert.are.equal(0, kc.data[13])
  end)

  it("GQA and MQA equal repeating the kv heads", function()
    local rng = ref.rng(31)
    local B, Sq, S, H, D = 2, 3, 7, 8, 4
    local q = randn(rng, { B, Sq, H, D })
    for _, Hk in ipairs({ 2, 1, 4 }) do
      local k, v = randn(rng, { B, S, Hk, D }), randn(rng, { B, S, Hk, D })
      local g = H / Hk
      local kr, vr = T({ B, S, H, D }), T({ B, S, H, D })
      for b = 0, B - 1 do
        for t = 0, S - 1 do
          for h = 0, H - 1 do
            for d = 1, D do
              local src = ((b * S + t) * Hk + math.floor(h / g)) * D + d
              local dst = ((b * S + t) * H + h) * D + d
              kr.data[dst] = k.data[src]
              vr.data[dst] = v.data[src]
            end
          end
        end
      end
      local opts = { causal = true, cache_seqlens = T({ B }, { 7, 4 }) }
      local o1, l1 = ref.attention_with_kvcache(q, k, v, opts)
      local o2, l2 = ref.attention_with_kvcache(q, kr, vr, opts)
      assert.are.equal(0, ref.max_abs_diff(o1, o2), "Hk " .. Hk)
      assert.are.equal(0, ref.max_abs_diff(l1, l2), "Hk " .. Hk)
    end
    errors_with(function()
      ref.attention_with_kvcache(T({ 1, 1, 6, 4 }), T({ 1, 2, 4, 4 }), T({ 1, 2, 4, 4 }), {})
    end, "not a multiple")
  end)

  describe("rotary", function()
    local function append_one(x, rotary_dim, cos, sin, interleaved, pos)
      local D = #x
      local kc, vc = T({ 1, pos + 1, 1, D }), T({ 1, pos + 1, 1, D })
      ref.attention_with_kvcache(T({ 1, 1, 1, D }), kc, vc, {
        cache_seqlens = pos, k = T({ 1, 1, 1, D }, x), v = T({ 1, 1, 1, D }, x),
        rotary_cos = cos, rotary_sin = sin, rotary_interleaved = interleaved })
      local k, v = {}, {}
      for d = 1, D do
        k[d] = kc.data[pos * D + d]
        v[d] = vc.data[pos * D + d]
      end
      return k, v
    end

    it("interleaved and neox pairs on a 90 degree rotation", function()
      local cos = T({ 2, 2 }, { 1, 1, 0, 0 })
      local sin = T({ 2, 2 }, { 0, 0, 1, 1 })
      local x = { 1, 2, 3, 4 }
      local ki, vi = append_one(x, 4, cos, sin, true, 1)
      assert.are.same({ -2, 1, -4, 3 }, ki)
      assert.are.same(x, vi) -- v is never rotated
      local kn = append_one(x, 4, cos, sin, false, 1)
      assert.are.same({ -3, -4, 1, 2 }, kn)
      -- default is interleaved
      local kc, vc = T({ 1, 2, 1, 4 }), T({ 1, 2, 1, 4 })
      ref.attention_with_kvcache(T({ 1, 1, 1, 4 }), kc, vc, { cache_seqlens = 1,
        k = T({ 1, 1, 1, 4 }, x), v = T({ 1, 1, 1, 4 }, x), rotary_cos = cos, rotary_sin = sin })
      assert.are.same({ 0, 0, 0, 0, -2, 1, -4, 3 }, kc.data)
    end)

    it("position 0 with cos = 1, sin = 0 is the identity", function()
      local cos, sin = rope_tables(4, 3)
      assert.are.equal(1, cos.data[1])
      assert.are.equal(0, sin.data[1])
      local x = { 0.5, -1.5, 2.25, 3, -4, 5.5, 6, 7 }
      for _, il in ipairs({ true, false }) do
        local k = append_one(x, 6, cos, sin, il, 0)
        assert.are.same(x, k)
      end
    end)

    it("preserves the norm of every rotated pair, leaves the tail alone", function()
      local rng = ref.rng(41)
      local D, rdim = 10, 6
      local cos, sin = rope_tables(16, rdim / 2)
      for _, il in ipairs({ true, false }) do
        for _, pos in ipairs({ 1, 5, 15 }) do
          local x = {}
          for d = 1, D do x[d] = rng:normal() end
          local k = append_one(x, rdim, cos, sin, il, pos)
          for j = 0, rdim / 2 - 1 do
            local a, b
            if il then a, b = 2 * j + 1, 2 * j + 2 else a, b = j + 1, j + rdim / 2 + 1 end
            near(k[a] ^ 2 + k[b] ^ 2, x[a] ^ 2 + x[b] ^ 2, 1e-13, "pair norm")
            assert.is_true(math.abs(k[a] - x[a]) > 1e-6, "pair should rotate")
          end
          for d = rdim + 1, D do assert.are.equal(x[d], k[d]) end
          local expect = rotate(x, { unpack(cos.data, pos * 3 + 1, pos * 3 + 3) },
            { unpack(sin.data, pos * 3 + 1, pos * 3 + 3) }, rdim, il)
          all_near(k, expect, 1e-15, "rotation")
        end
      end
    end)

    it("apply_rotary agrees with an independent rotation", function()
      local cos, sin = rope_tables(8, 2)
      local x = { 1, -2, 3, 0.5, 9 }
      for _, il in ipairs({ true, false }) do
        local y = ref.apply_rotary(x, 5, cos, sin, il)
        local e = rotate(x, { cos.data[11], cos.data[12] }, { sin.data[11], sin.data[12] }, 4, il)
        all_near(y, e, 1e-15, "apply_rotary")
      end
      assert.are.same({ 1, -2, 3, 0.5, 9 }, x)
    end)

    -- q positions: cache_seqlens + i when causal or windowed, else cache_seqlens
    for _, case in ipairs({
      { name = "causal", opts = { causal = true }, per_token = true },
      { name = "window", opts = { window_size = { 3, -1 } }, per_token = true },
      { name = "window right only", opts = { window_size = { -1, 5 } }, per_token = true },
      { name = "no mask", opts = {}, per_token = false },
    }) do
      for _, il in ipairs({ true, false }) do
        it("q is rotated at the flash-attention positions: " .. case.name
          .. (il and ", interleaved" or ", neox"), function()
          local rng = ref.rng(51)
          local B, Sq, H, Hk, D, S, rdim = 2, 3, 2, 1, 6, 10, 4
          local cos, sin = rope_tables(12, rdim / 2)
          local q = randn(rng, { B, Sq, H, D })
          local kc, vc = randn(rng, { B, S, Hk, D }), randn(rng, { B, S, Hk, D })
          local kc2, vc2 = ref.copy(kc), ref.copy(vc)
          local knew, vnew = randn(rng, { B, Sq, Hk, D }), randn(rng, { B, Sq, Hk, D })
          local cs = { 2, 6 }
          local opts = { cache_seqlens = T({ B }, cs), k = knew, v = vnew, rotary_cos = cos,
            rotary_sin = sin, rotary_interleaved = il }
          for key, val in pairs(case.opts) do opts[key] = val end
          local out, lse = ref.attention_with_kvcache(q, kc, vc, opts)
          -- by hand: rotate q and the new k, store, attend without rotary
          local q2 = ref.copy(q)
          local function rot_at(t, off, pos)
            local x = {}
            for d = 1, D do x[d] = t.data[off + d] end
            local y = rotate(x, { unpack(cos.data, pos * 2 + 1, pos * 2 + 2) },
              { unpack(sin.data, pos * 2 + 1, pos * 2 + 2) }, rdim, il)
            return y
          end
          for b = 0, B - 1 do
            for i = 0, Sq - 1 do
              local pos = cs[b + 1] + (case.per_token and i or 0)
              for h = 0, H - 1 do
                local off = ((b * Sq + i) * H + h) * D
                local y = rot_at(q, off, pos)
                for d = 1, D do q2.data[off + d] = y[d] end
              end
              local y = rot_at(knew, (b * Sq + i) * D, cs[b + 1] + i)
              for d = 1, D do
                kc2.data[(b * S + cs[b + 1] + i) * D + d] = y[d]
                vc2.data[(b * S + cs[b + 1] + i) * D + d] = vnew.data[(b * Sq + i) * D + d]
              end
            end
          end
          assert.is_true(ref.max_abs_diff(kc, kc2) <= 1e-15, "cache")
          local o2 = {}
          for key, val in pairs(case.opts) do o2[key] = val end
          o2.cache_seqlens = T({ B }, { cs[1] + Sq, cs[2] + Sq })
          local out2, lse2 = ref.attention_with_kvcache(q2, kc2, vc2, o2)
          assert.is_true(ref.max_abs_diff(out, out2) <= 1e-13, "out")
          assert.is_true(ref.max_abs_diff(lse, lse2) <= 1e-13, "lse")
        end)
      end
    end

    it("is refused without k/v", function()
      local cos, sin = rope_tables(4, 1)
      errors_with(function()
        ref.attention_with_kvcache(T({ 1, 1, 1, 2 }), T({ 1, 2, 1, 2 }), T({ 1, 2, 1, 2 }),
          { rotary_cos = cos, rotary_sin = sin })
      end, "only allowed with")
    end)
  end)

  it("refuses appends past the capacity and bad page ids in the used range", function()
    local kc, vc = T({ 1, 4, 1, 2 }), T({ 1, 4, 1, 2 })
    errors_with(function()
      ref.attention_with_kvcache(T({ 1, 1, 1, 2 }), kc, vc,
        { cache_seqlens = 3, k = T({ 1, 2, 1, 2 }), v = T({ 1, 2, 1, 2 }) })
    end, "capacity")
    local kp, vp = T({ 3, 2, 1, 2 }), T({ 3, 2, 1, 2 })
    errors_with(function()
      ref.attention_with_kvcache(T({ 1, 1, 1, 2 }), kp, vp,
        { block_table = T({ 1, 2 }, { 0, 3 }), cache_seqlens = 3 })
    end, "block_table[0][1]")
    -- garbage past the last used page is ignored
    local out = ref.attention_with_kvcache(T({ 1, 1, 1, 2 }), kp, vp,
      { block_table = T({ 1, 3 }, { 2, 7, -1 }), cache_seqlens = 2 })
    assert.are.same({ 0, 0 }, out.data)
    errors_with(function()
      ref.attention_with_kvcache(T({ 1, 1, 1, 2 }), kc, vc, { k = T({ 1, 1, 1, 2 }) })
    end, "together")
  end)
end)

describe("reference.attention_varlen", function()
  local function slice_rows(t, r0, r1) -- rows [r0, r1) of a [total, H, D] tensor
    local H, D = t.shape[2], t.shape[3]
    local d = {}
    for i = r0 * H * D + 1, r1 * H * D do d[#d + 1] = t.data[i] end
    return T({ 1, r1 - r0, H, D }, d)
  end

  for _, setup in ipairs({
    { name = "paged, causal", paged = true, opts = { causal = true } },
    { name = "paged, window, softcap, alibi", paged = true,
      opts = { window_size = { 4, 1 }, softcap = 2.5 }, alibi = true },
    { name = "contiguous with cache_batch_idx, no mask", paged = false, opts = {} },
  }) do
    it("equals with_kvcache per sequence: " .. setup.name, function()
      local seed = 61
      local rng = ref.rng(seed)
      local H, Hk, D, ps = 4, 2, 8, 3
      local sqs = { 3, 0, 1, 7 }
      local used = { 9, 4, 1, 5 } -- the last has more queries than keys
      local B = #sqs
      local cu = { 0 }
      for b = 1, B do cu[b + 1] = cu[b] + sqs[b] end
      local total = cu[B + 1]
      local q = randn(rng, { total, H, D })
      local kc, vc, bt, idx
      if setup.paged then
        kc, vc = randn(rng, { 20, ps, Hk, D }), randn(rng, { 20, ps, Hk, D })
        local ids = {}
        for i = 1, 20 do ids[i] = i - 1 end
        rng:shuffle(ids)
        bt = T({ B, 4 }, { ids[1], ids[2], ids[3], ids[4], ids[5], ids[6], -1, -1,
          ids[1], -1, -1, -1, ids[7], ids[8], 99, 99 })
      else
        kc, vc = randn(rng, { 5, 12, Hk, D }), randn(rng, { 5, 12, Hk, D })
        idx = T({ B }, { 4, 1, 1, 0 })
      end
      local opts = { cu_seqlens_q = T({ B + 1 }, cu), seqused_k = T({ B }, used),
        block_table = bt, cache_batch_idx = idx, max_seqlen_q = 7 }
      for key, val in pairs(setup.opts) do opts[key] = val end
      local slopes
      if setup.alibi then
        slopes = {}
        for i = 1, B * H do slopes[i] = rng:uniform() end
        opts.alibi_slopes = T({ B, H }, slopes)
      end
      local out, lse = ref.attention_varlen(q, kc, vc, opts)
      assert.are.same({ total, H, D }, out.shape)
      assert.are.same({ H, total }, lse.shape)
      for b = 0, B - 1 do
        local o = { cache_seqlens = used[b + 1] }
        for key, val in pairs(setup.opts) do o[key] = val end
        if slopes then
          o.alibi_slopes = T({ H }, { unpack(slopes, b * H + 1, b * H + H) })
        end
        local kb, vb = kc, vc
        if setup.paged then
          o.block_table = T({ 1, 4 }, { unpack(bt.data, b * 4 + 1, b * 4 + 4) })
        else
          local r = idx.data[b + 1]
          local n = 12 * Hk * D
          kb = T({ 1, 12, Hk, D }, { unpack(kc.data, r * n + 1, r * n + n) })
          vb = T({ 1, 12, Hk, D }, { unpack(vc.data, r * n + 1, r * n + n) })
        end
        local ob, lb = ref.attention_with_kvcache(slice_rows(q, cu[b + 1], cu[b + 2]), kb, vb, o)
        for i = 1, #ob.data do
          assert.are.equal(ob.data[i], out.data[cu[b + 1] * H * D + i], "seed " .. seed)
        end
        for h = 0, H - 1 do
          for i = 0, sqs[b + 1] - 1 do
            assert.are.equal(lb.data[h * sqs[b + 1] + i + 1], lse.data[h * total + cu[b + 1] + i + 1])
          end
        end
      end
      -- sequence 3 has 7 queries and 5 keys, causal: its first 2 rows are empty
      if setup.opts.causal then
        assert.are.equal(-huge, lse.data[cu[4] + 1])
        assert.are.equal(-huge, lse.data[cu[4] + 2])
        assert.is_true(lse.data[cu[4] + 3] > -huge)
      end
    end)
  end

  it("appends with rotary like with_kvcache per sequence", function()
    local rng = ref.rng(71)
    local H, Hk, D, ps, rdim = 2, 1, 6, 2, 4
    local sqs, used = { 2, 1, 3 }, { 5, 1, 3 }
    local B = #sqs
    local cu = { 0, 2, 3, 6 }
    local q = randn(rng, { 6, H, D })
    local knew, vnew = randn(rng, { 6, Hk, D }), randn(rng, { 6, Hk, D })
    local kp, vp = randn(rng, { 9, ps, Hk, D }), randn(rng, { 9, ps, Hk, D })
    local bt = T({ B, 3 }, { 4, 0, 7, 2, -1, -1, 8, 5, -1 })
    local cos, sin = rope_tables(8, rdim / 2)
    for _, causal in ipairs({ true, false }) do
      local k1, v1 = ref.copy(kp), ref.copy(vp)
      local out, lse = ref.attention_varlen(q, k1, v1, { cu_seqlens_q = T({ 4 }, cu),
        seqused_k = T({ 3 }, used), block_table = bt, k = knew, v = vnew, rotary_cos = cos,
        rotary_sin = sin, rotary_interleaved = false, causal = causal })
      local k2, v2 = ref.copy(kp), ref.copy(vp)
      for b = 0, B - 1 do
        local r0, r1 = cu[b + 1], cu[b + 2]
        local function rows(t)
          local d = {}
          for i = r0 * t.shape[2] * D + 1, r1 * t.shape[2] * D do d[#d + 1] = t.data[i] end
          return T({ 1, r1 - r0, t.shape[2], D }, d)
        end
        local ob, lb = ref.attention_with_kvcache(rows(q), k2, v2, {
          block_table = T({ 1, 3 }, { unpack(bt.data, b * 3 + 1, b * 3 + 3) }),
          cache_seqlens = used[b + 1] - sqs[b + 1], k = rows(knew), v = rows(vnew),
          rotary_cos = cos, rotary_sin = sin, rotary_interleaved = false, causal = causal })
        for i = 1, #ob.data do assert.are.equal(ob.data[i], out.data[r0 * H * D + i]) end
        for h = 0, H - 1 do
          for i = 0, r1 - r0 - 1 do
            assert.are.equal(lb.data[h * (r1 - r0) + i + 1], lse.data[h * 6 + r0 + i + 1])
          end
        end
      end
      assert.are.equal(0, ref.max_abs_diff(k1, k2))
      assert.are.equal(0, ref.max_abs_diff(v1, v2))
      -- the new tokens really landed: sequence 0 position 3 is page 0 slot 1
      assert.is_true(ref.max_abs_diff(k1, kp) > 0)
      for d = 1, D do assert.are.equal(vnew.data[d], v1.data[(0 * ps + 1) * D + d]) end
    end
    errors_with(function()
      ref.attention_varlen(q, ref.copy(kp), ref.copy(vp), { cu_seqlens_q = T({ 4 }, cu),
        seqused_k = T({ 3 }, { 1, 1, 3 }), block_table = bt, k = knew, v = vnew })
    end, "appends 2 tokens")
  end)
end)

describe("precision emulation", function()
  it("error grows from f64 (0) to f32 to f16 to bf16, outputs are representable", function()
    local seed = 81
    local rng = ref.rng(seed)
    local B, Sq, H, Hk, D, S = 2, 8, 4, 2, 32, 50
    local function rn(shape, dtype) return ref.randn(shape, rng, dtype) end
    local base = {
      q = rn({ B, Sq, H, D }, "bf16"),
      k = rn({ B, S, Hk, D }, "bf16"),
      v = rn({ B, S, Hk, D }, "bf16"),
    }
    local opts = { causal = true, cache_seqlens = T({ B }, { 50, 31 }),
      softcap = 10, alibi_slopes = T({ H }, { 0.25, 0.125, 0.0625, 0.03125 }) }
    local function run(prec)
      local o = { precision = prec }
      for key, val in pairs(opts) do o[key] = val end
      return ref.attention_with_kvcache(base.q, base.k, base.v, o)
    end
    local o64, l64 = run(nil)
    local err, lerr = {}, {}
    for _, p in ipairs({ "f64", "f32", "f16", "bf16" }) do
      local o, l = run(p)
      err[p] = ref.max_abs_diff(o, o64)
      lerr[p] = ref.max_abs_diff(l, l64)
      for i = 1, #o.data do
        assert.are.equal(ref.round(o.data[i], p), o.data[i], p .. " output representable")
      end
      if p ~= "f64" then
        for i = 1, #l.data do
          assert.are.equal(ref.round(l.data[i], "f32"), l.data[i], "lse is f32")
        end
      end
    end
    local msg = string.format("seed %d: errors f32 %g f16 %g bf16 %g", seed, err.f32, err.f16,
      err.bf16)
    assert.are.equal(0, err.f64)
    assert.are.equal(0, lerr.f64)
    assert.is_true(err.f32 > 0 and err.f32 < 1e-5, msg)
    assert.is_true(err.f16 > 10 * err.f32 and err.f16 < 1e-2, msg)
    assert.is_true(err.bf16 > 2 * err.f16 and err.bf16 < 1e-1, msg)
    assert.is_true(lerr.f32 < lerr.f16 and lerr.f16 < lerr.bf16, msg)
    -- the f64 output is not representable in bf16, so the comparison means something
    local exact = true
    for i = 1, #o64.data do
      if ref.round(o64.data[i], "bf16") ~= o64.data[i] then exact = false end
    end
    assert.is_false(exact)
  end)

  it("rounds to f32 as the hardware does (random values, ties, range edges)", function()
    local ffi = require "ffi"
    local box = ffi.new("float[1]")
    local function hw(x) box[0] = x; return box[0] end
    local rng = ref.rng(83)
    local sign = function() return rng:uniform() < 0.5 and -1 or 1 end
    local cases = { 0, -0.0, 1 / 0, -1 / 0, 2 ^ -149, 2 ^ -150, 3 * 2 ^ -151, 2 ^ 128, (2 - 2 ^ -24) * 2 ^ 127 }
    for i = 1, 20000 do
      local e = rng:int(-155, 130)
      cases[#cases + 1] = sign() * rng:normal() * 2 ^ e
      cases[#cases + 1] = sign() * (2 ^ 24 + rng:int(0, 2 ^ 24 - 1)) * 2 ^ (e - 24) -- 25 bits: ties
    end
    for _, x in ipairs(cases) do
      local got, want = ref.round(x, "f32"), hw(x)
      assert(got == want and 1 / got == 1 / want,
        string.format("f32 rounding of %a: %a, the hardware gives %a", x, got, want))
    end
  end)

  it("accumulates q.k in f32, one rounding per term (by hand)", function()
    -- 1 + 2^-24 ties to 1 in f32, twice; the f64 sum 1 + 2^-23 is an f32 value
    local q = T({ 1, 1, 1, 3 }, { 1, 2 ^ -24, 2 ^ -24 })
    local k = T({ 1, 1, 1, 3 }, { 1, 1, 1 })
    local v = T({ 1, 1, 1, 3 }, { 1, 1, 1 })
    local _, l32 = ref.attention_with_kvcache(q, k, v, { softmax_scale = 1, precision = "f32" })
    assert.are.equal(1, l32.data[1])
    local _, l64 = ref.attention_with_kvcache(q, k, v, { softmax_scale = 1 })
    assert.are.equal(1 + 2 ^ -23, l64.data[1])
  end)

  it("accumulates p v in f32, one rounding per key (by hand)", function()
    -- four equal scores: p = 1/4 each; terms 1/4, 2^-26, 2^-26, 0: each 2^-26
    -- is half an f32 ulp of 1/4 and ties back to 1/4; their f64 sum is an f32 value
    local q = T({ 1, 1, 1, 1 }, { 0 })
    local k = T({ 1, 4, 1, 1 }, { 1, 2, 3, 4 })
    local v = T({ 1, 4, 1, 1 }, { 1, 2 ^ -24, 2 ^ -24, 0 })
    local o32 = ref.attention_with_kvcache(q, k, v, { precision = "f32" })
    assert.are.equal(0.25, o32.data[1])
    local o64 = ref.attention_with_kvcache(q, k, v, {})
    assert.are.equal(0.25 + 2 ^ -25, o64.data[1])
  end)

  it("rounds the dot product before scaling (f16, by hand)", function()
    -- q.k = 1 + 2^-11 ties to 1 in f16; times 1 + 2^-10 is exactly 1 + 2^-10.
    -- Rounding only after scaling would give 1 + 2^-9.
    local q = T({ 1, 1, 1, 2 }, { 1, 2 ^ -11 })
    local k = T({ 1, 1, 1, 2 }, { 1, 1 })
    local v = T({ 1, 1, 1, 2 }, { 1, 1 })
    local _, lse = ref.attention_with_kvcache(q, k, v,
      { softmax_scale = 1 + 2 ^ -10, precision = "f16" })
    assert.are.equal(1 + 2 ^ -10, lse.data[1])
  end)

  it("rounds q to the precision (f16, by hand)", function()
    -- q = (1 + 2^-12, 1) rounds to (1, 1): q.k with k = (1, -1) is 0, not 2^-12
    local q = T({ 1, 1, 1, 2 }, { 1 + 2 ^ -12, 1 })
    local k = T({ 1, 1, 1, 2 }, { 1, -1 })
    local v = T({ 1, 1, 1, 2 }, { 1, 1 })
    local _, lse = ref.attention_with_kvcache(q, k, v, { softmax_scale = 1, precision = "f16" })
    assert.are.equal(0, lse.data[1])
    local _, l32 = ref.attention_with_kvcache(q, k, v, { softmax_scale = 1, precision = "f32" })
    assert.are.equal(2 ^ -12, l32.data[1])
  end)

  it("rounds each probability before the weighted sum (f16, by hand)", function()
    -- scores 0 and R(0.1); v = (1, -1) in dim 0: out = R(R(p0) - R(p1))
    local q = T({ 1, 1, 1, 2 }, { 1, 0 })
    local k = T({ 1, 2, 1, 2 }, { 0, 0, 0.1, 0 })
    local v = T({ 1, 2, 1, 2 }, { 1, 0, -1, 0 })
    local out = ref.attention_with_kvcache(q, k, v, { softmax_scale = 1, precision = "f16" })
    local s1 = 0.0999755859375 -- 0.1 in f16
    assert.are.equal(s1, ref.round(0.1, "f16"))
    local sum = 1 + math.exp(-s1)
    local p0, p1 = math.exp(-s1) / sum, 1 / sum
    local expect = ref.round(ref.round(p0, "f16") - ref.round(p1, "f16"), "f16")
    assert.are.equal(expect, out.data[1])
    assert.are_not.equal(ref.round(p0 - p1, "f16"), expect) -- the case discriminates
    assert.are.equal(0, out.data[2])
  end)

  it("rounds the scores: a 1-key f16 case by hand", function()
    -- q.k = 1 + 2^-11 + 2^-12 (not an f16 value); scale 1
    local q = T({ 1, 1, 1, 2 }, { 1, 1 })
    local k = T({ 1, 1, 1, 2 }, { 1, 2 ^ -11 + 2 ^ -12 })
    local v = T({ 1, 1, 1, 2 }, { 1 / 3, 3 })
    local out, lse = ref.attention_with_kvcache(q, k, v, { softmax_scale = 1, precision = "f16" })
    assert.are.equal(1 + 2 ^ -10, lse.data[1])          -- score rounded up to f16
    assert.are.equal(0.333251953125, out.data[1])      -- 1/3 in f16
    assert.are.equal(3, out.data[2])
    local _, l64 = ref.attention_with_kvcache(q, k, v, { softmax_scale = 1 })
    assert.are.equal(1 + 2 ^ -11 + 2 ^ -12, l64.data[1])
  end)
end)
