#!/usr/bin/env luajit
-- scripts/sweep.lua SWEEP.lua [options] -- runs (or resumes) an experiment sweep:
-- one CSV row per point, points already in the CSV skipped, failed points
-- recorded; --shard I/N and --emit-jobs spread it over GPUs and hosts.
--   scripts/run scripts/sweep.lua examples/sweep_page_size.lua
--   luajit scripts/sweep.lua SWEEP.lua --emit-jobs | parallel -j4
--   luajit scripts/sweep.lua --merge results/x.csv results/x.parts/*.csv
-- `--help` lists the options; lua/pagedattn/sweep/ is the library (cli.lua: this command line).

-- find lua/ of this source tree (an installed rock has its modules on the path)
local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local f = io.open(here .. "/../lua/pagedattn/sweep.lua", "r")
if f then
  f:close()
  package.path = here .. "/../lua/?.lua;" .. here .. "/../lua/?/init.lua;" .. package.path
end

local sweep = require "pagedattn.sweep"
os.exit(sweep.main(arg).code)
