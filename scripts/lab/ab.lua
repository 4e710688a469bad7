-- scripts/lab/ab.lua -- what the in-process A/B tools share (decode_ab.lua,
-- append_ab.lua; a module: require "scripts.lab.ab" from the checkout's root).
--   ab.timed(dev, call): the median seconds of 15 calls after 0.05 s of
--     untimed ones, each timed by device events around its kernels (wall
--     time where the device is not a GPU), 1 ms of sleep after each (calls
--     back to back drove some boards to their power limit: 250 -> 275 us
--     over seconds, docs/measuring.md).
--   ab.under(dev, cfg, fn): fn() with the config's tuning fields set (a
--     config of none runs as the device is: the CPU has no tuning).
--   ab.run(o): the tools' command line, "CFG|CFG|..." [WORKLOADS] [ROUNDS]
--     (a CFG: tuning fields "field=value,..." or "-", pagedattn.tuning;
--     WORKLOADS comma separated, default o.workloads; ROUNDS default 3) on
--     $PAGEDATTN_AB_DEVICE (default: the default device). For each
--     workload, o.make(dev, name) gives {call = ...}; each config's call is
--     looked at once, o.look(wl) (its output), and o.compare(look, first)
--     says how it stands against the first config's; then every round runs
--     every config in turn (ab.timed); o.row(name, cfg_name, median s,
--     rounds text, comparison, wl) is the printed line, all of them again
--     after "summary". o.title: the header's words after the device.
local ffi = require "ffi"
local pa = require "pagedattn"
local core = require "pagedattn.core"
local sweep = require "pagedattn.sweep"

pcall(ffi.cdef, "int usleep(unsigned int usec);")

local M = {}
local secs = ffi.new("double[1]")

function M.timed(dev, call)
  local C, ctx, gpu = core.C, core.ctx, dev.kind == "cuda"
  local t0 = pa.clock()
  repeat
    for _ = 1, 5 do call() end
    dev:synchronize()
  until pa.clock() - t0 >= 0.05
  local ts = {}
  if gpu then assert(C.pa_device_timing(ctx, dev.handle, 1) == 0, core.last_error()) end
  for i = 1, 15 do
    local t1 = pa.clock()
    call()
    if gpu then
      assert(C.pa_device_timing_last(ctx, dev.handle, secs) == 0, core.last_error())
      ts[i] = secs[0]
    else
      dev:synchronize()
      ts[i] = pa.clock() - t1
    end
    ffi.C.usleep(1000)
  end
  if gpu then C.pa_device_timing(ctx, dev.handle, 0) end
  return sweep.stats(ts).median
end

function M.under(dev, cfg, fn)
  if next(cfg.fields) == nil then return fn() end
  return dev:with_tuning(cfg.fields, fn)
end

function M.run(o)
  local cfg_arg, wl_arg, rounds = arg[1] or "-", arg[2] or o.workloads, tonumber(arg[3] or "3")
  local dev = assert(pa.device(os.getenv("PAGEDATTN_AB_DEVICE")))
  local configs = require("pagedattn.tuning").parse_configs(cfg_arg)
  print(string.format("%s on %s%s: %d configs, %d rounds (kernel us%s)", o.tool, dev.description, o.title or "",
    #configs, rounds, dev.kind == "cuda" and "" or "; wall time: not a GPU"))
  local rows = {}
  for w in wl_arg:gmatch("[^,]+") do
    local wl = o.make(dev, w)
    local times, cmp, first = {}, {}, nil
    for ci, cfg in ipairs(configs) do
      times[ci] = {}
      M.under(dev, cfg, function()
        local seen = o.look(wl)
        if ci == 1 then first = seen end
        cmp[ci] = o.compare(seen, first)
      end)
    end
    for _ = 1, rounds do
      for ci, cfg in ipairs(configs) do
        M.under(dev, cfg, function() times[ci][#times[ci] + 1] = M.timed(dev, wl.call) end)
      end
    end
    for ci, cfg in ipairs(configs) do
      local rs = {}
      for r, t in ipairs(times[ci]) do rs[r] = string.format("%.1f", t * 1e6) end
      local row = o.row(w, cfg.name, sweep.stats(times[ci]).median, table.concat(rs, " "), cmp[ci], wl)
      rows[#rows + 1] = row
      print(row)
      io.stdout:flush()
    end
    wl = nil
    collectgarbage()
    collectgarbage()
  end
  print("summary")
  for _, r in ipairs(rows) do print(r) end
end

return M
