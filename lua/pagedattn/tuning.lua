-- pagedattn.tuning: the tuning of a device's kernel choice (pagedattn_lab.h's
-- pa_cuda_tuning: CUDA devices), for sweeps, benchmarks and specs. Adds to
-- devices:
--   dev:tuning()              -- a table of every field (numbers; text fields as strings)
--   dev:set_tuning{ decode_kpw = 8, prefill_kernel = "wgmma" }   -- the fields named; the rest stay
--   dev:reset_tuning()        -- the tuning the device opened with
--   dev:with_tuning(t, fn, ...) -- fn(...) with t set, the tuning before restored after (also on error)
--   dev:last_plan()           -- the kernels the last attention call launched, one line each
-- and, for tools:
--   tuning.fields()           -- { {name, min, max, names = {...} | nil, text, doc}, ... } in the struct's order
--   tuning.variants_for(shape, t, arch) -- the kernel variants the planner may choose for a shape
--   tuning.parse_configs("decode_kpw=8,decode_stages=4|-|kernel_dir=/tmp/k2")
--                             -- { {name = "decode_kpw=8,decode_stages=4", fields = {...}}, ... }
--                             ("-": the tuning as it is; a field that does not exist is an error)
-- A device is shared by the process: what one sets, every user of it sees.
-- Enumerated fields take their value's name or number ("auto", "simt"; 0, 1).
local ffi = require "ffi"
local core = require "pagedattn.core"
local tensor = require "pagedattn.tensor"

local C, ctx, check, raise = core.C, core.ctx, core.check, core.raise
local Device = tensor.Device

local M = {}

