-- pagedattn.sweep: experiment sweeps. A sweep is a short table: axes (or a list
-- of points) and the function measured at each point. The runner times every
-- point (warm-up, repeats, median and spread), measures the device's ceilings
-- once per run so that every row has its ratio, appends one CSV row per point,
-- skips points already in the CSV (resume), records a failed point and goes
-- on, and slices the points for scale-out (--shard i/n, --emit-jobs).
--
--   local sweep = require "pagedattn.sweep"
--   return sweep.script {                       -- a sweep file (see scripts/sweep.lua)
--     name = "decode_pages",
--     axes = { context = { 1024, 4096 }, page = { "none", 1, 16, 256 } },
--     measure = sweep.decode,                   -- or sweep.prefill, or your own
--   }
--
-- CSV rule (what makes concatenation safe): every file starts with the same
-- header line, whose first field is "sweep"; a reader treats any later line
-- whose first field is "sweep" as a header (skipped when repeated, switching
-- columns when different). So `cat a.csv b.csv > all.csv` is a merge.
-- Fields never hold a newline. The axis columns are those between "sweep" and
-- "status"; a point's key is the sweep name plus its axis values.
--
-- Only running a sweep loads libpagedattn; reading CSVs and plotting do not
-- (scripts/plot runs under any Lua 5.1+).
local M = {}

-- True while scripts/sweep.lua loads a sweep file: sweep.script(def) then only
-- returns the definition instead of running it.
M.loading = false

M.RESULT_COLUMNS = {
  "status",   -- ok | error
  "median_s", "min_s", "max_s",
  "spread",   -- (p75 - p25) / median of the timed repeats
  "repeats",
  "gbps",     -- bytes the point must move / median, 1e9/s
  "gflops",   -- flops / median, 1e9/s
  "bound",    -- memory | compute: which ceiling the ratio is to
  "ratio",    -- gbps / ceil_read_gbps (memory) or gflops / ceil_peak_gflops (compute)
  "ceil_read_gbps", "ceil_peak_gflops",
  "ceil_peak_kind", -- fma_f32 (CPU) | matmul_bf16 (GPU)
  "device", "device_desc", "version", "host", "finished", "error",
}

-- Axis columns come first in this order when a sweep does not give one.
local AXIS_ORDER = { "kind", "device", "dtype", "layout", "batch", "heads", "kv_heads",
  "head_dim", "context", "seqlen", "page", "num_splits", "causal" }

local reserved = { sweep = true }
for _, c in ipairs(M.RESULT_COLUMNS) do reserved[c] = true end

---------------------------------------------------------------------------
-- small helpers

