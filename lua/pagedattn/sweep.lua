-- pagedattn.sweep: experiment sweeps. A sweep is a short table: axes (or a list
-- of points) and the function measured at each point. The runner times every
-- point (warm-up, repeats, median and quartiles), takes each device's
-- ceilings (measured once per device and kept on disk) so that every row has
-- its ratio, appends one CSV row per point, skips points already in the CSV
-- (resume), records a failed point and goes on, and slices the points for
-- scale-out (--shard i/n, --emit-jobs).
--
--   local sweep = require "pagedattn.sweep"
--   return sweep.script {                       -- a sweep file (see scripts/sweep.lua)
--     name = "decode_pages",
--     axes = { context = { 1024, 4096 }, page = { "none", 1, 16, 256 } },
--     measure = sweep.decode,                   -- or sweep.prefill, or your own
--   }
--
-- This file is the public face: the work is done by the modules under
-- pagedattn/sweep/, one job each:
--   csv       the results file: rows, reading, merging, the CSV rule
--   points    definitions made concrete: presets, --set/--only, shards, resume keys
--   stats     timing a point, median and quartiles
--   progress  the bar or the lines on stderr
--   runner    running the points: devices, cached ceilings, one row each
--   jobs      one command per point or shard for GNU parallel / Slurm
--   cli       the command line of scripts/sweep.lua
--   measures  decode / prefill workloads, caches and batches for benchmarks
--   env       environment-variable configs for tuning runs
--   plot, plot_cli  charts with gnuplot, and scripts/plot's command line
--   util      value spelling, shell quoting, paths
-- Only running a sweep loads libpagedattn; reading CSVs and plotting do not
-- (scripts/plot runs under any Lua 5.1+).
local util = require "pagedattn.sweep.util"
local csv = require "pagedattn.sweep.csv"
local points = require "pagedattn.sweep.points"
local stats = require "pagedattn.sweep.stats"
local runner = require "pagedattn.sweep.runner"
local jobs = require "pagedattn.sweep.jobs"
local cli = require "pagedattn.sweep.cli"
local measures = require "pagedattn.sweep.measures"
local env = require "pagedattn.sweep.env"
local plot = require "pagedattn.sweep.plot"

local M = {
  -- values and files
  fmt_value = util.fmt_value, parse_value = util.parse_value, parse_list = util.parse_list,
  shell_quote = util.shell_quote, fmt_duration = util.fmt_duration,
  RESULT_COLUMNS = csv.RESULT_COLUMNS, csv_line = csv.csv_line, parse_csv_line = csv.parse_csv_line,
  key_of = csv.key_of, read_csv = csv.read_csv, row_key = csv.row_key, parts_dir = csv.parts_dir,
  list_csv = csv.list_csv, merge = csv.merge,
  -- points
  product = points.product, concat = points.concat, define = points.define, select = points.select,
  parse_shard = points.parse_shard, done_keys = points.done_keys, describe_point = points.describe_point,
  -- running
  stats = stats.stats, default_device = util.default_device, run = runner.run,
  runner_command = jobs.runner_command, emit_jobs = jobs.emit_jobs,
  -- the command line
  USAGE = cli.USAGE, parse_args = cli.parse_args, load = cli.load, main = cli.main, script = cli.script,
  -- workloads and helpers for benchmarks
  decode = measures.decode, prefill = measures.prefill, attention = measures.attention,
  make_cache = measures.make_cache, decode_batch = measures.decode_batch, append_batch = measures.append_batch,
  shuffled_pages = measures.shuffled_pages, rope_tables = measures.rope_tables,
  env_configs = env.env_configs, with_env = env.with_env,
  -- charts
  plot = plot.plot, plot_script = plot.script,
}

-- sweep.loading: true while scripts/sweep.lua loads a sweep file (a file that
-- is also a program returns its table then instead of running); it is the
-- command line's state, so it is read from there rather than copied.
return setmetatable(M, {
  __index = function(_, k)
    if k == "loading" then return cli.loading end
  end,
})
