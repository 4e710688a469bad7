-- pagedattn.sweep.plot: charts from sweep CSVs with gnuplot. Chooses the rows
-- (the last ok row of each point), groups them into series, places x values
-- (a value like "none" on a numeric axis gets its own place at the left, not a
-- spot on the line), draws the interquartile range of the timed repeats as
-- error bars, and names the device and the shape in a subtitle. Needs no
-- libpagedattn: scripts/plot runs under any Lua 5.1+.
local util = require "pagedattn.sweep.util"
local csv = require "pagedattn.sweep.csv"
local stats = require "pagedattn.sweep.stats"

local fmt_value, shell_quote, execute = util.fmt_value, util.shell_quote, util.execute

local M = {}

local LABELS = {
  gbps = "GB/s", gflops = "GFLOP/s", tflops = "TFLOP/s", ratio = "fraction of the ceiling",
  median_s = "seconds (median)", ms = "milliseconds (median)", us = "microseconds (median)",
  context = "context length (keys)", seqlen = "sequence length (tokens)",
  page = "page size (tokens)", batch = "batch", heads = "query heads", head_dim = "head dim",
}

-- columns computed from others
local DERIVED = {
  tflops = function(r) return tonumber(r.gflops) and tonumber(r.gflops) / 1e3 end,
  ms = function(r) return tonumber(r.median_s) and tonumber(r.median_s) * 1e3 end,
  us = function(r) return tonumber(r.median_s) and tonumber(r.median_s) * 1e6 end,
}
-- Columns proportional to the median time, and to its inverse: the only ones
-- the quartiles of the timed repeats give error bars for.
local TIME_COLUMNS = { median_s = true, ms = true, us = true }
local RATE_COLUMNS = { gbps = true, gflops = true, tflops = true, ratio = true }

local function column(row, name)
  if DERIVED[name] and row[name] == nil then return DERIVED[name](row) end
  return row[name]
end

local function as_list(v)
  if v == nil then return {} end
  if type(v) == "table" then return v end
  local out = {}
  for item in tostring(v):gmatch("[^,]+") do out[#out + 1] = item end
  return out
end

-- A gnuplot string literal; a newline becomes a line break in titles.
local function gp_string(s)
  return '"' .. tostring(s):gsub("\\", "\\\\"):gsub('"', '\\"'):gsub("\n", "\\n") .. '"'
end

local terminal_cache
local function png_terminal()
  if terminal_cache == nil then
    terminal_cache = execute("gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1") and "pngcairo" or "png"
  end
  return terminal_cache
end

local function baseline(v) return v == "none" or v == "unpaged" end

-- numbers first (numerically), then strings, the unpaged baseline before other strings
local function value_less(a, b)
  local na, nb = tonumber(a), tonumber(b)
  if na and nb then return na < nb end
  if na then return true end
  if nb then return false end
  if baseline(a) ~= baseline(b) then return baseline(a) end
  return tostring(a) < tostring(b)
end

-- How an x value or a series is named on the chart: page 0 / "none" is the contiguous cache.
local function value_label(col, v)
  if col == "page" and (v == "none" or v == "0" or v == "unpaged") then return "unpaged" end
  return v
end

-- The error bar of y from the quartiles of the row's timed repeats ([y, y]
-- when the row has none). A CSV written before q1_s and q3_s existed has the
-- interquartile range's width only (spread): centred on the median then.
local function iqr_bar(r, ycol, y)
  if not (TIME_COLUMNS[ycol] or RATE_COLUMNS[ycol]) then return y, y end
  local med, q1, q3 = tonumber(r.median_s), tonumber(r.q1_s), tonumber(r.q3_s)
  if med and not (q1 and q3) and tonumber(r.spread) then
    local half = tonumber(r.spread) * med / 2
    q1, q3 = med - half, med + half
  end
  if not (med and q1 and q3 and med > 0 and q1 > 0) then return y, y end
  if TIME_COLUMNS[ycol] then return y * q1 / med, y * q3 / med end
  return y * med / q3, y * med / q1 -- a rate is highest at the fastest quartile
