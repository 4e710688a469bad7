-- pagedattn.sweep.points: what a sweep runs. A definition (axes or a list of
-- points, presets, overrides and filters) made concrete as numbered points
-- with stable keys; slices of them for shards; which of them a CSV already
-- holds; and how a point is named in messages.
local util = require "pagedattn.sweep.util"
local csv = require "pagedattn.sweep.csv"

local copy, is_array, fmt_value = util.copy, util.is_array, util.fmt_value

local M = {}

-- Axis columns come first in this order when a sweep does not give one.
local AXIS_ORDER = { "kind", "device", "dtype", "layout", "batch", "heads", "kv_heads",
  "head_dim", "context", "seqlen", "page", "num_splits", "causal" }

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

local function check_name(what, name)
  if type(name) ~= "string" or not name:match("^[%a][%w_]*$") then
    error("pagedattn.sweep: " .. what .. " '" .. tostring(name) ..
          "' must be a name (a letter, then letters, digits, _)", 3)
  end
end

-- An axis named in an override or a filter must be one of the sweep's: a
-- misspelt one would otherwise add an axis (a second CSV header) or keep no point.
local function check_axes_exist(d, axes, opts, key)
  local given = opts[key]
  if not given then return end
  local known = {}
  for _, a in ipairs(axes) do known[a] = true end
  local names = {}
  for a in pairs(given) do names[#names + 1] = a end
  table.sort(names)
  for _, a in ipairs(names) do
    if not known[a] then
      error(string.format("pagedattn.sweep: %s%s %s=...: sweep '%s' has no axis '%s' (its axes: %s)",
        opts.cli and "--" or "", key, tostring(a), d.name, tostring(a), table.concat(axes, ", ")), 0)
    end
  end
end

-- Applies preset `preset` of def to a copy of def.
local function apply_preset(def, preset)
  local d = copy(def)
  if not preset or preset == "" then return d end
  local p = def.presets and def.presets[preset]
  if not p then
    local names = {}
    for k in pairs(def.presets or {}) do names[#names + 1] = k end
    table.sort(names)
    error("pagedattn.sweep: no preset '" .. preset .. "' (presets: " ..
          (#names > 0 and table.concat(names, ", ") or "none") .. ")", 3)
  end
  -- (the preset's keys as a list: a pairs() loop around the axes' pairs()
  -- loop drops keys on Debian 12's LuaJIT, LuaJIT issue 827)
  local keys = {}
  for k in pairs(p) do keys[#keys + 1] = k end
  for _, k in ipairs(keys) do
    local v = p[k]
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
  return d
end

-- A sweep definition made concrete: preset applied, overrides (`set`) and
-- filters (`only`) applied, points enumerated with their 1-based index and key.
--   opts.preset   name of def.presets[...] (else def.default_preset, which may be
--                 a function of the device)
--   opts.set      { axis = {values} }: replaces the axis's values in every point
--   opts.only     { axis = {values} }: keeps the points whose value is listed
--   (an axis in set or only that the sweep does not have is an error)
function M.define(def, opts)
  opts = opts or {}
  if type(def) ~= "table" then error("pagedattn.sweep: a sweep is a table, got " .. type(def), 2) end
  local preset = opts.preset
  if preset == nil and def.default_preset ~= nil then
    preset = def.default_preset
    if type(preset) == "function" then preset = preset(opts.device_object or util.default_device(opts.device)) end
  end
  local d = apply_preset(def, preset)
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
  for _, a in ipairs(axes) do
    check_name("axis", a)
    if csv.RESERVED[a] then
      error("pagedattn.sweep: axis '" .. a .. "' is the name of a result column", 2)
    end
  end
  check_axes_exist(d, axes, opts, "set")
  check_axes_exist(d, axes, opts, "only")

  -- overrides: an axis set from the command line replaces its values
  if opts.set then
    local names = {}
    for a in pairs(opts.set) do names[#names + 1] = a end
    sort_axes(names)
    for _, a in ipairs(names) do
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

  local extra = d.columns or {}
  for _, c in ipairs(extra) do
    check_name("column", c)
    if csv.RESERVED[c] then error("pagedattn.sweep: column '" .. c .. "' is a result column", 2) end
  end

  local S = {
    defined = true, name = d.name, axes = axes, columns = extra, measure = d.measure, preset = preset,
    warmup = d.warmup or 1, repeats = d.repeats or 3, max_repeats = d.max_repeats or 100,
    budget = d.budget or 0.5, where = d.where, def = def,
  }
  S.header = { "sweep" }
  for _, a in ipairs(axes) do S.header[#S.header + 1] = a end
  for _, c in ipairs(csv.RESULT_COLUMNS) do S.header[#S.header + 1] = c end
  for _, c in ipairs(extra) do S.header[#S.header + 1] = c end
  S.header_line = csv.csv_line(S.header)

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
      local key = csv.key_of(S.name, axes, p)
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

-- Keys of the points of S already recorded in `paths`: ok rows, and failed rows
-- too unless retry_failed.
function M.done_keys(S, paths, retry_failed)
  local done = {}
  local rows = csv.read_csv(paths)
  for _, row in ipairs(rows) do
    if row.sweep == S.name and (row.status == "ok" or not retry_failed) then
      local key = csv.row_key(row, S.axes)
      if done[key] ~= "ok" then done[key] = row.status end
    end
  end
  return done
end

-- "context=1024 page=16": the axes that vary (all of them with all = true)
function M.describe_point(S, values, all)
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

return M
