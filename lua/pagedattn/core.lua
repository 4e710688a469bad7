-- pagedattn.core: finds and loads libpagedattn, declares its API once from the
-- public header, and turns C statuses into Lua errors.
--
-- Lookup order for the library: $PAGEDATTN_LIB, build/lib/ of the source tree
-- this file lives in, package.cpath, then the system's (ffi.load "pagedattn").
-- The header (the one source of the cdef): $PAGEDATTN_HEADER, src/ of the
-- source tree, pagedattn/pagedattn.h along package.path, /usr[/local]/include.
local ffi = require "ffi"

local M = {}

local function file_exists(path)
  local f = path and io.open(path, "rb")
  if f then f:close() return true end
  return false
end

-- "a/b/../c" -> "a/c" (for paths shown to users)
local function normalize(path)
  local out = {}
  for part in path:gmatch("[^/]+") do
    if part == ".." and #out > 0 and out[#out] ~= ".." then out[#out] = nil
    elseif part ~= "." then out[#out + 1] = part end
  end
  return (path:sub(1, 1) == "/" and "/" or "") .. table.concat(out, "/")
end

local function read_file(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- The directory of this module, and the source tree it sits in
-- (lua/pagedattn/core.lua -> root), if any.
local module_dir = (function()
  local src = debug.getinfo(1, "S").source
  if src:sub(1, 1) ~= "@" then return nil end
  return src:sub(2):match("^(.*)/[^/]*$") or "."
end)()
M.root = module_dir and module_dir .. "/../.."


local function find_header()
  local candidates = { os.getenv("PAGEDATTN_HEADER") }
  if M.root then candidates[#candidates + 1] = M.root .. "/src/pagedattn.h" end
  local via_path = package.searchpath and
    package.searchpath("pagedattn.pagedattn", (package.path:gsub("%.lua", ".h")))
  candidates[#candidates + 1] = via_path
  candidates[#candidates + 1] = "/usr/local/include/pagedattn.h"
  candidates[#candidates + 1] = "/usr/include/pagedattn.h"
  for _, c in ipairs(candidates) do
    if c and c ~= "" and file_exists(c) then return c end
  end
  error("pagedattn: cannot find pagedattn.h (set PAGEDATTN_HEADER)", 0)
end

local function find_library()
  local env = os.getenv("PAGEDATTN_LIB")
  if env and env ~= "" then return env end
  if M.root then
    local p = M.root .. "/build/lib/libpagedattn.so"
    if file_exists(p) then return p end
  end
  -- an installed package: beside the modules, or where scripts/install puts it
  -- (PREFIX/share/lua/5.1/pagedattn/ -> PREFIX/lib/), so LUA_PATH alone finds it
  if module_dir then
    for _, p in ipairs { module_dir .. "/libpagedattn.so", module_dir .. "/../../../../lib/libpagedattn.so" } do
      if file_exists(p) then return normalize(p) end
    end
  end
  local via_cpath = package.searchpath and package.searchpath("libpagedattn", package.cpath)
  return via_cpath or "pagedattn"
end

-- One cdef, straight from the headers' API blocks: the product's
-- (pagedattn.h) and the laboratory's (pagedattn_lab.h, beside it). busted may
-- load this module more than once in a process; the FFI keeps declarations,
-- so declare once.
if not pcall(ffi.typeof, "pa_attention_params") then
  local header_path = find_header()
  local text = read_file(header_path)
  local api = text:match("/%* PA_API_BEGIN %*/(.-)/%* PA_API_END %*/")
  if not api then error("pagedattn: " .. header_path .. " has no PA_API_BEGIN/END block", 0) end
  local lab_path = (header_path:match("^(.*)/[^/]*$") or ".") .. "/pagedattn_lab.h"
  if not file_exists(lab_path) then error("pagedattn: " .. lab_path .. " is missing (it sits beside pagedattn.h)", 0) end
  local lab = read_file(lab_path):match("/%* PA_LAB_API_BEGIN %*/(.-)/%* PA_LAB_API_END %*/")
  if not lab then error("pagedattn: " .. lab_path .. " has no PA_LAB_API_BEGIN/END block", 0) end
  ffi.cdef(api .. lab)
end

M.library_path = find_library()
local ok, lib = pcall(ffi.load, M.library_path)
if not ok then
  error("pagedattn: cannot load the library " .. M.library_path .. ": " .. tostring(lib) ..
        " (build it with scripts/test or scripts/run, or set PAGEDATTN_LIB)", 0)
end
M.C = lib
local C = lib

-- One context (error state) for this Lua state.
local ctx_box = ffi.new("pa_context*[1]")
assert(C.pa_context_create(ctx_box) == 0, "pagedattn: cannot create a context")
M.ctx = ffi.gc(ctx_box[0], C.pa_context_destroy)

function M.last_error()
  return ffi.string(C.pa_context_error(M.ctx))
end

-- Raises msg at the first stack frame outside the package (C frames such as
-- pcall skipped): the user's line that called into pagedattn, however deep
-- inside the package the mistake was found.
local package_dir = (debug.getinfo(1, "S").source:match("^@(.*/)[^/]*$"))
function M.raise(msg)
  local level = 2
  while true do
    local info = debug.getinfo(level, "S")
    if not info then break end
    local inside = info.what == "C" or
      (package_dir and info.source:sub(1, #package_dir + 1) == "@" .. package_dir)
    if not inside then break end
    level = level + 1
  end
  error(msg, level)
end

-- Caller mistakes (PA_ERR_ARGUMENT) raise at the caller's line; run-time
-- failures return nil, message. (`level` is accepted for old callers.)
local ARGUMENT = 1
function M.check(status, fname, level)
  if status == 0 then return true end
  local msg = "pagedattn." .. fname .. ": " .. M.last_error()
  if status == ARGUMENT then M.raise(msg) end
  return nil, msg
end

M.dtypes = { f32 = 0, f16 = 1, bf16 = 2, i32 = 3, fp8_e4m3 = 4, fp8_e5m2 = 5 }
M.dtype_names = { [0] = "f32", "f16", "bf16", "i32", "fp8_e4m3", "fp8_e5m2" }

return M
