-- pagedattn.attention: the two attention entry points of the API contract.
--   out, lse = pa.attention_with_kvcache(q, k_cache, v_cache, opts)
--   out, lse = pa.attention_varlen(q, k_cache, v_cache, opts)
-- Options are validated here for type, and by the C core for everything else;
-- a mistake raises an error naming the option, a run-time failure returns nil, err.
local ffi = require "ffi"
local core = require "pagedattn.core"
local T = require "pagedattn.tensor"

local C, ctx, check = core.C, core.ctx, core.check
local is_tensor, live = T.is_tensor, T.live
local floor = math.floor
local INT32_MAX = 2147483647

local M = {}

-- option name -> kind; anything else is a typo worth reporting
local common_opts = {
  k = "tensor", v = "tensor", rotary_cos = "tensor", rotary_sin = "tensor",
  rotary_interleaved = "boolean", cache_batch_idx = "i32", block_table = "table2d",
  softmax_scale = "number", causal = "boolean", window_size = "window", softcap = "number",
  alibi_slopes = "f32", num_splits = "number", return_softmax_lse = "boolean", out = "tensor",
  -- the pages in FlashInfer's CSR form, instead of block_table (a batch stages both)
  kv_indptr = "i32", kv_indices = "i32", kv_last_page_len = "i32",
  -- fp8 caches: a number for the tensor, or f32 [Hk] (a tensor or a Lua array) per kv head
  k_scale = "scale", v_scale = "scale",
}
local kvcache_opts = setmetatable({ cache_seqlens = "seqlens" }, { __index = common_opts })
local varlen_opts = setmetatable({
  cu_seqlens_q = "i32", seqused_k = "i32", max_seqlen_q = "number",
}, { __index = common_opts })

local function argerr(fname, name, msg)
  core.raise("pagedattn." .. fname .. ": " .. name .. ": " .. msg)
end

-- A whole number in [lo, INT32_MAX] (the C field is an int32), or an error
-- naming the option with the value as given.
local function int32_opt(fname, name, v, lo)
  if type(v) ~= "number" or v ~= floor(v) or v < lo or v > INT32_MAX then
    argerr(fname, name, "expected a whole number in [" .. lo .. ", 2^31 - 1], got " .. tostring(v))
  end
  return v
end

-- An i32 element given in a Lua array: a whole number in int32's range.
local function index_value(fname, name, v, where)
  if type(v) ~= "number" or v ~= floor(v) or v < -2147483648 or v > INT32_MAX then
    argerr(fname, name, where .. " is " .. tostring(v) .. ", not a whole number in int32's range")
  end
  return v
end

