-- pagedattn.sweep.csv: the results file. Writing rows, reading one or more
-- files as one, merging, and the rule that makes `cat a.csv b.csv` a merge:
-- every file starts with the same header line, whose first field is "sweep";
-- a reader treats any later line whose first field is "sweep" as a header
-- (skipped when repeated, switching columns when different) and drops a line
-- cut short by a kill. Fields never hold a newline. The axis columns are
-- those between "sweep" and "status"; a point's key is the sweep name plus
-- its axis values.
local util = require "pagedattn.sweep.util"

local fmt_value, shell_quote = util.fmt_value, util.shell_quote

local M = {}

-- The columns after the axes, in this order (a sweep's own metric columns follow).
M.RESULT_COLUMNS = {
  "status",   -- ok | error
  "median_s", "min_s", "max_s",
  "q1_s", "q3_s", -- the 25th and 75th percentiles of the timed repeats (error bars)
  "spread",   -- (q3_s - q1_s) / median_s
  "repeats",
  "gbps",     -- bytes the point must move / median, 1e9/s
  "gflops",   -- flops / median, 1e9/s
  "bound",    -- memory | compute: which ceiling the ratio is to
  "ratio",    -- gbps / ceil_read_gbps (memory) or gflops / ceil_peak_gflops (compute)
  "ceil_read_gbps", "ceil_peak_gflops",
  "ceil_peak_kind", -- fma_f32 (CPU) | matmul_bf16 (GPU)
  "device", "device_desc", "version", "host", "finished", "error",
}

M.RESERVED = { sweep = true }
for _, c in ipairs(M.RESULT_COLUMNS) do M.RESERVED[c] = true end

local function csv_field(s)
  s = tostring(s):gsub("\r?\n", " | ")
  if s:find('[,"]') or s:match("^%s") or s:match("%s$") then
    s = '"' .. s:gsub('"', '""') .. '"'
  end
  return s
end

function M.csv_line(fields)
  local out = {}
  for i = 1, #fields do out[i] = csv_field(fields[i]) end
  return table.concat(out, ",")
end

-- Fields of one CSV line, or nil when the line is malformed (e.g. cut short).
function M.parse_csv_line(line)
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

-- A point's key: the sweep name and its values of `axes`, in that order.
function M.key_of(name, axes, values)
  local parts = { name }
  for i, a in ipairs(axes) do parts[i + 1] = fmt_value(values[a]) end
  return table.concat(parts, "\31")
end

-- Rows of one or more CSV files (a path or a list; missing files are empty).
-- Each row is a table by column name (strings, as written), plus row._axes
-- (its header's axis columns), row._header and row._file. Repeated headers are
-- skipped, a different header switches columns, malformed lines (an
-- interrupted write) are counted in the second result.
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
          local fields = M.parse_csv_line(line)
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
  return M.key_of(row.sweep, axes or row._axes, row)
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
  util.mkdir_p(util.dirname(out))
  local tmp = out .. ".tmp"
  local f = assert(io.open(tmp, "wb"))
  local current
  local n = 0
  for _, key in ipairs(order) do
    local row = best[key]
    local line = M.csv_line(row._header) -- each row keeps the columns it came with
    if line ~= current then
      f:write(line, "\n")
      current = line
    end
    local fields = {}
    for i, c in ipairs(row._header) do fields[i] = row[c] or "" end
    f:write(M.csv_line(fields), "\n")
    n = n + 1
  end
  f:close()
  assert(os.rename(tmp, out))
  return n
end

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

-- Opens `path` for appending rows under `header_line`: the header is written
-- unless it is already the file's last one.
function M.open_append(path, header_line)
  local dir = util.dirname(path)
  if not util.mkdir_p(dir) then error("pagedattn.sweep: cannot create the directory " .. dir, 0) end
  local hdr, ends_nl = last_header(path)
  local f, err = io.open(path, "ab")
  if not f then error("pagedattn.sweep: cannot write " .. path .. ": " .. tostring(err), 0) end
  -- a row cut short by a kill: finish its line so the next row starts clean
  -- (the reader drops the malformed line)
  if not ends_nl then f:write("\n") end
  if hdr ~= header_line then f:write(header_line, "\n") end
  f:flush()
  return f
end

return M
