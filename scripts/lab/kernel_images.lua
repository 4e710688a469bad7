-- scripts/lab/kernel_images.lua OUTDIR LIST [--arch ARCH] [--shard K/N] -- compiles
-- each kernel variant named in the file LIST (one a line) through NVRTC with
-- the library that LUA_PATH / PAGEDATTN_LIB find, and writes its compiled
-- image to OUTDIR/<variant, blanks as _>.cubin (".ptx" for a compute_XX
-- ARCH). Each variant compiles into an empty disk cache of its own
-- (PAGEDATTN_KERNEL_CACHE, read by the library at every compile), whose one
-- file is the image behind a 48-byte header (src/cuda/cuda_kernels.c,
-- cache_header: "PAKERNEL", format, kind, key, size, checksum). A variant
-- that fails is listed in OUTDIR/failed.txt. Used by scripts/lab/sass_diff.sh;
-- ARCH defaults to sm_90a. --shard K/N: every N-th variant from the K-th.
local ffi = require "ffi"
local core = require "pagedattn.core"
local C = core.C
pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
-- (declared by the public header's cdef today; if the lab calls move to a
-- header of their own, this declaration keeps the script working)
if not pcall(function() return C.pa_kernel_compile end) then
  ffi.cdef("int pa_kernel_compile(pa_context *ctx, const char *variant, const char *arch, int use_disk_cache, int *was_cached);")
end

local out, list = arg[1], arg[2]
if not out or not list then
  io.stderr:write("usage: kernel_images.lua OUTDIR LIST [--arch ARCH] [--shard K/N]\n")
  os.exit(2)
end
local arch, shard_k, shard_n = "sm_90a", 1, 1
local i = 3
while i <= #arg do
  if arg[i] == "--arch" then arch = arg[i + 1]
  elseif arg[i] == "--shard" then
    local k, n = tostring(arg[i + 1]):match("^(%d+)/(%d+)$")
    shard_k, shard_n = assert(tonumber(k), "--shard K/N"), assert(tonumber(n), "--shard K/N")
  else error("kernel_images.lua: unknown argument " .. arg[i]) end
  i = i + 2
end

local function sh(cmd) assert(os.execute(cmd) == 0, cmd) end
local variants = {}
for line in io.lines(list) do
  line = line:gsub("#.*", ""):match("^%s*(.-)%s*$")
  if line ~= "" then variants[#variants + 1] = line end
end

local ext = arch:match("^compute_") and ".ptx" or ".cubin"
local tmp = string.format("%s/.cache-%d", out, shard_k)
local cached = ffi.new("int[1]")
local failed = {}
for j = shard_k, #variants, shard_n do
  local v = variants[j]
  sh("rm -rf '" .. tmp .. "' && mkdir -p '" .. tmp .. "'")
  assert(ffi.C.setenv("PAGEDATTN_KERNEL_CACHE", tmp, 1) == 0)
  if C.pa_kernel_compile(core.ctx, v, arch, 1, cached) ~= 0 then
    failed[#failed + 1] = v .. "\t" .. core.last_error():gsub("\n", " ")
  else
    local p = assert(io.popen("ls '" .. tmp .. "'"))
    local names = {}
    for name in p:lines() do names[#names + 1] = name end
    p:close()
    assert(#names == 1, v .. ": expected one cache file, found " .. #names)
    local f = assert(io.open(tmp .. "/" .. names[1], "rb"))
    local data = f:read("*a")
    f:close()
    assert(data:sub(1, 8) == "PAKERNEL", v .. ": not a pagedattn cache file")
    local image = data:sub(49)
    assert(ext == ".ptx" or image:sub(1, 4) == "\127ELF", v .. ": the image is not an ELF cubin")
    local o = assert(io.open(out .. "/" .. v:gsub("[^%w=._-]", "_") .. ext, "wb"))
    o:write(image)
    o:close()
  end
end
sh("rm -rf '" .. tmp .. "'")
if #failed > 0 then
  local f = assert(io.open(string.format("%s/failed-%d.txt", out, shard_k), "w"))
  f:write(table.concat(failed, "\n"), "\n")
  f:close()
end
print(string.format("kernel_images: shard %d/%d: %d variants, %d failed", shard_k, shard_n,
  math.floor((#variants - shard_k) / shard_n) + 1, #failed))
