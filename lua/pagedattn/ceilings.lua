-- pagedattn.ceilings: a device's measured ceilings (streaming read, copy,
-- fp32 FMA on a CPU, bf16 matmul on a GPU), measured once and kept on disk,
-- so that sweeps, jobs and serving replays do not spend seconds measuring
-- them again on every run.
--   local ceilings = require "pagedattn.ceilings"
--   local c, err = ceilings.get(dev)              -- cached when fresh
--   local c = ceilings.get(dev, { refresh = true }) -- measure now, store
-- The table is dev:ceilings()'s (read_gbps, copy_gbps, fma_gflops,
-- matmul_gflops, matmul_sustained_gflops, matmul_note, seconds) plus
-- `measured_at` (os.time()) and `cached` (true when it came from disk).
-- Entries are keyed by host, device name and description and the library's
-- version, in $XDG_CACHE_HOME/pagedattn/ceilings (else ~/.cache/...), one
-- small Lua file each; older than opts.max_age seconds (default 30 days) or
-- measured for fewer seconds than asked: measured again.
local ffi = require "ffi"
local core = require "pagedattn.core"

local M = {}

local FIELDS = { "read_gbps", "copy_gbps", "fma_gflops", "matmul_gflops",
                 "matmul_sustained_gflops", "seconds", "measured_at" }

local function hostname()
  local f = io.open("/proc/sys/kernel/hostname", "r") or io.open("/etc/hostname", "r")
  local h = f and f:read("*l")
  if f then f:close() end
  return (h and h ~= "") and h or "localhost"
end

-- The directory the entries live in ("off" in opts.dir: no disk cache).
function M.dir()
  local base = os.getenv("XDG_CACHE_HOME")
  if not base or base == "" then base = (os.getenv("HOME") or "/tmp") .. "/.cache" end
  return base .. "/pagedattn/ceilings"
end

local function key_of(dev)
  local version = ffi.string(core.C.pa_version())
  local raw = table.concat({ hostname(), dev.name, dev.description, version }, "|")
  return (raw:gsub("[^%w%.%-_]+", "_"))
end

local function read_entry(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  local chunk = loadstring(text, "=" .. path)
  if not chunk then return nil end
  setfenv(chunk, {})
  local ok, t = pcall(chunk)
  if not ok or type(t) ~= "table" then return nil end
  for _, k in ipairs(FIELDS) do
    if type(t[k]) ~= "number" then return nil end
  end
  return t
end

local function write_entry(path, dir, t)
  os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "' 2>/dev/null")
  local tmp = path .. ".tmp" .. tostring(os.time()) .. tostring(math.random(1e9))
  local f = io.open(tmp, "w")
  if not f then return false end
  local parts = { "return {" }
  for _, k in ipairs(FIELDS) do parts[#parts + 1] = string.format("  %s = %.17g,", k, t[k]) end
  if t.matmul_note then parts[#parts + 1] = string.format("  matmul_note = %q,", t.matmul_note) end
  parts[#parts + 1] = "}\n"
  f:write(table.concat(parts, "\n"))
  f:close()
  return os.rename(tmp, path) ~= nil -- atomic: a reader never sees half an entry
end

-- ceilings.get(dev [, opts]) -> table | nil, err
--   opts.seconds  how long each measurement runs when measuring (default 0.5)
--   opts.refresh  measure even when a fresh entry exists
--   opts.max_age  seconds an entry stays fresh (default 30 days)
--   opts.dir      where entries live ("off": measure, store nothing)
function M.get(dev, opts)
  opts = opts or {}
  local seconds = opts.seconds or 0.5
  local dir = opts.dir or M.dir()
  local path = dir ~= "off" and (dir .. "/" .. key_of(dev) .. ".lua") or nil
  if path and not opts.refresh then
    local t = read_entry(path)
    if t and os.time() - t.measured_at <= (opts.max_age or 30 * 86400) and t.seconds >= seconds * 0.999 then
      t.cached = true
      return t
    end
  end
  local m, err = dev:ceilings(seconds)
  if not m then return nil, err end
  m.measured_at = os.time()
  for _, k in ipairs(FIELDS) do m[k] = m[k] or 0 end
  if path then write_entry(path, dir, m) end
  m.cached = false
  return m
end

return M