local fields_cache
function M.fields()
  if fields_cache then return fields_cache end
  local list = {}
  for i = 0, C.pa_cuda_tuning_field_count() - 1 do
    local f = C.pa_cuda_tuning_field(i)
    local names
    if f.names ~= nil then
      names = {}
      for w in ffi.string(f.names):gmatch("[^|]+") do names[#names + 1] = w end
    end
    list[#list + 1] = {
      name = ffi.string(f.name), text = f.is_text ~= 0, min = tonumber(f.min), max = tonumber(f.max),
      names = names, doc = ffi.string(f.doc),
    }
    list[list[#list].name] = list[#list]
  end
  fields_cache = list
  return list
end

local tuning_t = ffi.typeof("pa_cuda_tuning")

local function get(dev, defaults, fname)
  local t = tuning_t()
  local ok, err = check(C.pa_device_get_tuning(ctx, dev.handle, t, defaults and 1 or 0), fname)
  if not ok then return nil, err end
  return t
end

local function to_table(t)
  local out = {}
  for _, f in ipairs(M.fields()) do
    out[f.name] = f.text and ffi.string(t[f.name]) or tonumber(t[f.name])
  end
  return out
end

-- The struct of `changes` applied to t (a caller's mistake: an error naming the field).
local function apply(t, changes, fname)
  local fields = M.fields()
  if type(changes) ~= "table" then raise("pagedattn." .. fname .. ": expected a table of fields, got " .. type(changes)) end
  for name, v in pairs(changes) do
    local f = fields[name]
    if not f then raise("pagedattn." .. fname .. ": no tuning field '" .. tostring(name) .. "'") end
    if f.text then
      if type(v) ~= "string" then raise("pagedattn." .. fname .. ": " .. name .. ": expected a string") end
      if #v >= f.max then raise(string.format("pagedattn.%s: %s: longer than %d characters", fname, name, f.max - 1)) end
      ffi.copy(t[name], v)
    else
      local n = v
      if type(v) == "string" and f.names then
        for i, w in ipairs(f.names) do if w == v then n = i - 1 end end
      end
      if type(n) ~= "number" or n ~= math.floor(n) then
        raise(string.format("pagedattn.%s: %s: %s is not an integer%s", fname, name, tostring(v),
          f.names and (" or one of " .. table.concat(f.names, ", ")) or ""))
      end
      if n < -2147483648 or n > 2147483647 then
        raise(string.format("pagedattn.%s: %s: %s is out of range", fname, name, tostring(v)))
      end
      t[name] = n
    end
  end
  return t
end

function Device:tuning()
  local t, err = get(self, false, "tuning")
  if not t then return nil, err end
  return to_table(t)
end

function Device:set_tuning(changes)
  local t, err = get(self, false, "set_tuning")
  if not t then raise(err) end
  apply(t, changes, "set_tuning")
  local ok, e = check(C.pa_device_set_tuning(ctx, self.handle, t), "set_tuning")
  if not ok then raise(e) end
  return self
end

function Device:reset_tuning()
  local t, err = get(self, true, "reset_tuning")
  if not t then raise(err) end
  local ok, e = check(C.pa_device_set_tuning(ctx, self.handle, t), "reset_tuning")
  if not ok then raise(e) end
  return self
end

function Device:with_tuning(changes, fn, ...)
  local before, err = get(self, false, "with_tuning")
  if not before then raise(err) end
  self:set_tuning(changes)
  local function pack(...) return { n = select("#", ...), ... } end
  local res = pack(pcall(fn, ...))
  assert(C.pa_device_set_tuning(ctx, self.handle, before) == 0, core.last_error())
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

local plan_buf = ffi.new("char[?]", 8192)
function Device:last_plan()
  local ok, err = check(C.pa_device_last_plan(ctx, self.handle, plan_buf, 8192), "last_plan")
  if not ok then return nil, err end
  return ffi.string(plan_buf)
end

function M.parse_configs(text)
  local fields, out = M.fields(), {}
  for c in (text or ""):gmatch("[^|]+") do
    local t = {}
    if c ~= "-" then
      for kv in c:gmatch("[^,]+") do
        local k, v = kv:match("^%s*([%w_]+)%s*=(.*)$")
        if not k then error("a tuning config is field=value,...; got '" .. kv .. "'", 2) end
        if not fields[k] then error("no tuning field '" .. k .. "' (in '" .. c .. "')", 2) end
        t[k] = fields[k].text and v or tonumber(v) or v
      end
    end
    out[#out + 1] = { name = c, fields = t }
  end
  return out
end

-- shape: { dtype = "bf16", head_dim = 128, heads = 32, kv_heads = 8, page_size = 16 (0:
-- contiguous), seqlen_q = 1, natural = false, rotary = false, kv_dtype = nil (or
-- "fp8_e4m3", "fp8_e5m2": fp8 caches) }; t: tuning fields to
-- change from the defaults (nil: none); arch: "sm_90a", "sm_80", ... (nil: CUDA device 0's).
function M.variants_for(shape, t, arch)
  local s = ffi.new("pa_kernel_shape")
  s.dtype = core.dtypes[shape.dtype or "bf16"] or raise("pagedattn.variants_for: dtype: " .. tostring(shape.dtype))
  s.head_dim, s.heads, s.kv_heads = shape.head_dim, shape.heads, shape.kv_heads
  s.page_size, s.seqlen_q = shape.page_size or 0, shape.seqlen_q or 1
  s.natural, s.rotary = shape.natural and 1 or 0, shape.rotary and 1 or 0
  if shape.kv_dtype and shape.kv_dtype ~= shape.dtype then
    local kv = core.dtypes[shape.kv_dtype]
    if kv ~= 4 and kv ~= 5 then raise("pagedattn.variants_for: kv_dtype: " .. tostring(shape.kv_dtype)) end
    s.kv_dtype = kv
  end
  local tp
  if t then
    tp = tuning_t()
    C.pa_cuda_tuning_defaults(tp)
    apply(tp, t, "variants_for")
  end
  local buf = ffi.new("char[?]", 65536)
  local n = ffi.new("int[1]")
  local ok, err = check(C.pa_kernel_variants_for(ctx, s, tp, arch, buf, 65536, n), "variants_for")
  if not ok then return nil, err end
  local out = {}
  for line in ffi.string(buf):gmatch("[^\n]+") do out[#out + 1] = line end
  return out
end

return M
