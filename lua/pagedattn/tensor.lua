-- pagedattn.tensor: devices and tensors over the C handles.
--   pa.device(name)  pa.tensor(shape, dtype, device)  pa.from_table(values, shape, dtype, device)
--   pa.randn(shape, dtype, device, seed)  t:to_table()  t.shape  t.dtype  t.device
local ffi = require "ffi"
local core = require "pagedattn.core"

local C, ctx, check, raise = core.C, core.ctx, core.check, core.raise

local M = {}

---------------------------------------------------------------------------
-- devices

local Device = {}
Device.__index = Device
M.Device = Device

local devices = {} -- by canonical name ("cpu", "cuda:0"); one object each
local default_device

local device_box = ffi.new("pa_device*[1]")

local function wrap_device(handle)
  local name = ffi.string(C.pa_device_name(handle))
  local existing = devices[name]
  if existing then
    C.pa_device_release(handle) -- we already hold a reference
    return existing
  end
  local dev = setmetatable({
    handle = ffi.gc(handle, C.pa_device_release),
    name = name,
    kind = C.pa_device_get_kind(handle) == 0 and "cpu" or "cuda",
    index = C.pa_device_index(handle),
    description = ffi.string(C.pa_device_description(handle)),
    num_threads = C.pa_device_num_threads(handle),
  }, Device)
  devices[name] = dev
  return dev
end

-- name: "cpu", "cuda", "cuda:N", or nil for the default ($PAGEDATTN_DEVICE,
-- else CUDA when usable, else the CPU). Returns the device, or nil, err.
function M.device(name)
  if name ~= nil and type(name) ~= "string" then
    if getmetatable(name) == Device then return name end
    raise("pagedattn.device: name: expected a string, got " .. type(name))
  end
  if name == nil and default_device then return default_device end
  if name and devices[name] then return devices[name] end
  local ok, err = check(C.pa_device_open(ctx, name, device_box), "device")
  if not ok then return nil, err end
  local dev = wrap_device(device_box[0])
  if name == nil then default_device = dev end
  return dev
end

-- Seconds this device has spent making kernels ready so far (run-time
-- compiles, the kernel cache, module loads; 0 on the CPU): subtract the
-- change from a timer around a call to time the work alone.
function Device:setup_seconds() return C.pa_device_setup_seconds(self.handle) end

function Device:synchronize()
  local ok, err = check(C.pa_device_synchronize(ctx, self.handle), "synchronize")
  if not ok then raise(err) end
  return self
end

-- Ceilings measured now: read_gbps, copy_gbps, fma_gflops (CPU), matmul_gflops
-- and matmul_sustained_gflops (GPU, cuBLAS bf16; 0 without cuBLAS), and
-- matmul_note (how the matmul was measured or why not; nil on the CPU).
function Device:ceilings(seconds)
  local out = ffi.new("pa_ceilings")
  local ok, err = check(C.pa_device_measure_ceilings(ctx, self.handle, seconds or 0.5, out), "ceilings")
  if not ok then return nil, err end
  local note = ffi.string(out.matmul_note)
  return {
    read_gbps = out.read_gbps, copy_gbps = out.copy_gbps, fma_gflops = out.fma_gflops,
    matmul_gflops = out.matmul_gflops, matmul_sustained_gflops = out.matmul_sustained_gflops,
    matmul_note = note ~= "" and note or nil, seconds = out.seconds,
  }
end

function Device:__tostring()
  return "pagedattn.device(" .. self.name .. ": " .. self.description .. ")"
end

local function resolve_device(dev, fname)
  if dev == nil then
    local d, err = M.device()
    if not d then raise(err) end
    return d
  end
  if getmetatable(dev) == Device then return dev end
  if type(dev) == "string" then
    local d, err = M.device(dev)
    if not d then raise(err) end
    return d
  end
  raise("pagedattn." .. fname .. ": device: expected a device or a name, got " .. type(dev))
end

---------------------------------------------------------------------------
-- tensors

local Tensor = {}
Tensor.__index = Tensor
M.Tensor = Tensor

local shape_buf = ffi.new("int64_t[8]")
local tensor_box = ffi.new("pa_tensor*[1]")

local function is_tensor(x) return getmetatable(x) == Tensor end
M.is_tensor = is_tensor