local function is_array(t)
  return type(t) == "table" and (#t > 0 or next(t) == nil)
end

local function copy(t)
  local r = {}
  for k, v in pairs(t) do r[k] = v end
  return r
end

-- The one spelling of a value in a CSV and in a key: integers without a
-- fraction, other numbers in the shortest form that reads back the same.
local function fmt_value(v)
  if v == nil then return "" end
  if type(v) == "number" then
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return string.format("%d", v) end
    local s = string.format("%.15g", v)
    if tonumber(s) ~= v then s = string.format("%.17g", v) end
    return s
  end
  return tostring(v)
end
M.fmt_value = fmt_value

local function fmt_metric(v)
  if v == nil then return "" end
  if type(v) == "number" then
    if v ~= v or v == math.huge or v == -math.huge then return "" end
    if v == math.floor(v) and math.abs(v) < 1e15 then return string.format("%d", v) end
    return string.format("%.6g", v)
  end
  return tostring(v)
end

-- "16" -> 16, "true" -> true, anything else stays a string.
local function parse_value(s)
  local n = tonumber(s)
  if n then return n end
  if s == "true" then return true elseif s == "false" then return false end
  return s
end
M.parse_value = parse_value

local function csv_field(s)
  s = tostring(s):gsub("\r?\n", " | ")
  if s:find('[,"]') or s:match("^%s") or s:match("%s$") then
    s = '"' .. s:gsub('"', '""') .. '"'
  end
  return s
end

local function csv_line(fields)
  local out = {}
  for i = 1, #fields do out[i] = csv_field(fields[i]) end
  return table.concat(out, ",")
end
M.csv_line = csv_line

-- Fields of one CSV line, or nil when the line is malformed (e.g. cut short).
local function parse_csv_line(line)
  local fields, i = {}, 1
  while true do
    if line:sub(i, i) == '"' then
      local parts, j = {}, i + 1
      while true do
        local q = line:find('"', j, true)
        if not q then return nil end
        parts[#parts + 1] = line:sub(j, q - 1)
        if line:sub(q + 1, q + 1) == '"' then
          parts[#parts + 1] = '"'
          j = q + 2
        else
          i = q + 1
          break
        end
      end
      fields[#fields + 1] = table.concat(parts)
      local c = line:sub(i, i)
      if c == "," then i = i + 1 elseif c == "" then break else return nil end
    else
      local c = line:find(",", i, true)
      if c then
        fields[#fields + 1] = line:sub(i, c - 1)
        i = c + 1
      else
        fields[#fields + 1] = line:sub(i)
        break
      end
    end
  end
  return fields
end
M.parse_csv_line = parse_csv_line

local function file_exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

local function shell_quote(s)
  s = tostring(s)
  if s:match("^[%w@%%+=:,./_-]+$") then return s end
  return "'" .. s:gsub("'", "'\\''") .. "'"
end
M.shell_quote = shell_quote

-- os.execute's status under Lua 5.1/LuaJIT (a number) and 5.2+ (true/nil, how, code)
local function execute(cmd)
  local a, _, c = os.execute(cmd)
  if type(a) == "number" then return a == 0 end
  return a == true and (c == nil or c == 0)
end

local function dirname(path)
  return path:match("^(.*)/[^/]*$") or "."
end

local function mkdir_p(dir)
  if dir == "" or dir == "." then return true end
  return execute("mkdir -p " .. shell_quote(dir))
end

-- An absolute path without "." and ".." components (lexically).
local function absolute(path)
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

local function fmt_duration(s)
  if s ~= s or s == math.huge then return "?" end
  s = math.floor(s + 0.5)
  if s < 60 then return s .. "s" end
  if s < 3600 then return string.format("%dm%02ds", math.floor(s / 60), s % 60) end
  return string.format("%dh%02dm", math.floor(s / 3600), math.floor(s % 3600 / 60))
end
M.fmt_duration = fmt_duration

local hostname_cache
local function hostname()
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

---------------------------------------------------------------------------
-- points

local function axis_rank(name)
  for i, a in ipairs(AXIS_ORDER) do if a == name then return i end end
  return #AXIS_ORDER + 1
end

local function sort_axes(names)
  table.sort(names, function(a, b)
    local ra, rb = axis_rank(a), axis_rank(b)
    if ra ~= rb then return ra < rb end
    return a < b
  end)
  return names
end

-- axes: { name = {values} } or { {name, {values}}, ... }; a scalar is one value.
-- Returns names (in order) and values by name.
local function normalize_axes(axes, order)
  local names, values = {}, {}
  if is_array(axes) then
    for _, pair in ipairs(axes) do
      local name, vals = pair[1], pair[2]
      names[#names + 1] = name
      values[name] = type(vals) == "table" and vals or { vals }
    end
  else
    for name, vals in pairs(axes) do
      names[#names + 1] = name
      values[name] = type(vals) == "table" and vals or { vals }
    end
    if order then
      local rank = {}
      for i, n in ipairs(order) do rank[n] = i end
      table.sort(names, function(a, b)
        local ra, rb = rank[a] or math.huge, rank[b] or math.huge
        if ra ~= rb then return ra < rb end
        return axis_rank(a) < axis_rank(b) or (axis_rank(a) == axis_rank(b) and a < b)
      end)
    else
      sort_axes(names)
    end
  end
  return names, values
end

-- Every combination of the axes, first axis outermost. The list carries its
-- axis order in `.order` (sweep.concat keeps it).
function M.product(axes, order)
  local names, values = normalize_axes(axes, order)
  local points = { {} }
  for _, name in ipairs(names) do
    local nxt = {}
    for _, p in ipairs(points) do
      for _, v in ipairs(values[name]) do
        local q = copy(p)
        q[name] = v
        nxt[#nxt + 1] = q
      end
    end
    points = nxt
  end
  if #names == 0 then points = {} end
  points.order = names
  return points
end

-- Lists of points one after the other (e.g. decode points, then prefill points).
function M.concat(...)
  local out, order, seen = {}, {}, {}
  for i = 1, select("#", ...) do
    local list = select(i, ...)
    for _, p in ipairs(list) do out[#out + 1] = p end
    local names = list.order
    if not names then
      names = {}
      for _, p in ipairs(list) do for k in pairs(p) do names[#names + 1] = k end end
      sort_axes(names)
    end
    for _, n in ipairs(names) do
      if not seen[n] then seen[n] = true order[#order + 1] = n end
    end
  end
  out.order = order
  return out
end

local function key_of(name, axes, values)
  local parts = { name }
  for i, a in ipairs(axes) do parts[i + 1] = fmt_value(values[a]) end
  return table.concat(parts, "\31")
end
M.key_of = key_of

local function check_name(what, name)
  if type(name) ~= "string" or not name:match("^[%a][%w_]*$") then
    error("pagedattn.sweep: " .. what .. " '" .. tostring(name) ..
          "' must be a name (a letter, then letters, digits, _)", 3)
  end
end

-- "1,8,16" or "none" -> {1, 8, 16} / {"none"}
local function parse_list(s)
  local vals = {}
  for item in tostring(s):gmatch("[^,]+") do vals[#vals + 1] = parse_value(item) end
  return vals
end
M.parse_list = parse_list

-- A sweep definition made concrete: preset applied, overrides (`set`) and
-- filters (`only`) applied, points enumerated with their 1-based index and key.
--   opts.preset   name of def.presets[...] (else def.default_preset, which may be
--                 a function of the device)
--   opts.set      { axis = {values} }: replaces the axis's values in every point
--   opts.only     { axis = {values} }: keeps the points whose value is listed
function M.define(def, opts)
  opts = opts or {}
  if type(def) ~= "table" then error("pagedattn.sweep: a sweep is a table, got " .. type(def), 2) end
  local preset = opts.preset
  if preset == nil and def.default_preset ~= nil then
    preset = def.default_preset
    if type(preset) == "function" then preset = preset(opts.device_object or M.default_device(opts.device)) end
  end
  local d = copy(def)
  if preset and preset ~= "" then
    local p = def.presets and def.presets[preset]
    if not p then
      local names = {}
      for k in pairs(def.presets or {}) do names[#names + 1] = k end
      table.sort(names)
      error("pagedattn.sweep: no preset '" .. preset .. "' (presets: " ..
            (#names > 0 and table.concat(names, ", ") or "none") .. ")", 2)
    end
    for k, v in pairs(p) do
      if k == "axes" and d.axes and not is_array(v) and not is_array(d.axes) then
        local merged = copy(d.axes)
        for a, vals in pairs(v) do merged[a] = vals end
        d.axes = merged
      elseif k == "axes" and v ~= nil then
        d.axes, d.points = v, nil
      elseif k == "points" then
        d.points, d.axes = v, nil
      else
        d[k] = v
      end
    end
  end
  d.preset = preset

  check_name("sweep name", d.name)
  if d.name == "sweep" then
    error("pagedattn.sweep: a sweep cannot be named 'sweep' (its rows would read as CSV headers)", 2)
  end
  if type(d.measure) ~= "function" then
    error("pagedattn.sweep: sweep '" .. d.name .. "' has no measure function", 2)
  end

  local points, order
  if d.points then
    points = d.points
    order = d.order or points.order
    if not order then
      local seen = {}
      order = {}
      for _, p in ipairs(points) do
        for k in pairs(p) do if not seen[k] then seen[k] = true order[#order + 1] = k end end
      end
      sort_axes(order)
    end
  elseif d.axes then
    points = M.product(d.axes, d.order)
    order = points.order
  else
    error("pagedattn.sweep: sweep '" .. d.name .. "' has neither axes nor points", 2)
  end
  local axes = {}
  for i, a in ipairs(order) do axes[i] = a end

  -- overrides: an axis set from the command line replaces (or adds) its values
  if opts.set then
    local names = {}
    for a in pairs(opts.set) do names[#names + 1] = a end
    sort_axes(names)
    for _, a in ipairs(names) do
      check_name("axis", a)
      local known = false
      for _, b in ipairs(axes) do if b == a then known = true end end
      if not known then axes[#axes + 1] = a end
      local vals = opts.set[a]
      local nxt = {}
      for _, p in ipairs(points) do
        for _, v in ipairs(vals) do
          local q = copy(p)
          q[a] = v
          nxt[#nxt + 1] = q
        end
      end
      points = nxt
    end
  end

  for _, a in ipairs(axes) do
    check_name("axis", a)
    if reserved[a] then
      error("pagedattn.sweep: axis '" .. a .. "' is the name of a result column", 2)
    end
  end
  local extra = d.columns or {}
  for _, c in ipairs(extra) do
    check_name("column", c)
    if reserved[c] then error("pagedattn.sweep: column '" .. c .. "' is a result column", 2) end
  end

  local S = {
    defined = true, name = d.name, axes = axes, columns = extra, measure = d.measure, preset = preset,
    warmup = d.warmup or 1, repeats = d.repeats or 3, max_repeats = d.max_repeats or 100,
    budget = d.budget or 0.5, where = d.where, def = def,
  }
  S.header = { "sweep" }
  for _, a in ipairs(axes) do S.header[#S.header + 1] = a end
  for _, c in ipairs(M.RESULT_COLUMNS) do S.header[#S.header + 1] = c end
  for _, c in ipairs(extra) do S.header[#S.header + 1] = c end
  S.header_line = csv_line(S.header)

  -- enumerate: filters, then drop duplicates (an override can create them)
  local list, seen = {}, {}
  for _, p in ipairs(points) do
    local keep = not S.where or S.where(p)
    if keep and opts.only then
      for a, vals in pairs(opts.only) do
        local hit = false
        for _, v in ipairs(vals) do if fmt_value(p[a]) == fmt_value(v) then hit = true end end
        if not hit then keep = false end
      end
    end
    if keep then
      local key = key_of(S.name, axes, p)
      if not seen[key] then
        seen[key] = true
        list[#list + 1] = { index = #list + 1, key = key, values = p }
      end
    end
  end
  S.points = list
  return S
end

-- Slices of the points: shard {i, n} (1-based i) takes points i, i+n, i+2n...
-- (round robin, so slow and fast points spread evenly); `points` picks indices.
function M.select(S, opts)
  opts = opts or {}
  local out = {}
  local pick
  if opts.points then
    pick = {}
    for _, k in ipairs(opts.points) do pick[k] = true end
  end
  for _, pt in ipairs(S.points) do
    local ok = true
    if opts.shard then
      local i, n = opts.shard[1], opts.shard[2]
      ok = (pt.index - 1) % n == i - 1
    end
    if pick and not pick[pt.index] then ok = false end
    if ok then out[#out + 1] = pt end
  end
  return out
end

-- "3/8" -> {3, 8}
function M.parse_shard(s)
  local i, n = tostring(s):match("^(%d+)/(%d+)$")
  i, n = tonumber(i), tonumber(n)
  if not i or n < 1 or i < 1 or i > n then
    return nil, "--shard wants I/N with 1 <= I <= N (got '" .. tostring(s) .. "')"
  end
  return { i, n }
end

---------------------------------------------------------------------------
-- reading CSVs

-- Rows of one or more CSV files (a path or a list; missing files are empty).
-- Each row is a table by column name (strings, as written), plus row._axes
-- (its header's axis columns) and row._file. Repeated headers are skipped, a
-- different header switches columns, malformed lines (an interrupted write)
-- are counted in the second result.
function M.read_csv(paths)
  if type(paths) == "string" then paths = { paths } end
  local rows, bad = {}, 0
  for _, path in ipairs(paths) do
    local f = io.open(path, "rb")
    if f then
      local header, axes
      for line in f:lines() do
        line = line:gsub("\r$", "")
        if line:match("%S") then
          local fields = parse_csv_line(line)
          if fields and fields[1] == "sweep" then
            header, axes = fields, {}
            for i = 2, #fields do
              if fields[i] == "status" then break end
              axes[#axes + 1] = fields[i]
            end
          elseif fields and header and #fields == #header then
            local row = { _axes = axes, _header = header, _file = path }
            for i, c in ipairs(header) do row[c] = fields[i] end
            rows[#rows + 1] = row
          else
            bad = bad + 1
          end
        end
      end
      f:close()
    end
  end
  return rows, bad
end

-- The key of a row under a sweep's axes (or the row's own axes).
function M.row_key(row, axes)
  return key_of(row.sweep, axes or row._axes, row)
end

-- Keys of the points of S already recorded in `paths`: ok rows, and failed rows
-- too unless retry_failed.
function M.done_keys(S, paths, retry_failed)
  local done = {}
  local rows = M.read_csv(paths)
  for _, row in ipairs(rows) do
    if row.sweep == S.name and (row.status == "ok" or not retry_failed) then
      local key = M.row_key(row, S.axes)
      if done[key] ~= "ok" then done[key] = row.status end
    end
  end
  return done
end

-- The CSVs written by jobs of an --emit-jobs run: <csv without .csv>.parts/*.csv
function M.parts_dir(csv)
  return (csv:gsub("%.csv$", "")) .. ".parts"
end

function M.list_csv(dir)
  local out = {}
  local p = io.popen("ls -1 " .. shell_quote(dir) .. " 2>/dev/null")
  if p then
    for name in p:lines() do
      if name:match("%.csv$") then out[#out + 1] = dir .. "/" .. name end
    end
    p:close()
  end
  table.sort(out)
  return out
end

-- Merges CSVs into one file with one header per column set, keeping one row
-- per point: the last ok row, else the last failed one. Writes `out` anew
-- (through a temporary file); `out` itself may be one of the inputs.
function M.merge(out, inputs)
  local rows = M.read_csv(inputs)
  local best, order = {}, {}
  for _, row in ipairs(rows) do
    local key = M.row_key(row) .. "\30" .. table.concat(row._axes, ",")
    local prev = best[key]
    if not prev then order[#order + 1] = key end
    if not prev or row.status == "ok" or prev.status ~= "ok" then best[key] = row end
  end
  mkdir_p(dirname(out))
  local tmp = out .. ".tmp"
  local f = assert(io.open(tmp, "wb"))
  local current
  local n = 0
  for _, key in ipairs(order) do
    local row = best[key]
    -- rebuild the header this row came with
    local hdr = row._header
    if not hdr then
      hdr = { "sweep" }
      for _, a in ipairs(row._axes) do hdr[#hdr + 1] = a end
      for _, c in ipairs(M.RESULT_COLUMNS) do hdr[#hdr + 1] = c end
    end
    local line = csv_line(hdr)
    if line ~= current then
      f:write(line, "\n")
      current = line
    end
    local fields = {}
    for i, c in ipairs(hdr) do fields[i] = row[c] or "" end
    f:write(csv_line(fields), "\n")
    n = n + 1
  end
  f:close()
  assert(os.rename(tmp, out))
  return n
end

---------------------------------------------------------------------------
-- writing CSVs

-- The last header line in a file, and whether the file ends with a newline.
local function last_header(path)
  local f = io.open(path, "rb")
  if not f then return nil, true end
  local hdr
  local text = f:read("*a")
  f:close()
  for line in text:gmatch("[^\n]+") do
    if line:sub(1, 6) == "sweep," or line == "sweep" then hdr = line:gsub("\r$", "") end
  end
  return hdr, text == "" or text:sub(-1) == "\n"
end

local function open_csv(path, S)
  local dir = dirname(path)
  if not mkdir_p(dir) then error("pagedattn.sweep: cannot create the directory " .. dir, 0) end
  local hdr, ends_nl = last_header(path)
  local f, err = io.open(path, "ab")
  if not f then error("pagedattn.sweep: cannot write " .. path .. ": " .. tostring(err), 0) end
  -- a row cut short by a kill: finish its line so the next row starts clean
  -- (the reader drops the malformed line)
  if not ends_nl then f:write("\n") end
  if hdr ~= S.header_line then f:write(S.header_line, "\n") end
  f:flush()
  return f
end

---------------------------------------------------------------------------
-- timing

local function quantile(sorted, q)
  local n = #sorted
  if n == 0 then return 0 / 0 end
  local pos = 1 + (n - 1) * q
  local lo = math.floor(pos)
  local hi = math.min(lo + 1, n)
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo)
end

function M.stats(times)
  local s = {}
  for i, t in ipairs(times) do s[i] = t end
  table.sort(s)
  local median = quantile(s, 0.5)
  return {
    median = median, min = s[1], max = s[#s], repeats = #s,
    spread = median > 0 and (quantile(s, 0.75) - quantile(s, 0.25)) / median or 0,
  }
end

-- Times case.run: `warmup` calls, then at least `repeats` calls and until
-- `budget` seconds have passed (at most max_repeats); the device is
-- synchronized after each call so that queued GPU work is counted.
local function time_case(case, dev, cfg, clock)
  local sync = dev and function() dev:synchronize() end or function() end
  for _ = 1, cfg.warmup do case.run() end
  sync()
  local times = {}
  local start = clock()
  repeat
    local t0 = clock()
    case.run()
    sync()
    times[#times + 1] = clock() - t0
  until (#times >= cfg.repeats and clock() - start >= cfg.budget) or #times >= cfg.max_repeats
  return M.stats(times)
end

---------------------------------------------------------------------------
-- progress: a bar with ETA on a terminal, one line per point otherwise

local function stderr_is_tty()
  local ok, ffi = pcall(require, "ffi")
  if ok then
    if not pcall(function() return ffi.C.isatty end) then
      pcall(ffi.cdef, "int isatty(int fd);")
    end
    local ok2, r = pcall(function() return ffi.C.isatty(2) end)
    if ok2 then return r == 1 end
  end
  return execute("test -t 2")
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

-- "context=1024 page=16": the axes that vary (all of them with all = true)
local function describe_point(S, values, all)
  if not S.varying then
    S.varying = {}
    for _, a in ipairs(S.axes) do
      local first
      for _, pt in ipairs(S.points) do
        local v = fmt_value(pt.values[a])
        if first == nil then first = v elseif v ~= first then S.varying[a] = true break end
      end
    end
  end
  if next(S.varying) == nil then all = true end -- a single point: name it in full
  local parts = {}
  for _, a in ipairs(S.axes) do
    if all or S.varying[a] then parts[#parts + 1] = a .. "=" .. fmt_value(values[a]) end
  end
  return table.concat(parts, " ")
end
M.describe_point = describe_point

local function new_progress(mode, total, out)
  out = out or io.stderr
  if mode == nil or mode == "auto" then mode = stderr_is_tty() and "bar" or "lines" end
  local P = { mode = mode, total = total, done = 0, out = out, width = 80 }
  if mode == "bar" then P.width = terminal_width() end
  local function clip(s) return #s >= P.width and s:sub(1, P.width - 1) or s end
  function P:eta(elapsed)
    if self.done == 0 then return "?" end
    return fmt_duration(elapsed / self.done * (self.total - self.done))
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

---------------------------------------------------------------------------
-- running

local pa_module
local function pa()
  pa_module = pa_module or require "pagedattn"
  return pa_module
end

-- The device a sweep runs on when its points name none.
function M.default_device(name)
  local dev, err = pa().device(name)
  if not dev then error(err, 0) end
  return dev
end

local function interrupted(err)
  return tostring(err):match("interrupted!?$") ~= nil
end

local function first_line(s, max)
  s = tostring(s):gsub("%s*stack traceback:.*$", ""):gsub("\r?\n", " | ")
  if max and #s > max then s = s:sub(1, max - 3) .. "..." end
  return s
end

-- The ceiling a point's rate is judged against.
local function ratio_of(case, st, c)
  local gbps = case.bytes and case.bytes / st.median / 1e9 or nil
  local gflops = case.flops and case.flops / st.median / 1e9 or nil
  local bound = case.bound or (gbps and not gflops and "memory") or (gflops and not gbps and "compute")
  local ratio
  if c then
    if bound == "memory" and gbps and c.read_gbps and c.read_gbps > 0 then
      ratio = gbps / c.read_gbps
    elseif bound == "compute" and gflops and c.peak_gflops and c.peak_gflops > 0 then
      ratio = gflops / c.peak_gflops
    end
  end
  return gbps, gflops, bound, ratio
end

-- Runs the selected points of a sweep that are not yet in the CSV.
--   opts.csv          results file (appended to; default results/<name>.csv)
--   opts.device       device name for points without a device axis (nil: default)
--   opts.shard        {i, n}; opts.points: list of indices
--   opts.retry_failed run points recorded as failed again
--   opts.ceilings     nil: measure (opts.ceilings_seconds, default 0.5) once per
--                     device; false: no ratios; a table: use these values
--   opts.budget, warmup, repeats, max_repeats: override the sweep's
--   opts.progress     "auto" | "bar" | "lines" | "none"; opts.out: stream (stderr)
--   opts.preset, opts.set, opts.only: as in sweep.define
-- Returns a summary {total, selected, skipped, ran, ok, failed, csv, seconds}.
-- An interrupt (Ctrl-C) stops the run without recording the running point.
function M.run(def, opts)
  opts = opts or {}
  local S = def.defined and def or M.define(def, opts)
  local csv = opts.csv or ("results/" .. S.name .. ".csv")
  local cfg = {
    warmup = opts.warmup or S.warmup, repeats = opts.repeats or S.repeats,
    max_repeats = opts.max_repeats or S.max_repeats, budget = opts.budget or S.budget,
  }
  local selected = M.select(S, opts)
  local done = M.done_keys(S, { csv }, opts.retry_failed)
  local todo = {}
  for _, pt in ipairs(selected) do
    if not done[pt.key] then todo[#todo + 1] = pt end
  end
  local summary = { total = #S.points, selected = #selected, skipped = #selected - #todo,
                    ran = 0, ok = 0, failed = 0, csv = csv, sweep = S }
  local progress = new_progress(opts.progress, #todo, opts.out)
  if summary.skipped > 0 then
    progress:line(string.format("%s: %d of %d points already in %s; %d to run", S.name,
      summary.skipped, #selected, csv, #todo))
  end
  if #todo == 0 then
    summary.seconds = 0
    return summary
  end

  local lib = pa()
  local clock = lib.clock
  local version = lib.version
  local f
  local ceilings = {}     -- by device name
  local devices = {}
  local start = clock()
  local overhead = 0      -- seconds spent on ceilings, left out of the ETA

  local function get_device(name)
    local key = name or ""
    if devices[key] == nil then
      local dev, err = lib.device(name)
      devices[key] = dev or err
    end
    local d = devices[key]
    if type(d) == "string" then error(d, 0) end
    return d
  end

  -- the device of points without a device axis: a failure here stops the run
  -- (recording it against every point would only hide it)
  for _, pt in ipairs(todo) do
    if pt.values.device == nil then
      local ok, err = pcall(get_device, opts.device)
      if not ok then error(err, 0) end
      break
    end
  end
  f = open_csv(csv, S)

  local function get_ceilings(dev)
    if opts.ceilings == false then return nil end
    if type(opts.ceilings) == "table" then return opts.ceilings end
    local c = ceilings[dev.name]
    if c == nil then
      progress:line(string.format("%s: measuring the ceilings of %s (%s)", S.name, dev.name,
        dev.description))
      local t0 = clock()
      local m, err = dev:ceilings(opts.ceilings_seconds or 0.5)
      overhead = overhead + (clock() - t0)
      if not m then
        progress:line("  ceilings failed: " .. tostring(err) .. " (rows get no ratio)")
        c = false
      else
        -- the compute ceiling: fp32 FMA on a CPU, a bf16 matmul on a GPU (0: not measured)
        local peak, kind = m.fma_gflops, "fma_f32"
        if dev.kind == "cuda" then peak, kind = m.matmul_gflops, "matmul_bf16" end
        local peak_text = string.format("%s %.1f GFLOP/s", kind, peak or 0)
        if not peak or peak <= 0 then
          peak_text = kind .. " not measured (compute-bound rows get no ratio)"
          peak = nil
        end
        c = { read_gbps = m.read_gbps, copy_gbps = m.copy_gbps, peak_gflops = peak,
              peak_kind = peak and kind or nil }
        progress:line(string.format("  read %.1f GB/s, copy %.1f GB/s, %s", c.read_gbps, c.copy_gbps,
          peak_text))
      end
      ceilings[dev.name] = c
    end
    return c or nil
  end

  for n, pt in ipairs(todo) do
    local label = describe_point(S, pt.values)
    progress:bar(clock() - start - overhead, label)
    local t_point, overhead_before = clock(), overhead
    local dev, c, case, st
    local ok, err = pcall(function()
      dev = get_device(pt.values.device or opts.device)
      c = get_ceilings(dev)
      local env = { device = dev, pa = lib, ceilings = c, index = pt.index, sweep = S }
      local res, merr = S.measure(pt.values, env)
      if res == nil then error(merr or "measure returned nothing", 0) end
      case = res
      if case.run then
        st = time_case(case, dev, cfg, clock)
      elseif case.seconds then
        st = type(case.seconds) == "table" and M.stats(case.seconds) or M.stats({ case.seconds })
      else
        error("measure returned neither run nor seconds", 0)
      end
      if case.metrics then
        local allowed = {}
        for _, col in ipairs(S.columns) do allowed[col] = true end
        for k in pairs(case.metrics) do
          if not allowed[k] then
            error("measure returned metric '" .. tostring(k) ..
                  "', which is not in the sweep's columns", 0)
          end
        end
      end
    end)
    if not ok and interrupted(err) then
      progress:finish()
      f:close()
      progress:line(string.format("%s: interrupted; %d points recorded in %s by this run; the same command resumes",
        S.name, summary.ran, csv))
      error(err, 0)
    end

    local row = { sweep = S.name, finished = os.date("!%Y-%m-%dT%H:%M:%SZ"), host = hostname(),
                  version = version }
    for _, a in ipairs(S.axes) do row[a] = fmt_value(pt.values[a]) end
    if dev then row.device, row.device_desc = dev.name, dev.description
    else row.device = pt.values.device or opts.device or "" end
    if c then
      row.ceil_read_gbps = fmt_metric(c.read_gbps)
      row.ceil_peak_gflops = fmt_metric(c.peak_gflops)
      row.ceil_peak_kind = c.peak_kind
    end
    local msg
    if ok then
      local gbps, gflops, bound, ratio = ratio_of(case, st, c)
      row.status = "ok"
      row.median_s, row.min_s, row.max_s = fmt_metric(st.median), fmt_metric(st.min), fmt_metric(st.max)
      row.spread, row.repeats = fmt_metric(st.spread), fmt_metric(st.repeats)
      row.gbps, row.gflops, row.bound, row.ratio =
        fmt_metric(gbps), fmt_metric(gflops), bound or "", fmt_metric(ratio)
      for k, v in pairs(case.metrics or {}) do row[k] = fmt_metric(v) end
      summary.ok = summary.ok + 1
      local rate = bound == "compute" and gflops and string.format("%.1f GFLOP/s", gflops)
        or gbps and string.format("%.1f GB/s", gbps)
        or gflops and string.format("%.1f GFLOP/s", gflops) or ""
      msg = string.format("%8.3f ms %s%s", st.median * 1e3, rate,
        ratio and string.format(" (%.2f of %s)", ratio, bound == "memory" and "read" or "peak") or "")
    else
      row.status = "error"
      row.error = first_line(err, 400)
      summary.failed = summary.failed + 1
      msg = "FAILED: " .. first_line(err, 200)
    end
    local fields = {}
    for i, col in ipairs(S.header) do fields[i] = row[col] or "" end
    f:write(csv_line(fields), "\n")
    f:flush()
    summary.ran = summary.ran + 1

    case = nil -- let the point's tensors go before the next point allocates its own
    collectgarbage()
    collectgarbage()
    progress.done = n
    if progress.mode ~= "none" then
      local elapsed = clock() - start - overhead
      progress:line(string.format("[%d/%d] %s: %s  (%.1fs, ETA %s)", n, #todo, label, msg,
        clock() - t_point - (overhead - overhead_before), progress:eta(elapsed)))
    end
  end
  f:close()
  progress:finish()
  summary.seconds = clock() - start
  progress:line(string.format("%s: %d points run (%d ok, %d failed) in %s -> %s", S.name,
    summary.ran, summary.ok, summary.failed, fmt_duration(summary.seconds), csv))
  return summary
end

---------------------------------------------------------------------------
-- job emission

-- How a job starts the runner: scripts/sweep.lua of this source tree under
-- LuaJIT, or the pagedattn-sweep command of an installed rock.
function M.runner_command()
  local src = debug.getinfo(1, "S").source
  if src:sub(1, 1) == "@" then
    local root = dirname(dirname(dirname(absolute(src:sub(2)))))
    local script = root .. "/scripts/sweep.lua"
    if file_exists(script) then return "luajit " .. shell_quote(script) end
  end
  return "pagedattn-sweep"
end

-- The runner's name in messages: scripts/sweep.lua, or pagedattn-sweep when installed.
local function program()
  return M.runner_command() == "pagedattn-sweep" and "pagedattn-sweep" or "scripts/sweep.lua"
end

-- One command per point still to run (or per shard with opts.shards = N).
--   opts.file    the sweep file (made absolute); opts.csv the results file
--   opts.parts   where the jobs write (default <csv>.parts/)
--   opts.pass    extra runner arguments (already shell-quoted strings)
-- Points already in the CSV or in a part file are left out.
function M.emit_jobs(S, opts)
  local csv = opts.csv or ("results/" .. S.name .. ".csv")
  local parts = absolute(opts.parts or M.parts_dir(csv))
  local done_files = { csv }
  for _, p in ipairs(M.list_csv(parts)) do done_files[#done_files + 1] = p end
  local done = M.done_keys(S, done_files, opts.retry_failed)
  local base = (opts.runner or M.runner_command()) .. " " .. shell_quote(absolute(opts.file))
  local pass = opts.pass and #opts.pass > 0 and (" " .. table.concat(opts.pass, " ")) or ""
  local jobs = {}
  if opts.shards then
    local n = opts.shards
    local width = #tostring(n)
    for i = 1, n do
      local pending = 0
      for _, pt in ipairs(M.select(S, { shard = { i, n }, points = opts.points })) do
        if not done[pt.key] then pending = pending + 1 end
      end
      if pending > 0 then
        local out = string.format("%s/shard-%0" .. width .. "d-of-%d.csv", parts, i, n)
        jobs[#jobs + 1] = string.format("%s --shard %d/%d --csv %s%s", base, i, n, shell_quote(out), pass)
      end
    end
  else
    local width = math.max(4, #tostring(#S.points))
    for _, pt in ipairs(M.select(S, { points = opts.points })) do
      if not done[pt.key] then
        local out = string.format("%s/point-%0" .. width .. "d.csv", parts, pt.index)
        jobs[#jobs + 1] = string.format("%s --point %d --csv %s%s", base, pt.index, shell_quote(out), pass)
      end
    end
  end
  return jobs
end

---------------------------------------------------------------------------
-- the command line (scripts/sweep.lua, and sweep files run as programs)

M.USAGE = [[
usage: scripts/sweep.lua SWEEP.lua [options]     run (or resume) a sweep
       scripts/sweep.lua --merge OUT.csv IN.csv...  merge CSVs (one row per point)
options:
  --csv FILE         results (default results/<name>.csv): appended; points in it are skipped
  --device NAME      cpu, cuda, cuda:N (points without a device axis; default: pa.device())
  --preset NAME      one of the sweep's presets (sizes)
  --set AXIS=V1,V2   replace an axis's values (repeatable)
  --only AXIS=V1,V2  keep only points with these values (repeatable)
  --shard I/N        run the I-th of N disjoint slices (1 <= I <= N; round robin)
  --point K[,K...]   run these points (1-based indices; see --list)
  --list             print the points (index, done/todo, values) and exit
  --emit-jobs        print one runner command per point still to run, and exit
  --shards N         with --emit-jobs: one command per shard instead
  --parts DIR        with --emit-jobs: where jobs write their CSVs (default <csv>.parts)
  --retry-failed     run points recorded as failed again
  --budget S         seconds of timed repeats per point (after warm-up)
  --warmup N         warm-up calls per point; --repeats N: at least N timed calls
  --ceilings S       seconds per ceiling measurement (default 0.5); --no-ceilings: no ratios
  --progress MODE    auto (bar on a terminal, else lines), bar, lines, none
]]

local function usage_error(msg)
  io.stderr:write(program(), ": ", msg, "\n", (M.USAGE:gsub("scripts/sweep%.lua", program())))
  return { code = 2 }
end

-- Parses runner arguments. Returns opts, or nil, message.
function M.parse_args(argv)
  local o = { set = nil, only = nil, pass = {} }
  local positional = {}
  local args = {}
  for k = 1, #argv do args[k] = argv[k] end
  argv = args
  local i = 1
  local function value(flag)
    local v = argv[i + 1]
    if v == nil then error({ msg = flag .. " needs a value" }) end
    i = i + 1
    return v
  end
  local function axis_list(flag, s)
    local a, vals = s:match("^([%a][%w_]*)=(.*)$")
    if not a or vals == "" then error({ msg = flag .. " wants AXIS=V1,V2 (got '" .. s .. "')" }) end
    return a, parse_list(vals)
  end
  -- flags that a job must repeat to see the same points and settings
  local function pass(flag, v) o.pass[#o.pass + 1] = flag .. (v and (" " .. shell_quote(v)) or "") end
  local ok, err = pcall(function()
    while i <= #argv do
      local a = argv[i]
      local flag, inline = a:match("^(%-%-[%w-]+)=(.*)$")
      if flag then
        a = flag
        table.insert(argv, i + 1, inline)
      end
      if a == "--csv" then o.csv = value(a)
      elseif a == "--device" then o.device = value(a) pass(a, o.device)
      elseif a == "--preset" then o.preset = value(a)
      elseif a == "--set" then
        local v = value(a)
        local ax, vals = axis_list(a, v)
        o.set = o.set or {}
        o.set[ax] = vals
        pass(a, v)
      elseif a == "--only" then
        local v = value(a)
        local ax, vals = axis_list(a, v)
        o.only = o.only or {}
        o.only[ax] = vals
        pass(a, v)
      elseif a == "--shard" then
        local s, e = M.parse_shard(value(a))
        if not s then error({ msg = e }) end
        o.shard = s
      elseif a == "--point" or a == "--points" then
        o.points = {}
        for k in value(a):gmatch("[^,]+") do
          local n = tonumber(k)
          if not n or n < 1 or n ~= math.floor(n) then error({ msg = a .. ": bad index '" .. k .. "'" }) end
          o.points[#o.points + 1] = n
        end
      elseif a == "--list" then o.list = true
      elseif a == "--emit-jobs" then o.emit_jobs = true
      elseif a == "--shards" then
        o.shards = tonumber(value(a))
        if not o.shards or o.shards < 1 then error({ msg = "--shards wants a count >= 1" }) end
      elseif a == "--parts" then o.parts = value(a)
      elseif a == "--retry-failed" then o.retry_failed = true pass(a)
      elseif a == "--budget" then o.budget = tonumber(value(a)) pass(a, o.budget)
      elseif a == "--warmup" then o.warmup = tonumber(value(a)) pass(a, o.warmup)
      elseif a == "--repeats" then o.repeats = tonumber(value(a)) pass(a, o.repeats)
      elseif a == "--max-repeats" then o.max_repeats = tonumber(value(a)) pass(a, o.max_repeats)
      elseif a == "--ceilings" then o.ceilings_seconds = tonumber(value(a)) pass(a, o.ceilings_seconds)
      elseif a == "--no-ceilings" then o.ceilings = false pass(a)
      elseif a == "--progress" then o.progress = value(a)
      elseif a == "--merge" then o.merge = true
      elseif a == "-h" or a == "--help" then o.help = true
      elseif a:sub(1, 1) == "-" and a ~= "-" then error({ msg = "unknown option " .. a })
      else positional[#positional + 1] = a end
      i = i + 1
    end
  end)
  if not ok then
    if type(err) == "table" then return nil, err.msg end
    error(err, 0)
  end
  o.positional = positional
  return o
end

-- Loads a sweep file: it returns a definition (a plain table, or
-- sweep.script(def), which only returns def while we load it).
function M.load(path)
  local chunk, err = loadfile(path)
  if not chunk then error("pagedattn.sweep: " .. err, 0) end
  local was = M.loading
  M.loading = true
  local ok, def = pcall(chunk)
  M.loading = was
  if not ok then error(def, 0) end
  if type(def) ~= "table" then
    error("pagedattn.sweep: " .. path .. " must return a sweep table (got " .. type(def) .. ")", 0)
  end
  return def
end

local main

-- The runner. argv: arguments (a sweep file first unless `def` is given; `file`
-- is then def's file, for --emit-jobs). Never raises: returns {code = exit
-- status (2: usage, 1: failed points or an error, 130: interrupted), ran =
-- true when points were run, csv, summary}.
function M.main(argv, def, file)
  local ok, r = pcall(main, argv, def, file)
  if ok then return r end
  if tostring(r):match("interrupted!?$") then return { code = 130 } end
  io.stderr:write(program(), ": ", tostring(r), "\n")
  return { code = 1 }
end

function main(argv, def, file)
  local o, err = M.parse_args(argv or {})
  if not o then return usage_error(err) end
  if o.help then io.stdout:write((M.USAGE:gsub("scripts/sweep%.lua", program()))) return { code = 0 } end
  if o.merge then
    local out = table.remove(o.positional, 1)
    if not out or #o.positional == 0 then return usage_error("--merge OUT.csv IN.csv...") end
    local inputs = {}
    if file_exists(out) then inputs[1] = out end
    for _, p in ipairs(o.positional) do inputs[#inputs + 1] = p end
    local n = M.merge(out, inputs)
    io.stderr:write(string.format("merged %d files: %d rows -> %s\n", #inputs, n, out))
    return { code = 0 }
  end
  if not def then
    file = o.positional[1]
    if not file then return usage_error("no sweep file") end
    def = M.load(file)
  end
  if o.shard and o.points then return usage_error("--shard and --point do not combine") end

  local dev_obj
  if type(def.default_preset) == "function" and not o.preset then
    local e
    dev_obj, e = pa().device(o.device)
    if not dev_obj then
      error(string.format("cannot open the device%s to choose the sweep's preset (%s); pass --preset NAME",
        o.device and (" " .. o.device) or "", tostring(e)), 0)
    end
  end
  local S = M.define(def, { preset = o.preset, set = o.set, only = o.only, device_object = dev_obj })
  local csv = o.csv or ("results/" .. S.name .. ".csv")

  if o.list then
    local done = M.done_keys(S, { csv }, o.retry_failed)
    for _, pt in ipairs(M.select(S, o)) do
      io.stdout:write(string.format("%d\t%s\t%s\n", pt.index, done[pt.key] and "done" or "todo",
        describe_point(S, pt.values, true)))
    end
    return { code = 0 }
  end

  if o.emit_jobs then
    if not file then return usage_error("--emit-jobs needs the sweep's file") end
    local pass = {}
    -- the resolved preset, so a job on another machine sees the same points
    if S.preset and S.preset ~= "" then pass[1] = "--preset " .. shell_quote(S.preset) end
    for _, p in ipairs(o.pass) do pass[#pass + 1] = p end
    local jobs = M.emit_jobs(S, { file = file, csv = csv, parts = o.parts, shards = o.shards,
                                  points = o.points, pass = pass, retry_failed = o.retry_failed })
    for _, j in ipairs(jobs) do io.stdout:write(j, "\n") end
    local parts = o.parts or M.parts_dir(csv)
    io.stderr:write(string.format("%d jobs; each writes to %s/; then merge with\n  %s --merge %s %s/*.csv\n" ..
      "(or: cat %s/*.csv >> %s)\n", #jobs, parts, program(), csv, parts, parts, csv))
    return { code = 0 }
  end

  local summary = M.run(S, {
    csv = csv, device = o.device, shard = o.shard, points = o.points,
    retry_failed = o.retry_failed, ceilings = o.ceilings, ceilings_seconds = o.ceilings_seconds,
    budget = o.budget, warmup = o.warmup, repeats = o.repeats, max_repeats = o.max_repeats,
    progress = o.progress,
  })
  return { code = summary.failed > 0 and 1 or 0, ran = true, csv = csv, summary = summary }
end

-- For a sweep file that is also a program: returns def while scripts/sweep.lua
-- loads the file; run directly (luajit file.lua [options]), runs the sweep with
-- the command line and exits.
function M.script(def)
  if M.loading then return def end
  local file = arg and arg[0]
  local r = M.main(arg or {}, def, file)
  os.exit(r.code)
end

---------------------------------------------------------------------------
-- ready-made measures: decode and prefill over a paged (or contiguous) cache
--
-- Point fields (all optional): batch (1), heads (32), kv_heads (8), head_dim
-- (128), dtype ("bf16"), page (16; 0 or "none" = contiguous, unpaged),
-- context (decode: keys in the cache, 4096; prefill: keys before the new
-- tokens, 0), seqlen (prefill: new tokens, 2048; decode: 1), causal (prefill:
-- true), num_splits (0: the library chooses), page_order ("shuffled" like a
-- pool after some churn, or "sequential").

local function shuffled_pages(n, seed)
  local ids = {}
  for i = 1, n do ids[i] = i - 1 end
  local x = seed
  for i = n, 2, -1 do
    x = (x * 1103515245 + 12345) % 2147483648
    local j = x % i + 1
    ids[i], ids[j] = ids[j], ids[i]
  end
  return ids
end
M.shuffled_pages = shuffled_pages

local dtype_bytes = { f32 = 4, f16 = 2, bf16 = 2 }

local function unpaged(page)
  return page == nil and false or page == 0 or page == "none" or page == "unpaged"
end

-- K/V caches holding B sequences of L keys: paged [B * ceil(L/page), page, Hk, D]
-- with a block table, or contiguous [B, L, Hk, D].
function M.make_cache(lib, dev, B, L, Hk, D, page, dtype, order)
  if unpaged(page) then
    return lib.randn({ B, L, Hk, D }, dtype, dev, 1), lib.randn({ B, L, Hk, D }, dtype, dev, 2), nil
  end
  assert(type(page) == "number" and page >= 1, "page: a size >= 1, or 0 / \"none\" for unpaged")
  local per = math.max(1, math.ceil(L / page))
  local ids
  if order == "sequential" then
    ids = {}
    for i = 1, B * per do ids[i] = i - 1 end
  else
    ids = shuffled_pages(B * per, 7)
  end
  local kc = lib.randn({ B * per, page, Hk, D }, dtype, dev, 1)
  local vc = lib.randn({ B * per, page, Hk, D }, dtype, dev, 2)
  local bt = lib.from_table(ids, { B, per }, "i32", dev)
  return kc, vc, bt
end

-- One decode call of the batch named `name`, "BxL" (B sequences of L keys)
-- or "BxL+BxL..." (one batch of them all, the lengths in a fixed shuffled
-- order): one query a sequence of o.H heads, a cache from make_cache of
-- o.Hk heads, o.D, o.dtype, o.page (0: contiguous) and o.order. Returns the
-- call (its tensors live as long as it), its `out` tensor and the bytes of
-- K/V it reads; nil for a name that is not a batch.
function M.decode_batch(lib, dev, name, o)
  local lens, parts = {}, 0
  for b, l in name:gmatch("(%d+)x(%d+)") do
    parts = parts + 1
    for _ = 1, tonumber(b) do lens[#lens + 1] = tonumber(l) end
  end
  if parts == 0 then return nil end
  require("pagedattn.reference").rng(11):shuffle(lens)
  local B, L, keys = #lens, 0, 0
  for _, l in ipairs(lens) do L, keys = math.max(L, l), keys + l end
  local kc, vc, bt = M.make_cache(lib, dev, B, L, o.Hk, o.D, o.page, o.dtype, o.order)
  local q = assert(lib.randn({ B, 1, o.H, o.D }, o.dtype, dev, 3))
  local out = assert(lib.tensor({ B, 1, o.H, o.D }, o.dtype, dev))
  local seqlens = parts == 1 and L or assert(lib.from_table(lens, { B }, "i32", dev))
  local opts = { block_table = bt, cache_seqlens = seqlens, out = out }
  return function() assert(lib.attention_with_kvcache(q, kc, vc, opts)) end, out,
    2 * keys * o.Hk * o.D * dtype_bytes[o.dtype]
end

-- Configs of environment variables from text "A=1,B=2|C=3" ("-": a config
-- of none), for tuning runs: { { name = "A=1,B=2", vars = { A = "1", B = "2" } }, ... }
function M.env_configs(text)
  local configs = {}
  for c in (text or ""):gmatch("[^|]+") do
    local vars = {}
    if c ~= "-" then
      for kv in c:gmatch("[^,]+") do
        local k, v = kv:match("^%s*([%w_]+)=(.*)$")
        if not k then error("a config's setting is VAR=VALUE, got '" .. kv .. "'", 2) end
        vars[k] = v
      end
    end
    configs[#configs + 1] = { name = c, vars = vars }
  end
  return configs
end

-- Runs fn with environment variables set (false: unset), restoring them
-- after (the library reads its PAGEDATTN_* tuning variables at each call).
function M.with_env(vars, fn)
  local ffi = require "ffi"
  pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite); int unsetenv(const char *name);")
  local saved = {}
  for k, v in pairs(vars) do
    saved[k] = os.getenv(k) or false
    if v then ffi.C.setenv(k, v, 1) else ffi.C.unsetenv(k) end
  end
  local ok, err = pcall(fn)
  for k, v in pairs(saved) do
    if v then ffi.C.setenv(k, v, 1) else ffi.C.unsetenv(k) end
  end
  if not ok then error(err, 0) end
end

-- Rotary tables for positions 0 .. L - 1 of rotary dim 2 half (base 10000,
-- GPT-NeoX's frequencies): cos and sin tensors [L, half] of `dtype`.
function M.rope_tables(lib, dev, L, half, dtype)
  local cs, sn = {}, {}
  for pos = 0, L - 1 do
    for j = 0, half - 1 do
      local th = pos * 10000 ^ (-j / half)
      cs[pos * half + j + 1], sn[pos * half + j + 1] = math.cos(th), math.sin(th)
    end
  end
  return assert(lib.from_table(cs, { L, half }, dtype, dev)), assert(lib.from_table(sn, { L, half }, dtype, dev))
end

local function shape_of(p)
  local s = {
    B = p.batch or 1, H = p.heads or 32, Hk = p.kv_heads or 8, D = p.head_dim or 128,
    dtype = p.dtype or "bf16", page = p.page == nil and 16 or p.page,
  }
  s.esize = dtype_bytes[s.dtype] or error("dtype: '" .. tostring(s.dtype) .. "' is not f32, f16 or bf16", 0)
  return s
end

-- A workload's tensors: caches of `keys` keys per sequence, q and out of Sq
-- queries per sequence.
local function tensors_of(p, env, s, keys, Sq)
  local lib, dev = env.pa, env.device
  local kc, vc, bt = M.make_cache(lib, dev, s.B, keys, s.Hk, s.D, s.page, s.dtype, p.page_order)
  local q = lib.randn({ s.B, Sq, s.H, s.D }, s.dtype, dev, 3)
  local out = lib.tensor({ s.B, Sq, s.H, s.D }, s.dtype, dev)
  return kc, vc, bt, q, out
end

-- Decode: one new query token per sequence over `context` cached keys.
-- Memory-bound: judged by the K/V bytes read.
function M.decode(p, env)
  local lib = env.pa
  local s = shape_of(p)
  local L = p.context or 4096
  local Sq = p.seqlen or 1
  local kc, vc, bt, q, out = tensors_of(p, env, s, L, Sq)
  local opts = { cache_seqlens = L, block_table = bt, out = out, num_splits = p.num_splits,
                 causal = Sq > 1 and p.causal ~= false or nil }
  return {
    run = function() assert(lib.attention_with_kvcache(q, kc, vc, opts)) end,
    bytes = 2.0 * s.B * L * s.Hk * s.D * s.esize,
    flops = 4.0 * s.B * Sq * L * s.H * s.D,
    bound = "memory",
  }
end

-- Prefill (context = 0) or chunked prefill (new tokens after `context` keys):
-- seqlen queries per sequence over context + seqlen keys, causal by default.
-- Compute-bound: judged by 4 * H * D flops per unmasked (query, key) pair.
function M.prefill(p, env)
  local lib = env.pa
  local s = shape_of(p)
  local Sq = p.seqlen or 2048
  local ctx = p.context or 0
  local Sk = ctx + Sq
  local causal = p.causal ~= false
  local kc, vc, bt, q, out = tensors_of(p, env, s, Sk, Sq)
  local opts = { cache_seqlens = Sk, block_table = bt, out = out, causal = causal,
                 num_splits = p.num_splits }
  -- bottom-right aligned causal mask: query i sees ctx + i + 1 keys
  local pairs_ = causal and (Sq * ctx + Sq * (Sq + 1) / 2) or Sq * Sk
  return {
    run = function() assert(lib.attention_with_kvcache(q, kc, vc, opts)) end,
    bytes = 2.0 * s.B * Sk * s.Hk * s.D * s.esize + 2.0 * s.B * Sq * s.H * s.D * s.esize,
    flops = 4.0 * s.B * s.H * s.D * pairs_,
    bound = "compute",
  }
end

-- Decode or prefill by the point's `kind` ("decode" | "prefill").
function M.attention(p, env)
  local kind = p.kind or "decode"
  if kind == "decode" then return M.decode(p, env) end
  if kind == "prefill" or kind == "chunked_prefill" then return M.prefill(p, env) end
  error("kind: '" .. tostring(kind) .. "' is not decode or prefill", 0)
end

---------------------------------------------------------------------------
-- plots (gnuplot)

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
local TIME_COLUMNS = { median_s = true, ms = true, us = true }

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

local function gp_string(s)
  return '"' .. tostring(s):gsub("\\", "\\\\"):gsub('"', '\\"') .. '"'
end

local terminal_cache
local function png_terminal()
  if terminal_cache == nil then
    terminal_cache = execute("gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1") and "pngcairo" or "png"
  end
  return terminal_cache
end

-- numbers first (numerically), then strings
local function value_less(a, b)
  local na, nb = tonumber(a), tonumber(b)
  if na and nb then return na < nb end
  if na then return true end
  if nb then return false end
  return tostring(a) < tostring(b)
end

-- Draws a chart from CSV rows with gnuplot.
--   o.csv      a path or a list of paths (concatenated; repeated headers skipped)
--   o.x, o.y   columns (o.y may be a derived column: tflops, ms, us)
--   o.by       series: a column or a list ("page" or "page,dtype")
--   o.where    filters: { col = "v1,v2" } or a list of "col=v1,v2"
--   o.output   file; .png or .svg picks the format (default <csv>-<y>.png)
--   o.title, o.xlabel, o.ylabel, o.logx, o.logy (true or a base), o.scale (y factor),
--   o.ceiling  draw the measured ceiling (y = gbps/gflops/tflops/ratio),
--   o.errorbars  the min..max range of the timed repeats, o.size {w, h}
-- Only rows with status ok are drawn; one row per point (the last one).
-- Returns the output path, or nil, err.
function M.plot(o)
  if not o.x or not o.y then return nil, "plot: x and y columns are required" end
  local paths = type(o.csv) == "table" and o.csv or { o.csv }
  if #paths == 0 or not paths[1] then return nil, "plot: no CSV" end
  for _, p in ipairs(paths) do
    if not file_exists(p) then return nil, "plot: no such file: " .. p end
  end
  local rows = M.read_csv(paths)
  local by = as_list(o.by)
  local where = {}
  if o.where then
    if is_array(o.where) then
      for _, w in ipairs(o.where) do
        local c, v = tostring(w):match("^([^=]+)=(.*)$")
        if not c then return nil, "plot: --where wants COLUMN=V1,V2 (got '" .. tostring(w) .. "')" end
        where[c] = as_list(v)
      end
    else
      for c, v in pairs(o.where) do
        local vals = type(v) == "table" and v or as_list(fmt_value(v))
        where[c] = {}
        for i, x in ipairs(vals) do where[c][i] = fmt_value(x) end
      end
    end
  end

  -- the last ok row of each point
  local last, order = {}, {}
  local columns_seen = {}
  for _, r in ipairs(rows) do
    for k in pairs(r) do columns_seen[k] = true end
    local keep = r.status == "ok"
    for c, vals in pairs(where) do
      local hit = false
      for _, v in ipairs(vals) do if r[c] == v then hit = true end end
      if not hit then keep = false end
    end
    if keep then
      local key = M.row_key(r)
      if not last[key] then order[#order + 1] = key end
      last[key] = r
    end
  end
  for _, c in ipairs({ o.x, o.y }) do
    if not columns_seen[c] and not DERIVED[c] then
      return nil, "plot: no column '" .. c .. "' in " .. table.concat(paths, ", ")
    end
  end
  for _, c in ipairs(by) do
    if not columns_seen[c] then return nil, "plot: no column '" .. c .. "' (for --by)" end
  end
  if #order == 0 then return nil, "plot: no ok rows match in " .. table.concat(paths, ", ") end

  local scale = tonumber(o.scale) or 1
  local series, series_names = {}, {}
  local cells = {}
  local xs_numeric = true
  local xvals = {}
  for _, key in ipairs(order) do
    local r = last[key]
    local y = tonumber(column(r, o.y))
    local x = column(r, o.x)
    if y and x and x ~= "" then
      if not tonumber(x) then xs_numeric = false end
      local parts = {}
      for _, c in ipairs(by) do parts[#parts + 1] = (#by > 1 and (c .. "=") or "") .. tostring(r[c]) end
      local sname = #by > 0 and table.concat(parts, " ") or o.y
      local sortkey = {}
      for _, c in ipairs(by) do sortkey[#sortkey + 1] = r[c] end
      if not series[sname] then
        series[sname] = { name = sname, sortkey = sortkey, points = {} }
        series_names[#series_names + 1] = sname
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
      local lo, hi = y, y
      local med, mn, mx = tonumber(r.median_s), tonumber(r.min_s), tonumber(r.max_s)
      if med and mn and mx and med > 0 and mn > 0 then
        if TIME_COLUMNS[o.y] then lo, hi = y * mn / med, y * mx / med
        else lo, hi = y * med / mx, y * med / mn end
      end
      local sp = series[sname].points
      sp[#sp + 1] = { x = x, y = y * scale, lo = lo * scale, hi = hi * scale, row = r }
      xvals[x] = true
    end
  end
  if #series_names == 0 then return nil, "plot: no numeric values of " .. o.y end
  -- the baseline (page none / 0: unpaged) first, then by value
  local function baseline(v) return v == "none" or v == "unpaged" end
  table.sort(series_names, function(a, b)
    local ka, kb = series[a].sortkey, series[b].sortkey
    for i = 1, #ka do
      if ka[i] ~= kb[i] then
        if baseline(ka[i]) ~= baseline(kb[i]) then return baseline(ka[i]) end
        return value_less(ka[i], kb[i])
      end
    end
    return a < b
  end)

  -- categorical x (e.g. page = none, 1, 16): positions 0, 1, ... with labels
  local xpos
  if not xs_numeric then
    local list = {}
    for x in pairs(xvals) do list[#list + 1] = x end
    table.sort(list, function(a, b)
      if (a == "none") ~= (b == "none") then return a == "none" end -- the unpaged baseline first
      return value_less(a, b)
    end)
    xpos = { list = list }
    for i, x in ipairs(list) do xpos[x] = i - 1 end
  end

  local output = o.output or ((paths[1]:gsub("%.csv$", "")) .. "-" .. o.y .. ".png")
  local fmt = o.format or (output:match("%.svg$") and "svg") or "png"
  local w, h = 900, 560
  if o.size then w, h = o.size[1] or w, o.size[2] or h end
  mkdir_p(dirname(output))

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
  add("set title %s", gp_string(o.title or string.format("%s against %s%s", LABELS[o.y] or o.y, o.x,
    #by > 0 and (", by " .. table.concat(by, ", ")) or "")))
  add("set xlabel %s", gp_string(o.xlabel or LABELS[o.x] or o.x))
  add("set ylabel %s", gp_string(ylabel))
  add("set grid")
  add("set key outside right top")
  add("set yrange [0:*]")
  if o.logy then
    add("set logscale y %s", o.logy == true and "" or tostring(o.logy))
    add("set yrange [*:*]")
  end
  if xpos then
    local tics = {}
    for i, x in ipairs(xpos.list) do
      local label = (o.x == "page" and x == "none") and "unpaged" or x
      tics[i] = string.format("%s %d", gp_string(label), i - 1)
    end
    add("set xtics (%s)", table.concat(tics, ", "))
    add("set xrange [-0.5:%f]", #xpos.list - 0.5)
  else
    if o.logx then add("set logscale x %s", o.logx == true and "2" or tostring(o.logx)) end
    add("set xtics nomirror")
    add("set offsets graph 0.03, graph 0.03, 0, 0")
  end
  add("set format x '%%g'")

  local plots = {}
  for i, name in ipairs(series_names) do
    local pts = series[name].points
    table.sort(pts, function(a, b) return value_less(a.x, b.x) end)
    add("$s%d << EOD", i)
    for _, p in ipairs(pts) do
      local x = xpos and xpos[p.x] or tonumber(p.x)
      add("%.10g %.10g %.10g %.10g", x, p.y, p.lo, p.hi)
    end
    add("EOD")
    local title = name
    if #by == 1 then
      -- page 0 / "none" is the contiguous cache
      if by[1] == "page" and (name == "none" or name == "0" or name == "unpaged") then title = "unpaged"
      else title = by[1] .. " " .. name end
    end
    local style = title == "unpaged" and "lw 3 lc rgb '#000000' pt 5 ps 0.8" or "lw 2 pt 7 ps 0.8"
    if o.errorbars then
      plots[#plots + 1] = string.format("$s%d using 1:2:3:4 with yerrorlines %s title %s",
        i, style, gp_string(title))
    else
      plots[#plots + 1] = string.format("$s%d using 1:2 with linespoints %s title %s",
        i, style, gp_string(title))
    end
  end

  if o.ceiling then
    local col, label, factor = nil, nil, 1
    if o.y == "gbps" then col, label = "ceil_read_gbps", "read ceiling"
    elseif o.y == "gflops" then col, label = "ceil_peak_gflops", "peak"
    elseif o.y == "tflops" then col, label, factor = "ceil_peak_gflops", "peak", 1e-3
    elseif o.y == "ratio" then label = "ceiling" end
    local vals = {}
    if col then
      for _, key in ipairs(order) do
        local v = tonumber(last[key][col])
        if v then vals[#vals + 1] = v end
      end
    end
    local value = col and #vals > 0 and M.stats(vals).median * factor or (o.y == "ratio" and 1 or nil)
    if value then
      value = value * scale
      plots[#plots + 1] = string.format("%.10g with lines dt 2 lw 2 lc rgb '#777777' title %s",
        value, gp_string(string.format("%s %.4g", label, value)))
    end
  end
  add("plot %s", table.concat(plots, ", \\\n     "))
  add("unset output")

  local script = os.tmpname()
  local errfile = os.tmpname()
  local f = assert(io.open(script, "wb"))
  f:write(table.concat(gp, "\n"), "\n")
  f:close()
  local ok = execute("gnuplot " .. shell_quote(script) .. " 2>" .. shell_quote(errfile))
  local ef = io.open(errfile, "rb")
  local errtext = ef and ef:read("*a") or ""
  if ef then ef:close() end
  os.remove(errfile)
  if not ok then
    if o.keep_script then io.stderr:write("gnuplot script: ", script, "\n") else os.remove(script) end
    if not execute("command -v gnuplot >/dev/null 2>&1") then
      return nil, "plot: gnuplot is not installed (apt-get install gnuplot-nox, or scripts/setup)"
    end
    return nil, "plot: gnuplot failed: " .. errtext
  end
  if o.keep_script then io.stderr:write("gnuplot script: ", script, "\n") else os.remove(script) end
  return output
end

return M
