-- pagedattn.sweep.plot_cli: the command line of scripts/plot (pagedattn-plot):
-- options parsed from one table that also writes --help, then plot.plot.
local plot = require "pagedattn.sweep.plot"

local M = {}

local function number(flag, v)
  return tonumber(v) or error({ msg = flag .. " wants a number (got '" .. tostring(v) .. "')" })
end

-- flag (and an alias), the value's name (nil: none; "[BASE]": optional), help, what it sets
local FLAGS = {
  { "-x", "COLUMN", "the x column (a column of the CSV header)", function(o, v) o.x = v end },
  { "-y", "COLUMN", "the y column; also tflops, ms, us (gflops / 1000, median_s * 1e3, * 1e6)",
    function(o, v) o.y = v end },
  { "--by", "COL[,COL]", "one line per value (e.g. --by page)", function(o, v) o.by = v end },
  { "--where", "COL=V[,V]", "keep rows with these values (repeatable)",
    function(o, v) o.where[#o.where + 1] = v end },
  { "--output", "FILE", ".png or .svg (default: <first csv>-<y>.png)", alias = "-o",
    function(o, v) o.output = v end },
  { "--title", "T", "the chart's title (the device and shape line stays under it)",
    function(o, v) o.title = v end },
  { "--subtitle", "T", "the line under the title instead of the device and shape ('' for none)",
    function(o, v) o.subtitle = v end },
  { "--xlabel", "T", "the x axis label", function(o, v) o.xlabel = v end },
  { "--ylabel", "T", "the y axis label", function(o, v) o.ylabel = v end },
  { "--logx", "[BASE]", "logarithmic x axis (base 2 by default)", function(o, v) o.logx = v or true end },
  { "--logy", "[BASE]", "logarithmic y axis", function(o, v) o.logy = v or true end },
  { "--scale", "F", "multiply y by F", function(o, v, f) o.scale = number(f, v) end },
  { "--ceiling", nil, "draw the measured ceiling (y = gbps, gflops, tflops, ratio)",
    function(o) o.ceiling = true end },
  { "--errorbars", nil, "draw the interquartile range of the timed repeats (y = a time or a rate)",
    function(o) o.errorbars = true end },
  { "--size", "W,H", "pixels (default 900,560)", function(o, v, f)
      local w, h = v:match("^(%d+),(%d+)$")
      if not w then error({ msg = f .. " wants W,H (got '" .. v .. "')" }) end
      o.size = { tonumber(w), tonumber(h) }
    end },
  { "--keep-script", nil, "keep the gnuplot script and print its path on stderr",
    function(o) o.keep_script = true end },
  { "--help", nil, "this text", alias = "-h", function(o) o.help = true end },
}

local BY_NAME = {}
for _, f in ipairs(FLAGS) do
  BY_NAME[f[1]] = f
  if f.alias then BY_NAME[f.alias] = f end
end

local function usage_text()
  local lines = { "usage: scripts/plot CSV... -x COLUMN -y COLUMN [options]" }
  for _, f in ipairs(FLAGS) do
    local name = (f.alias and (f.alias .. ", ") or "") .. f[1] .. (f[2] and (" " .. f[2]) or "")
    lines[#lines + 1] = string.format("  %-20s %s", name, f[3])
  end
  lines[#lines + 1] = "Only rows with status ok are drawn, the last row of each point; several CSVs"
  lines[#lines + 1] = "(shard files, parts) are read as one."
  return table.concat(lines, "\n") .. "\n"
end
M.USAGE = usage_text()

-- Parses the arguments: opts for plot.plot (o.csv: the CSV files), or nil, message.
function M.parse_args(argv)
  local o = { csv = {}, where = {} }
  local ok, err = pcall(function()
    local i = 1
    while i <= #argv do
      local a = argv[i]
      local f = BY_NAME[a]
      if f then
        local v
        if f[2] == "[BASE]" then
          if tonumber(argv[i + 1] or "") then v = tonumber(argv[i + 1]) i = i + 1 end
        elseif f[2] then
          v = argv[i + 1]
          if v == nil then error({ msg = a .. " needs a value" }) end
          i = i + 1
        end
        f[4](o, v, a)
      elseif a:sub(1, 1) == "-" then
        error({ msg = "unknown option " .. a })
      else
        o.csv[#o.csv + 1] = a
      end
      i = i + 1
    end
    if o.help then return end
    if #o.csv == 0 then error({ msg = "no CSV file" }) end
    if not o.x or not o.y then error({ msg = "-x and -y are required" }) end
  end)
  if not ok then
    if type(err) == "table" then return nil, err.msg end
    error(err, 0)
  end
  return o
end

-- scripts/plot: returns the exit status (0: drawn, 1: no chart, 2: usage).
function M.main(argv)
  local o, err = M.parse_args(argv)
  if not o then
    io.stderr:write("scripts/plot: ", err, "\n", M.USAGE)
    return 2
  end
  if o.help then io.stdout:write(M.USAGE) return 0 end
  local out, perr = plot.plot(o)
  if not out then
    io.stderr:write(perr, "\n")
    return 1
  end
  io.stdout:write(out, "\n")
  return 0
end

return M