-- The handle of a tensor that is still alive, or an error naming the
-- argument: a tensor released by t:free(), or a batch's view after its batch
-- (or cache) was closed, must not reach the C library.
local function live(t, fname, name)
  local h = t.handle
  if h == nil then raise("pagedattn." .. fname .. ": " .. name .. ": " .. (t.dead or "freed")) end
  return h
end
M.live = live

---------------------------------------------------------------------------
-- native memory the collector cannot see
--
-- A tensor is a few bytes of Lua heap in front of up to gigabytes of native
-- memory, so the collector alone lets dropped tensors pile up until
-- allocations fail. The bytes of live tensors are counted per device; when
-- they pass the device's limit a full collection runs (the finalizers free
-- whatever is unreachable) and the limit becomes twice what is still live,
-- at least GC_MIN (Torch7's heap tracking did the same). An allocation that
-- fails for want of memory collects and tries once more.
local GC_MIN = 256 * 1024 * 1024
local native = {} -- device name -> { live = bytes, limit = bytes, collections = n }

local function native_of(dev)
  local n = native[dev.name]
  if not n then
    n = { live = 0, limit = GC_MIN, collections = 0 }
    native[dev.name] = n
  end
  return n
end

local function collect(n)
  collectgarbage("collect")
  n.collections = n.collections + 1
  n.limit = math.max(GC_MIN, 2 * n.live)
end

-- Bytes of live tensors on a device (made by this Lua state), its current
-- limit and how many collections the accounting asked for.
function M.native_memory(dev)
  local n = native_of(dev)
  return { live = n.live, limit = n.limit, collections = n.collections }
end

local function check_shape(shape, fname)
  if type(shape) ~= "table" then
    raise("pagedattn." .. fname .. ": shape: expected a table of sizes, got " .. type(shape))
  end
  if #shape > 8 then raise("pagedattn." .. fname .. ": shape: more than 8 dimensions") end
  local numel = 1
  for i = 1, #shape do
    local n = shape[i]
    if type(n) ~= "number" or n < 0 or n ~= math.floor(n) then
      raise("pagedattn." .. fname .. ": shape: dimension " .. i .. " is " .. tostring(n) ..
            " (expected a whole number >= 0)")
    end
    numel = numel * n
  end
  return numel
end

local function check_dtype(dtype, fname)
  dtype = dtype or "f32"
  local code = core.dtypes[dtype]
  if not code then
    raise("pagedattn." .. fname .. ": dtype: '" .. tostring(dtype) ..
          "' is not one of f32, f16, bf16, i32, fp8_e4m3, fp8_e5m2")
  end
  return dtype, code
end

local OUT_OF_MEMORY = 2

local function new_tensor(shape, dtype, dev, fname)
  local numel = check_shape(shape, fname)
  local code
  dtype, code = check_dtype(dtype, fname)
  dev = resolve_device(dev, fname)
  for i = 1, #shape do shape_buf[i - 1] = shape[i] end
  local bytes = numel * tonumber(C.pa_dtype_size(code))
  local n = native_of(dev)
  if n.live + bytes > n.limit then collect(n) end
  local st = C.pa_tensor_create(ctx, dev.handle, code, #shape, shape_buf, tensor_box)
  if st == OUT_OF_MEMORY then
    collect(n)
    st = C.pa_tensor_create(ctx, dev.handle, code, #shape, shape_buf, tensor_box)
  end
  local ok, err = check(st, fname, 3)
  if not ok then return nil, err end
  n.live = n.live + bytes
  local copy = {}
  for i = 1, #shape do copy[i] = shape[i] end
  return setmetatable({
    handle = ffi.gc(tensor_box[0], function(h)
      n.live = n.live - bytes
      C.pa_tensor_destroy(h)
    end),
    shape = copy, dtype = dtype, device = dev, numel = numel, nbytes = bytes,
  }, Tensor)
end
M.new_tensor = new_tensor

-- Releases the tensor's memory now, instead of when the collector finds it
-- unreachable; using it afterwards is an error. Freeing twice is harmless.
-- (A batch's views belong to the batch: close the batch instead.)
function Tensor:free()
  if self.owner then
    raise("pagedattn.free: tensor: a view owned by its batch (b:close() releases it)")
  end
  if (self.held_by or 0) > 0 then
    raise("pagedattn.free: tensor: a kv_cache's page pool uses it (cache:close() first)")
  end
  local h = self.handle
  if h == nil then return end
  self.handle = nil
  self.dead = "released by t:free()"
  ffi.gc(h, nil)
  local n = native_of(self.device)
  n.live = n.live - (self.nbytes or 0)
  C.pa_tensor_destroy(h)
end

-- A zero-filled tensor.
function M.tensor(shape, dtype, device)
  return new_tensor(shape, dtype, device, "tensor")
end

-- values: flat 1-based Lua array in row-major order.
function M.from_table(values, shape, dtype, device)
  if type(values) ~= "table" then
    raise("pagedattn.from_table: values: expected a table, got " .. type(values))
  end
  if shape == nil then shape = { #values } end
  local t, err = new_tensor(shape, dtype, device, "from_table")
  if not t then return nil, err end
  if #values ~= t.numel then
    raise("pagedattn.from_table: values: " .. #values .. " numbers for shape [" ..
          table.concat(shape, ", ") .. "] (" .. t.numel .. " elements)")
  end
  local ok, werr = t:write(values)
  if not ok then return nil, werr end
  return t
end

-- Standard normal values generated on the device from seed (Philox-4x32-10).
function M.randn(shape, dtype, device, seed)
  local t, err = new_tensor(shape, dtype or "f32", device, "randn")
  if not t then return nil, err end
  if seed ~= nil and (type(seed) ~= "number" or seed < 0 or seed ~= math.floor(seed)) then
    raise("pagedattn.randn: seed: expected a whole number >= 0, got " .. tostring(seed))
  end
  local ok, ferr = check(C.pa_tensor_fill_randn(ctx, live(t, "randn", "tensor"), seed or 0), "randn")
  if not ok then return nil, ferr end
  return t
end

-- Writes values (flat Lua array, or a double* with count) at element offset (0-based).
function Tensor:write(values, offset, count)
  offset = offset or 0
  local buf
  if type(values) == "table" then
    count = count or #values
    buf = ffi.new("double[?]", count > 0 and count or 1)
    for i = 1, count do
      local v = values[i]
      if type(v) ~= "number" then
        raise("pagedattn.write: values: element " .. i .. " is " .. type(v) .. ", not a number")
      end
      buf[i - 1] = v
    end
  else
    buf = values
  end
  local ok, err = check(C.pa_tensor_write_f64(ctx, live(self, "write", "tensor"), offset, buf, count), "write")
  if not ok then return nil, err end
  return self
end

-- Flat 1-based Lua array of numbers (copied to the host): every element, or
-- `count` elements from element `offset` (0-based).
function Tensor:to_table(offset, count)
  offset = offset or 0
  local n = count or (self.numel - offset)
  local buf = ffi.new("double[?]", n > 0 and n or 1)
  local ok, err = check(C.pa_tensor_read_f64(ctx, live(self, "to_table", "tensor"), offset, buf, n), "to_table")
  if not ok then raise(err) end
  local out = {}
  for i = 1, n do out[i] = buf[i - 1] end
  return out
end

function Tensor:fill(value)
  local ok, err = check(C.pa_tensor_fill(ctx, live(self, "fill", "tensor"), value), "fill")
  if not ok then raise(err) end
  return self
end

-- Copies src (same device, dtype and size) into self.
function Tensor:copy_from(src)
  if not is_tensor(src) then raise("pagedattn.copy_from: src: expected a tensor") end
  local ok, err = check(C.pa_tensor_copy(ctx, live(self, "copy_from", "tensor"), live(src, "copy_from", "src")),
                        "copy_from")
  if not ok then raise(err) end
  return self
end

function Tensor:clone()
  local t = assert(new_tensor(self.shape, self.dtype, self.device, "clone"))
  return t:copy_from(self)
end

-- The data's address (device address on a GPU). Writes through it are not
-- seen by the library: from now on attention downloads this tensor whenever
-- it reads it as an index tensor (it keeps no host copy of it any more).
function Tensor:data_ptr() return C.pa_tensor_data(live(self, "data_ptr", "tensor")) end

function Tensor:__tostring()
  return string.format("pagedattn.tensor([%s], %s, %s%s)", table.concat(self.shape, ", "),
                       self.dtype, self.device.name, self.handle == nil and ", dead" or "")
end

return M