-- Lua arrays given for small index tensors become tensors on q's device.
local function as_tensor(fname, name, value, kind, device)
  if is_tensor(value) then return value end
  if type(value) ~= "table" then
    argerr(fname, name, (kind == "scale" and "expected a number, a tensor or a table, got " or
      "expected a tensor or a table, got ") .. type(value))
  end
  if kind == "table2d" then
    local rows, width = #value, 0
    for r = 1, rows do
      if type(value[r]) ~= "table" then argerr(fname, name, "row " .. r .. " is not a table") end
      if #value[r] > width then width = #value[r] end
    end
    local flat = {}
    for r = 1, rows do
      local row = value[r]
      for c = 1, width do
        local v = row[c]
        flat[(r - 1) * width + c] = v == nil and 0 or index_value(fname, name, v, "row " .. r .. " entry " .. c)
      end
    end
    return T.from_table(flat, { rows, width }, "i32", device)
  end
  local float = kind == "f32" or kind == "scale"
  if not float then
    for i = 1, #value do index_value(fname, name, value[i], "element " .. i) end
  else
    for i = 1, #value do
      if type(value[i]) ~= "number" then argerr(fname, name, "element " .. i .. " is " .. type(value[i]) .. ", not a number") end
    end
  end
  return T.from_table(value, { #value }, float and "f32" or "i32", device)
end

local params = ffi.new("pa_attention_params")
local float_box = ffi.new("float[1]")

-- A scale given as a number: positive and finite once it is an f32 (the C
-- field), else an error naming the option with the value as given.
local function scale_number(fname, name, v)
  float_box[0] = v
  local f = float_box[0]
  if not (f > 0 and f < math.huge) then
    argerr(fname, name, "expected a positive finite number (as an f32), got " .. tostring(v))
  end
  return v
end

-- q's rank and head sizes, checked before out and lse are made from its shape
-- (the C core checks the same, but only once they exist: a malformed q could
-- ask for terabytes first)
local function check_q_shape(fname, q, varlen)
  local sh = q.shape
  local rank, layout = varlen and 3 or 4, varlen and "[total_q, H, D]" or "[B, Sq, H, D]"
  if #sh ~= rank then
    argerr(fname, "q", "expected " .. rank .. " dimensions " .. layout .. ", got shape [" .. table.concat(sh, ", ") .. "]")
  end
  if sh[rank] < 1 or sh[rank] > 256 then argerr(fname, "q", "head dim " .. sh[rank] .. " is not in [1, 256]") end
  if sh[rank - 1] < 1 or sh[rank - 1] > 65536 then
    argerr(fname, "q", sh[rank - 1] .. " heads is not in [1, 65536]")
  end
end

local function fill_params(fname, allowed, q, k_cache, v_cache, opts, varlen)
  if not is_tensor(q) then argerr(fname, "q", "expected a tensor, got " .. type(q)) end
  check_q_shape(fname, q, varlen)
  if not is_tensor(k_cache) then argerr(fname, "k_cache", "expected a tensor, got " .. type(k_cache)) end
  if not is_tensor(v_cache) then argerr(fname, "v_cache", "expected a tensor, got " .. type(v_cache)) end
  opts = opts or {}
  if type(opts) ~= "table" then argerr(fname, "opts", "expected a table, got " .. type(opts)) end
  local keep = {} -- tensors made here must outlive the call
  for key, value in pairs(opts) do
    local kind = allowed[key]
    if not kind then argerr(fname, tostring(key), "unknown option") end
    if kind == "boolean" and type(value) ~= "boolean" then
      argerr(fname, key, "expected a boolean, got " .. type(value))
    elseif kind == "number" and type(value) ~= "number" then
      argerr(fname, key, "expected a number, got " .. type(value))
    elseif kind == "tensor" and not is_tensor(value) then
      argerr(fname, key, "expected a tensor, got " .. type(value))
    end
  end

  C.pa_attention_params_init(params)
  local p = params
  p.q, p.k_cache, p.v_cache = live(q, fname, "q"), live(k_cache, fname, "k_cache"), live(v_cache, fname, "v_cache")
  local function tensor_opt(name)
    local value = opts[name]
    if value == nil then return nil end
    local t = as_tensor(fname, name, value, allowed[name], q.device)
    keep[#keep + 1] = t
    return live(t, fname, name)
  end
  p.k, p.v = tensor_opt("k"), tensor_opt("v")
  p.rotary_cos, p.rotary_sin = tensor_opt("rotary_cos"), tensor_opt("rotary_sin")
  p.cache_batch_idx = tensor_opt("cache_batch_idx")
  p.block_table = tensor_opt("block_table")
  p.kv_indptr, p.kv_indices = tensor_opt("kv_indptr"), tensor_opt("kv_indices")
  p.kv_last_page_len = tensor_opt("kv_last_page_len")
  p.alibi_slopes = tensor_opt("alibi_slopes")
  if varlen then
    p.cu_seqlens_q, p.seqused_k = tensor_opt("cu_seqlens_q"), tensor_opt("seqused_k")
    if opts.max_seqlen_q then p.max_seqlen_q = int32_opt(fname, "max_seqlen_q", opts.max_seqlen_q, 0) end
  else
    local cs = opts.cache_seqlens
    if type(cs) == "number" then
      if cs < 0 or cs ~= floor(cs) or cs > 2^62 then
        argerr(fname, "cache_seqlens", "expected a whole number >= 0, got " .. tostring(cs))
      end
      p.cache_seqlen = cs
    elseif cs ~= nil then
      p.cache_seqlens = tensor_opt("cache_seqlens")
    end
  end
  if opts.rotary_interleaved == false then p.rotary_interleaved = 0 end
  if opts.causal then p.causal = 1 end
  local w = opts.window_size
  if w ~= nil then
    if type(w) ~= "table" or type(w[1]) ~= "number" or type(w[2]) ~= "number" then
      argerr(fname, "window_size", "expected {left, right} (numbers, -1 = unbounded)")
    end
    p.window_left = int32_opt(fname, "window_size: left", w[1], -1)
    p.window_right = int32_opt(fname, "window_size: right", w[2], -1)
  end
  if opts.softmax_scale then
    -- (a float field: a finite number beyond its range would arrive as inf)
    if opts.softmax_scale ~= opts.softmax_scale or math.abs(opts.softmax_scale) > 3.4028234663852886e38 then
      argerr(fname, "softmax_scale", tostring(opts.softmax_scale) .. " is not a finite float")
    end
    p.softmax_scale = opts.softmax_scale
  end
  if opts.softcap then
    if not (opts.softcap >= 0 and opts.softcap <= 3.4028234663852886e38) then
      argerr(fname, "softcap", tostring(opts.softcap) .. " must be a finite float >= 0")
    end
    p.softcap = opts.softcap
  end
  if opts.num_splits then p.num_splits = int32_opt(fname, "num_splits", opts.num_splits, 0) end
  for _, name in ipairs({ "k_scale", "v_scale" }) do
    local sc = opts[name]
    if type(sc) == "number" then
      p[name] = scale_number(fname, name, sc)
    elseif sc ~= nil then
      p[name .. "s"] = tensor_opt(name) -- per kv head: the C field k_scales / v_scales
    end
  end

  local out = opts.out
  if not out then
    local err
    out, err = T.new_tensor(q.shape, q.dtype, q.device, fname)
    if not out then return nil, err end
  end
  p.out = live(out, fname, "out")
  local lse
  if opts.return_softmax_lse then
    local H = q.shape[#q.shape - 1]
    local shape
    if varlen then shape = { H, q.shape[1] } else shape = { q.shape[1], H, q.shape[2] } end
    local err
    lse, err = T.new_tensor(shape, "f32", q.device, fname)
    if not lse then return nil, err end
    p.softmax_lse = lse.handle
  end
  return out, lse, keep
end

-- fill, call, and keep the tensors made for the call alive until it returns
local function run(fname, allowed, varlen, cfn, q, k_cache, v_cache, opts)
  local out, lse, keep = fill_params(fname, allowed, q, k_cache, v_cache, opts, varlen)
  if not out then return nil, lse end -- (lse: the allocation's error)
  local ok, err = check(cfn(ctx, params), fname)
  keep = nil
  if not ok then return nil, err end
  return out, lse
end

-- out, lse = batch_attention(batch_handle, q, k_cache, v_cache, opts): one
-- attention over a staged batch (pa_batch_attention: the two levels of a
-- cascade batch, or the plain call), with the options of the contract
-- functions less the index tensors, which the batch sets.
function M.batch_attention(bh, fname, q, k_cache, v_cache, opts)
  local varlen = is_tensor(q) and #q.shape == 3
  local out, lse, keep = fill_params(fname, varlen and varlen_opts or kvcache_opts, q, k_cache, v_cache, opts, varlen)
  if not out then return nil, lse end -- (lse: the allocation's error)
  local ok, err = check(C.pa_batch_attention(ctx, bh, params), fname)
  keep = nil
  if not ok then return nil, err end
  return out, lse
end

---------------------------------------------------------------------------
-- merging partial results

local merge_params = ffi.new("pa_merge_params")
local tensor_ptrs = ffi.typeof("const pa_tensor*[?]")

-- out, out_lse = pa.merge_states(o_a, lse_a, o_b, lse_b [, out, out_lse])
-- out, out_lse = pa.merge_states({ {o1, lse1}, {o2, lse2}, ... } [, out, out_lse])
-- The exact merge of attention results over disjoint key sets by their
-- log-sum-exp (pagedattn.h, pa_merge_states): o [T, H, D] with lse [H, T]
-- (attention_varlen's), or o [B, Sq, H, D] with lse [B, H, Sq]
-- (attention_with_kvcache's). out may be one of the o (in place); out_lse
-- is made when not given.
function M.merge_states(a, b, c, d, e, f)
  local F = "merge_states"
  local states, out, out_lse, names
  if is_tensor(a) then
    states = { { a, b }, { c, d } }
    out, out_lse = e, f
    names = { [0] = { "o_a", "lse_a" }, [1] = { "o_b", "lse_b" } }
  elseif type(a) == "table" then
    states, out, out_lse = a, b, c
    if #states < 1 then argerr(F, "states", "expected a list of {o, lse} pairs, got an empty table") end
  else
    argerr(F, "o_a", "expected a tensor (or a list of {o, lse} pairs), got " .. type(a))
  end
  local function name_of(i, k) -- i 0-based, k 1 (o) or 2 (lse)
    if names then return names[i][k] end
    return "states[" .. (i + 1) .. "][" .. k .. "]"
  end
  local n = #states
  local os_, ls = tensor_ptrs(n), tensor_ptrs(n)
  for i = 1, n do
    local st = states[i]
    if type(st) ~= "table" then argerr(F, "states[" .. i .. "]", "expected an {o, lse} pair, got " .. type(st)) end
    if not is_tensor(st[1]) then argerr(F, name_of(i - 1, 1), "expected a tensor, got " .. type(st[1])) end
    if not is_tensor(st[2]) then argerr(F, name_of(i - 1, 2), "expected a tensor, got " .. type(st[2])) end
    os_[i - 1] = live(st[1], F, name_of(i - 1, 1))
    ls[i - 1] = live(st[2], F, name_of(i - 1, 2))
  end
  local o1, l1 = states[1][1], states[1][2]
  if out ~= nil and not is_tensor(out) then argerr(F, "out", "expected a tensor, got " .. type(out)) end
  if out_lse ~= nil and not is_tensor(out_lse) then argerr(F, "out_lse", "expected a tensor, got " .. type(out_lse)) end
  if out == nil then
    local err
    out, err = T.new_tensor(o1.shape, o1.dtype, o1.device, F)
    if not out then return nil, err end
  end
  if out_lse == nil then
    local err
    out_lse, err = T.new_tensor(l1.shape, "f32", l1.device, F)
    if not out_lse then return nil, err end
  end
  C.pa_merge_params_init(merge_params)
  merge_params.num_states = n
  merge_params.o, merge_params.lse = os_, ls
  merge_params.out = live(out, F, "out")
  merge_params.out_lse = live(out_lse, F, "out_lse")
  local st = C.pa_merge_states(ctx, merge_params)
  merge_params.o, merge_params.lse = nil, nil
  if st ~= 0 then
    -- the C message names the states o[i] / lse[i]: use this call's names
    local msg = core.last_error():gsub("%f[%a](%a+)%[(%d+)%]", function(kind, i)
      if kind ~= "o" and kind ~= "lse" then return nil end
      return name_of(tonumber(i), kind == "o" and 1 or 2)
    end)
    msg = "pagedattn." .. F .. ": " .. msg
    if st == 1 then core.raise(msg) end
    return nil, msg
  end
  return out, out_lse
end

function M.attention_with_kvcache(q, k_cache, v_cache, opts)
  local out, lse = run("attention_with_kvcache", kvcache_opts, false, C.pa_attention_with_kvcache,
                       q, k_cache, v_cache, opts)
  return out, lse
end

function M.attention_varlen(q, k_cache, v_cache, opts)
  local out, lse = run("attention_varlen", varlen_opts, true, C.pa_attention_varlen,
                       q, k_cache, v_cache, opts)
  return out, lse
end

return M
