-- pagedattn.sweep.cli: the runner's command line (scripts/sweep.lua, and sweep
-- files run as programs): the options, parsed from one table that also writes
-- --help, so that no option goes undocumented; loading a sweep file; and
-- main, which lists, emits jobs, merges or runs.
local util = require "pagedattn.sweep.util"
local csv = require "pagedattn.sweep.csv"
local points = require "pagedattn.sweep.points"
local runner = require "pagedattn.sweep.runner"
local jobs = require "pagedattn.sweep.jobs"

local shell_quote = util.shell_quote

local M = {}

-- True while M.load runs a sweep file: sweep.script(def) then only returns
-- the definition instead of running it.
M.loading = false

local function number(flag, v, min)
  local n = tonumber(v)
  if not n or (min and n < min) then
    error({ msg = string.format("%s wants a number%s (got '%s')", flag, min and (" >= " .. min) or "", v) })
  end
  return n
end

local function count(flag, v, min)
  local n = number(flag, v, min)
  if n ~= math.floor(n) then error({ msg = string.format("%s wants a whole number (got '%s')", flag, v) }) end
  return n
end

local function axis_list(flag, s)
  local a, vals = s:match("^([%a][%w_]*)=(.*)$")
  if not a or vals == "" then error({ msg = flag .. " wants AXIS=V1,V2 (got '" .. s .. "')" }) end
  return a, util.parse_list(vals)
end

