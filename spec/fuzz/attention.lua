-- spec/fuzz/attention.lua -- a seeded fuzzer of the attention entry points
-- (pa.attention_with_kvcache, pa.attention_varlen) and of a staged batch's
-- b:attention / b:append_kv.
--
-- Each case starts from a random *valid* call (pagedattn.check builds it:
-- shapes, dtypes, page sizes 1/3/5/16 or contiguous caches, block tables with
-- duplicates, empty and single-token sequences, k/v append, rotary, causal,
-- windows, softcap, alibi, lse, num_splits; a quarter of them over fp8
-- caches with scales per tensor or per kv head) and usually applies one to three
-- mutations from MUTATIONS below. A mutation says what the call must do:
--   fail  the call must be refused: a Lua error "pagedattn.<fn>: <arg>: ..."
--         naming a known argument (raised at the caller's line), or nil, err;
--   same  the call must succeed and match the float64 reference (DESIGN's
--         tolerance) on inputs the mutation kept in step with the device's;
--   pass  the call must succeed (plus the mutation's own check, if any);
--   any   either (aliasing, appends through duplicate pages: no promise).
-- Whatever happens: no crash (ASan/UBSan in CI), a call that fails changes no
-- tensor it was given (compared element by element), a call that succeeds
-- writes none of its read-only inputs, and unmutated cases match the reference
-- through check.run. Rarer scenarios: a staged batch (valid and malformed calls,
-- then the valid call again after a failed one; near half of them with forks and
-- cascade = true, so that shared prefixes run as two levels), and key counts near
-- PA_MAX_SEQLEN = 2^30 and 2^31 on caches of huge pages.
--
--   local fuzz = require "spec.fuzz.attention"   -- busted: require "fuzz.attention"
--   local s = fuzz.run{ seed = 1, iters = 200, device = "cpu", log = print }
--   -- s.outcomes.ok / refused / runtime, s.kinds, s.mutations, s.args, s.seconds
--
-- A violation raises an error with the seed, the case, its mutations and the
-- command that reruns it (scripts/fuzz.lua). Deterministic for a seed: no
-- clock is read except to report the run time.
local ffi = require "ffi"
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local check = require "pagedattn.check"
local T = require "pagedattn.tensor"

local M = {}

local is_tensor = T.is_tensor
local floor = math.floor
local MAXSEQ = 2 ^ 30 -- PA_MAX_SEQLEN: keys (and queries) one sequence may hold
local I32_MAX, I32_MIN = 2147483647, -2147483648
local DTYPE_MAX = { f32 = 3.4028234663852886e38, f16 = 65504, bf16 = 3.3895313892515355e38 }
local FLOATS = { "f32", "f16", "bf16" }

local function pick(rng, list) return list[rng:int(1, #list)] end
local function chance(rng, p) return rng:uniform() < p end
local function other(rng, list, not_this)
  local l = {}
  for _, x in ipairs(list) do if x ~= not_this then l[#l + 1] = x end end
  return pick(rng, l)
end

-- The command that reruns a run (or one case of it).
function M.rerun(seed, iters, device, case)
  local s = string.format("scripts/run scripts/fuzz.lua attention --seed %d --iters %d --device %s",
    seed, iters, device)
  if case then s = s .. string.format("  (this case alone: --case %d)", case) end
  return s
end

---------------------------------------------------------------------------
-- tensors: device copies of reference tensors, snapshots

local int_keys = { block_table = true, cache_batch_idx = true, cu_seqlens_q = true,
  seqused_k = true, cache_seqlens = true }

local function opt_dtype(key, dt)
  if int_keys[key] then return "i32" end
  if key == "alibi_slopes" or key == "k_scale" or key == "v_scale" then return "f32" end
  return dt
end

-- Device arguments for a case built by check.build, as check.run makes them.
local function materialise(c, inputs, dev)
  local function to_dev(t, dtype) return assert(pa.from_table(t.data, t.shape, dtype, dev)) end
  local o = {}
  for k, v in pairs(inputs.opts) do
    if type(v) == "table" and v.data then o[k] = to_dev(v, opt_dtype(k, c.dtype))
    elseif type(v) == "table" then o[k] = { v[1], v[2] }
    else o[k] = v end
  end
  o.return_softmax_lse = c.lse or nil
  o.num_splits = c.num_splits > 0 and c.num_splits or nil
  local cdt = c.cache_dtype or c.dtype
  return to_dev(inputs.q, c.dtype), to_dev(inputs.k_cache, cdt), to_dev(inputs.v_cache, cdt), o
end

-- Equal as numbers, with NaN equal to NaN and 0 distinct from -0.
local function same_value(x, y)
  if x ~= x then return y ~= y end
  if x ~= y then return false end
  return x ~= 0 or 1 / x == 1 / y
end

-- The live tensors a call was given, each once, with a name for messages.
local function call_tensors(args)
  local list, seen = {}, {}
  -- (a tensor passed as two arguments is one entry named after both: "q = k_cache")
  local function add(name, t)
    if not (is_tensor(t) and t.handle ~= nil) then return end
    if seen[t] then
      seen[t].name = seen[t].name .. " = " .. name
    else
      seen[t] = { name = name, t = t }
      list[#list + 1] = seen[t]
    end
  end
  add("q", args.q)
  add("k_cache", args.kc)
  add("v_cache", args.vc)
  if type(args.opts) == "table" then
    local keys = {}
    for k in pairs(args.opts) do keys[#keys + 1] = tostring(k) end
    table.sort(keys)
    for _, k in ipairs(keys) do add("opts." .. k, args.opts[k]) end
  end
  return list
end

local function snapshot(list)
  local s = {}
  for i, e in ipairs(list) do s[i] = { name = e.name, t = e.t, data = e.t:to_table() } end
  return s
end

-- The first difference between a snapshot and the tensors now, as text; nil
-- when every element is as it was. skip(entry) leaves a tensor out.
local function difference(snap, skip)
  for _, e in ipairs(snap) do
    if not (skip and skip(e)) and e.t.handle ~= nil then
      local now = e.t:to_table()
      if #now ~= #e.data then return e.name .. ": element count changed" end
      for i = 1, #now do
        if not same_value(now[i], e.data[i]) then
          return string.format("%s: element %d was %s, is %s", e.name, i - 1, tostring(e.data[i]), tostring(now[i]))
        end
      end
    end
  end
  return nil
end

---------------------------------------------------------------------------
-- what an error must look like

-- Every argument name a message may start with.
local ARG_NAMES = {}
for _, n in ipairs({ "q", "k_cache", "v_cache", "opts", "out", "softmax_lse", "k", "v", "rotary_cos",
  "rotary_sin", "rotary_interleaved", "cache_batch_idx", "block_table", "softmax_scale", "causal",
  "window_size", "softcap", "alibi_slopes", "num_splits", "return_softmax_lse", "cache_seqlens",
  "cu_seqlens_q", "seqused_k", "max_seqlen_q", "layer", "batch", "cache", "kv_indptr", "kv_indices",
  "kv_last_page_len", "k_scale", "v_scale" }) do
  ARG_NAMES[n] = true
end

local PACKAGE_FILE = "lua/pagedattn/"

-- Checks a raised message; returns the argument it names, or nil and why not.
-- `fnames` lists the functions that may report it; `extra` more argument names.
local function parse_error(msg, fnames, extra)
  if type(msg) ~= "string" then return nil, "the error is a " .. type(msg) .. ", not a message" end
  local loc, body = msg:match("^([^\n]-:%d+): (.*)$")
  if loc and loc:find(PACKAGE_FILE, 1, true) then
    return nil, "the error points inside the package (" .. loc .. "), not at the caller"
  end
  body = body or msg
  local fname, arg = body:match("^pagedattn%.([%w_:]+): ([%w_%[%]]+):")
  if not fname then -- the argument, then what it stands for: "kv_indices (as the block table [B, widest]):"
    fname, arg = body:match("^pagedattn%.([%w_:]+): ([%w_]+) %b():")
  end
  if not fname then return nil, "the message does not start with 'pagedattn.<function>: <argument>:'" end
  local known = false
  for _, f in ipairs(fnames) do if f == fname then known = true end end
  if not known then return nil, "the message names function '" .. fname .. "'" end
  if not (ARG_NAMES[arg] or (extra and extra[arg])) then
    return nil, "the message names '" .. arg .. "', not an argument"
  end
  return arg
end

---------------------------------------------------------------------------
-- the reference, for mutations that keep the semantics (kind "same")

local function compare_with_reference(ctx, out, lse)
  local c, inputs = ctx.c, ctx.inputs
  local cdt = c.cache_dtype or c.dtype
  local function ref_run(precision, given_k, given_v)
    local o = { precision = precision, cache_dtype = cdt, write_cache = given_k == nil }
    for k, v in pairs(inputs.opts) do o[k] = v end
    local kc, vc = ref.copy(given_k or inputs.k_cache), ref.copy(given_v or inputs.v_cache)
    local rfn = c.form == "varlen" and ref.attention_varlen or ref.attention_with_kvcache
    local ro, rl = rfn(inputs.q, kc, vc, o)
    return ro, rl, kc, vc
  end
  local eo, el, ek, ev = ref_run("f64")
  local no, nl = ref_run(c.dtype)
  -- an fp8 append: within one fp8 step of the reference's, and attention
  -- judged on the caches the device holds (as check.run does)
  if cdt ~= c.dtype and inputs.opts.k and is_tensor(ctx.kc) and is_tensor(ctx.vc) then
    local gk, gv = ctx.kc:to_table(), ctx.vc:to_table()
    local excess = math.max(check.excess_over_step(gk, ek.data, cdt), check.excess_over_step(gv, ev.data, cdt))
    if excess > 0 then return string.format("the fp8 append differs by %.3g beyond one fp8 step", excess) end
    local dk, dv = ref.tensor(inputs.k_cache.shape, gk), ref.tensor(inputs.v_cache.shape, gv)
    eo, el = ref_run("f64", dk, dv)
    no, nl = ref_run(c.dtype, dk, dv)
  end
  local err = ref.max_abs_diff(out:to_table(), eo.data)
  local tol = ref.tolerance(c.dtype, ref.max_abs_diff(no.data, eo.data))
  if not (err <= tol) then
    return string.format("out differs from the reference: max |err| %.3g > tolerance %.3g", err, tol)
  end
  if lse then
    local lerr = ref.max_abs_diff(lse:to_table(), el.data)
    local ltol = ref.tolerance(c.dtype, ref.max_abs_diff(nl.data, el.data))
    if not (lerr <= ltol) then
      return string.format("lse differs from the reference: max |err| %.3g > tolerance %.3g", lerr, ltol)
    end
  end
  return nil
end

---------------------------------------------------------------------------
-- facts about a case that mutations need

local function facts(c, inputs)
  local f = { B = c.B, H = c.H, Hk = c.Hk, D = c.D, seqlen_k = {}, pages = {} }
  local o = inputs.opts
  f.new = c.new
  for b = 1, c.B do f.seqlen_k[b] = c.before[b] + c.new[b] end
  if c.page_size > 0 then
    f.ps = c.page_size
    f.width = o.block_table.shape[2]
    f.num_pages = inputs.k_cache.shape[1]
    f.capacity = f.width * f.ps
    for b = 1, c.B do f.pages[b] = math.ceil(f.seqlen_k[b] / f.ps) end
  else
    f.capacity = inputs.k_cache.shape[2]
    f.cache_rows = inputs.k_cache.shape[1]
  end
  f.max_pages = 0
  for b = 1, c.B do if (f.pages[b] or 0) > f.max_pages then f.max_pages = f.pages[b] end end
  f.total_q = inputs.q.shape[1]
  f.s_new = c.form == "kvcache" and (c.append and c.new[1] or 0) or nil
  -- a call with nothing to read or write skips the per-sequence checks (it
  -- costs O(1) by design): mutations of per-sequence values need work
  if c.form == "varlen" then f.work = f.total_q > 0
  else f.work = c.B * c.sq[1] > 0 or (c.append and c.new[1] > 0) end
  f.max_q = 0
  for b = 1, c.B do if c.sq[b] > f.max_q then f.max_q = c.sq[b] end end
  -- the last rotary position any sequence needs (-1: none)
  local w = o.window_size
  local step = c.causal or (w and (w[1] >= 0 or w[2] >= 0))
  f.last_pos = -1
  for b = 1, c.B do
    local nn = c.append and c.new[b] or 0
    local sq = c.sq[b]
    if nn > 0 or sq > 0 then
      local last = c.before[b] + (nn > 0 and nn - 1 or 0)
      local lq = c.before[b] + ((step and sq > 0) and sq - 1 or 0)
      if lq > last then last = lq end
      if last > f.last_pos then f.last_pos = last end
    end
  end
  return f
end

---------------------------------------------------------------------------
-- mutations. apply(x) changes x.q, x.kc, x.vc, x.opts (device side) and, for
-- kind "same", x.inputs (the reference side) to match; it returns false when
-- it does not apply to this case. x.rng draws, x.dev is the device, x.f the
-- facts, x.dt the case's dtype, x.extra_args more names an error may give.

local function tensor(x, shape, dtype) return assert(pa.tensor(shape, dtype or x.dt, x.dev)) end
local function ints(x, values, shape) return assert(pa.from_table(values, shape or { #values }, "i32", x.dev)) end
local function copy_list(t) local r = {} for i = 1, #t do r[i] = t[i] end return r end
local function shape_plus(shape, i, d) local s = copy_list(shape) s[i] = s[i] + d return s end

-- A freed copy of t (t:free()), or of a small tensor when t is not one.
local function freed(x, t)
  local f = (is_tensor(t) and t.handle ~= nil) and t:clone() or tensor(x, { 1 })
  f:free()
  return f
end

-- A dead view: a batch's index tensor after the batch (or its cache) closed.
local function dead_view(x, field)
  local cache = assert(pa.kv_cache{ num_pages = 4, page_size = 2, layers = 0 })
  local b = assert(cache:batch{ device = x.dev })
  b:add(assert(cache:sequence()), 3)
  assert(b:stage())
  local view = b[field]
  if chance(x.rng, 0.5) then b:close() else cache:close() end
  return view
end

-- The CSR form (kv_indptr, kv_indices, kv_last_page_len) of the case's
-- block table: each sequence's pages, and `extra` more entries after them.
local function csr_of(x, extra)
  local bt, w = x.inputs.opts.block_table.data, x.f.width
  local ip, ix, last = { 0 }, {}, {}
  for b = 1, x.f.B do
    for j = 1, x.f.pages[b] do ix[#ix + 1] = bt[(b - 1) * w + j] end
    for _ = 1, extra or 0 do ix[#ix + 1] = x.rng:int(0, x.f.num_pages - 1) end
    ip[b + 1] = #ix
    local sk = x.f.seqlen_k[b]
    last[b] = sk > 0 and sk - floor((sk - 1) / x.f.ps) * x.f.ps or 0
  end
  return ip, ix, last
end

local function set_csr(x, ip, ix, last)
  x.opts.block_table = nil
  x.opts.kv_indptr = ints(x, ip)
  x.opts.kv_indices = #ix > 0 and ints(x, ix) or tensor(x, { 0 }, "i32")
  x.opts.kv_last_page_len = last and ints(x, last) or nil
end

local NEAR_LIMITS = { MAXSEQ, MAXSEQ + 1, MAXSEQ - 1, I32_MAX, I32_MAX - 1, I32_MIN, -1 }

local MUTATIONS = {
  -- q
  { name = "q_ndim", kind = "fail", apply = function(x)
    local s = copy_list(x.inputs.q.shape)
    if chance(x.rng, 0.5) then table.remove(s, 1) else table.insert(s, 1, 1) end
    x.q = tensor(x, s)
  end },
  { name = "q_dtype", kind = "fail", apply = function(x)
    -- (fp8 caches take any float q: only i32 is wrong there)
    local fp8 = x.c.cache_dtype and x.c.cache_dtype ~= x.dt
    x.q = tensor(x, x.inputs.q.shape, fp8 and "i32" or other(x.rng, { "f32", "f16", "bf16", "i32" }, x.dt))
  end },
  { name = "q_heads_not_multiple", kind = "fail", apply = function(x)
    if x.f.Hk == 1 then return false end
    local s = copy_list(x.inputs.q.shape)
    s[#s - 1] = x.f.H + pick(x.rng, { 1, -1 })
    x.q = tensor(x, s)
  end },
  { name = "q_head_dim", kind = "fail", apply = function(x)
    local s = copy_list(x.inputs.q.shape)
    s[#s] = pick(x.rng, { 0, 257, x.f.D + 1 })
    x.q = tensor(x, s)
  end },
  { name = "q_zero_heads", kind = "fail", apply = function(x)
    local s = copy_list(x.inputs.q.shape)
    s[#s - 1] = 0
    x.q = tensor(x, s)
  end },
  { name = "q_dim_beyond_int32", kind = "fail", apply = function(x)
    -- zero elements, so nothing is allocated; the size itself must be refused
    local s = copy_list(x.inputs.q.shape)
    s[1] = pick(x.rng, { 2 ^ 31, 2 ^ 32 + 1, 2 ^ 40 })
    s[#s - 1] = 0
    x.q = tensor(x, s)
  end },
  { name = "q_empty_huge_lse", kind = "fail", apply = function(x)
    -- no element, but an lse of 2^36 or more floats if anyone made it first
    if x.c.form == "varlen" then x.q = tensor(x, { MAXSEQ, pick(x.rng, { 65536, 2 ^ 20 }), 0 })
    else x.q = tensor(x, { 1, MAXSEQ, pick(x.rng, { 65536, 2 ^ 20 }), 0 }) end
    x.opts.return_softmax_lse = true
  end },
  { name = "q_not_tensor", kind = "fail", apply = function(x)
    x.q = pick(x.rng, { {}, 42, "q", false, x.inputs.q })
  end },
  -- caches
  { name = "cache_dtype", kind = "fail", apply = function(x)
    -- one cache only, so the two differ whatever else changed
    local which = chance(x.rng, 0.5) and "kc" or "vc"
    local keep = which == "kc" and x.vc or x.kc
    local dt = other(x.rng, { "f32", "f16", "bf16", "i32", "fp8_e4m3", "fp8_e5m2" },
      is_tensor(keep) and keep.dtype or x.dt)
    x[which] = tensor(x, x.inputs.k_cache.shape, dt)
  end },
  { name = "cache_shape", kind = "fail", apply = function(x)
    local s = shape_plus(x.inputs.k_cache.shape, x.rng:int(1, 4), pick(x.rng, { 1, -1 }))
    if s[2] == 0 or s[1] == 0 then s = shape_plus(x.inputs.k_cache.shape, 4, 1) end
    if chance(x.rng, 0.5) then x.vc = tensor(x, s) else x.kc = tensor(x, s) end
    if chance(x.rng, 0.2) then x.vc = tensor(x, { s[1], s[2], s[3] }) end
  end },
  { name = "same_cache", kind = "fail", apply = function(x) x.vc = x.kc end },
  { name = "cache_not_tensor", kind = "fail", apply = function(x)
    if chance(x.rng, 0.5) then x.kc = nil else x.vc = pick(x.rng, { {}, 3 }) end
  end },
  { name = "zero_page_size", kind = "fail", apply = function(x)
    if not x.f.ps then return false end
    local s = copy_list(x.inputs.k_cache.shape)
    s[2] = 0
    x.kc, x.vc = tensor(x, s), tensor(x, s)
  end },
  -- new k/v
  { name = "kv_half", kind = "fail", apply = function(x)
    -- one of k and v, whatever was there before
    local s = x.c.form == "varlen" and { x.f.total_q, x.f.Hk, x.f.D } or { x.f.B, 1, x.f.Hk, x.f.D }
    local given = x.opts.k or x.opts.v or tensor(x, s)
    if chance(x.rng, 0.5) then x.opts.k, x.opts.v = given, nil else x.opts.k, x.opts.v = nil, given end
  end },
  { name = "kv_shape", kind = "fail", apply = function(x)
    local s = x.c.form == "varlen" and { x.f.total_q, x.f.Hk, x.f.D } or { x.f.B, x.f.s_new or 1, x.f.Hk, x.f.D }
    local s2 = shape_plus(s, x.rng:int(1, #s), 1)
    if chance(x.rng, 0.3) then s2 = { s[1], s[2] } end
    if chance(x.rng, 0.5) then x.opts.k, x.opts.v = tensor(x, s2), tensor(x, s)
    else x.opts.k, x.opts.v = tensor(x, s), tensor(x, s2) end
  end },
  { name = "kv_dtype", kind = "fail", apply = function(x)
    local s = x.c.form == "varlen" and { x.f.total_q, x.f.Hk, x.f.D } or { x.f.B, x.f.s_new or 1, x.f.Hk, x.f.D }
    local dt = other(x.rng, { "f32", "f16", "bf16", "i32" }, x.dt)
    x.opts.k, x.opts.v = tensor(x, s, dt), tensor(x, s, dt)
    if x.c.form == "kvcache" and not x.opts.cache_seqlens then x.opts.cache_seqlens = 0 end
  end },
  -- block table
  { name = "bt_dtype", kind = "fail", apply = function(x)
    if not x.f.ps then return false end
    local bt = x.inputs.opts.block_table
    x.opts.block_table = assert(pa.from_table(bt.data, bt.shape, pick(x.rng, { "f32", "f16" }), x.dev))
  end },
  { name = "bt_shape", kind = "fail", apply = function(x)
    if not x.f.ps then return false end
    local r = x.rng:int(1, 3)
    if r == 1 then x.opts.block_table = ints(x, { 0 }, { 1 })
    elseif r == 2 then x.opts.block_table = tensor(x, { x.f.B + 1, x.f.width }, "i32")
    else x.opts.block_table = tensor(x, { x.f.B, 1, x.f.width }, "i32") end
  end },
  { name = "bt_entry_outside", kind = "fail", apply = function(x)
    x.needs_work = true
    if not x.f.ps or x.f.max_pages == 0 then return false end
    local rows = {}
    for b = 1, x.f.B do if x.f.pages[b] > 0 then rows[#rows + 1] = b end end
    local b = pick(x.rng, rows)
    local j = x.rng:int(1, x.f.pages[b])
    local vals = copy_list(x.inputs.opts.block_table.data)
    vals[(b - 1) * x.f.width + j] = pick(x.rng, { x.f.num_pages, x.f.num_pages + 1, -1, I32_MIN, I32_MAX, MAXSEQ })
    x.opts.block_table = ints(x, vals, { x.f.B, x.f.width })
  end },
  { name = "bt_too_narrow", kind = "fail", apply = function(x)
    x.needs_work = true
    if not x.f.ps or x.f.max_pages == 0 then return false end
    local w = x.f.max_pages - 1
    local vals = {}
    for b = 1, x.f.B do for j = 1, w do vals[#vals + 1] = x.inputs.opts.block_table.data[(b - 1) * x.f.width + j] end end
    x.opts.block_table = ints(x, vals, { x.f.B, w })
  end },
  { name = "bt_with_contiguous_idx", kind = "fail", apply = function(x)
    if not x.f.ps or x.opts.block_table == nil then return false end
    local idx = {}
    for b = 1, x.f.B do idx[b] = 0 end
    x.opts.cache_batch_idx = ints(x, idx)
  end },
  -- key counts
  { name = "seqlens_beyond", kind = "fail", apply = function(x)
    x.needs_work = true
    if x.c.form ~= "kvcache" then return false end
    local vals = copy_list(x.c.before)
    local b = x.rng:int(1, x.f.B)
    local nn = x.f.s_new or 0
    vals[b] = pick(x.rng, { x.f.capacity - nn + 1, x.f.capacity - nn + x.rng:int(2, 40), NEAR_LIMITS[x.rng:int(1, #NEAR_LIMITS)] })
    if vals[b] >= 0 and vals[b] + nn <= x.f.capacity then vals[b] = x.f.capacity + 1 end
    x.opts.cache_seqlens = ints(x, vals)
  end },
  { name = "seqlens_number", kind = "fail", apply = function(x)
    x.needs_work = true
    if x.c.form ~= "kvcache" then return false end
    local nn = x.f.s_new or 0
    x.opts.cache_seqlens = pick(x.rng, { -1, 1.5, 2 ^ 31, 2 ^ 32 + 1, 2 ^ 62, 2 ^ 63, 1 / 0, -1 / 0, 0 / 0,
      MAXSEQ + 1, x.f.capacity - nn + 1, "3", true })
  end },
  { name = "seqlens_tensor_shape", kind = "fail", apply = function(x)
    if x.c.form ~= "kvcache" then return false end
    local r = x.rng:int(1, 3)
    if r == 1 then x.opts.cache_seqlens = tensor(x, { x.f.B + 1 }, "i32")
    elseif r == 2 then x.opts.cache_seqlens = tensor(x, { x.f.B }, "f32")
    else x.opts.cache_seqlens = tensor(x, { x.f.B, 1 }, "i32") end
  end },
  { name = "seqlens_missing_with_k", kind = "fail", apply = function(x)
    if x.c.form ~= "kvcache" or not x.opts.k then return false end
    x.opts.cache_seqlens = nil
  end },
  { name = "seqused_bad", kind = "fail", apply = function(x)
    x.needs_work = true
    if x.c.form ~= "varlen" then return false end
    local vals = copy_list(x.inputs.opts.seqused_k.data)
    local b = x.rng:int(1, x.f.B)
    local nn = x.c.append and x.c.new[b] or 0
    local choices = { -1, I32_MIN, x.f.capacity + 1, MAXSEQ + 1, I32_MAX }
    if nn > 0 then choices[#choices + 1] = nn - 1 end
    vals[b] = pick(x.rng, choices)
    x.opts.seqused_k = ints(x, vals)
  end },
  { name = "cu_bad", kind = "fail", apply = function(x)
    if x.c.form ~= "varlen" then return false end
    local cu = copy_list(x.inputs.opts.cu_seqlens_q.data)
    local r = x.rng:int(1, 6)
    if r == 1 then cu[1] = pick(x.rng, { 1, -1, I32_MIN })
    elseif r == 2 then cu[#cu] = cu[#cu] + pick(x.rng, { 1, -1, I32_MAX - cu[#cu] })
      if cu[#cu] < 0 then cu[#cu] = cu[#cu] + 2 end
    elseif r == 3 then
      if #cu < 3 or cu[2] == 0 then cu[#cu] = cu[#cu] + 1 else cu[2] = cu[2] + cu[#cu] + 1 end -- decreasing after, or wrong total
    elseif r == 4 then x.opts.cu_seqlens_q = tensor(x, { 0 }, "i32") return
    elseif r == 5 then x.opts.cu_seqlens_q = assert(pa.from_table(cu, { #cu }, "f32", x.dev)) return
    else cu[#cu + 1] = cu[#cu] end -- B + 2 entries: seqused_k no longer matches
    x.opts.cu_seqlens_q = ints(x, cu)
  end },
  { name = "max_seqlen_q_bad", kind = "fail", apply = function(x)
    if x.c.form ~= "varlen" then return false end
    local choices = { -1, 0.5, 2 ^ 31, 0 / 0, 1 / 0, "8" }
    if x.f.max_q >= 2 then choices[#choices + 1] = x.f.max_q - 1 end
    x.opts.max_seqlen_q = pick(x.rng, choices)
  end },
  { name = "varlen_missing", kind = "fail", apply = function(x)
    if x.c.form ~= "varlen" then return false end
    x.opts[chance(x.rng, 0.5) and "cu_seqlens_q" or "seqused_k"] = nil
  end },
  { name = "batch_idx_bad", kind = "fail", apply = function(x)
    if x.f.ps then return false end
    local idx = {}
    for b = 1, x.f.B do idx[b] = x.rng:int(0, x.f.cache_rows - 1) end
    idx[x.rng:int(1, x.f.B)] = pick(x.rng, { -1, x.f.cache_rows, I32_MAX, I32_MIN })
    x.opts.cache_batch_idx = ints(x, idx)
  end },
  -- rotary
  { name = "rotary_bad", kind = "fail", apply = function(x)
    local half = math.max(1, floor(x.f.D / 2))
    local rows = math.max(1, x.f.last_pos + 1)
    local r = x.rng:int(1, 7)
    local cs, sn = { rows, half }, { rows, half }
    local dt = "f32"
    if not x.opts.k then r = 8 -- rotary without new k/v
    elseif r == 1 then cs, sn = { 0, half }, { 0, half }
    elseif r == 2 then cs, sn = { rows, 0 }, { rows, 0 }
    elseif r == 3 then cs, sn = { rows, floor(x.f.D / 2) + 1 }, { rows, floor(x.f.D / 2) + 1 }
    elseif r == 4 then if x.f.last_pos < 1 then return false end x.needs_work = true; cs, sn = { x.f.last_pos, half }, { x.f.last_pos, half }
    elseif r == 5 then sn = { rows + 1, half }
    elseif r == 6 then dt = "i32"
    else x.opts.rotary_cos, x.opts.rotary_sin = tensor(x, cs), nil return end
    x.opts.rotary_cos, x.opts.rotary_sin = tensor(x, cs, dt), tensor(x, sn, dt)
  end },
  -- other options
  { name = "alibi_bad", kind = "fail", apply = function(x)
    local r = x.rng:int(1, 4)
    if r == 1 then x.opts.alibi_slopes = tensor(x, { x.f.H + 1 }, "f32")
    elseif r == 2 then x.opts.alibi_slopes = tensor(x, { x.f.B + 1, x.f.H }, "f32")
    elseif r == 3 then x.opts.alibi_slopes = tensor(x, { x.f.H }, pick(x.rng, { "f16", "bf16", "i32" }))
    else x.opts.alibi_slopes = tensor(x, { 1, x.f.B, x.f.H }, "f32") end
  end },
  { name = "window_bad", kind = "fail", apply = function(x)
    x.opts.window_size = pick(x.rng, { { -2, 0 }, { 0, -5 }, { 1.5, 0 }, { 2 ^ 31, 0 }, { 0, 2 ^ 32 },
      { 0 / 0, 1 }, { 1 / 0, 0 }, { 1 }, "x", { -1, I32_MIN }, { "1", 0 } })
  end },
  { name = "softcap_bad", kind = "fail", apply = function(x)
    x.opts.softcap = pick(x.rng, { -1, 1 / 0, 0 / 0, -1e-30, 1e39, "5" })
  end },
  { name = "scale_bad", kind = "fail", apply = function(x)
    -- (NaN too: the C default's sentinel, refused from Lua)
    x.opts.softmax_scale = pick(x.rng, { 1 / 0, -1 / 0, 0 / 0, 1e39, -1e39, "0.3", {} })
  end },
  { name = "num_splits_bad", kind = "fail", apply = function(x)
    x.opts.num_splits = pick(x.rng, { -1, 1.5, 2 ^ 31, 0 / 0, 1 / 0, "2" })
  end },
  { name = "unknown_option", kind = "fail", apply = function(x)
    local name = pick(x.rng, { "casual", "block_tables", "seqlens", "lse", "scale",
      x.c.form == "varlen" and "cache_seqlens" or "cu_seqlens_q", x.c.form == "varlen" and "cache_seqlen" or "seqused_k" })
    x.extra_args[name] = true
    x.opts[name] = pick(x.rng, { true, 1, tensor(x, { 1 }, "i32") })
  end },
  { name = "option_type", kind = "fail", apply = function(x)
    local r = x.rng:int(1, 6)
    if r == 1 then x.opts.causal = pick(x.rng, { 1, "yes" })
    elseif r == 2 then x.opts.rotary_interleaved = "no"
    elseif r == 3 then x.opts.return_softmax_lse = 1
    elseif r == 4 then x.opts.k = "tensor"
    elseif r == 5 then x.opts.out = {}
    else x.opts.block_table = pick(x.rng, { 7, "bt", { { 0, 1 }, "row" } }) end
  end },
  { name = "opts_not_table", kind = "fail", order = 5, apply = function(x)
    x.opts = pick(x.rng, { "opts", 5, true })
  end },
  { name = "lua_table_bad", kind = "fail", apply = function(x)
    local bad = pick(x.rng, { 1.5, "x", 2 ^ 31, -2 ^ 31 - 1, 0 / 0, 1 / 0, {} })
    if x.c.form == "kvcache" and chance(x.rng, 0.5) then
      local v = copy_list(x.c.before)
      v[x.rng:int(1, #v)] = bad
      x.opts.cache_seqlens = v
    elseif x.f.ps then
      local rows = {}
      for b = 1, x.f.B do rows[b] = {} for j = 1, x.f.width do rows[b][j] = 0 end end
      if x.f.max_pages > 0 then
        local b = x.rng:int(1, x.f.B)
        rows[b][x.rng:int(1, x.f.width)] = bad
      else
        rows[x.rng:int(1, x.f.B)] = "row"
      end
      x.opts.block_table = rows
    else
      local idx = {}
      for b = 1, x.f.B do idx[b] = 0 end
      idx[x.rng:int(1, x.f.B)] = bad
      x.opts.cache_batch_idx = idx
    end
  end },
  -- out
  { name = "out_bad", kind = "fail", apply = function(x)
    local r = x.rng:int(1, 5)
    local s = x.inputs.q.shape -- (not q's: another mutation may have made it huge and empty)
    if r == 1 then x.opts.out = tensor(x, shape_plus(s, x.rng:int(1, #s), 1))
    elseif r == 2 then x.opts.out = tensor(x, s, other(x.rng, { "f32", "f16", "bf16", "i32" }, x.dt))
    elseif r == 3 then x.opts.out = x.q
    elseif r == 4 then x.opts.out = x.kc
    else x.opts.out = x.vc end
  end },
  -- dead tensors
  { name = "freed_tensor", kind = "fail", apply = function(x)
    local slots = { "q", "kc", "vc" }
    for _, k in ipairs({ "k", "v", "block_table", "cache_seqlens", "seqused_k", "cu_seqlens_q",
      "rotary_cos", "alibi_slopes", "out", "cache_batch_idx", "kv_indptr", "kv_indices", "kv_last_page_len" }) do
      if is_tensor(x.opts[k]) then slots[#slots + 1] = "opts." .. k end
    end
    local s = pick(x.rng, slots)
    if s:sub(1, 5) == "opts." then x.opts[s:sub(6)] = freed(x, x.opts[s:sub(6)])
    else x[s] = freed(x, x[s]) end
  end },
  { name = "dead_batch_view", kind = "fail", apply = function(x)
    if x.f.ps then x.opts.block_table = dead_view(x, "block_table")
    elseif x.c.form == "kvcache" then x.opts.cache_seqlens = dead_view(x, "cache_seqlens")
    else x.opts[pick(x.rng, { "seqused_k", "cu_seqlens_q" })] = dead_view(x, "seqused_k") end
  end },
  -- an index tensor rewritten after a first, valid call with it: checks made
  -- (or cached) for the first call must not let the second through
  { name = "index_rewritten_after_a_call", kind = "fail", deferred = true, apply = function(x)
    local targets = {}
    if x.f.ps and x.f.max_pages > 0 then targets[#targets + 1] = "block_table" end
    if x.c.form == "kvcache" and is_tensor(x.opts.cache_seqlens) then targets[#targets + 1] = "cache_seqlens" end
    if x.c.form == "varlen" then targets[#targets + 1] = "seqused_k" end
    if #targets == 0 then return false end
    local which = pick(x.rng, targets)
    x.needs_work = true
    x.pre = function()
      -- (another mutation may have made this first call invalid too: then
      -- it is just one more refused call, and the second is judged alone)
      pcall(x.fn, x.q, x.kc, x.vc, x.opts)
      if type(x.opts) ~= "table" then return false end
      local t = x.opts[which]
      if not is_tensor(t) or t.handle == nil then return end
      local at, value
      if which == "block_table" then
        local b
        repeat b = x.rng:int(1, x.f.B) until x.f.pages[b] > 0
        at, value = (b - 1) * x.f.width + x.rng:int(0, x.f.pages[b] - 1), pick(x.rng, { -1, x.f.num_pages, I32_MAX })
      else
        at, value = x.rng:int(0, x.f.B - 1), pick(x.rng, { -1, x.f.capacity + 1, MAXSEQ + 1, I32_MAX })
      end
      if at >= t.numel then return false end -- (another mutation emptied it)
      if x.dev.name:match("^cpu") and chance(x.rng, 0.3) then
        -- through the data's address, which the library cannot see (so it
        -- must stop trusting what it knew of the tensor when it handed it out);
        -- the CPU devices' memory is the host's
        ffi.cast("int32_t *", t:data_ptr())[at] = value
      else
        assert(t:write({ value }, at))
      end
      return true
    end
  end },

  -- the CSR form of the pages (kv_indptr, kv_indices, kv_last_page_len)
  { name = "csr_bad", kind = "fail", apply = function(x)
    if not x.f.ps then return false end
    local ip, ix, last = csr_of(x)
    local r = x.rng:int(1, 12)
    if r == 1 then ip[1] = pick(x.rng, { 1, -1, I32_MIN })
    elseif r == 2 then -- decreasing
      if #ip >= 3 then ip[2] = ip[3] + 1 else ip[2] = -1 end
    elseif r == 3 then ip[#ip] = #ix + x.rng:int(1, 3) -- past kv_indices' end
    elseif r == 4 then ip[#ip + 1] = ip[#ip] -- [B + 2]
    elseif r == 5 then set_csr(x, ip, ix) x.opts.kv_indices = nil return
    elseif r == 6 then set_csr(x, ip, ix) x.opts.kv_indptr = nil return
    elseif r == 7 then -- both forms
      set_csr(x, ip, ix)
      x.opts.block_table = ints(x, x.inputs.opts.block_table.data, x.inputs.opts.block_table.shape)
      return
    elseif r == 8 then set_csr(x, ip, ix) x.opts.kv_indptr = assert(pa.from_table(ip, { #ip }, "f32", x.dev)) return
    elseif r == 9 then -- a wrong last page length (checked against the keys attended)
      x.needs_work = true
      local b = x.rng:int(1, x.f.B)
      last[b] = last[b] + pick(x.rng, { 1, -1, x.f.ps, I32_MAX - last[b] })
      set_csr(x, ip, ix, last)
      return
    elseif r == 10 then -- kv_last_page_len with a block table
      x.opts.kv_indptr, x.opts.kv_indices = nil, nil
      x.opts.block_table = ints(x, x.inputs.opts.block_table.data, x.inputs.opts.block_table.shape)
      x.opts.kv_last_page_len = ints(x, last)
      return
    elseif r == 11 then -- a page outside the pool
      if #ix == 0 then return false end
      x.needs_work = true
      ix[x.rng:int(1, #ix)] = pick(x.rng, { -1, x.f.num_pages, I32_MAX, I32_MIN })
    else
      -- a sequence's list a page short of what its keys need (any row: the
      -- call must refuse it, kv_indptr)
      local rows = {}
      for b = 1, x.f.B do
        local ok = x.f.pages[b] > 0
        if ok then rows[#rows + 1] = b end
      end
      if #rows == 0 then return false end
      x.needs_work = true
      local b = pick(x.rng, rows)
      table.remove(ix, ip[b + 1])
      for j = b + 1, #ip do ip[j] = ip[j] - 1 end
    end
    set_csr(x, ip, ix, chance(x.rng, 0.5) and last or nil)
  end },

  -- kind "same": another spelling of the same call
  { name = "csr_form", kind = "same", apply = function(x)
    -- the pages in CSR form: each sequence's own, or a few more (never read)
    if not x.f.ps then return false end
    local ip, ix, last = csr_of(x, pick(x.rng, { 0, 0, 1, 3 }))
    set_csr(x, ip, ix, chance(x.rng, 0.5) and last or nil)
    -- the call's capacity is now the longest list's
    local widest = 0
    for b = 1, x.f.B do widest = math.max(widest, ip[b + 1] - ip[b]) end
    x.f.capacity = widest * x.f.ps
  end },
  { name = "lua_tables_for_indices", kind = "same", apply = function(x)
    local io = x.inputs.opts
    if x.opts.kv_indptr then -- (the CSR form replaced the table)
      for _, k in ipairs({ "kv_indptr", "kv_indices", "kv_last_page_len" }) do
        if is_tensor(x.opts[k]) then x.opts[k] = x.opts[k]:to_table() end
      end
    elseif x.f.ps then
      local rows = {}
      for b = 1, x.f.B do
        rows[b] = {}
        for j = 1, x.f.width do rows[b][j] = io.block_table.data[(b - 1) * x.f.width + j] end
      end
      x.opts.block_table = rows
    end
    if x.c.form == "kvcache" then
      local cs = copy_list(io.cache_seqlens.data)
      local uniform = true
      for b = 2, #cs do if cs[b] ~= cs[1] then uniform = false end end
      x.opts.cache_seqlens = (uniform and chance(x.rng, 0.5)) and cs[1] or cs
      if io.cache_batch_idx then x.opts.cache_batch_idx = copy_list(io.cache_batch_idx.data) end
    else
      x.opts.cu_seqlens_q = copy_list(io.cu_seqlens_q.data)
      x.opts.seqused_k = copy_list(io.seqused_k.data)
    end
    if io.alibi_slopes and #io.alibi_slopes.shape == 1 then x.opts.alibi_slopes = copy_list(io.alibi_slopes.data) end
  end },
  { name = "num_splits_huge", kind = "same", apply = function(x)
    x.opts.num_splits = pick(x.rng, { 64, 1000, I32_MAX })
  end },
  { name = "scale_zero_or_tiny", kind = "same", apply = function(x)
    local s = pick(x.rng, { 0, 1e-40, -0.25, 2 ^ -126 })
    x.opts.softmax_scale, x.inputs.opts.softmax_scale = s, s
  end },
  { name = "window_huge", kind = "same", apply = function(x)
    local w = { pick(x.rng, { -1, MAXSEQ, I32_MAX }), pick(x.rng, { -1, MAXSEQ, I32_MAX }) }
    x.opts.window_size, x.inputs.opts.window_size = w, { w[1], w[2] }
  end },
  { name = "max_seqlen_q_hint", kind = "same", apply = function(x)
    if x.c.form ~= "varlen" then return false end
    x.opts.max_seqlen_q = pick(x.rng, { 0, x.f.max_q, x.f.max_q + 1, I32_MAX })
  end },
  { name = "bt_padding_garbage", kind = "same", apply = function(x)
    -- columns past every sequence's last page are never read: any value goes
    if not x.f.ps then return false end
    local extra = x.rng:int(1, 3)
    local w = x.f.width + extra
    local vals, old = {}, x.inputs.opts.block_table.data
    for b = 1, x.f.B do
      for j = 1, w do
        vals[(b - 1) * w + j] = j <= x.f.width and old[(b - 1) * x.f.width + j]
          or pick(x.rng, { -1, I32_MIN, I32_MAX, x.f.num_pages })
      end
    end
    x.opts.block_table = ints(x, vals, { x.f.B, w })
    x.inputs.opts.block_table = ref.tensor({ x.f.B, w }, vals)
    x.f.width, x.f.capacity = w, w * x.f.ps
  end },
  { name = "scale_as_list", kind = "same", apply = function(x)
    -- a scale per kv head as a Lua list instead of an f32 tensor
    local sc = x.inputs.opts.k_scale
    if type(sc) ~= "table" then return false end
    x.opts.k_scale = copy_list(sc.data)
  end },
  { name = "out_given", kind = "same", apply = function(x)
    x.opts.out = tensor(x, x.inputs.q.shape):fill(0 / 0)
  end },

  -- fp8 caches' scales
  { name = "scale_bad", kind = "fail", apply = function(x)
    if not x.c.cache_dtype or x.c.cache_dtype == x.dt then return false end
    local name = pick(x.rng, { "k_scale", "v_scale" })
    x.opts[name] = pick(x.rng, { 0, -0.5, 0 / 0, 1 / 0, -1 / 0, 1e39, "2", true })
  end },
  { name = "scale_per_head_shape", kind = "fail", apply = function(x)
    if not x.c.cache_dtype or x.c.cache_dtype == x.dt then return false end
    local name = pick(x.rng, { "k_scale", "v_scale" })
    local Hk = x.f.Hk
    local vals = {}
    for h = 1, Hk + 1 do vals[h] = 0.5 end
    x.opts[name] = pick(x.rng, {
      assert(pa.from_table(vals, { Hk + 1 }, "f32", x.dev)),           -- one too many
      assert(pa.from_table({ 0.5 }, { 1, 1 }, "f32", x.dev)),          -- rank 2
      assert(pa.tensor({ Hk }, "f16", x.dev)),                         -- not f32
      vals,                                                            -- a list of Hk + 1
      { 0.5, -1, 2, 2, 2, 2 },                                         -- a bad element (or the wrong length)
    })
  end },
  { name = "scale_without_fp8", kind = "fail", apply = function(x)
    if x.c.cache_dtype and x.c.cache_dtype ~= x.dt then return false end
    x.opts[pick(x.rng, { "k_scale", "v_scale" })] = pick(x.rng, { 0.5, 2 })
  end },

  -- kind "pass": legal calls outside what check builds
  { name = "zero_batch", kind = "pass", apply = function(x)
    -- B = 0 throughout: nothing to do, nothing to check but the shapes
    local q = copy_list(x.inputs.q.shape)
    if x.c.form == "varlen" then
      q[1] = 0
      x.opts.cu_seqlens_q = ints(x, { 0 })
      x.opts.seqused_k = tensor(x, { 0 }, "i32")
      if x.opts.k then x.opts.k, x.opts.v = tensor(x, { 0, x.f.Hk, x.f.D }), tensor(x, { 0, x.f.Hk, x.f.D }) end
    else
      q[1] = 0
      x.opts.cache_seqlens = tensor(x, { 0 }, "i32")
      if x.opts.k then
        local s = copy_list(x.opts.k.shape)
        s[1] = 0
        x.opts.k, x.opts.v = tensor(x, s), tensor(x, s)
      end
    end
    x.q = tensor(x, q)
    x.f.max_q = 0 -- (no sequence: any max_seqlen_q >= 0 is right now)
    x.opts.out = nil
    if not x.f.ps then x.opts.cache_batch_idx = tensor(x, { 0 }, "i32") end -- (else B_cache must be 0)
    if x.opts.kv_indptr then
      x.opts.kv_indptr, x.opts.kv_indices = ints(x, { 0 }), tensor(x, { 0 }, "i32")
      if x.opts.kv_last_page_len then x.opts.kv_last_page_len = tensor(x, { 0 }, "i32") end
    elseif x.f.ps then
      x.opts.block_table = tensor(x, { 0, pick(x.rng, { 0, x.f.width, 2 ^ 40, 2 ^ 62 }) }, "i32")
    end
    if is_tensor(x.opts.alibi_slopes) and #x.opts.alibi_slopes.shape == 2 then
      x.opts.alibi_slopes = tensor(x, { 0, x.f.H }, "f32")
    end
    x.f.work = false
  end },
  { name = "no_queries_huge_batch", kind = "pass", apply = function(x)
    -- a huge batch of empty sequences must cost nothing (it took 13 s and 5 GB)
    if x.c.form ~= "kvcache" or not x.f.ps then return false end -- (a contiguous cache of B rows is too big)
    local B = pick(x.rng, { 2 ^ 27 - 1, I32_MAX })
    x.q = tensor(x, { B, 0, x.f.H, x.f.D })
    x.opts = { cache_seqlens = 0, causal = x.opts.causal, block_table = tensor(x, { B, 0 }, "i32") }
    x.f.work = false
  end },
  { name = "special_values", kind = "pass", apply = function(x)
    -- NaN and inf are values like others: no promise about the output
    local target = pick(x.rng, { "q", "kc", "vc" })
    local t = x[target]:clone()
    local n = t.numel
    if n == 0 then return false end
    for _ = 1, x.rng:int(1, 4) do
      assert(t:write({ pick(x.rng, { 0 / 0, 1 / 0, -1 / 0, DTYPE_MAX[x.dt], -DTYPE_MAX[x.dt] }) }, x.rng:int(0, n - 1)))
    end
    x[target] = t
    x.values_void = true -- (v_near_max's promise no longer holds)
  end },
  { name = "v_near_max", kind = "pass", apply = function(x)
    -- out is a convex combination of v rows: finite while v is (issue 46, 9);
    -- (an fp8 cache's values are cache x v_scale: past any bound written here)
    if x.c.cache_dtype and x.c.cache_dtype ~= x.dt then return false end
    local big = DTYPE_MAX[x.dt] * pick(x.rng, { 0.5, 0.9 })
    local function scaled(t)
      local vals = t:to_table()
      for i = 1, #vals do vals[i] = vals[i] >= 0 and big or -big end
      local n = t:clone()
      assert(n:write(vals))
      return n
    end
    x.vc = scaled(x.vc)
    if is_tensor(x.opts.v) then x.opts.v = scaled(x.opts.v) end
    x.post = function(out)
      local vals = out:to_table()
      for i = 1, #vals do
        local y = vals[i]
        if y ~= y or math.abs(y) > big * 1.01 then
          return string.format("out element %d is %s with every |v| = %g (a convex combination of v)", i - 1, tostring(y), big)
        end
      end
    end
  end },

  -- kind "any": no promise either way, only no crash and no damage when refused
  { name = "alias_new_kv", kind = "any", apply = function(x)
    if not x.opts.k then return false end
    local r = x.rng:int(1, 3)
    if r == 1 then x.opts.v = x.opts.k
    elseif r == 2 then x.opts.out = x.opts.k
    else x.opts.k = x.q end
    x.no_readonly_check, x.values_void = true, true
  end },
  { name = "alias_cache", kind = "any", apply = function(x)
    local r = x.rng:int(1, 2)
    if r == 1 then x.q = x.kc else x.opts.k = x.kc end
    x.no_readonly_check, x.values_void = true, true
  end },
  { name = "swap_tensors", kind = "any", apply = function(x)
    -- two tensor arguments swapped: some swaps are legal (k_cache and v_cache)
    local slots = { "q", "kc", "vc" }
    for _, k in ipairs({ "k", "v", "block_table", "cache_seqlens", "seqused_k", "cu_seqlens_q", "rotary_cos",
      "rotary_sin", "alibi_slopes", "out", "cache_batch_idx" }) do
      if is_tensor(x.opts[k]) then slots[#slots + 1] = "opts." .. k end
    end
    local function get(s) if s:sub(1, 5) == "opts." then return x.opts[s:sub(6)] end return x[s] end
    local function set(s, v) if s:sub(1, 5) == "opts." then x.opts[s:sub(6)] = v else x[s] = v end end
    local a = x.rng:int(1, #slots)
    local b = x.rng:int(1, #slots - 1)
    if b >= a then b = b + 1 end
    local ta, tb = get(slots[a]), get(slots[b])
    set(slots[a], tb)
    set(slots[b], ta)
    x.no_readonly_check, x.values_void = true, true
  end },
  { name = "drop_block_table", kind = "any", apply = function(x)
    if not x.f.ps then return false end
    x.opts.block_table = nil
    x.values_void = true
  end },
}

local RANK = { same = 1, pass = 2, any = 3, fail = 4 }

local function count(t, k) t[k] = (t[k] or 0) + 1 end

-- Library bugs this fuzzer found and steps around, so that CI stays useful
-- until they are fixed (each has a failing spec in the fuzzers' commit).
M.KNOWN_BUGS = {
  -- (the six this fuzzer and the pool's found first are fixed, each with a
  -- case in spec/hardening_spec.lua's "found by the fuzzers")
  huge_batch_with_k = { "no_queries_huge_batch", {} },
}

-- Bugs known by their message: such a refusal is counted in s.known (the
-- call still must change nothing) instead of failing the run, unless
-- run{strict = true} (scripts/fuzz.lua --strict).
M.KNOWN_MESSAGES = {}

-- The known bug a message shows, when the run steps around known bugs.
local function known_bug(st, msg)
  if st.strict or type(msg) ~= "string" then return nil end
  for _, k in ipairs(M.KNOWN_MESSAGES) do
    if msg:find(k.pattern) then
      count(st.known, k.name)
      return k.name
    end
  end
end
M.MUTATIONS = MUTATIONS

---------------------------------------------------------------------------
-- one direct call: build, mutate, call, judge

local function fail_case(st, x, msg)
  error(string.format("attention fuzzer: %s\n  case %d (case seed %d) on %s: %s\n  mutations: %s\n  seed %d\n  rerun: %s",
    msg, x.index, x.case_seed, st.device.name, x.describe, #x.applied > 0 and table.concat(x.applied, ", ") or "none",
    st.seed, M.rerun(st.seed, st.iters, st.device.name, x.index)), 0)
end

-- A small random valid case (small enough for the Lua reference).
local function small_case(rng)
  local mode = pick(rng, { "decode", "prefill", "chunked", "read" })
  local want = {
    mode = mode, D = pick(rng, { 1, 2, 3, 8, 16, 37, 64 }), B = rng:int(1, 4), Hk = pick(rng, { 1, 2 }),
    group = pick(rng, { 1, 2, 4 }), max_keys = pick(rng, { 12, 40, 64 }),
    page_size = pick(rng, { 0, 1, 3, 16, 5 }),
  }
  if mode == "prefill" or mode == "chunked" then want.new = rng:int(1, math.min(16, want.max_keys - 1)) end
  local fp8 = chance(rng, 0.25) and pick(rng, { "fp8_e4m3", "fp8_e5m2" }) or nil
  local c = check.random_case(rng, want)
  if fp8 then -- (drawn after the case, so the 16-bit cases are the ones drawn before)
    c.cache_dtype, c.fp8_range = fp8, pick(rng, { "normal", "normal", "saturate", "subnormal" })
    c.k_scale = chance(rng, 0.3) and "head" or pick(rng, { 1, 0.5, 3.7 })
    c.v_scale = chance(rng, 0.3) and "head" or pick(rng, { 1, 0.25, 2 })
  end
  return c
end

-- How the call turned out: "ok", "refused" (raised) or "runtime" (nil, err).
local function judge(st, x, kind)
  local fname = x.c.form == "varlen" and "attention_varlen" or "attention_with_kvcache"
  local all = call_tensors({ q = x.q, kc = x.kc, vc = x.vc, opts = x.opts })
  local snap = snapshot(all)
  local ok, out, lse = pcall(x.fn, x.q, x.kc, x.vc, x.opts)
  if not ok then
    local arg, why = parse_error(out, { fname }, x.extra_args)
    if not arg and not known_bug(st, out) then fail_case(st, x, why .. ":\n    " .. tostring(out)) end
    count(st.args, arg or "(known bug)")
    local d = difference(snap)
    if d then fail_case(st, x, "a refused call changed " .. d .. "\n    (" .. tostring(out) .. ")") end
    if kind == "same" or kind == "pass" then fail_case(st, x, "a valid call was refused: " .. tostring(out)) end
    return "refused"
  end
  if out == nil then
    if type(lse) ~= "string" or not lse:find("^pagedattn%." .. fname .. ": ") then
      fail_case(st, x, "nil without a 'pagedattn." .. fname .. ": ' message: " .. tostring(lse))
    end
    local d = difference(snap)
    if d then fail_case(st, x, "a call that returned nil, err changed " .. d .. "\n    (" .. lse .. ")") end
    if kind == "same" or kind == "pass" then fail_case(st, x, "a valid call failed: " .. lse) end
    return "runtime"
  end
  if kind == "fail" then fail_case(st, x, "a malformed call was accepted") end
  if not is_tensor(out) or table.concat(out.shape, ",") ~= table.concat(x.q.shape, ",") then
    fail_case(st, x, "out is not a tensor of q's shape")
  end
  if not x.no_readonly_check then
    local appending = is_tensor(x.opts.k)
    local d = difference(snap, function(e)
      return e.t == out or (appending and (e.t == x.kc or e.t == x.vc))
    end)
    if d then fail_case(st, x, "a call wrote a read-only input: " .. d) end
  end
  if kind == "same" then
    local why = compare_with_reference(x, out, lse)
    if why then fail_case(st, x, why) end
  end
  if x.post and not x.values_void then
    local why = x.post(out, lse)
    if why then fail_case(st, x, why) end
  end
  return "ok"
end

local function direct_case(st, x, rng)
  local c = small_case(rng)
  x.c = c
  x.describe = check.describe(c)
  x.fn = c.form == "varlen" and pa.attention_varlen or pa.attention_with_kvcache
  -- a quarter of the cases go through check.run unchanged: the differential check
  if chance(rng, 0.25) then
    local okr, r = pcall(check.run, c, st.device, rng)
    if not okr then fail_case(st, x, "a valid call (check.run): " .. tostring(r)) end
    if not r.ok then fail_case(st, x, "differs from the reference: " .. r.report) end
    count(st.kinds, "valid")
    return "ok"
  end
  x.inputs = check.build(c, rng)
  x.q, x.kc, x.vc, x.opts = materialise(c, x.inputs, st.device)
  x.f = facts(c, x.inputs)
  x.dt = c.dtype
  -- one mutation mostly, sometimes two or three; "same" ones alone now and then
  local n = pick(rng, { 1, 1, 1, 1, 1, 2, 2, 3 })
  local chosen, names = {}, {}
  local tries = 0
  while #chosen < n and tries < 50 do
    tries = tries + 1
    local m = MUTATIONS[rng:int(1, #MUTATIONS)]
    if not names[m.name] then
      names[m.name] = true
      chosen[#chosen + 1] = m
    end
  end
  if names.no_queries_huge_batch then
    local kept = {}
    for _, m in ipairs(chosen) do
      local avoid = false
      for _, other_name in ipairs(M.KNOWN_BUGS.huge_batch_with_k[2]) do if m.name == other_name then avoid = true end end
      if not avoid then kept[#kept + 1] = m end
    end
    chosen = kept
  end
  -- the others before "fail" ones, so a spelling change cannot undo a mistake
  -- (and opts_not_table last: nothing can go into opts after it)
  table.sort(chosen, function(a, b)
    local ra, rb = a.order or RANK[a.kind], b.order or RANK[b.kind]
    if ra ~= rb then return ra < rb end
    return a.name < b.name
  end)
  -- a mutation whose every option a later one set again counts for nothing
  -- (lua_table_bad's cache_seqlens list, then seqlens_number's scalar)
  local kind = "same"
  local applied, last_writer = {}, {}
  for _, m in ipairs(chosen) do
    x.needs_work = nil
    local before, tensors = {}, { x.q, x.kc, x.vc, x.opts }
    if type(x.opts) == "table" then for key, v in pairs(x.opts) do before[key] = v end end
    if m.apply(x) ~= false then
      local k = m.kind
      if x.needs_work and not x.f.work then k = "any" end
      local me = { m = m, kind = k, keys = {}, lost = 0, at = #x.applied + 1,
        -- (one that changed q, a cache or the opts table itself always counts)
        other = x.q ~= tensors[1] or x.kc ~= tensors[2] or x.vc ~= tensors[3] or x.opts ~= tensors[4] }
      if type(x.opts) == "table" then
        for key, v in pairs(x.opts) do if before[key] ~= v then me.keys[#me.keys + 1] = key end end
        for key in pairs(before) do if x.opts[key] == nil then me.keys[#me.keys + 1] = key end end
      end
      for _, key in ipairs(me.keys) do
        if last_writer[key] then last_writer[key].lost = last_writer[key].lost + 1 end
        last_writer[key] = me
      end
      applied[#applied + 1] = me
      x.applied[#x.applied + 1] = m.name .. (k ~= m.kind and " (no work: any)" or "")
      if m.deferred and k ~= m.kind then x.pre_kind = k end
    end
  end
  for _, me in ipairs(applied) do
    if #me.keys > 0 and me.lost == #me.keys and not me.other then
      x.applied[me.at] = x.applied[me.at] .. " (overwritten)"
    elseif RANK[me.kind] > RANK[kind] and not me.m.deferred then
      kind = me.kind
    end
  end
  if #x.applied == 0 then x.applied[1] = "(none applied)" end
  -- a deferred mutation (a first call, then a rewrite) runs before the
  -- snapshot the second call is judged by, and counts only if it wrote
  if x.pre then
    local ok, wrote = pcall(x.pre)
    if not ok then fail_case(st, x, tostring(wrote)) end
    if wrote and x.pre_kind == nil then kind = "fail" end
  end
  local outcome = judge(st, x, kind)
  count(st.kinds, kind)
  for _, name in ipairs(x.applied) do
    st.mutations[name] = st.mutations[name] or { ok = 0, refused = 0, runtime = 0 }
    count(st.mutations[name], outcome)
  end
  return outcome
end

---------------------------------------------------------------------------
-- a staged batch: b:attention and b:append_kv, valid and malformed

local function batch_case(st, x, rng)
  local dev = st.device
  local dt = pick(rng, FLOATS)
  local ps, Hk, group, D = pick(rng, { 1, 3, 16 }), pick(rng, { 1, 2 }), pick(rng, { 1, 2 }), pick(rng, { 2, 4, 8, 16 })
  local H, layers, N = Hk * group, rng:int(1, 2), rng:int(4, 40)
  x.describe = string.format("batch %s page=%d H=%d/Hk=%d D=%d layers=%d pages=%d", dt, ps, H, Hk, D, layers, N)
  x.applied = {}
  local cache = assert(pa.kv_cache{ num_pages = N, page_size = ps, kv_heads = Hk, head_dim = D,
    dtype = dt, device = dev, layers = layers })
  for l = 1, layers do -- random contents: a read of a wrong slot shows
    cache.k_caches[l]:copy_from(assert(pa.randn({ N, ps, Hk, D }, dt, dev, rng:int(0, 2 ^ 30))))
    cache.v_caches[l]:copy_from(assert(pa.randn({ N, ps, Hk, D }, dt, dev, rng:int(0, 2 ^ 30))))
  end
  -- near half the batches plan shared prefixes (cascade): forks share pages
  local cascade = chance(rng, 0.45)
  local seqs = {}
  for i = 1, rng:int(1, 4) do
    local s = assert(cache:sequence())
    -- (a cascade batch's sequences mostly hold a whole page or more: shareable)
    local n = cascade and chance(rng, 0.8) and rng:int(ps, 2 * ps + 3) or rng:int(0, 2 * ps + 3)
    if s:append(n) == nil then s:free() else seqs[#seqs + 1] = s end
    if #seqs > 0 and chance(rng, cascade and 0.8 or 0.3) then
      local kid = seqs[rng:int(1, #seqs)]:fork()
      if kid then seqs[#seqs + 1] = kid end
    end
  end
  if #seqs == 0 then cache:close() return "ok" end
  local b = assert(cache:batch{ capacity = pick(rng, { 1, 64 }), cascade = cascade })
  local form = pick(rng, { "varlen", "varlen", "kvcache", "append_kv" })
  local uniform = form == "kvcache" and rng:int(1, 3) or nil
  for _, s in ipairs(seqs) do b:add(s, uniform or rng:int(form == "append_kv" and 1 or 0, 4)) end
  if not b:stage() then cache:close() count(st.kinds, "batch_out_of_pages") return "ok" end
  x.describe = x.describe .. string.format(" %s B=%d total_q=%d%s", form, b.size, b.total_q,
    cascade and string.format(" cascade (%d groups)", b:cascade_info().groups) or "")
  if cascade and b:cascade_info().groups > 0 then count(st.kinds, "batch_cascade") end
  local Tq, layer = b.total_q, rng:int(1, layers)
  local qh = ref.randn({ Tq, H, D }, rng, dt)
  local kh, vh = ref.randn({ Tq, Hk, D }, rng, dt), ref.randn({ Tq, Hk, D }, rng, dt)
  local q = form == "kvcache" and assert(pa.from_table(qh.data, { b.size, uniform, H, D }, dt, dev))
    or assert(pa.from_table(qh.data, qh.shape, dt, dev))
  local k = form == "kvcache" and assert(pa.from_table(kh.data, { b.size, uniform, Hk, D }, dt, dev))
    or assert(pa.from_table(kh.data, kh.shape, dt, dev))
  local v = form == "kvcache" and assert(pa.from_table(vh.data, { b.size, uniform, Hk, D }, dt, dev))
    or assert(pa.from_table(vh.data, vh.shape, dt, dev))

  -- the valid call, checked: appended rows in their pages, out against the
  -- reference over the caches as they are after the call
  local function valid_call()
    local out
    if form == "append_kv" then
      local ok, err = b:append_kv(k, v, { layer = layer })
      if not ok then error("append_kv failed: " .. tostring(err), 0) end
      out = assert(b:attention(q, nil, nil, { layer = layer }))
    else
      out = assert(b:attention(q, k, v, { layer = layer }))
    end
    if cascade and b:cascade_info().last == "used" then count(st.kinds, "batch_cascade_used") end
    if Tq == 0 then return end
    local kc, vc = cache.k_caches[layer], cache.v_caches[layer]
    local kall, vall = kc:to_table(), vc:to_table()
    local cu, before = b.cu_seqlens_q:to_table(), b.cache_seqlens:to_table()
    local tok = Hk * D
    for j = 1, b.size do
      local pages = seqs[j]:pages()
      for t = 0, cu[j + 1] - cu[j] - 1 do
        local pos = before[j] + t
        local base = (pages[floor(pos / ps) + 1] * ps + pos % ps) * tok
        local row = (cu[j] + t) * tok
        for e = 1, tok do
          if kall[base + e] ~= kh.data[row + e] or vall[base + e] ~= vh.data[row + e] then
            error(string.format("entry %d token %d: the appended k/v is not in its page", j, t), 0)
          end
        end
      end
    end
    local function ref_out(precision)
      return ref.attention_varlen(qh, ref.tensor(kc.shape, kall), ref.tensor(vc.shape, vall), {
        cu_seqlens_q = cu, seqused_k = b.seqused_k:to_table(), causal = true,
        block_table = ref.tensor(b.block_table.shape, b.block_table:to_table()),
        precision = precision, cache_dtype = dt })
    end
    local exact, naive = ref_out("f64"), ref_out(dt)
    local err = ref.max_abs_diff(out:to_table(), exact.data)
    local tol = ref.tolerance(dt, ref.max_abs_diff(naive.data, exact.data))
    if not (err <= tol) then
      error(string.format("out differs from the reference: max |err| %.3g > tolerance %.3g", err, tol), 0)
    end
  end

  local function pool_state()
    local s = { stats = cache:stats(), seqs = {} }
    for i, sq in ipairs(seqs) do s.seqs[i] = sq:len() .. ":" .. table.concat(sq:pages(), ",") end
    return s
  end

  local outcome = "ok"
  if chance(rng, 0.6) then
    -- malformed: must fail, change nothing; then the valid call must still be right
    local mutations = {
      { "layer_bad", function(o) o.layer = pick(rng, { 0, layers + 1, 1.5, "1" }) end },
      { "reserved_option", function(o) o[pick(rng, { "block_table", "cu_seqlens_q", "seqused_k", "cache_seqlens", "k" })] = b.block_table end },
      { "k_without_v", function(_, a) a.v = nil end, "attention" },
      { "q_ndim", function(_, a) a.q = assert(pa.tensor({ Tq, H * D }, dt, dev)) end, "attention" },
      { "q_not_tensor", function(_, a) a.q = pick(rng, { 1, {} }) end, "attention" },
      { "k_rows", function(_, a)
        local s = copy_list(k.shape)
        s[1] = s[1] + 1
        a.k, a.v = assert(pa.tensor(s, dt, dev)), assert(pa.tensor(s, dt, dev))
      end },
      { "rotary_0_rows", function(o) o.rotary_cos, o.rotary_sin = assert(pa.tensor({ 0, 1 }, dt, dev)), assert(pa.tensor({ 0, 1 }, dt, dev)) end },
      { "opts_not_table", function(_, a) a.opts = 5 end },
      { "freed_q", function(_, a) a.q = freed(x, q) end, "attention" },
      { "unknown_option", function(o) o.casual = true end },
      { "not_staged", function() b:clear() end, nil, true },
      { "added_after_stage", function() b:add(seqs[1], 1) end, nil, true },
      { "closed", function() if chance(rng, 0.5) then b:close() else cache:close() end end, nil, true },
    }
    local m = pick(rng, mutations)
    x.applied = { m[1] }
    local a, o = { q = q, k = k, v = v, opts = nil }, { layer = layer }
    a.opts = o
    local ruins = m[4]
    local all = { { name = "q", t = q }, { name = "k", t = k }, { name = "v", t = v } }
    for l = 1, layers do
      all[#all + 1] = { name = "k_caches[" .. l .. "]", t = cache.k_caches[l] }
      all[#all + 1] = { name = "v_caches[" .. l .. "]", t = cache.v_caches[l] }
    end
    local snap, pool_before = snapshot(all), pool_state()
    m[2](o, a)
    local use_append = form == "append_kv" and m[3] ~= "attention"
    local ok, r, err
    if use_append then ok, r, err = pcall(b.append_kv, b, a.k, a.v, a.opts)
    else ok, r, err = pcall(b.attention, b, a.q, a.k, a.v, a.opts) end
    local fnames = { "batch:attention", "batch:append_kv", "attention_varlen", "attention_with_kvcache" }
    if ok and r then fail_case(st, x, "a malformed batch call was accepted") end
    if not ok then
      local arg, why = parse_error(r, fnames, { casual = true })
      if not arg and not known_bug(st, r) then fail_case(st, x, why .. ":\n    " .. tostring(r)) end
      count(st.args, arg or "(known bug)")
      outcome = "refused"
    else
      if type(err) ~= "string" or not err:find("^pagedattn%.") then
        fail_case(st, x, "nil without a 'pagedattn.' message: " .. tostring(err))
      end
      outcome = "runtime"
    end
    local d = difference(snap)
    if d then fail_case(st, x, "a failed batch call changed " .. d) end
    if cache.handle ~= nil then
      local now = pool_state()
      for key, val in pairs(pool_before.stats) do
        if now.stats[key] ~= val then fail_case(st, x, "a failed batch call changed stats." .. key) end
      end
      for i = 1, #seqs do
        if now.seqs[i] ~= pool_before.seqs[i] then fail_case(st, x, "a failed batch call changed sequence " .. i) end
      end
    end
    if not ruins then
      local vok, verr = pcall(valid_call)
      if not vok then fail_case(st, x, "after a failed call, the valid call: " .. tostring(verr)) end
    end
  else
    local vok, verr = pcall(valid_call)
    if not vok then fail_case(st, x, "a valid batch call: " .. tostring(verr)) end
  end
  count(st.kinds, "batch")
  local name = "batch:" .. (x.applied[1] or "valid")
  st.mutations[name] = st.mutations[name] or { ok = 0, refused = 0, runtime = 0 }
  count(st.mutations[name], outcome)
  if cache.handle ~= nil then cache:validate() end
  cache:close()
  return outcome
end

---------------------------------------------------------------------------
-- key counts near 2^30 and 2^31: one huge page repeated in the block table
-- (legal when only reading), v all 3, a causal window so that the valid
-- calls stay cheap. A valid call outputs 3 (or 0 for a row that sees no key);
-- past PA_MAX_SEQLEN or the table's capacity it must be refused.

local LIMIT_SEQLENS = { 0, 1, MAXSEQ - 5, MAXSEQ - 1, MAXSEQ, MAXSEQ + 1, I32_MAX - 2, I32_MAX, 2 ^ 31, 2 ^ 32 + 1, 2 ^ 40 }

local function limits_case(st, x, rng)
  local dev = st.device
  local dt = pick(rng, FLOATS)
  local ps = pick(rng, { 2 ^ 16, 2 ^ 16 + 3 })
  local D, Hk = pick(rng, { 1, 2, 4 }), 1
  local H = pick(rng, { 1, 2 })
  local B = rng:int(1, 2)
  local width = math.ceil((MAXSEQ + 64) / ps) + rng:int(0, 2)
  local capacity = width * ps
  -- one sequence may append; two would write into the one page (no promise)
  local s_new = B == 1 and pick(rng, { 0, 0, 1, 4 }) or 0
  local Sq = pick(rng, { 0, 1, 2 })
  local w = pick(rng, { 0, 1, 10, 100 })
  local lens = {}
  local uniform = chance(rng, 0.5)
  for b = 1, B do lens[b] = (uniform and b > 1) and lens[1] or pick(rng, LIMIT_SEQLENS) end
  local fits_i32 = true
  for b = 1, B do if lens[b] > I32_MAX then fits_i32 = false end end
  local as_number = uniform and (not fits_i32 or chance(rng, 0.5))
  if not as_number and not fits_i32 then
    for b = 1, B do if lens[b] > I32_MAX then lens[b] = I32_MAX end end
  end
  x.describe = string.format("limits %s B=%d H=%d D=%d page=%d width=%d cache_seqlens={%s}%s new=%d Sq=%d window={%d,0}",
    dt, B, H, D, ps, width, table.concat(lens, ","), as_number and " (number)" or "", s_new, Sq, w)
  x.applied = {}
  local valid = true
  for b = 1, B do if lens[b] + s_new > MAXSEQ or lens[b] + s_new > capacity then valid = false end end
  -- a call with nothing to read or write is not checked per sequence (it
  -- costs O(1) by design): past the limits it may pass
  if Sq == 0 and s_new == 0 and not valid then valid = "either" end
  local kc = assert(pa.randn({ 1, ps, Hk, D }, dt, dev, rng:int(0, 2 ^ 30)))
  local vc = assert(pa.tensor({ 1, ps, Hk, D }, dt, dev)):fill(3)
  local q = assert(pa.randn({ B, Sq, H, D }, dt, dev, rng:int(0, 2 ^ 30)))
  local bt = assert(pa.tensor({ B, width }, "i32", dev)) -- every entry page 0
  local opts = { block_table = bt, causal = true, window_size = { w, 0 }, return_softmax_lse = true,
    num_splits = pick(rng, { 0, 1, 3 }),
    cache_seqlens = as_number and lens[1] or assert(pa.from_table(lens, { B }, "i32", dev)) }
  if s_new > 0 then
    opts.k = assert(pa.randn({ B, s_new, Hk, D }, dt, dev, rng:int(0, 2 ^ 30)))
    opts.v = assert(pa.tensor({ B, s_new, Hk, D }, dt, dev)):fill(3)
  end
  local all = call_tensors({ q = q, kc = kc, vc = vc, opts = opts })
  local snap = snapshot(all)
  local ok, out, lse = pcall(pa.attention_with_kvcache, q, kc, vc, opts)
  local outcome
  if not ok then
    local arg, why = parse_error(out, { "attention_with_kvcache" })
    if not arg then fail_case(st, x, why .. ":\n    " .. tostring(out)) end
    count(st.args, arg)
    if valid == true then fail_case(st, x, "a valid call was refused: " .. tostring(out)) end
    local d = difference(snap)
    if d then fail_case(st, x, "a refused call changed " .. d) end
    outcome = "refused"
  elseif out == nil then
    if type(lse) ~= "string" or not lse:find("^pagedattn%.attention_with_kvcache: ") then
      fail_case(st, x, "nil without a 'pagedattn.attention_with_kvcache: ' message: " .. tostring(lse))
    end
    fail_case(st, x, "a call failed at run time: " .. tostring(lse))
  else
    if not valid then fail_case(st, x, "a call past the limits was accepted") end
    local o, l = out:to_table(), lse:to_table()
    for b = 1, B do
      local sk = lens[b] + s_new
      for i = 0, Sq - 1 do
        local pos = sk - Sq + i -- bottom-right aligned
        local sees = pos >= 0
        for h = 0, H - 1 do
          local lv = l[((b - 1) * H + h) * Sq + i + 1]
          if sees and not (lv > -math.huge and lv < math.huge) then fail_case(st, x, "lse is " .. tostring(lv) .. " for a row with keys") end
          for e = 1, D do
            local y = o[(((b - 1) * Sq + i) * H + h) * D + e]
            local want = sees and 3 or 0
            if not (math.abs(y - want) <= 0.02) then
              fail_case(st, x, string.format("out[%d, %d, %d] is %s where every v is 3 (expected %g)", b - 1, i, h, tostring(y), want))
            end
          end
        end
      end
    end
    outcome = "ok"
  end
  count(st.kinds, "limits")
  local name = "limits:" .. (valid == true and "valid" or valid == "either" and "no_work" or "beyond")
  st.mutations[name] = st.mutations[name] or { ok = 0, refused = 0, runtime = 0 }
  count(st.mutations[name], outcome)
  return outcome
end

---------------------------------------------------------------------------
-- the run

-- run{ seed =, iters =, device = "cpu" | "cpu:staged" | "cuda" | a device,
--      log = function(line) (progress; nil: quiet), case = i (only case i),
--      strict = true (fail on the messages of M.KNOWN_MESSAGES too),
--      only = "direct" | "batch" | "limits" (one kind of case) }
-- Returns a summary: seed, iters, device, outcomes {ok, refused, runtime},
-- kinds (valid, same, pass, any, fail, batch, limits), mutations[name] =
-- outcomes, args[name] = refusals naming it, known[bug] = refusals with the
-- message of a known bug, seconds (processor time).
function M.run(o)
  o = o or {}
  local seed = assert(tonumber(o.seed), "fuzz.attention.run: seed: a number expected")
  local iters = o.iters or 200
  local dev = o.device
  if type(dev) ~= "table" then
    local d, err = pa.device(dev or "cpu")
    if not d then error("fuzz.attention.run: device " .. tostring(dev) .. ": " .. tostring(err), 2) end
    dev = d
  end
  local log = o.log
  local st = { seed = seed, iters = iters, device = dev, strict = o.strict, known = {}, outcomes = { ok = 0, refused = 0, runtime = 0 },
    kinds = {}, mutations = {}, args = {} }
  local t0 = os.clock()
  -- one draw a case from the master stream: case i's seed does not depend on
  -- what earlier cases did, so --case i reruns it alone
  local master = ref.rng(seed)
  for i = 1, iters do
    local case_seed = floor(master:uniform() * 2 ^ 52)
    if not o.case or o.case == i then
      local rng = ref.rng(case_seed)
      local x = { index = i, case_seed = case_seed, rng = rng, dev = dev, applied = {}, extra_args = {}, strict = o.strict,
        describe = "?" }
      local r = rng:uniform()
      if o.only then r = ({ batch = 0, limits = 0.09, direct = 0.5 })[o.only] end
      local case_fn = r < 0.08 and batch_case or (r < 0.11 and limits_case or direct_case)
      local ok, outcome = pcall(case_fn, st, x, rng)
      if not ok then
        if type(outcome) == "string" and outcome:find("^attention fuzzer: ") then error(outcome, 0) end
        fail_case(st, x, "the fuzzer itself failed: " .. tostring(outcome))
      end
      count(st.outcomes, outcome)
      if log and (i % (o.log_every or 500) == 0 or i == iters) then
        log(string.format("attention %s: %d/%d cases, ok %d, refused %d, run-time errors %d (%.1f s)",
          dev.name, i, iters, st.outcomes.ok, st.outcomes.refused, st.outcomes.runtime, os.clock() - t0))
      end
    end
    -- tensors made by a case are garbage now: let the collector have them
    if i % 50 == 0 then collectgarbage() end
  end
  st.seconds = os.clock() - t0
  st.rng, st.device = nil, dev.name
  return st
end

-- A few lines for a log: outcomes per mutation and the arguments refusals named.
function M.report(s)
  local lines = { string.format("attention fuzzer on %s: seed %d, %d cases in %.1f s: ok %d, refused %d, run-time errors %d",
    s.device, s.seed, s.iters, s.seconds, s.outcomes.ok, s.outcomes.refused, s.outcomes.runtime) }
  local kinds = {}
  for k, n in pairs(s.kinds) do kinds[#kinds + 1] = k .. " " .. n end
  table.sort(kinds)
  lines[#lines + 1] = "  kinds: " .. table.concat(kinds, ", ")
  local names = {}
  for k in pairs(s.mutations) do names[#names + 1] = k end
  table.sort(names)
  local parts = {}
  for _, k in ipairs(names) do
    local m = s.mutations[k]
    parts[#parts + 1] = string.format("%s %d/%d/%d", k, m.ok, m.refused, m.runtime)
  end
  lines[#lines + 1] = "  mutations (ok/refused/run-time): " .. table.concat(parts, ", ")
  local args = {}
  for k, n in pairs(s.args) do args[#args + 1] = k .. " " .. n end
  table.sort(args)
  lines[#lines + 1] = "  refusals named: " .. table.concat(args, ", ")
  local known = {}
  for k, n in pairs(s.known or {}) do known[#known + 1] = k .. " " .. n end
  table.sort(known)
  if #known > 0 then lines[#lines + 1] = "  known library bugs met (--strict fails on them): " .. table.concat(known, ", ") end
  return table.concat(lines, "\n")
end

return M
