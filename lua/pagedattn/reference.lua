-- pagedattn.reference: a pure-Lua float64 reference of the attention semantics
-- (flash-attention 2's flash_attn_with_kvcache and a varlen form), written
-- independently of the C and CUDA code so that it can check them.
--
-- Pure Lua (no ffi): runs under LuaJIT 2.1 and Lua 5.1/5.2. Hot loops are plain
-- numeric for-loops over flat arrays so that LuaJIT compiles them.
--
-- A reference tensor is {shape = {d1, ..., dn}, data = {...}}: data is a flat
-- 1-based array in row-major order; element (i1, ..., in) (0-based) is at
-- data[1 + linear index]. Integer tensors (block tables, seqlens) use the same form.
-- Page ids, positions and indices are 0-based, as in the C API.
--
-- Choices the brief left open:
-- * every append (all sequences, in batch order) happens before any attention,
--   so a sequence that reads a page another one appends to sees the new tokens;
--   two appends to the same slot: the later sequence wins.
-- * a fully masked row (and one whose scores are all -inf) gives zeros and
--   lse = -inf (flash-attention 2's non-split path reports +inf there).
-- * precision emulation rounds softcap the way PyTorch would: after s / cap,
--   after tanh, after * cap. Cache values that were already there are read as
--   given (callers pass values that are representable in their dtype).
-- * fp8 caches ("fp8_e4m3", "fp8_e5m2" as cache_dtype) hold x / scale,
--   computed as x * (1 / scale) in double and rounded once, as pagedattn
--   does (k_scale, v_scale: one number, or one per kv head); attention reads
--   cache * scale, exactly here, and in the precision emulation as PyTorch
--   would dequantize (cache * scale rounded to the precision). Rounding into
--   fp8 saturates at the largest finite value, as the library does.
-- * precision emulation accumulates q.k and p v in f32, rounding after each
--   multiply-add in key (and dimension) order, as PyTorch's matrix products
--   accumulate in f32 for f32, f16 and bf16 inputs: the naive computation's
--   error includes its accumulation error.
-- * the window is used as given; flash-attention 2 first turns a side that is
--   >= the cache capacity into -1, which can change where q is rotated.
-- * opts.out, opts.num_splits, opts.return_softmax_lse, opts.max_seqlen_q are
--   ignored; lse is always returned.
-- * opts.write_cache = false: the new k/v are not written (the caches hold
--   them already, e.g. a device's append read back); q is rotated as with
--   the append.

local ref = {}

local floor, abs, exp, log, sqrt = math.floor, math.abs, math.exp, math.log, math.sqrt
local tanh, frexp, ldexp = math.tanh, math.frexp, math.ldexp
local huge = math.huge
local type, assert, error, tostring = type, assert, error, tostring
local format = string.format

---------------------------------------------------------------------------
-- tensors
---------------------------------------------------------------------------

local function is_int(x)
  return type(x) == "number" and x == x and x % 1 == 0 and x > -huge and x < huge
end

local function numel(shape)
  local n = 1
  for i = 1, #shape do n = n * shape[i] end
  return n
end
ref.numel = numel

local function shape_str(shape)
  local parts = {}
  for i = 1, #shape do parts[i] = tostring(shape[i]) end
  return "[" .. table.concat(parts, ", ") .. "]"
end
ref.shape_str = shape_str

-- ref.tensor(shape, data): data is used as is (not copied); nil gives zeros.
function ref.tensor(shape, data)
  assert(type(shape) == "table", "reference.tensor: shape must be a table")
  local sh = {}
  for i = 1, #shape do
    assert(is_int(shape[i]) and shape[i] >= 0,
      "reference.tensor: shape entries must be integers >= 0, got " .. tostring(shape[i]))
    sh[i] = shape[i]
  end
  local n = numel(sh)
  if data == nil then
    data = {}
    for i = 1, n do data[i] = 0 end
  else
    assert(type(data) == "table", "reference.tensor: data must be a flat table")
    assert(#data == n, format("reference.tensor: data has %d elements, shape %s needs %d",
      #data, shape_str(sh), n))
  end
  return { shape = sh, data = data }
end

function ref.copy(t)
  assert(type(t) == "table" and type(t.shape) == "table" and type(t.data) == "table",
    "reference.copy: not a reference tensor")
  local sh, d, src = {}, {}, t.data
  for i = 1, #t.shape do sh[i] = t.shape[i] end
  for i = 1, #src do d[i] = src[i] end
  return { shape = sh, data = d }
end

---------------------------------------------------------------------------
-- rounding to narrower floating-point formats (pagedattn.reference.rounding)
---------------------------------------------------------------------------

local rounding = require "pagedattn.reference.rounding"
local ROUNDERS, FP8, rounder, identity = rounding.ROUNDERS, rounding.FP8, rounding.rounder, rounding.identity
-- ref.fp8_decode(byte, dtype): the value of an fp8 byte (0..255);
-- ref.fp8_encode(x, dtype): the byte that x rounds to (saturating).
ref.fp8_decode, ref.fp8_encode = rounding.fp8_decode, rounding.fp8_encode

-- ref.round(x, dtype): x rounded to dtype ("f64", "f32", "f16", "bf16",
-- "fp8_e4m3", "fp8_e5m2").
function ref.round(x, dtype)
  return rounder(dtype, "dtype")(x)
end

-- ref.rounder(dtype): the rounding function for dtype (f64: identity).
function ref.rounder(dtype)
  return rounder(dtype, "dtype")
end

-- ref.round_tensor(t, dtype): a new tensor with every element rounded.
function ref.round_tensor(t, dtype)
  local R = rounder(dtype, "dtype")
  local c = ref.copy(t)
  local d = c.data
  for i = 1, #d do d[i] = R(d[i]) end
  return c
end

---------------------------------------------------------------------------
-- comparison helpers
---------------------------------------------------------------------------

-- Max |a[i] - b[i]| over two flat arrays (or reference tensors). NaN anywhere is
-- an infinite difference; equal values (inf == inf, -inf == -inf) differ by 0.
function ref.max_abs_diff(a, b)
  if type(a) == "table" and a.data then a = a.data end
  if type(b) == "table" and b.data then b = b.data end
  assert(type(a) == "table" and type(b) == "table", "reference.max_abs_diff: arrays expected")
  local n = #a
  assert(#b == n, format("reference.max_abs_diff: lengths differ (%d vs %d)", n, #b))
  local m = 0
  for i = 1, n do
    local x, y = a[i], b[i]
    if x ~= x or y ~= y then return huge end
    if x ~= y then
      local d = x - y
      if d < 0 then d = -d end
      if d > m then m = d end
    end
  end
  return m
end

-- docs/design.md's rule: error vs the float64 reference at most 3x the error of the
-- naive computation in that precision, plus 1e-5.
function ref.tolerance(dtype, naive_err)
  assert(type(naive_err) == "number", "reference.tolerance: naive_err must be a number")
  return 3 * naive_err + 1e-5
end

---------------------------------------------------------------------------
-- deterministic RNG (pagedattn.reference.rng: MRG32k3a, the same stream
-- under LuaJIT and PUC Lua)
---------------------------------------------------------------------------

-- ref.rng(seed): seed is an integer in [0, 2^53); nil takes os.time(). The seed
-- is kept in rng.seed so that specs can print it. Methods: uniform() in
-- (0, 1), normal(), int(lo, hi), shuffle(array).
ref.rng = require("pagedattn.reference.rng").new

-- ref.randn(shape, rng, dtype): standard normal values, rounded to dtype
-- (default "f64").
function ref.randn(shape, rng, dtype)
  local R = rounder(dtype, "dtype")
  local t = ref.tensor(shape)
  local d = t.data
  for i = 1, #d do d[i] = R(rng:normal()) end
  return t
end

---------------------------------------------------------------------------
-- rotary embedding
---------------------------------------------------------------------------

-- Rotates the D-vector src[so+1 .. so+D] at the cos/sin row starting at
-- cosd[co+1] (rhalf = rotary_dim/2 entries) into dst[dso+1 .. dso+D];
-- dims >= rotary_dim are copied. src and dst must not overlap.
local function rotate_into(src, so, dst, dso, D, rhalf, cosd, sind, co, interleaved)
  for d = 1, D do dst[dso + d] = src[so + d] end
  if interleaved then
    for j = 0, rhalf - 1 do
      local c, s = cosd[co + j + 1], sind[co + j + 1]
      local x0, x1 = src[so + 2 * j + 1], src[so + 2 * j + 2]
      dst[dso + 2 * j + 1] = x0 * c - x1 * s
      dst[dso + 2 * j + 2] = x0 * s + x1 * c
    end
  else
    for j = 0, rhalf - 1 do
      local c, s = cosd[co + j + 1], sind[co + j + 1]
      local x0, x1 = src[so + j + 1], src[so + j + rhalf + 1]
      dst[dso + j + 1] = x0 * c - x1 * s
      dst[dso + j + rhalf + 1] = x0 * s + x1 * c
    end
  end
end

local function check_rotary_tables(cos, sin)
  assert(type(cos) == "table" and cos.shape and #cos.shape == 2,
    "reference: rotary_cos must be a tensor [seqlen_ro, rotary_dim/2]")
  assert(type(sin) == "table" and sin.shape and #sin.shape == 2,
    "reference: rotary_sin must be a tensor [seqlen_ro, rotary_dim/2]")
  assert(cos.shape[1] == sin.shape[1] and cos.shape[2] == sin.shape[2], format(
    "reference: rotary_cos %s and rotary_sin %s must have the same shape",
    shape_str(cos.shape), shape_str(sin.shape)))
end

-- ref.apply_rotary(x, pos, cos, sin, interleaved): x is a 1-based vector of
-- length D >= rotary_dim; returns a new rotated vector (x is unchanged).
-- interleaved defaults to true (GPT-J pairs (2j, 2j+1)); false is GPT-NeoX
-- pairs (j, j + rotary_dim/2).
function ref.apply_rotary(x, pos, cos, sin, interleaved)
  check_rotary_tables(cos, sin)
  local rhalf = cos.shape[2]
  local D = #x
  assert(2 * rhalf <= D, format("reference.apply_rotary: rotary_dim %d > vector length %d",
    2 * rhalf, D))
  assert(is_int(pos) and pos >= 0 and pos < cos.shape[1], format(
    "reference.apply_rotary: position %s outside [0, %d)", tostring(pos), cos.shape[1]))
  local y = {}
  rotate_into(x, 0, y, 0, D, rhalf, cos.data, sin.data, pos * rhalf, interleaved ~= false)
  return y
end

---------------------------------------------------------------------------
-- argument parsing
---------------------------------------------------------------------------

local function check_tensor(t, rank, name)
  if type(t) ~= "table" or type(t.shape) ~= "table" or type(t.data) ~= "table" then
    error(format("reference: %s must be a reference tensor {shape=, data=}", name), 3)
  end
  if #t.shape ~= rank then
    error(format("reference: %s must have rank %d, got shape %s", name, rank,
      shape_str(t.shape)), 3)
  end
  if #t.data ~= numel(t.shape) then
    error(format("reference: %s has %d elements for shape %s", name, #t.data,
      shape_str(t.shape)), 3)
  end
  return t.shape
end

-- A 1-D integer input: a reference tensor [n] or a plain 1-based array.
local function int_array(x, n, name)
  local d = x
  if type(x) == "table" and x.data then
    if #x.shape ~= 1 then
      error(format("reference: %s must be 1-D, got shape %s", name, shape_str(x.shape)), 3)
    end
    d = x.data
  end
  if type(d) ~= "table" then error(format("reference: %s must be an integer tensor", name), 3) end
  if #d ~= n then
    error(format("reference: %s must have %d entries, got %d", name, n, #d), 3)
  end
  for i = 1, n do
    if not is_int(d[i]) then
      error(format("reference: %s[%d] = %s is not an integer", name, i - 1, tostring(d[i])), 3)
    end
  end
  return d
end

-- A cache's scale: nil (1), a number, or one per kv head (a reference
-- tensor [Hk] or a plain array); returns Hk scales, or nil when all are 1.
local function parse_scale(x, Hk, name)
  if x == nil then return nil end
  local d = x
  if type(x) == "number" then
    d = {}
    for i = 1, Hk do d[i] = x end
  elseif type(x) == "table" and x.data then
    d = x.data
  end
  if type(d) ~= "table" or #d ~= Hk then
    error(format("reference: %s must be a number or %d numbers (one per kv head)", name, Hk), 4)
  end
  local ones = true
  for i = 1, Hk do
    local v = d[i]
    if not (type(v) == "number" and v > 0 and v < huge) then
      error(format("reference: %s[%d] = %s is not a positive finite number", name, i - 1, tostring(v)), 4)
    end
    if v ~= 1 then ones = false end
  end
  if ones then return nil end
  local out = {}
  for i = 1, Hk do out[i] = d[i] end
  return out
end

-- The cache as attention reads it: every element times its kv head's scale
-- (rounded by R, the naive precision, when given); d itself without scales.
local function dequantize(d, scales, Hk, D, R)
  if not scales then return d end
  local out = {}
  for i = 1, #d do
    local x = d[i] * scales[floor((i - 1) / D) % Hk + 1]
    if R then x = R(x) end
    out[i] = x
  end
  return out
end

-- Options shared by both entry points.
local function parse_common(opts, B, H, Hk, D)
  local c = {}
  if H % Hk ~= 0 then
    error(format("reference: H = %d is not a multiple of Hk = %d", H, Hk), 3)
  end
  c.group = H / Hk
  c.scale = opts.softmax_scale or 1 / sqrt(D)
  assert(type(c.scale) == "number", "reference: softmax_scale must be a number")
  c.causal = opts.causal and true or false
  local left, right = -1, -1
  if opts.window_size ~= nil then
    local w = opts.window_size
    assert(type(w) == "table" and is_int(w[1]) and is_int(w[2]) and w[1] >= -1 and w[2] >= -1,
      "reference: window_size must be {left, right}, integers >= -1")
    left, right = w[1], w[2]
  end
  -- flash-attention 2 rotates q at per-token positions when causal or local
  c.q_pos_per_token = c.causal or left ~= -1 or right ~= -1
  if c.causal then right = 0 end
  c.left, c.right = left, right
  c.softcap = opts.softcap or 0
  assert(type(c.softcap) == "number" and c.softcap >= 0, "reference: softcap must be >= 0")
  if opts.alibi_slopes ~= nil then
    local a = opts.alibi_slopes
    assert(type(a) == "table" and a.shape and (#a.shape == 1 or #a.shape == 2),
      "reference: alibi_slopes must be a tensor [H] or [B, H]")
    if #a.shape == 1 then
      assert(a.shape[1] == H, format("reference: alibi_slopes %s, expected [%d]",
        shape_str(a.shape), H))
      c.alibi_bstride = 0
    else
      assert(a.shape[1] == B and a.shape[2] == H, format(
        "reference: alibi_slopes %s, expected [%d, %d]", shape_str(a.shape), B, H))
      c.alibi_bstride = H
    end
    c.alibi = a.data
  end
  if opts.precision ~= nil and opts.precision ~= "f64" then
    assert(not FP8[opts.precision], "reference: precision must be f64, f32, f16 or bf16 (the cache's dtype is cache_dtype)")
    c.R = rounder(opts.precision, "precision")
    c.A = ROUNDERS.f32 -- the accumulator of the naive matrix products
  end
  -- p_e4m3 (f64 only): P as the e4m3 tensor-core prefill (CUDA tuning
  -- prefill_fp8 = 2) holds it in P V, each p relative to the row's largest,
  -- times 2^8, rounded to e4m3 and divided again; the row sum unrounded
  if opts.p_e4m3 then
    assert(not c.R, "reference: p_e4m3 takes precision f64")
    c.p8 = rounder("fp8_e4m3", "p_e4m3")
  end
  c.store = rounder(opts.cache_dtype, "cache_dtype")
  c.k_scale = parse_scale(opts.k_scale, Hk, "k_scale")
  c.v_scale = parse_scale(opts.v_scale, Hk, "v_scale")
  c.write_cache = opts.write_cache ~= false
  if opts.rotary_cos ~= nil or opts.rotary_sin ~= nil then
    check_rotary_tables(opts.rotary_cos, opts.rotary_sin)
    local rhalf = opts.rotary_cos.shape[2]
    assert(2 * rhalf <= D, format("reference: rotary_dim %d > head dim %d", 2 * rhalf, D))
    c.rhalf = rhalf
    c.seqlen_ro = opts.rotary_cos.shape[1]
    c.cosd, c.sind = opts.rotary_cos.data, opts.rotary_sin.data
    c.interleaved = opts.rotary_interleaved ~= false
  end
  return c
end

-- The KV cache: returns an object with capacity and offsets(b, n), the 0-based
-- element offsets of tokens 0..n-1 of batch b (their slot, kv head 0, dim 0).
local function parse_cache(k_cache, v_cache, opts, B, Hk_expect, D_expect)
  local ks = check_tensor(k_cache, 4, "k_cache")
  local vs = check_tensor(v_cache, 4, "v_cache")
  for i = 1, 4 do
    assert(ks[i] == vs[i], format("reference: k_cache %s and v_cache %s differ",
      shape_str(ks), shape_str(vs)))
  end
  local N, S, Hk, D = ks[1], ks[2], ks[3], ks[4]
  if D_expect then
    assert(D == D_expect, format("reference: cache head dim %d, q head dim %d", D, D_expect))
  end
  local tok = Hk * D
  local cache = { Hk = Hk, D = D }
  if opts.block_table ~= nil then
    assert(opts.cache_batch_idx == nil,
      "reference: cache_batch_idx cannot be combined with block_table")
    local bs = check_tensor(opts.block_table, 2, "block_table")
    assert(bs[1] == B, format("reference: block_table %s, expected %d rows", shape_str(bs), B))
    assert(S >= 1, "reference: page_size must be >= 1")
    local maxp = bs[2]
    local bt = opts.block_table.data
    cache.capacity = maxp * S
    cache.paged = true
    function cache.offsets(b, n)
      assert(n <= cache.capacity, format(
        "reference: sequence %d needs %d tokens, block table holds %d (%d pages of %d)",
        b, n, cache.capacity, maxp, S))
      local offs = {}
      local npages = floor((n + S - 1) / S)
      for pg = 0, npages - 1 do
        local id = bt[b * maxp + pg + 1]
        if not (is_int(id) and id >= 0 and id < N) then
          error(format("reference: block_table[%d][%d] = %s is not a page id in [0, %d)",
            b, pg, tostring(id), N), 0)
        end
        local base = id * S * tok
        local t0 = pg * S
        local t1 = t0 + S - 1
        if t1 > n - 1 then t1 = n - 1 end
        for t = t0, t1 do offs[t + 1] = base + (t - t0) * tok end
      end
      return offs
    end
  else
    cache.capacity = S
    local rows
    if opts.cache_batch_idx ~= nil then
      rows = int_array(opts.cache_batch_idx, B, "cache_batch_idx")
      for b = 1, B do
        assert(rows[b] >= 0 and rows[b] < N, format(
          "reference: cache_batch_idx[%d] = %d outside [0, %d)", b - 1, rows[b], N))
      end
    else
      assert(N >= B, format("reference: contiguous cache has %d rows for batch %d", N, B))
    end
    function cache.offsets(b, n)
      assert(n <= S, format("reference: sequence %d needs %d tokens, cache holds %d", b, n, S))
      local row = rows and rows[b + 1] or b
      local offs = {}
      for t = 0, n - 1 do offs[t + 1] = (row * S + t) * tok end
      return offs
    end
  end
  return cache
end

---------------------------------------------------------------------------
-- the computation
---------------------------------------------------------------------------

-- Appends n_new tokens (rows of knew/vnew starting at element offset new_off,
-- token stride Hk*D) at positions pos0 .. pos0+n_new-1 of a sequence whose token
-- offsets are offs; k is rotated at its position, both are rounded to the cache
-- dtype.
local function append_seq(c, kd, vd, knew, vnew, new_off, n_new, pos0, offs, Hk, D, tmp)
  local store = c.store
  local ks, vs = c.k_scale, c.v_scale
  for i = 0, n_new - 1 do
    local p = pos0 + i
    local dst = offs[p + 1]
    for hk = 0, Hk - 1 do
      local so = new_off + (i * Hk + hk) * D
      local o = dst + hk * D
      if c.rhalf then
        assert(p < c.seqlen_ro, format(
          "reference: rotary position %d outside rotary_cos rows [0, %d)", p, c.seqlen_ro))
        rotate_into(knew, so, tmp, 0, D, c.rhalf, c.cosd, c.sind, p * c.rhalf, c.interleaved)
      else
        for d = 1, D do tmp[d] = knew[so + d] end
      end
      if ks then
        local inv = 1 / ks[hk + 1]
        for d = 1, D do kd[o + d] = store(tmp[d] * inv) end
      else
        for d = 1, D do kd[o + d] = store(tmp[d]) end
      end
      if vs then
        local inv = 1 / vs[hk + 1]
        for d = 1, D do vd[o + d] = store(vnew[so + d] * inv) end
      else
        for d = 1, D do vd[o + d] = store(vnew[so + d]) end
      end
    end
  end
end

-- Attention of one sequence. s fields: q_off (element offset of query token 0,
-- head 0; token stride H*D; out uses the same layout), sq, sk, qpos0 (rotary
-- position base), offs (token offsets), lse_off, lse_hstride, b.
local function attend_seq(c, s, qd, kd, vd, outd, lsed, H, D, scr)
  local R, A = c.R, c.A
  local scale, softcap = c.scale, c.softcap
  local group = c.group
  local sq, sk, offs = s.sq, s.sk, s.offs
  local qv, sc, o, tmp = scr.qv, scr.sc, scr.o, scr.tmp
  local slopes, sl_off = c.alibi, c.alibi_bstride and s.b * c.alibi_bstride or 0
  local left, right, causal = c.left, c.right, c.causal
  for i = 0, sq - 1 do
    local r = i + sk - sq -- bottom-right aligned diagonal
    local jlo, jhi = 0, sk - 1
    if causal and r < jhi then jhi = r end
    if left >= 0 and r - left > jlo then jlo = r - left end
    if right >= 0 and r + right < jhi then jhi = r + right end
    local n = jhi - jlo + 1
    if n < 0 then n = 0 end
    local qpos = s.qpos0 + (c.q_pos_per_token and i or 0)
    if c.rhalf then
      assert(qpos >= 0 and qpos < c.seqlen_ro, format(
        "reference: rotary position %d of q outside rotary_cos rows [0, %d)", qpos, c.seqlen_ro))
    end
    for h = 0, H - 1 do
      local qo = s.q_off + (i * H + h) * D
      local hk = floor(h / group)
      if c.rhalf then
        rotate_into(qd, qo, qv, 0, D, c.rhalf, c.cosd, c.sind, qpos * c.rhalf, c.interleaved)
      else
        for d = 1, D do qv[d] = qd[qo + d] end
      end
      if R then for d = 1, D do qv[d] = R(qv[d]) end end
      local slope = slopes and slopes[sl_off + h + 1]
      -- scores
      local m = -huge
      for idx = 1, n do
        local j = jlo + idx - 1
        local ko = offs[j + 1] + hk * D
        local acc = 0
        if R then
          for d = 1, D do acc = A(acc + qv[d] * kd[ko + d]) end
          acc = R(acc)
          acc = R(acc * scale)
          if softcap > 0 then acc = R(softcap * R(tanh(R(acc / softcap)))) end
          if slope then
            local dist = r - j
            if dist < 0 then dist = -dist end
            acc = R(acc - slope * dist)
          end
        else
          for d = 1, D do acc = acc + qv[d] * kd[ko + d] end
          acc = acc * scale
          if softcap > 0 then acc = softcap * tanh(acc / softcap) end
          if slope then
            local dist = r - j
            if dist < 0 then dist = -dist end
            acc = acc - slope * dist
          end
        end
        sc[idx] = acc
        if acc > m then m = acc end
      end
      for d = 1, D do o[d] = 0 end
      local lse
      if n == 0 or m == -huge then
        lse = -huge
      else
        local sum = 0
        for idx = 1, n do
          local e = exp(sc[idx] - m)
          sc[idx] = e
          sum = sum + e
        end
        lse = m + log(sum)
        local P8 = c.p8
        for idx = 1, n do
          local p = P8 and P8(sc[idx] * 256) / 256 / sum or sc[idx] / sum
          local vo = offs[jlo + idx] + hk * D
          if R then
            p = R(p)
            for d = 1, D do o[d] = A(o[d] + p * vd[vo + d]) end
          else
            for d = 1, D do o[d] = o[d] + p * vd[vo + d] end
          end
        end
        if R then lse = ROUNDERS.f32(lse) end
      end
      if R then
        for d = 1, D do outd[qo + d] = R(o[d]) end
      else
        for d = 1, D do outd[qo + d] = o[d] end
      end
      lsed[s.lse_off + h * s.lse_hstride + i + 1] = lse
    end
  end
end

local function scratch(D, maxk)
  local s = { qv = {}, sc = {}, o = {}, tmp = {} }
  for d = 1, D do s.qv[d] = 0; s.o[d] = 0; s.tmp[d] = 0 end
  for j = 1, maxk do s.sc[j] = 0 end
  return s
end

local function check_new_kv(opts, shape_expect, name_shape)
  if (opts.k == nil) ~= (opts.v == nil) then
    error("reference: opts.k and opts.v must be given together", 3)
  end
  if opts.k == nil then
    if opts.rotary_cos ~= nil or opts.rotary_sin ~= nil then
      error("reference: rotary_cos/rotary_sin are only allowed with opts.k/opts.v", 3)
    end
    return false
  end
  local rank = #shape_expect
  local ks = check_tensor(opts.k, rank, "opts.k")
  local vs = check_tensor(opts.v, rank, "opts.v")
  for i = 1, rank do
    if (shape_expect[i] and ks[i] ~= shape_expect[i]) or ks[i] ~= vs[i] then
      error(format("reference: opts.k %s / opts.v %s, expected %s", shape_str(ks),
        shape_str(vs), name_shape), 3)
    end
  end
  return true
end

-- out, lse = ref.attention_with_kvcache(q, k_cache, v_cache, opts)
-- q [B, Sq, H, D]; caches [B_cache, S_cache, Hk, D] or paged [num_pages,
-- page_size, Hk, D] with opts.block_table [B, max_pages]. See the module header
-- and docs/reference.md for the options. out [B, Sq, H, D], lse [B, H, Sq].
-- opts.k / opts.v are appended into the caches IN PLACE.
function ref.attention_with_kvcache(q, k_cache, v_cache, opts)
  opts = opts or {}
  local qs = check_tensor(q, 4, "q")
  local B, Sq, H, D = qs[1], qs[2], qs[3], qs[4]
  local cache = parse_cache(k_cache, v_cache, opts, B, nil, D)
  local Hk = cache.Hk
  local c = parse_common(opts, B, H, Hk, D)
  local has_new = check_new_kv(opts, { B, false, Hk, D }, format("[%d, S_new, %d, %d]", B, Hk, D))
  local S_new = has_new and opts.k.shape[2] or 0

  local cs
  local csl = opts.cache_seqlens
  if csl == nil then
    cs = {}
    for b = 1, B do cs[b] = cache.capacity end
  elseif type(csl) == "number" then
    assert(is_int(csl) and csl >= 0, "reference: cache_seqlens must be an integer >= 0")
    cs = {}
    for b = 1, B do cs[b] = csl end
  else
    cs = int_array(csl, B, "cache_seqlens")
  end

  local kd, vd = k_cache.data, v_cache.data
  local seqs = {}
  local maxk = 0
  for b = 0, B - 1 do
    local c0 = cs[b + 1]
    assert(c0 >= 0, format("reference: cache_seqlens[%d] = %d < 0", b, c0))
    local sk = c0 + S_new
    assert(sk <= cache.capacity, format(
      "reference: batch %d: cache_seqlens %d + %d new tokens exceed the cache capacity %d",
      b, c0, S_new, cache.capacity))
    local offs = cache.offsets(b, sk)
    seqs[b + 1] = { b = b, q_off = b * Sq * H * D, sq = Sq, sk = sk, qpos0 = c0, offs = offs,
      lse_off = b * H * Sq, lse_hstride = Sq }
    if sk > maxk then maxk = sk end
  end
  local scr = scratch(D, maxk)

  -- appends first (all of them), then attention: a sequence reading a page that
  -- another sequence appends to sees the appended values.
  if has_new and c.write_cache then
    for b = 0, B - 1 do
      local s = seqs[b + 1]
      append_seq(c, kd, vd, opts.k.data, opts.v.data, b * S_new * Hk * D, S_new, s.qpos0,
        s.offs, Hk, D, scr.tmp)
    end
  end

  local out = ref.tensor({ B, Sq, H, D })
  local lse = ref.tensor({ B, H, Sq })
  local akd, avd = dequantize(kd, c.k_scale, Hk, D, c.R), dequantize(vd, c.v_scale, Hk, D, c.R)
  for b = 1, B do
    attend_seq(c, seqs[b], q.data, akd, avd, out.data, lse.data, H, D, scr)
  end
  return out, lse
end

-- out, lse = ref.attention_varlen(q, k_cache, v_cache, opts)
-- q [total_q, H, D]; opts.cu_seqlens_q [B+1]; opts.seqused_k [B] (keys per
-- sequence after any append); opts.block_table or a contiguous cache (with
-- optional cache_batch_idx); optional opts.k / opts.v [total_q, Hk, D] appended
-- at seqused_k[b] - sq_b + i. out [total_q, H, D], lse [H, total_q].
function ref.attention_varlen(q, k_cache, v_cache, opts)
  opts = opts or {}
  local qs = check_tensor(q, 3, "q")
  local total_q, H, D = qs[1], qs[2], qs[3]
  local cu = opts.cu_seqlens_q
  assert(cu ~= nil, "reference.attention_varlen: opts.cu_seqlens_q is required")
  local cun = (type(cu) == "table" and cu.data) and #cu.data or #cu
  assert(cun >= 1, "reference.attention_varlen: cu_seqlens_q needs B+1 >= 1 entries")
  local B = cun - 1
  cu = int_array(cu, B + 1, "cu_seqlens_q")
  assert(cu[1] == 0, "reference.attention_varlen: cu_seqlens_q[0] must be 0")
  for b = 1, B do
    assert(cu[b + 1] >= cu[b], format(
      "reference.attention_varlen: cu_seqlens_q decreases at %d", b))
  end
  assert(cu[B + 1] == total_q, format(
    "reference.attention_varlen: cu_seqlens_q[B] = %d but q has %d rows", cu[B + 1], total_q))
  assert(opts.seqused_k ~= nil, "reference.attention_varlen: opts.seqused_k is required")
  local used = int_array(opts.seqused_k, B, "seqused_k")

  local cache = parse_cache(k_cache, v_cache, opts, B, nil, D)
  local Hk = cache.Hk
  local c = parse_common(opts, B, H, Hk, D)
  local has_new = check_new_kv(opts, { total_q, Hk, D }, format("[%d, %d, %d]", total_q, Hk, D))

  local kd, vd = k_cache.data, v_cache.data
  local seqs = {}
  local maxk = 0
  for b = 0, B - 1 do
    local sq = cu[b + 2] - cu[b + 1]
    local sk = used[b + 1]
    assert(sk >= 0, format("reference: seqused_k[%d] = %d < 0", b, sk))
    local pos0 = sk - sq
    if has_new then
      assert(pos0 >= 0, format(
        "reference: sequence %d appends %d tokens but seqused_k is %d", b, sq, sk))
    end
    local offs = cache.offsets(b, sk)
    seqs[b + 1] = { b = b, q_off = cu[b + 1] * H * D, sq = sq, sk = sk, qpos0 = pos0,
      offs = offs, lse_off = cu[b + 1], lse_hstride = total_q, new_off = cu[b + 1] * Hk * D }
    if sk > maxk then maxk = sk end
  end
  local scr = scratch(D, maxk)

  if has_new and c.write_cache then
    for b = 1, B do
      local s = seqs[b]
      append_seq(c, kd, vd, opts.k.data, opts.v.data, s.new_off, s.sq, s.qpos0, s.offs,
        Hk, D, scr.tmp)
    end
  end

  local out = ref.tensor({ total_q, H, D })
  local lse = ref.tensor({ H, total_q })
  local akd, avd = dequantize(kd, c.k_scale, Hk, D, c.R), dequantize(vd, c.v_scale, Hk, D, c.R)
  for b = 1, B do
    attend_seq(c, seqs[b], q.data, akd, avd, out.data, lse.data, H, D, scr)
  end
  return out, lse
end

-- out, lse = ref.merge_states(states, opts): partial attention results over
-- disjoint key sets merged by their log-sum-exp. states: a list of
-- {o, lse} pairs of reference tensors, all o [T, H, D] with lse [H, T], or
-- all o [B, Sq, H, D] with lse [B, H, Sq]. For each row and head, with
-- m = max lse_s: out = sum_s exp(lse_s - m) o_s / sum_s exp(lse_s - m),
-- lse = m + log(sum_s exp(lse_s - m)); a state with lse -inf counts for
-- nothing (its o is not read), and when all are -inf out is 0 and lse -inf.
-- opts.precision ("f64" default, "f32", "f16", "bf16"): a naive merge in f32
-- whose result is rounded to that dtype (the tolerance rule's baseline).
function ref.merge_states(states, opts)
  opts = opts or {}
  assert(type(states) == "table" and #states >= 1, "reference.merge_states: a list of {o, lse} pairs expected")
  local R = opts.precision and opts.precision ~= "f64" and rounder(opts.precision, "opts.precision") or nil
  local F = R and ROUNDERS.f32 or identity
  local o1 = states[1][1]
  local os = check_tensor(o1, #o1.shape, "states[1][1]")
  local rank = #os
  assert(rank == 3 or rank == 4, "reference.merge_states: o must be [T, H, D] or [B, Sq, H, D]")
  local H, D = os[rank - 1], os[rank]
  local nb, seq = rank == 3 and 1 or os[1], rank == 3 and os[1] or os[2]
  local n = #states
  for s = 1, n do
    local o, l = states[s][1], states[s][2]
    local sh = check_tensor(o, rank, format("states[%d][1]", s))
    for i = 1, rank do
      assert(sh[i] == os[i], format("reference.merge_states: states[%d][1] is %s, states[1][1] %s", s,
        shape_str(sh), shape_str(os)))
    end
    local want = rank == 3 and { H, seq } or { nb, H, seq }
    local ls = check_tensor(l, #want, format("states[%d][2]", s))
    for i = 1, #want do
      assert(ls[i] == want[i], format("reference.merge_states: states[%d][2] is %s, expected %s", s,
        shape_str(ls), shape_str(want)))
    end
  end
  local out = ref.tensor(os)
  local lse = ref.tensor(rank == 3 and { H, seq } or { nb, H, seq })
  local od, ld = out.data, lse.data
  local w = {}
  for bi = 0, nb - 1 do
    for i = 0, seq - 1 do
      for h = 0, H - 1 do
        local li = bi * H * seq + h * seq + i + 1  -- lse element
        local oo = ((bi * seq + i) * H + h) * D     -- o row offset
        local m = -huge
        for s = 1, n do
          local v = states[s][2].data[li]
          if v > m then m = v end
        end
        if m == -huge then
          for d = 1, D do od[oo + d] = 0 end
          ld[li] = -huge
        else
          local sum = 0
          for s = 1, n do
            local v = states[s][2].data[li]
            w[s] = v == -huge and 0 or F(exp(F(v - m)))
            sum = F(sum + w[s])
          end
          for d = 1, D do
            local acc = 0
            for s = 1, n do
              if w[s] ~= 0 then acc = F(acc + F(F(w[s] / sum) * states[s][1].data[oo + d])) end
            end
            od[oo + d] = R and R(acc) or acc
          end
          ld[li] = F(m + F(log(sum)))
        end
      end
    end
  end
  return out, lse
end

return ref
