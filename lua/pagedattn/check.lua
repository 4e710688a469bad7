-- pagedattn.check: differential checks of a device against the pure-Lua float64
-- reference, on random problems (shapes, page sizes, block tables with or
-- without duplicates, options). Used by the specs, scripts/difftest.lua, and by
-- anyone who wants to check a device or a change on small sizes.
--
--   local check = require "pagedattn.check"
--   local rng = require("pagedattn.reference").rng(seed)
--   local case = check.random_case(rng, { dtype = "bf16", page_size = 16 })
--   local r = check.run(case, pa.device("cpu"))   -- r.ok, r.report
--
-- Tolerance (docs/design.md): error against the float64 reference at most 3x the
-- error of the same computation done naively in the dtype, plus 1e-5. Cache
-- contents after an append must match the reference's to one rounding step.
local pa = require "pagedattn"
local ref = require "pagedattn.reference"

local check = {}

local MANTISSA_BITS = { f32 = 23, f16 = 10, bf16 = 7, fp8_e4m3 = 3, fp8_e5m2 = 2 }
-- fp8 caches: the smallest normal exponent (a step below it is the
-- subnormals' fixed quantum), the largest finite value
local FP8 = { fp8_e4m3 = { emin = -6, max = 448 }, fp8_e5m2 = { emin = -14, max = 57344 } }
check.FP8_DTYPES = { "fp8_e4m3", "fp8_e5m2" }

local function pick(rng, list) return list[rng:int(1, #list)] end
local function chance(rng, p) return rng:uniform() < p end

-- A random problem. `want` fixes any field: form ("kvcache"|"varlen"), dtype,
-- page_size (0 = contiguous cache), mode ("decode"|"prefill"|"chunked"|"read"),
-- B, Hk, group, D, causal, lse, max_keys, cached (keys already in the cache: a
-- number or a list per sequence), sq (queries when only reading), and for an
-- fp8 cache cache_dtype ("fp8_e4m3" | "fp8_e5m2"), fp8_range ("normal" |
-- "saturate": values past the largest finite one | "subnormal"), k_scale,
-- v_scale (a number, or "head" for one per kv head), q_range ("wide": each
-- query row times its own power of two, 2^-60 .. 2^60 in bf16 and f32, 2^-6
-- .. 2^6 in f16, some rows zero, some elements 2^-20 .. 2^-35 of their
-- row's; a number N: the same with powers up to 2^+-N, at most 6 in f16:
-- only where asked), ...
function check.random_case(rng, want)
  want = want or {}
  local c = {}
  local function w(name, default)
    if want[name] ~= nil then c[name] = want[name] else c[name] = default end
  end
  w("form", chance(rng, 0.25) and "varlen" or "kvcache")
  w("dtype", pick(rng, { "f32", "f16", "bf16" }))
  w("page_size", pick(rng, { 0, 1, 3, 16, 256, 5, 8 }))
  w("mode", pick(rng, { "decode", "prefill", "chunked", "read" }))
  w("B", rng:int(1, 4))
  w("Hk", pick(rng, { 1, 2 }))
  w("group", pick(rng, { 1, 4, 8 }))
  w("D", pick(rng, { 64, 128, 256, 37, 40, 96 }))
  c.H = c.Hk * c.group
  w("max_keys", c.page_size == 256 and 600 or 300)
  c.append = c.mode ~= "read"
  -- per-sequence lengths: keys already cached, new tokens, queries
  c.before, c.new, c.sq = {}, {}, {}
  local uniform_sq -- with_kvcache has one Sq (and one S_new) for the batch
  local max_new = c.mode == "decode" and 1 or (c.mode == "read" and 0 or rng:int(1, 48))
  if c.mode == "decode" and chance(rng, 0.3) then max_new = rng:int(2, 8) end
  if want.new then max_new = want.new end
  for b = 1, c.B do
    local n = c.form == "varlen" and rng:int(c.mode == "decode" and 1 or 0, max_new) or max_new
    local before
    if want.cached then before = type(want.cached) == "table" and want.cached[b] or want.cached
    elseif c.mode == "prefill" then before = 0
    elseif chance(rng, 0.1) then before = 0 -- an empty cache now and then
    else before = rng:int(1, c.max_keys - n) end
    c.before[b], c.new[b] = before, n
  end
  if c.mode == "read" then
    uniform_sq = want.sq or rng:int(1, 12)
    for b = 1, c.B do c.sq[b] = c.form == "varlen" and rng:int(0, 12) or uniform_sq end
  else
    for b = 1, c.B do c.sq[b] = c.new[b] end
  end
  -- pages: unique when appending, anything (duplicates) when only reading
  if c.page_size > 0 then
    w("duplicates", not c.append and chance(rng, 0.7))
  else
    w("cache_batch_idx", chance(rng, 0.3))
  end
  -- options
  w("causal", chance(rng, 0.5))
  if want.window == nil and chance(rng, 0.2) then
    c.window = { rng:int(-1, 40), rng:int(-1, 12) }
  else
    c.window = want.window
  end
  w("softcap", chance(rng, 0.15) and pick(rng, { 5, 30 }) or nil)
  w("alibi", chance(rng, 0.15) and pick(rng, { "H", "BH" }) or nil)
  if c.append and c.D >= 2 and want.rotary == nil and chance(rng, 0.5) then
    local full = c.D - c.D % 2
    local rd = chance(rng, 0.6) and full or math.max(2, (math.floor(full / 4)) * 2)
    c.rotary = { dim = rd, interleaved = chance(rng, 0.5) }
  else
    c.rotary = want.rotary
  end
  c.q_range = want.q_range -- (no draw: other cases draw what they drew before)
  c.q_e4m3 = want.q_e4m3 -- (check.run_e4m3: the e4m3 tensor-core prefill; no draw)
  w("lse", chance(rng, 0.7))
  w("num_splits", chance(rng, 0.2) and rng:int(1, 5) or 0)
  w("softmax_scale", chance(rng, 0.1) and 0.3 or nil)
  -- (drawn last, and only for fp8 caches: other cases draw what they drew before)
  w("cache_dtype", c.dtype)
  if FP8[c.cache_dtype] then
    w("fp8_range", pick(rng, { "normal", "normal", "saturate", "subnormal" }))
    for _, name in ipairs({ "k_scale", "v_scale" }) do
      if want[name] == nil then
        c[name] = chance(rng, 0.3) and "head" or pick(rng, { 1, 0.5, 0.1, 3.7 })
      else
        c[name] = want[name]
      end
    end
  end
  return c
end

-- The scale an fp8 case's values are written at: x / scale is past the
-- largest finite value for |x| > 1.75 ("saturate"), below the smallest
-- normal for |x| < 1 ("subnormal"), else the case's number.
local function range_scale(c, given)
  local f = FP8[c.cache_dtype]
  if c.fp8_range == "saturate" then return 1.75 / f.max end
  if c.fp8_range == "subnormal" then return 2 ^ -f.emin end
  return given
end

function check.describe(c)
  local parts = { c.form, c.dtype, "B=" .. c.B, "H=" .. c.H .. "/Hk=" .. c.Hk, "D=" .. c.D,
    c.page_size > 0 and ("page=" .. c.page_size .. (c.duplicates and " dup" or "")) or "contiguous",
    c.mode }
  local function list(t) return "{" .. table.concat(t, ",") .. "}" end
  parts[#parts + 1] = "cached=" .. list(c.before)
  parts[#parts + 1] = "new=" .. list(c.new)
  parts[#parts + 1] = "sq=" .. list(c.sq)
  if c.cache_batch_idx then parts[#parts + 1] = "batch_idx" end
  if c.causal then parts[#parts + 1] = "causal" end
  if c.window then parts[#parts + 1] = "window=" .. list(c.window) end
  if c.softcap then parts[#parts + 1] = "softcap=" .. c.softcap end
  if c.alibi then parts[#parts + 1] = "alibi[" .. c.alibi .. "]" end
  if c.rotary then
    parts[#parts + 1] = "rotary(" .. c.rotary.dim .. (c.rotary.interleaved and ",gptj)" or ",neox)")
  end
  if c.lse then parts[#parts + 1] = "lse" end
  if c.cache_dtype and c.cache_dtype ~= c.dtype then
    local function sc(x) return x == "head" and "per head" or tostring(range_scale(c, x)) end
    parts[#parts + 1] = "cache=" .. c.cache_dtype .. "(" .. c.fp8_range .. ", k_scale=" .. sc(c.k_scale) ..
      ", v_scale=" .. sc(c.v_scale) .. ")"
  end
  if c.num_splits > 0 then parts[#parts + 1] = "splits=" .. c.num_splits end
  if c.q_range then parts[#parts + 1] = "q_range=" .. c.q_range end
  if c.softmax_scale then parts[#parts + 1] = "scale=" .. c.softmax_scale end
  return table.concat(parts, " ")
end

-- Materialises a case: reference tensors (values exact in the dtype) and the
-- option tables for both sides. The caches hold random values everywhere, so a
-- read of a wrong slot shows.
local function build(c, rng)
  local B, H, Hk, D, dt = c.B, c.H, c.Hk, c.D, c.dtype
  local inputs = { opts = {} }
  local o = inputs.opts
  local cdt = c.cache_dtype or dt
  local fp8 = FP8[cdt]
  -- the caches' contents: normal values in their dtype; fp8 ones spread
  -- over the case's range (many at the largest finite value, or subnormal)
  local cache_randn = function(shape) return ref.randn(shape, rng, dt) end
  if fp8 then
    local mult = c.fp8_range == "saturate" and fp8.max / 2 or c.fp8_range == "subnormal" and 2 ^ (fp8.emin - 1) or 1
    local R = ref.rounder(cdt)
    cache_randn = function(shape)
      local t = ref.tensor(shape)
      for i = 1, #t.data do t.data[i] = R(rng:normal() * mult) end
      return t
    end
  end
  local seqlen_k = {}
  local max_k = 1
  for b = 1, B do
    seqlen_k[b] = c.before[b] + c.new[b]
    if seqlen_k[b] > max_k then max_k = seqlen_k[b] end
  end
  -- caches and tables
  if c.page_size > 0 then
    local ps = c.page_size
    local need, width = 0, 0
    for b = 1, B do
      local n = math.ceil(seqlen_k[b] / ps)
      need = need + n
      if n > width then width = n end
    end
    width = width + rng:int(0, 2)
    if width == 0 then width = 1 end
    local num_pages
    if c.duplicates then num_pages = rng:int(1, math.max(1, need)) else num_pages = need + rng:int(0, 3) end
    if num_pages == 0 then num_pages = 1 end
    local pool = {}
    for i = 1, num_pages do pool[i] = i - 1 end
    rng:shuffle(pool)
    local bt, next_free = {}, 1
    for b = 1, B do
      local used = math.ceil(seqlen_k[b] / ps)
      for j = 1, width do
        local v
        if j <= used then
          if c.duplicates then v = rng:int(0, num_pages - 1)
          else v = pool[next_free]; next_free = next_free + 1 end
        else
          v = (j % 2 == 0) and -1 or 1073741824 -- garbage past the end: never read
        end
        bt[(b - 1) * width + j] = v
      end
    end
    inputs.k_cache = cache_randn({ num_pages, ps, Hk, D })
    inputs.v_cache = cache_randn({ num_pages, ps, Hk, D })
    o.block_table = ref.tensor({ B, width }, bt)
  else
    local cap = max_k + rng:int(0, 5)
    local bc = B
    if c.cache_batch_idx then
      bc = B + rng:int(0, 2)
      local rows = {}
      for i = 1, bc do rows[i] = i - 1 end
      rng:shuffle(rows)
      local idx = {}
      for b = 1, B do idx[b] = c.append and rows[b] or rng:int(0, bc - 1) end
      o.cache_batch_idx = ref.tensor({ B }, idx)
    end
    inputs.k_cache = cache_randn({ bc, cap, Hk, D })
    inputs.v_cache = cache_randn({ bc, cap, Hk, D })
  end
  -- queries and new tokens
  if c.form == "varlen" then
    local cu, total = { 0 }, 0
    for b = 1, B do total = total + c.sq[b]; cu[b + 1] = total end
    inputs.q = ref.randn({ total, H, D }, rng, dt)
    o.cu_seqlens_q = ref.tensor({ B + 1 }, cu)
    o.seqused_k = ref.tensor({ B }, seqlen_k)
    if c.append then
      o.k = ref.randn({ total, Hk, D }, rng, dt)
      o.v = ref.randn({ total, Hk, D }, rng, dt)
    end
  else
    inputs.q = ref.randn({ B, c.sq[1], H, D }, rng, dt)
    if c.append then
      o.k = ref.randn({ B, c.new[1], Hk, D }, rng, dt)
      o.v = ref.randn({ B, c.new[1], Hk, D }, rng, dt)
    end
    o.cache_seqlens = ref.tensor({ B }, c.before)
  end
  if c.q_range then
    local d, e = inputs.q.data, math.min(c.q_range == "wide" and 60 or c.q_range, dt == "f16" and 6 or 60)
    for r = 0, #d / D - 1 do
      local f = chance(rng, 0.1) and 0 or 2 ^ rng:int(-e, e)
      for i = r * D + 1, r * D + D do
        d[i] = d[i] * f * (chance(rng, 0.1) and 2 ^ -rng:int(20, dt == "f16" and 24 or 35) or 1)
      end
    end
    inputs.q = ref.round_tensor(inputs.q, dt)
  end
  -- rotary tables: positions up to the longest sequence (+ a few)
  if c.rotary then
    local half, n = c.rotary.dim / 2, max_k + rng:int(0, 4)
    local cs, sn = {}, {}
    for pos = 0, n - 1 do
      for j = 0, half - 1 do
        local theta = pos * 10000 ^ (-2 * j / c.rotary.dim)
        cs[pos * half + j + 1] = ref.round(math.cos(theta), dt)
        sn[pos * half + j + 1] = ref.round(math.sin(theta), dt)
      end
    end
    o.rotary_cos = ref.tensor({ n, half }, cs)
    o.rotary_sin = ref.tensor({ n, half }, sn)
    o.rotary_interleaved = c.rotary.interleaved
  end
  if c.alibi then
    local shape = c.alibi == "H" and { H } or { B, H }
    local s = {}
    for i = 1, ref.numel(shape) do s[i] = ref.round(rng:uniform() * 0.5, "f32") end
    o.alibi_slopes = ref.tensor(shape, s)
  end
  o.causal = c.causal or nil
  o.window_size = c.window
  o.softcap = c.softcap or nil -- (false: none, as nil)
  o.softmax_scale = c.softmax_scale
  -- the scales, as f32 numbers (what the device uses): one, or one per kv head
  if fp8 then
    for _, name in ipairs({ "k_scale", "v_scale" }) do
      if c[name] == "head" then
        local base, list = range_scale(c, 1), {}
        for h = 1, Hk do list[h] = ref.round(base * 2 ^ (2 * rng:uniform() - 1), "f32") end
        o[name] = ref.tensor({ Hk }, list)
      elseif c[name] ~= nil then
        o[name] = ref.round(range_scale(c, c[name]), "f32")
      end
    end
  end
  return inputs
end

local ref_keys = { "k", "v", "rotary_cos", "rotary_sin", "block_table", "cache_batch_idx",
  "cu_seqlens_q", "seqused_k", "cache_seqlens", "alibi_slopes", "k_scale", "v_scale" }
local f32_keys = { alibi_slopes = true, k_scale = true, v_scale = true }
local int_keys = { block_table = true, cache_batch_idx = true, cu_seqlens_q = true,
  seqused_k = true, cache_seqlens = true }

local function to_device(t, dtype, device)
  return assert(pa.from_table(t.data, t.shape, dtype, device))
end

local function to_ref(t) return ref.tensor(t.shape, t:to_table()) end

-- Largest |a - b| beyond one rounding step of the dtype (0 when within).
local function excess_over_ulp(a, b, dtype)
  local rel = 2 ^ -MANTISSA_BITS[dtype]
  local worst = 0
  local f = FP8[dtype]
  if f then -- a step of the fp8 grid at the larger of the two (subnormals: the fixed quantum)
    local m = MANTISSA_BITS[dtype]
    for i = 1, #a do
      local x, y = a[i], b[i]
      if x ~= y then
        local big = math.max(math.abs(x), math.abs(y))
        local _, e = math.frexp(big)
        local step = 2 ^ (math.max(e - 1, f.emin) - m)
        local d = math.abs(x - y) - step
        if x ~= x or y ~= y or big == math.huge then d = math.huge end
        if d > worst then worst = d end
      end
    end
    return worst
  end
  for i = 1, #a do
    local x, y = a[i], b[i]
    if x ~= y then
      local d = math.abs(x - y) - (rel * math.abs(y) * 1.0001 + 1e-30)
      if x ~= x or y ~= y then d = math.huge end
      if d > worst then worst = d end
    end
  end
  return worst
end

-- The reference's call of case c over q and the caches given (reference
-- tensors; written to where o.write_cache), with the case's options and
-- those of o: returns out, lse.
local function reference(c, inputs, q, k_cache, v_cache, o)
  o.cache_dtype = c.cache_dtype or c.dtype
  for k, v in pairs(inputs.opts) do o[k] = v end
  local rfn = c.form == "varlen" and ref.attention_varlen or ref.attention_with_kvcache
  return rfn(q, k_cache, v_cache, o)
end

-- The largest of a scale option: a number, or a reference tensor of them.
local function largest_scale(x)
  if type(x) ~= "table" then return x or 1 end
  local m = 0
  for _, s in ipairs(x.data) do m = math.max(m, s) end
  return m
end

-- Runs a case on `device` and on the reference; returns a result table:
--   ok, report (one line per quantity), and the errors and tolerances.
function check.run(c, device, rng)
  local inputs = build(c, rng)
  local dt = c.dtype
  local cdt = c.cache_dtype or dt
  -- device side
  local dopts = {}
  for k, v in pairs(inputs.opts) do dopts[k] = v end
  for _, k in ipairs(ref_keys) do
    local t = inputs.opts[k]
    if type(t) == "table" then
      local tdt = int_keys[k] and "i32" or (f32_keys[k] and "f32" or dt)
      dopts[k] = to_device(t, tdt, device)
    end
  end
  dopts.return_softmax_lse = c.lse or nil
  dopts.num_splits = c.num_splits > 0 and c.num_splits or nil
  local q = to_device(inputs.q, dt, device)
  local kc = to_device(inputs.k_cache, cdt, device)
  local vc = to_device(inputs.v_cache, cdt, device)
  local poison = pa.tensor(q.shape, dt, device):fill(0 / 0)
  dopts.out = poison
  local fn = c.form == "varlen" and pa.attention_varlen or pa.attention_with_kvcache
  local out, lse = fn(q, kc, vc, dopts)
  assert(out, lse)
  if c.q_e4m3 then return check.run_e4m3(c, inputs, q, kc, vc, out, lse) end

  -- reference: exact (f64) and naive (in the dtype), each on its own caches
  -- (copies of the inputs, or of `given` caches that hold the append already)
  local function ref_run(precision, given_k, given_v)
    local k_cache, v_cache = ref.copy(given_k or inputs.k_cache), ref.copy(given_v or inputs.v_cache)
    local rout, rlse = reference(c, inputs, inputs.q, k_cache, v_cache,
      { precision = precision, write_cache = given_k == nil })
    return rout, rlse, k_cache, v_cache
  end
  local exact_out, exact_lse, exact_k, exact_v = ref_run("f64")
  local naive_out, naive_lse = ref_run(dt)

  local r = { case = c }
  local cache_lines = {}
  if c.append then
    local got_k, got_v = kc:to_table(), vc:to_table()
    r.cache_excess = math.max(excess_over_ulp(got_k, exact_k.data, cdt), excess_over_ulp(got_v, exact_v.data, cdt))
    cache_lines[1] = string.format("caches: %s", r.cache_excess == 0 and "match"
      or string.format("differ by %.3g beyond one rounding step", r.cache_excess))
    -- An fp8 step is an eighth of a value: a device whose append rounds one
    -- element the other way (an f32 rotation next to a tie of the grid) is
    -- within the rule above, and its attention is judged on the caches it
    -- holds, by the references reading them (the append checked just now).
    if FP8[cdt] and r.cache_excess == 0 and (ref.max_abs_diff(got_k, exact_k.data) > 0 or
                                             ref.max_abs_diff(got_v, exact_v.data) > 0) then
      local dk, dv = ref.tensor(inputs.k_cache.shape, got_k), ref.tensor(inputs.v_cache.shape, got_v)
      exact_out, exact_lse = ref_run("f64", dk, dv)
      naive_out, naive_lse = ref_run(dt, dk, dv)
      cache_lines[1] = "caches: within one fp8 step (attention judged on the device's)"
    end
  end
  local got_out = out:to_table()
  r.out_err = ref.max_abs_diff(got_out, exact_out.data)
  r.out_naive = ref.max_abs_diff(naive_out.data, exact_out.data)
  r.out_tol = ref.tolerance(dt, r.out_naive)
  r.ok = r.out_err <= r.out_tol
  local lines = { string.format("out: max |err| %.3g, tolerance %.3g (naive %s error %.3g)",
    r.out_err, r.out_tol, dt, r.out_naive) }
  if c.lse then
    r.lse_err = ref.max_abs_diff(lse:to_table(), exact_lse.data)
    r.lse_naive = ref.max_abs_diff(naive_lse.data, exact_lse.data)
    r.lse_tol = ref.tolerance(dt, r.lse_naive)
    if c.q_range then
      -- Rows to 2^60 make lse ~1e19, where the rule's 1e-5 is far below one
      -- f32 ulp, and the naive f32 sum (a rounding a term) often lands within
      -- an ulp; tensor cores add each 16 products to the f32 sum with one
      -- truncation, and a sum of D terms in another order may be a few ulps
      -- off: D / 16 + 2 ulps of the largest |lse| (below ~10 this is under
      -- the rule's 1e-5 and changes nothing).
      local big = 0
      for _, x in ipairs(exact_lse.data) do
        if x == x and math.abs(x) < math.huge and math.abs(x) > big then big = math.abs(x) end
      end
      local _, ex = math.frexp(big)
      r.lse_tol = math.max(r.lse_tol, 3 * r.lse_naive + (c.D / 16 + 2) * 2 ^ (ex - 24))
    end
    r.ok = r.ok and r.lse_err <= r.lse_tol
    lines[#lines + 1] = string.format("lse: max |err| %.3g, tolerance %.3g", r.lse_err, r.lse_tol)
  end
  if c.append then
    r.ok = r.ok and r.cache_excess == 0
    lines[#lines + 1] = cache_lines[1]
  end
  r.report = table.concat(lines, "; ")
  if c.keep then r.got_out, r.exact_out, r.q = got_out, exact_out.data, inputs.q end -- (lab scripts: per-row looks)
  return r
end

-- q as the e4m3 tensor-core prefill (tuning prefill_fp8 = 2) rounds it:
-- each row (a query's head, D elements) times 2^c, the power of two that
-- brings its largest |element| into [128, 256) (c from that element's f32
-- exponent E, clamped to 8 .. 254: 2^c = 2^(134 - E)), rounded to e4m3
-- (nearest even, saturating), and divided by 2^c again. q: the values of the
-- device's q (its dtype's); returns a new table.
function check.q_e4m3(q, D)
  local scaled, muls = {}, {}
  for r0 = 0, #q - 1, D do
    local amax = 0
    for d = 1, D do amax = math.max(amax, math.abs(q[r0 + d])) end
    local E = 0
    if amax >= 2 ^ -126 then
      local _, e = math.frexp(amax)
      E = e + 126
    end
    local mul = 2 ^ (134 - math.min(math.max(E, 8), 254))
    muls[#muls + 1] = mul
    for d = 1, D do scaled[r0 + d] = q[r0 + d] * mul end
  end
  local cpu = assert(pa.device("cpu"))
  local q8 = assert(pa.from_table(scaled, nil, "fp8_e4m3", cpu)):to_table()
  for i = 1, #q8 do q8[i] = q8[i] / muls[math.floor((i - 1) / D) + 1] end
  return q8
end

-- check.run for a case with q_e4m3 set (the e4m3 tensor-core prefill): its
-- out against the float64 reference over q as that path rounds it
-- (check.q_e4m3) and the device's caches (after its append, checked as in
-- check.run). What remains is P in e4m3: each p_j times (1 + d_j), |d_j| <=
-- 2^-4 (2^-18 absolutely, subnormals, in units of the row's largest p), the
-- row sum exact, so an element of out may move by 2^-4 sum_j p_j |v_j| /
-- sum_j p_j (the reference over |v|) + keys x 2^-18 x max |v|; plus the
-- rounding of out to its dtype (an ulp of the reference) and the f32 sums'
-- (2^-12 of the |v| term, far above them). The scores themselves move by
-- up to delta (fp8 wgmma's accumulation, below): out by 2 delta of the |v|
-- term more, lse (from the unrounded p) by 1e-4 + 2^-14 |lse| + delta.
function check.run_e4m3(c, inputs, q, kc, vc, out, lse)
  local dt, cdt = c.dtype, c.cache_dtype
  local got_k, got_v = kc:to_table(), vc:to_table()
  local r = { case = c }
  if c.append then
    local ek, ev = ref.copy(inputs.k_cache), ref.copy(inputs.v_cache)
    reference(c, inputs, inputs.q, ek, ev, { precision = "f64", write_cache = true })
    r.cache_excess = math.max(excess_over_ulp(got_k, ek.data, cdt), excess_over_ulp(got_v, ev.data, cdt))
  end
  local q8 = ref.tensor(inputs.q.shape, check.q_e4m3(q:to_table(), c.D))
  local function ref_run(vabs, p_e4m3)
    local v_data = {}
    for i, x in ipairs(got_v) do v_data[i] = vabs and math.abs(x) or x end
    return reference(c, inputs, q8, ref.tensor(inputs.k_cache.shape, got_k), ref.tensor(inputs.v_cache.shape, v_data),
      { precision = "f64", write_cache = false, p_e4m3 = p_e4m3 })
  end
  local exact_out, exact_lse = ref_run(false)
  local abs_out = ref_run(true)
  local got_out, got_lse = out:to_table(), lse and lse:to_table()
  if c.q_e4m3 == "emulate" then -- (judge the reference's own model of P in e4m3 instead: the bound's soundness)
    local eo, el = ref_run(false, true)
    got_out, got_lse = eo.data, el.data
  end
  local vmax, keys = 0, 0
  for _, x in ipairs(got_v) do if math.abs(x) > vmax then vmax = math.abs(x) end end
  vmax = vmax * largest_scale(inputs.opts.v_scale)
  for b = 1, c.B do keys = math.max(keys, (c.before[b] or 0) + (c.new[b] or 0)) end
  -- the scores: fp8 wgmma accumulates with about 14 bits (DeepSeek-V3's
  -- measurement on H800s), so each score within 2^-12 of sum_d |q_d k_d|
  -- (at most |q| |k|, Cauchy-Schwarz: the largest row of q as rounded, the
  -- largest key times the largest k scale) in natural units: delta
  local function max_row_norm(data)
    local best = 0
    for r0 = 0, #data - 1, c.D do
      local n = 0
      for d = 1, c.D do n = n + data[r0 + d] ^ 2 end
      best = math.max(best, math.sqrt(n))
    end
    return best
  end
  local kmax = largest_scale(inputs.opts.k_scale)
  local scale = inputs.opts.softmax_scale or 1 / math.sqrt(c.D)
  local delta = 2 ^ -12 * scale * max_row_norm(q8.data) * max_row_norm(got_k) * kmax
  local ulp = 2 ^ -MANTISSA_BITS[dt]
  local worst, worst_tol, err = -math.huge, 0, 0
  for i, y in ipairs(exact_out.data) do
    local x = got_out[i]
    local tol = (2 ^ -4 + 2 ^ -12 + 2 * delta) * abs_out.data[i] + keys * 2 ^ -18 * vmax + ulp * math.abs(y)
    local d = math.abs(x - y)
    if x ~= x or y ~= y then d = (x ~= x and y ~= y) and 0 or math.huge end
    if d - tol > worst then worst, worst_tol, err = d - tol, tol, d end
  end
  r.out_err, r.out_tol = err, worst_tol
  r.out_max = ref.max_abs_diff(got_out, exact_out.data)
  r.ok = worst <= 0
  local lines = { string.format("out (q in e4m3): max |err| %.3g; worst element %.3g against its bound %.3g", r.out_max,
    err, worst_tol) }
  if c.lse then
    local gl = got_lse
    r.lse_err = 0
    local lworst = -math.huge
    for i, y in ipairs(exact_lse.data) do
      local d = math.abs(gl[i] - y)
      if gl[i] ~= y and (y ~= y or gl[i] ~= gl[i] or math.abs(y) == math.huge) then d = math.huge end
      r.lse_err = math.max(r.lse_err, d)
      lworst = math.max(lworst, d - (1e-4 + 2 ^ -14 * math.abs(y) + delta))
    end
    r.ok = r.ok and lworst <= 0
    lines[#lines + 1] = string.format("lse: max |err| %.3g (bound 1e-4 + 2^-14 |lse| + %.3g of the scores)", r.lse_err,
      delta)
  end
  if c.append then
    r.ok = r.ok and r.cache_excess == 0
    lines[#lines + 1] = r.cache_excess == 0 and "caches: match" or
      string.format("caches: differ by %.3g beyond one rounding step", r.cache_excess)
  end
  r.report = table.concat(lines, "; ")
  return r
end

check.build = build
check.to_ref = to_ref
-- The largest |a[i] - b[i]| beyond one rounding step of dtype (0: within).
check.excess_over_step = excess_over_ulp
return check
