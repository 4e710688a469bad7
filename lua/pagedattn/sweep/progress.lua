-- pagedattn.sweep.progress: what a running sweep tells its user on stderr: a
-- bar with an ETA on a terminal, one line per point otherwise.
local util = require "pagedattn.sweep.util"

local M = {}

local function stderr_is_tty()
  local ok, ffi = pcall(require, "ffi")
  if ok then
    if not pcall(function() return ffi.C.isatty end) then
      pcall(ffi.cdef, "int isatty(int fd);")
    end
    local ok2, r = pcall(function() return ffi.C.isatty(2) end)
    if ok2 then return r == 1 end
  end
  return util.execute("test -t 2")
end

local function terminal_width()
  local cols = tonumber(os.getenv("COLUMNS") or "")
  if cols then return cols end
  local p = io.popen("(stty size </dev/tty) 2>/dev/null")
  local line = p and p:read("*l")
  if p then p:close() end
  cols = line and tonumber(line:match("%d+%s+(%d+)"))
  return cols or 80
end

-- mode: "auto" (nil) | "bar" | "lines" | "none"; total: points to run; out:
-- a stream (default io.stderr). P.done is the count finished so far.
function M.new(mode, total, out)
  out = out or io.stderr
  if mode == nil or mode == "auto" then mode = stderr_is_tty() and "bar" or "lines" end
  local P = { mode = mode, total = total, done = 0, out = out, width = 80 }
  if mode == "bar" then P.width = terminal_width() end
  local function clip(s) return #s >= P.width and s:sub(1, P.width - 1) or s end
  function P:eta(elapsed)
    if self.done == 0 then return "?" end
    return util.fmt_duration(elapsed / self.done * (self.total - self.done))
  end
  function P:bar(elapsed, label)
    if self.mode ~= "bar" then return end
    local n = 24
    local fill = self.total > 0 and math.floor(n * self.done / self.total) or n
    local s = string.format("[%s%s] %d/%d  ETA %s  %s", string.rep("#", fill),
      string.rep(".", n - fill), self.done, self.total, self:eta(elapsed), label or "")
    self.out:write("\r\27[K", clip(s))
    self.out:flush()
  end
  -- a message on its own line (above the bar on a terminal)
  function P:line(s)
    if self.mode == "none" then return end
    if self.mode == "bar" then self.out:write("\r\27[K") end
    self.out:write(s, "\n")
    self.out:flush()
  end
  function P:finish()
    if self.mode == "bar" then self.out:write("\r\27[K") self.out:flush() end
  end
  return P
end

return M
