-- pagedattn.sweep.util: small helpers the sweep modules share: how a value is
-- spelt in a CSV and a key, shell quoting, paths, durations, the host name,
-- and the library loaded on first use (reading CSVs and plotting never load
-- it, so scripts/plot runs under any Lua 5.1+).
local M = {}

function M.is_array(t)
  return type(t) == "table" and (#t > 0 or next(t) == nil)
end

function M.copy(t)
  local r = {}
  for k, v in pairs(t) do r[k] = v end
  return r
end

-- The one spelling of a value in a CSV and in a key: integers without a
-- fraction, other numbers in the shortest form that reads back the same.
function M.fmt_value(v)
  if v == nil then return "" end
  if type(v) == "number" then
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return string.format("%d", v) end
    local s = string.format("%.15g", v)
    if tonumber(s) ~= v then s = string.format("%.17g", v) end
    return s
  end
  return tostring(v)
end

-- A measured number in a CSV: 6 significant digits; nothing for nan and inf.
function M.fmt_metric(v)
  if v == nil then return "" end
  if type(v) == "number" then
    if v ~= v or v == math.huge or v == -math.huge then return "" end
    if v == math.floor(v) and math.abs(v) < 1e15 then return string.format("%d", v) end
    return string.format("%.6g", v)
  end
  return tostring(v)
end

-- "16" -> 16, "true" -> true, anything else stays a string.
function M.parse_value(s)
  local n = tonumber(s)
  if n then return n end
  if s == "true" then return true elseif s == "false" then return false end
  return s
end

-- "1,8,16" or "none" -> {1, 8, 16} / {"none"}
function M.parse_list(s)
  local vals = {}
  for item in tostring(s):gmatch("[^,]+") do vals[#vals + 1] = M.parse_value(item) end
  return vals
end

function M.file_exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

function M.shell_quote(s)
  s = tostring(s)
  if s:match("^[%w@%%+=:,./_-]+$") then return s end
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- os.execute's status under Lua 5.1/LuaJIT (a number) and 5.2+ (true/nil, how, code)
function M.execute(cmd)
  local a, _, c = os.execute(cmd)
  if type(a) == "number" then return a == 0 end
  return a == true and (c == nil or c == 0)
end

function M.dirname(path)
  return path:match("^(.*)/[^/]*$") or "."
end

function M.mkdir_p(dir)
  if dir == "" or dir == "." then return true end
  return M.execute("mkdir -p " .. M.shell_quote(dir))
end

-- An absolute path without "." and ".." components (lexically).
function M.absolute(path)
  if path:sub(1, 1) ~= "/" then
    local pwd = os.getenv("PWD")
    if not pwd then
      local p = io.popen("pwd")
      pwd = p:read("*l")
      p:close()
    end
    path = pwd .. "/" .. path
  end
  local parts = {}
  for part in path:gmatch("[^/]+") do
    if part == ".." then
      if #parts > 0 then parts[#parts] = nil end
    elseif part ~= "." then
      parts[#parts + 1] = part
    end
  end
  return "/" .. table.concat(parts, "/")
end

function M.fmt_duration(s)
  if s ~= s or s == math.huge then return "?" end
  s = math.floor(s + 0.5)
  if s < 60 then return s .. "s" end
  if s < 3600 then return string.format("%dm%02ds", math.floor(s / 60), s % 60) end
  return string.format("%dh%02dm", math.floor(s / 3600), math.floor(s % 3600 / 60))
end

local hostname_cache
function M.hostname()
  if not hostname_cache then
    local f = io.open("/proc/sys/kernel/hostname", "r")
    if f then hostname_cache = f:read("*l") f:close() end
    if not hostname_cache or hostname_cache == "" then
      local p = io.popen("uname -n 2>/dev/null")
      hostname_cache = p and p:read("*l") or ""
      if p then p:close() end
    end
  end
  return hostname_cache
end

-- The pagedattn module, loaded on first use.
local pa_module
function M.pa()
  pa_module = pa_module or require "pagedattn"
  return pa_module
end

-- The device a sweep runs on when its points name none.
function M.default_device(name)
  local dev, err = M.pa().device(name)
  if not dev then error(err, 0) end
  return dev
end

return M