end

-- The where filters as { column = {values as written} }, or nil, err.
local function parse_where(where)
  local out = {}
  if not where then return out end
  if util.is_array(where) then
    for _, w in ipairs(where) do
      local c, v = tostring(w):match("^([^=]+)=(.*)$")
      if not c then return nil, "plot: --where wants COLUMN=V1,V2 (got '" .. tostring(w) .. "')" end
      out[c] = as_list(v)
    end
  else
    for c, v in pairs(where) do
      local vals = type(v) == "table" and v or as_list(fmt_value(v))
      out[c] = {}
      for i, x in ipairs(vals) do out[c][i] = fmt_value(x) end
    end
  end
  return out
end

-- The last ok row of each point that passes the filters: rows in order, and
-- the set of columns seen. Or nil, err.
local function chosen_rows(paths, where)
  local rows = csv.read_csv(paths)
  local last, order, seen = {}, {}, {}
  for _, r in ipairs(rows) do
    for k in pairs(r) do seen[k] = true end
    local keep = r.status == "ok"
    for c, vals in pairs(where) do
      local hit = false
      for _, v in ipairs(vals) do if r[c] == v then hit = true end end
      if not hit then keep = false end
    end
    if keep then
      local key = csv.row_key(r)
      if not last[key] then order[#order + 1] = key end
      last[key] = r
    end
  end
  local out = {}
  for i, key in ipairs(order) do out[i] = last[key] end
  return out, seen
end

-- Parts joined by sep into lines of at most `limit` characters.
local function wrap(parts, sep, limit)
  local lines, cur = {}, nil
  for _, p in ipairs(parts) do
    if cur and #cur + #sep + #p > limit then
      lines[#lines + 1] = cur .. sep:gsub("%s+$", "")
      cur = p
    else
      cur = cur and (cur .. sep .. p) or p
    end
  end
  lines[#lines + 1] = cur
  return table.concat(lines, "\n")
end

-- "cpu (Intel Xeon, 2 threads)\nbatch 4, heads 32, ...": the device(s), then
-- every axis that holds one value across the drawn rows, other than x and
-- --by; lines of at most `limit` characters (default 100).
function M.subtitle(rows, x, by, limit)
  limit = limit or 100
  local skip = { [x] = true }
  for _, c in ipairs(by) do skip[c] = true end
  local devices, dev_order = {}, {}
  local axes, axis_order, value = {}, {}, {}
  for _, r in ipairs(rows) do
    local d = (r.device or "") ~= "" and r.device or "?"
    if (r.device_desc or "") ~= "" then d = d .. " (" .. r.device_desc .. ")" end
    if not devices[d] then devices[d] = true dev_order[#dev_order + 1] = d end
    for _, a in ipairs(r._axes or {}) do
      if not axes[a] then axes[a] = true axis_order[#axis_order + 1] = a end
    end
  end
  local shape = {}
  for _, a in ipairs(axis_order) do
    if not skip[a] and a ~= "device" then
      local one = true
      for _, r in ipairs(rows) do
        local v = r[a]
        if v == nil or v == "" then one = false break end
        if value[a] == nil then value[a] = v elseif value[a] ~= v then one = false break end
      end
      if one then shape[#shape + 1] = a .. " " .. value_label(a, value[a]) end
    end
  end
  local text = wrap(dev_order, "; ", limit)
  if #shape > 0 then text = text .. "\n" .. wrap(shape, ", ", limit) end
  return text
end

-- Groups rows into series by the `by` columns: sorted series names, series by
-- name ({name, points = {x, y, lo, hi}}), or nil, err when two rows land on one spot.
local function group(rows, o, by, scale)
  local series, names, cells = {}, {}, {}
  for _, r in ipairs(rows) do
    local y = tonumber(column(r, o.y))
    local x = column(r, o.x)
    if y and x and x ~= "" then
      local parts = {}
      for _, c in ipairs(by) do parts[#parts + 1] = (#by > 1 and (c .. "=") or "") .. tostring(r[c]) end
      local sname = #by > 0 and table.concat(parts, " ") or o.y
      if not series[sname] then
        local sortkey = {}
        for _, c in ipairs(by) do sortkey[#sortkey + 1] = r[c] end
        series[sname] = { name = sname, sortkey = sortkey, points = {} }
        names[#names + 1] = sname
      end
      local cell = sname .. "\31" .. tostring(x)
      if cells[cell] then
        -- two points land on one spot: name the columns that tell them apart
        local a, diff = cells[cell], {}
        for _, c in ipairs(r._axes) do
          if a[c] ~= r[c] then diff[#diff + 1] = string.format("%s (%s vs %s)", c, a[c], r[c]) end
        end
        if a.sweep ~= r.sweep then diff[#diff + 1] = "sweep (" .. a.sweep .. " vs " .. r.sweep .. ")" end
        return nil, string.format("plot: several rows for %s=%s%s; they differ in %s: choose one with " ..
          "--where COLUMN=VALUE or add the column to --by", o.x, tostring(x),
          #by > 0 and (" in series " .. sname) or "", table.concat(diff, ", "))
      end
      cells[cell] = r
      local lo, hi = iqr_bar(r, o.y, y)
      local sp = series[sname].points
      sp[#sp + 1] = { x = x, y = y * scale, lo = lo * scale, hi = hi * scale }
    end
  end
  -- the baseline series (page none: unpaged) first, then by value
  table.sort(names, function(a, b)
    local ka, kb = series[a].sortkey, series[b].sortkey
    for i = 1, #ka do
      if ka[i] ~= kb[i] then
        if baseline(ka[i]) ~= baseline(kb[i]) then return baseline(ka[i]) end
        return value_less(ka[i], kb[i])
      end
    end
    return a < b
  end)
  return names, series
end

-- Where each x value goes. All categorical (no numbers): positions 0, 1, ...
-- Numbers with some categories ("none" next to page sizes): the numbers at
-- their values, each category one step further left, past a dashed line,
-- with explicit tics so that no automatic tic lands among the categories.
-- Returns { pos = {x -> position}, numeric = bool, categories = {...},
-- apart = {x -> true for a category among numbers}, tics = {{label,
-- position}}, separator = position or nil }.
local function place_x(series, names, o)
  local log = o.logx and (o.logx == true and 2 or tonumber(o.logx)) or nil
  local nums, cats, seen = {}, {}, {}
  for _, name in ipairs(names) do
    for _, p in ipairs(series[name].points) do
      if not seen[p.x] then
        seen[p.x] = true
        local n = tonumber(p.x)
        if n and (not log or n > 0) then nums[#nums + 1] = p.x else cats[#cats + 1] = p.x end
      end
    end
  end
  table.sort(nums, value_less)
  table.sort(cats, value_less)
  local P = { pos = {}, numeric = #nums > 0, log = log, tics = {}, categories = cats, apart = {} }
  if #nums == 0 then
    for i, x in ipairs(cats) do
      P.pos[x] = i - 1
      P.tics[i] = { value_label(o.x, x), i - 1 }
    end
    return P
  end
  for _, x in ipairs(nums) do P.pos[x] = tonumber(x) end
  if #cats == 0 then return P end
  local lo, hi = tonumber(nums[1]), tonumber(nums[#nums])
  local function left(k) -- k steps left of the smallest number
    if log then
      local f = #nums > 1 and (hi / lo) ^ (1 / (#nums - 1)) or log
      return lo / f ^ k
    end
    local step = #nums > 1 and (hi - lo) / (#nums - 1) or math.max(1, math.abs(lo))
    return lo - k * step
  end
  for i, x in ipairs(cats) do
    P.pos[x] = left(#cats - i + 1)
    P.apart[x] = true
    P.tics[#P.tics + 1] = { value_label(o.x, x), P.pos[x] }
  end
  P.separator = left(0.5)
  for _, x in ipairs(nums) do P.tics[#P.tics + 1] = { x, tonumber(x) } end
  return P
end

-- The gnuplot script of a chart (see M.plot for o), or nil, err; the second
-- result is the output path.
function M.script(o)
  if not o.x or not o.y then return nil, "plot: x and y columns are required" end
  local paths = type(o.csv) == "table" and o.csv or { o.csv }
  if #paths == 0 or not paths[1] then return nil, "plot: no CSV" end
  for _, p in ipairs(paths) do
    if not util.file_exists(p) then return nil, "plot: no such file: " .. p end
  end
  local where, werr = parse_where(o.where)
  if not where then return nil, werr end
  local by = as_list(o.by)
  local rows, columns_seen = chosen_rows(paths, where)
  for _, c in ipairs({ o.x, o.y }) do
    if not columns_seen[c] and not DERIVED[c] then
      return nil, "plot: no column '" .. c .. "' in " .. table.concat(paths, ", ")
    end
  end
  for _, c in ipairs(by) do
    if not columns_seen[c] then return nil, "plot: no column '" .. c .. "' (for --by)" end
  end
  for c in pairs(where) do
    if not columns_seen[c] then return nil, "plot: no column '" .. c .. "' (for --where)" end
  end
  if #rows == 0 then return nil, "plot: no ok rows match in " .. table.concat(paths, ", ") end

  local scale = tonumber(o.scale) or 1
  local names, series = group(rows, o, by, scale)
  if not names then return nil, series end
  if #names == 0 then return nil, "plot: no numeric values of " .. o.y end
  local X = place_x(series, names, o)

  local output = o.output or ((paths[1]:gsub("%.csv$", "")) .. "-" .. o.y .. ".png")
  local fmt = o.format or (output:match("%.svg$") and "svg") or "png"
  local w, h = 900, 560
  if o.size then w, h = o.size[1] or w, o.size[2] or h end

  local gp = {}
  local function add(...) gp[#gp + 1] = string.format(...) end
  if fmt == "svg" then
    add("set terminal svg size %d,%d dynamic noenhanced font 'sans,11' background '#ffffff'", w, h)
  elseif png_terminal() == "pngcairo" then
    add("set terminal pngcairo size %d,%d noenhanced font 'sans,10'", w, h)
  else
    add("set terminal png size %d,%d noenhanced", w, h)
  end
  add("set output %s", gp_string(output))
  local ylabel = o.ylabel or LABELS[o.y] or o.y
  if scale ~= 1 and not o.ylabel then ylabel = string.format("%s x %g", ylabel, scale) end
  local title = o.title or string.format("%s against %s%s", LABELS[o.y] or o.y, o.x,
    #by > 0 and (", by " .. table.concat(by, ", ")) or "")
  local subtitle = o.subtitle
  -- about 8 pixels a character at the chart's font size
  if subtitle == nil then subtitle = M.subtitle(rows, o.x, by, math.max(40, math.floor(w / 8))) end
  if subtitle and subtitle ~= "" then title = title .. "\n" .. subtitle end
  add("set title %s", gp_string(title))
  add("set xlabel %s", gp_string(o.xlabel or LABELS[o.x] or o.x))
  add("set ylabel %s", gp_string(ylabel))
  add("set grid")
  add("set key outside right top")
  add("set yrange [0:*]")
  if o.logy then
    add("set logscale y %s", o.logy == true and "" or tostring(o.logy))
    add("set yrange [*:*]")
  end
  if X.numeric and X.log then add("set logscale x %s", tostring(X.log)) end
  if #X.tics > 0 then
    local tics = {}
    for i, t in ipairs(X.tics) do tics[i] = string.format("%s %.10g", gp_string(t[1]), t[2]) end
    add("set xtics (%s)", table.concat(tics, ", "))
  end
  if not X.numeric then
    add("set xrange [-0.5:%f]", #X.categories - 0.5)
  else
    add("set xtics nomirror")
    add("set offsets graph 0.03, graph 0.03, 0, 0")
  end
  if X.separator then
    add("set arrow from %.10g, graph 0 to %.10g, graph 1 nohead dt 3 lc rgb '#999999'", X.separator, X.separator)
  end
  add("set format x '%%g'")

  local plots = {}
  for i, name in ipairs(names) do
    local pts = series[name].points
    table.sort(pts, function(a, b) return X.pos[a.x] < X.pos[b.x] end)
    add("$s%d << EOD", i)
    local prev_apart
    for _, p in ipairs(pts) do
      -- a blank line ends a line in gnuplot: a category's point stands alone
      local apart = X.apart[p.x] or false
      if prev_apart ~= nil and (apart or prev_apart) then add("") end
      add("%.10g %.10g %.10g %.10g", X.pos[p.x], p.y, p.lo, p.hi)
      prev_apart = apart
    end
    add("EOD")
    local label = name
    if #by == 1 then
      label = value_label(by[1], name)
      if label == name then label = by[1] .. " " .. name end
    end
    local style = label == "unpaged" and "lw 3 lc rgb '#000000' pt 5 ps 0.8" or "lw 2 pt 7 ps 0.8"
    plots[#plots + 1] = string.format("$s%d using 1:2%s with %s %s title %s", i,
      o.errorbars and ":3:4" or "", o.errorbars and "yerrorlines" or "linespoints", style, gp_string(label))
  end

  if o.ceiling then
    local col, label, factor = nil, nil, 1
    if o.y == "gbps" then col, label = "ceil_read_gbps", "read ceiling"
    elseif o.y == "gflops" then col, label = "ceil_peak_gflops", "peak"
    elseif o.y == "tflops" then col, label, factor = "ceil_peak_gflops", "peak", 1e-3
    elseif o.y == "ratio" then label = "ceiling" end
    local vals = {}
    if col then
      for _, r in ipairs(rows) do
        local v = tonumber(r[col])
        if v then vals[#vals + 1] = v end
      end
    end
    local value = col and #vals > 0 and stats.stats(vals).median * factor or (o.y == "ratio" and 1 or nil)
    if value then
      value = value * scale
      plots[#plots + 1] = string.format("%.10g with lines dt 2 lw 2 lc rgb '#777777' title %s",
        value, gp_string(string.format("%s %.4g", label, value)))
    end
  end
  add("plot %s", table.concat(plots, ", \\\n     "))
  add("unset output")
  return table.concat(gp, "\n") .. "\n", output
end

-- Draws a chart from CSV rows with gnuplot.
--   o.csv      a path or a list of paths (concatenated; repeated headers skipped)
--   o.x, o.y   columns (o.y may be a derived column: tflops, ms, us)
--   o.by       series: a column or a list ("page" or "page,dtype")
--   o.where    filters: { col = "v1,v2" } or a list of "col=v1,v2"
--   o.output   file; .png or .svg picks the format (default <csv>-<y>.png)
--   o.title, o.xlabel, o.ylabel, o.logx, o.logy (true or a base), o.scale (y factor),
--   o.subtitle the lines under the title (default: the device and the shape; false: none)
--   o.ceiling  draw the measured ceiling (y = gbps/gflops/tflops/ratio),
--   o.errorbars  the interquartile range of the timed repeats, o.size {w, h}
--   o.keep_script  keep the gnuplot script and say where it is (stderr)
-- Only rows with status ok are drawn; one row per point (the last one).
-- Returns the output path, or nil, err.
function M.plot(o)
  local text, output = M.script(o)
  if not text then return nil, output end
  util.mkdir_p(util.dirname(output))
  local script = os.tmpname()
  local errfile = os.tmpname()
  local f = assert(io.open(script, "wb"))
  f:write(text)
  f:close()
  local ok = execute("gnuplot " .. shell_quote(script) .. " 2>" .. shell_quote(errfile))
  local ef = io.open(errfile, "rb")
  local errtext = ef and ef:read("*a") or ""
  if ef then ef:close() end
  os.remove(errfile)
  if o.keep_script then io.stderr:write("gnuplot script: ", script, "\n") else os.remove(script) end
  if not ok then
    if not execute("command -v gnuplot >/dev/null 2>&1") then
      return nil, "plot: gnuplot is not installed (apt-get install gnuplot-nox, or scripts/setup)"
    end
    return nil, "plot: gnuplot failed: " .. errtext
  end
  return output
end

return M
