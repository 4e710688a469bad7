-- pagedattn.sweep.jobs: scale-out without a scheduler of our own: one shell
-- command per point still to run (or per shard), each writing its own CSV
-- under <csv>.parts/, for GNU parallel or a Slurm array.
local util = require "pagedattn.sweep.util"
local csv = require "pagedattn.sweep.csv"
local points = require "pagedattn.sweep.points"

local shell_quote, absolute, dirname = util.shell_quote, util.absolute, util.dirname

local M = {}

-- How a job starts the runner: scripts/sweep.lua of this source tree under
-- LuaJIT, or the pagedattn-sweep command of an installed rock.
function M.runner_command()
  local src = debug.getinfo(1, "S").source
  if src:sub(1, 1) == "@" then
    -- this file is <root>/lua/pagedattn/sweep/jobs.lua
    local root = dirname(dirname(dirname(dirname(absolute(src:sub(2))))))
    local script = root .. "/scripts/sweep.lua"
    if util.file_exists(script) then return "luajit " .. shell_quote(script) end
  end
  return "pagedattn-sweep"
end

-- The runner's name in messages: scripts/sweep.lua, or pagedattn-sweep when installed.
function M.program()
  return M.runner_command() == "pagedattn-sweep" and "pagedattn-sweep" or "scripts/sweep.lua"
end

-- One command per point still to run (or per shard with opts.shards = N).
--   opts.file    the sweep file (made absolute); opts.csv the results file
--   opts.parts   where the jobs write (default <csv>.parts/)
--   opts.pass    extra runner arguments (already shell-quoted strings)
-- Points already in the CSV or in a part file are left out.
function M.emit_jobs(S, opts)
  local path = opts.csv or ("results/" .. S.name .. ".csv")
  local parts = absolute(opts.parts or csv.parts_dir(path))
  local done_files = { path }
  for _, p in ipairs(csv.list_csv(parts)) do done_files[#done_files + 1] = p end
  local done = points.done_keys(S, done_files, opts.retry_failed)
  local base = (opts.runner or M.runner_command()) .. " " .. shell_quote(absolute(opts.file))
  local pass = opts.pass and #opts.pass > 0 and (" " .. table.concat(opts.pass, " ")) or ""
  local jobs = {}
  if opts.shards then
    local n = opts.shards
    local width = #tostring(n)
    for i = 1, n do
      local pending = 0
      for _, pt in ipairs(points.select(S, { shard = { i, n }, points = opts.points })) do
        if not done[pt.key] then pending = pending + 1 end
      end
      if pending > 0 then
        local out = string.format("%s/shard-%0" .. width .. "d-of-%d.csv", parts, i, n)
        jobs[#jobs + 1] = string.format("%s --shard %d/%d --csv %s%s", base, i, n, shell_quote(out), pass)
      end
    end
  else
    local width = math.max(4, #tostring(#S.points))
    for _, pt in ipairs(points.select(S, { points = opts.points })) do
      if not done[pt.key] then
        local out = string.format("%s/point-%0" .. width .. "d.csv", parts, pt.index)
        jobs[#jobs + 1] = string.format("%s --point %d --csv %s%s", base, pt.index, shell_quote(out), pass)
      end
    end
  end
  return jobs
end

return M