-- The options: flag (and an alias), the value's name (nil: none), help, and
-- what it sets. pass = true: a job from --emit-jobs repeats it, to see the
-- same points and settings.
local FLAGS = {
  { "--csv", "FILE", "results (default results/<name>.csv): appended; points in it are skipped",
    function(o, v) o.csv = v end },
  { "--device", "NAME", "cpu, cuda, cuda:N (points without a device axis; default: pa.device())",
    function(o, v) o.device = v end, pass = true },
  { "--preset", "NAME", "one of the sweep's presets (sizes)", function(o, v) o.preset = v end },
  { "--set", "AXIS=V1,V2", "replace an axis's values (repeatable; the axis must be the sweep's)",
    function(o, v, f)
      local a, vals = axis_list(f, v)
      o.set = o.set or {}
      o.set[a] = vals
    end, pass = true },
  { "--only", "AXIS=V1,V2", "keep only points with these values (repeatable; the axis must be the sweep's)",
    function(o, v, f)
      local a, vals = axis_list(f, v)
      o.only = o.only or {}
      o.only[a] = vals
    end, pass = true },
  { "--shard", "I/N", "run the I-th of N disjoint slices (1 <= I <= N; round robin)",
    function(o, v)
      local s, e = points.parse_shard(v)
      if not s then error({ msg = e }) end
      o.shard = s
    end },
  { "--point", "K[,K...]", "run these points (1-based indices; see --list)", alias = "--points",
    function(o, v, f)
      o.points = {}
      for k in v:gmatch("[^,]+") do
        local n = tonumber(k)
        if not n or n < 1 or n ~= math.floor(n) then error({ msg = f .. ": bad index '" .. k .. "'" }) end
        o.points[#o.points + 1] = n
      end
    end },
  { "--list", nil, "print the points (index, done/todo, values) and exit", function(o) o.list = true end },
  { "--emit-jobs", nil, "print one runner command per point still to run, and exit",
    function(o) o.emit_jobs = true end },
  { "--shards", "N", "with --emit-jobs: one command per shard instead",
    function(o, v, f) o.shards = count(f, v, 1) end },
  { "--parts", "DIR", "with --emit-jobs: where jobs write their CSVs (default <csv>.parts)",
    function(o, v) o.parts = v end },
  { "--retry-failed", nil, "run points recorded as failed again", function(o) o.retry_failed = true end,
    pass = true },
  { "--budget", "S", "seconds of timed repeats per point, after the warm-up (the sweep's, else 0.5)",
    function(o, v, f) o.budget = number(f, v, 0) end, pass = true },
  { "--warmup", "N", "untimed calls per point first (the sweep's, else 1)",
    function(o, v, f) o.warmup = count(f, v, 0) end, pass = true },
  { "--repeats", "N", "at least N timed calls per point (the sweep's, else 3)",
    function(o, v, f) o.repeats = count(f, v, 1) end, pass = true },
  { "--max-repeats", "N", "at most N timed calls per point, budget or not (the sweep's, else 100)",
    function(o, v, f) o.max_repeats = count(f, v, 1) end, pass = true },
  { "--ceilings", "S", "seconds per ceiling measurement (default 0.5; measured once per device, then cached)",
    function(o, v, f) o.ceilings_seconds = number(f, v, 0) end, pass = true },
  { "--refresh-ceilings", nil, "measure the ceilings again now (and keep them for the next runs)",
    function(o) o.refresh_ceilings = true end },
  { "--no-ceilings", nil, "no ratios: measure no ceilings", function(o) o.ceilings = false end, pass = true },
  { "--progress", "MODE", "auto (bar on a terminal, else lines), bar, lines, none",
    function(o, v, f)
      if v ~= "auto" and v ~= "bar" and v ~= "lines" and v ~= "none" then
        error({ msg = f .. " wants auto, bar, lines or none (got '" .. v .. "')" })
      end
      o.progress = v
    end },
  { "--merge", nil, "OUT.csv IN.csv...: merge CSVs into OUT (one row per point), and exit",
    function(o) o.merge = true end },
  { "--help", nil, "this text", alias = "-h", function(o) o.help = true end },
}

local BY_NAME = {}
for _, f in ipairs(FLAGS) do
  BY_NAME[f[1]] = f
  if f.alias then BY_NAME[f.alias] = f end
end

local function usage_text()
  local lines = {
    "usage: scripts/sweep.lua SWEEP.lua [options]     run (or resume) a sweep",
    "       scripts/sweep.lua --merge OUT.csv IN.csv...  merge CSVs (one row per point)",
    "options:",
  }
  for _, f in ipairs(FLAGS) do
    local name = f[1]
    if f.alias then -- a short alias before the flag (-h, --help), a long one after it
      name = f.alias:match("^%-%-") and (name .. ", " .. f.alias) or (f.alias .. ", " .. name)
    end
    name = name .. (f[2] and (" " .. f[2]) or "")
    if #name > 20 then
      lines[#lines + 1] = "  " .. name
      lines[#lines + 1] = string.rep(" ", 23) .. f[3]
    else
      lines[#lines + 1] = string.format("  %-20s %s", name, f[3])
    end
  end
  return table.concat(lines, "\n") .. "\n"
end
M.USAGE = usage_text()

local function usage_for_program(more)
  return (M.USAGE:gsub("scripts/sweep%.lua", jobs.program())) .. (more or "")
end

local function usage_error(msg, more)
  io.stderr:write(jobs.program(), ": ", msg, "\n", usage_for_program(more))
  return { code = 2 }
end

-- Parses runner arguments. Returns opts (o.positional: the other arguments;
-- o.pass: the flags a job repeats), or nil, message.
function M.parse_args(argv)
  local o = { pass = {} }
  local positional = {}
  local args = {}
  for k = 1, #argv do args[k] = argv[k] end
  local ok, err = pcall(function()
    local i = 1
    while i <= #args do
      local a = args[i]
      local name, inline = a:match("^(%-%-[%w-]+)=(.*)$")
      local f = BY_NAME[name or a]
      if f then
        local v
        if f[2] then
          if inline then v = inline
          else
            v = args[i + 1]
            if v == nil then error({ msg = f[1] .. " needs a value" }) end
            i = i + 1
          end
        elseif inline then
          error({ msg = f[1] .. " takes no value (got '" .. a .. "')" })
        end
        f[4](o, v, name or a)
        if f.pass then o.pass[#o.pass + 1] = f[1] .. (v and (" " .. shell_quote(v)) or "") end
      elseif a:sub(1, 1) == "-" and a ~= "-" then
        error({ msg = "unknown option " .. a })
      else
        positional[#positional + 1] = a
      end
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

local function merge(o)
  local out = table.remove(o.positional, 1)
  if not out or #o.positional == 0 then return usage_error("--merge OUT.csv IN.csv...") end
  local inputs = {}
  if util.file_exists(out) then inputs[1] = out end
  for _, p in ipairs(o.positional) do inputs[#inputs + 1] = p end
  local n = csv.merge(out, inputs)
  io.stderr:write(string.format("merged %d files: %d rows -> %s\n", #inputs, n, out))
  return { code = 0 }
end

local function list(S, o, path)
  local done = points.done_keys(S, { path }, o.retry_failed)
  for _, pt in ipairs(points.select(S, o)) do
    io.stdout:write(string.format("%d\t%s\t%s\n", pt.index, done[pt.key] and "done" or "todo",
      points.describe_point(S, pt.values, true)))
  end
  return { code = 0 }
end

local function emit(S, o, path, file)
  local pass = {}
  -- the resolved preset, so a job on another machine sees the same points
  if S.preset and S.preset ~= "" then pass[1] = "--preset " .. shell_quote(S.preset) end
  for _, p in ipairs(o.pass) do pass[#pass + 1] = p end
  local list_ = jobs.emit_jobs(S, { file = file, csv = path, parts = o.parts, shards = o.shards,
                                    points = o.points, pass = pass, retry_failed = o.retry_failed })
  for _, j in ipairs(list_) do io.stdout:write(j, "\n") end
  local parts = o.parts or csv.parts_dir(path)
  io.stderr:write(string.format("%d jobs; each writes to %s/; then merge with\n  %s --merge %s %s/*.csv\n" ..
    "(or: cat %s/*.csv >> %s)\n", #list_, parts, jobs.program(), path, parts, parts, path))
  return { code = 0 }
end

local function main(argv, def, file, more_usage)
  local o, err = M.parse_args(argv or {})
  if not o then return usage_error(err, more_usage) end
  if o.help then io.stdout:write(usage_for_program(more_usage)) return { code = 0 } end
  if o.merge then return merge(o) end
  if not def then
    file = o.positional[1]
    if not file then return usage_error("no sweep file", more_usage) end
    def = M.load(file)
  end
  if o.shard and o.points then return usage_error("--shard and --point do not combine", more_usage) end

  local dev_obj
  if type(def.default_preset) == "function" and not o.preset then
    local e
    dev_obj, e = util.pa().device(o.device)
    if not dev_obj then
      error(string.format("cannot open the device%s to choose the sweep's preset (%s); pass --preset NAME",
        o.device and (" " .. o.device) or "", tostring(e)), 0)
    end
  end
  local S = points.define(def, { preset = o.preset, set = o.set, only = o.only, device_object = dev_obj,
                                 cli = true })
  local path = o.csv or ("results/" .. S.name .. ".csv")
  if o.list then return list(S, o, path) end
  if o.emit_jobs then
    if not file then return usage_error("--emit-jobs needs the sweep's file", more_usage) end
    return emit(S, o, path, file)
  end

  local summary = runner.run(S, {
    csv = path, device = o.device, shard = o.shard, points = o.points,
    retry_failed = o.retry_failed, ceilings = o.ceilings, ceilings_seconds = o.ceilings_seconds,
    refresh_ceilings = o.refresh_ceilings,
    budget = o.budget, warmup = o.warmup, repeats = o.repeats, max_repeats = o.max_repeats,
    progress = o.progress,
  })
  return { code = summary.failed > 0 and 1 or 0, ran = true, csv = path, summary = summary }
end

-- The runner. argv: arguments (a sweep file first unless `def` is given; `file`
-- is then def's file, for --emit-jobs; more_usage: lines --help adds, for a
-- sweep file's own options). Never raises: returns {code = exit status (2:
-- usage, 1: failed points or an error, 130: interrupted), ran = true when
-- points were run, csv, summary}.
function M.main(argv, def, file, more_usage)
  local ok, r = pcall(main, argv, def, file, more_usage)
  if ok then return r end
  if runner.interrupted(r) then return { code = 130 } end
  io.stderr:write(jobs.program(), ": ", tostring(r), "\n")
  return { code = 1 }
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

return M
