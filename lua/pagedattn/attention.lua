-- pagedattn.attention: the two attention entry points of the API contract.
--   out, lse = pa.attention_with_kvcache(q, k_cache, v_cache, opts)
--   out, lse = pa.attention_varlen(q, k_cache, v_cache, opts)
-- Options are validated here for type, and by the C core for everything else;
-- a mistake raises an error naming the option, a run-time failure returns nil, err.
local ffi = require "ffi"
local core = require "pagedattn.core"
local T = require "pagedattn.tensor"

local C, ctx, check = core.C, core.ctx, core.check
local is_tensor = T.is_tensor

local M = {}

-- option name -> kind; anything else is a typo worth reporting
local common_opts = {
  k = "tensor", v = "tensor", rotary_cos = "tensor", rotary_sin = "tensor",
  rotary_interleaved = "boolean", cache_batch_idx = "i32", block_table = "table2d",
  softmax_scale = "number", causal = "boolean", window_size = "window", softcap = "number",
  alibi_slopes = "f32", num_splits = "number", return_softmax_lse = "boolean", out = "tensor",
}
local kvcache_opts = setmetatable({ cache_seqlens = "seqlens" }, { __index = common_opts })
local varlen_opts = setmetatable({
  cu_seqlens_q = "i32", seqused_k = "i32", max_seqlen_q = "number",
}, { __index = common_opts })

local function argerr(fname, name, msg)
  core.raise("pagedattn." .. fname .. ": " .. name .. ": " .. msg)
end

-- Lua arrays given for small index tensors become tensors on q's device.
local function as_tensor(fname, name, value, kind, device)
  if is_tensor(value) then return value end
  if type(value) ~= "table" then
    argerr(fname, name, "expected a tensor or a table, got " .. type(value))
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
      for c = 1, width do flat[(r - 1) * width + c] = row[c] or 0 end
    end
    return T.from_table(flat, { rows, width }, "i32", device)
  end
  return T.from_table(value, { #value }, kind == "f32" and "f32" or "i32", device)
end

local params = ffi.new("pa_attention_params")

local function fill_params(fname, allowed, q, k_cache, v_cache, opts, varlen)
  if not is_tensor(q) then argerr(fname, "q", "expected a tensor, got " .. type(q)) end
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
  p.q, p.k_cache, p.v_cache = q.handle, k_cache.handle, v_cache.handle
  local function tensor_opt(name)
    local value = opts[name]
    if value == nil then return nil end
    local t = as_tensor(fname, name, value, allowed[name], q.device)
    keep[#keep + 1] = t
    return t.handle
  end
  p.k, p.v = tensor_opt("k"), tensor_opt("v")
  p.rotary_cos, p.rotary_sin = tensor_opt("rotary_cos"), tensor_opt("rotary_sin")
  p.cache_batch_idx = tensor_opt("cache_batch_idx")
  p.block_table = tensor_opt("block_table")
  p.alibi_slopes = tensor_opt("alibi_slopes")
  if varlen then
    p.cu_seqlens_q, p.seqused_k = tensor_opt("cu_seqlens_q"), tensor_opt("seqused_k")
    if opts.max_seqlen_q then p.max_seqlen_q = opts.max_seqlen_q end
  else
    local cs = opts.cache_seqlens
    if type(cs) == "number" then
      if cs < 0 or cs ~= math.floor(cs) then
        argerr(fname, "cache_seqlens", "expected a whole number >= 0, got " .. cs)
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
    p.window_left, p.window_right = w[1], w[2]
  end
  if opts.softmax_scale then p.softmax_scale = opts.softmax_scale end
  if opts.softcap then p.softcap = opts.softcap end
  if opts.num_splits then p.num_splits = opts.num_splits end

  local out = opts.out
  if not out then
    out = T.new_tensor(q.shape, q.dtype, q.device, fname)
  end
  p.out = out.handle
  local lse
  if opts.return_softmax_lse then
    local H = q.shape[#q.shape - 1]
    local shape
    if varlen then shape = { H, q.shape[1] } else shape = { q.shape[1], H, q.shape[2] } end
    lse = T.new_tensor(shape, "f32", q.device, fname)
    p.softmax_lse = lse.handle
  end
  return out, lse, keep
end

-- fill, call, and keep the tensors made for the call alive until it returns
local function run(fname, allowed, varlen, cfn, q, k_cache, v_cache, opts)
  local out, lse, keep = fill_params(fname, allowed, q, k_cache, v_cache, opts, varlen)
  local ok, err = check(cfn(ctx, params), fname)
  keep = nil
  if not ok then return nil, err end
  return out, lse
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
