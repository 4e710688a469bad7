-- pagedattn.sweep.runner: runs a sweep's points that the CSV does not hold
-- yet: opens their devices, takes each device's ceilings (from the on-disk
-- cache of pagedattn.ceilings, so they are measured once per device, not on
-- every run and job), times each point, and appends one row per point, a
-- failed point included, flushed as it finishes.
local util = require "pagedattn.sweep.util"
local csv = require "pagedattn.sweep.csv"
local points = require "pagedattn.sweep.points"
local stats = require "pagedattn.sweep.stats"
local progress_m = require "pagedattn.sweep.progress"

local fmt_value, fmt_metric = util.fmt_value, util.fmt_metric

local M = {}

local function interrupted(err)
  return tostring(err):match("interrupted!?$") ~= nil
end
M.interrupted = interrupted

local function first_line(s, max)
  s = tostring(s):gsub("%s*stack traceback:.*$", ""):gsub("\r?\n", " | ")
  if max and #s > max then s = s:sub(1, max - 3) .. "..." end
  return s
end

-- The rates of a timed case and its ratio to the ceiling it is bound by.
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

local function age(seconds)
  return util.fmt_duration(math.max(0, seconds))
end

-- The ceilings of dev as rows record them ({read_gbps, copy_gbps, peak_gflops,
-- peak_kind}), or nil when they cannot be had; says on `progress` where they
-- came from. Returns the seconds spent measuring as the second result.
local function device_ceilings(dev, opts, progress, sweep_name, clock)
  local t0 = clock()
  local m, err = require("pagedattn.ceilings").get(dev, {
    seconds = opts.ceilings_seconds or 0.5, refresh = opts.refresh_ceilings, dir = opts.ceilings_dir,
  })
  local spent = clock() - t0
  if not m then
    progress:line(string.format("%s: the ceilings of %s failed: %s (rows get no ratio)", sweep_name,
      dev.name, tostring(err)))
    return nil, spent
  end
  if m.cached then
    progress:line(string.format("%s: the ceilings of %s (%s), measured %s ago (cached; --refresh-ceilings " ..
      "measures them again)", sweep_name, dev.name, dev.description, age(os.time() - m.measured_at)))
  else
    progress:line(string.format("%s: measured the ceilings of %s (%s) in %.1fs; kept for the next runs",
      sweep_name, dev.name, dev.description, spent))
  end
  -- the compute ceiling: fp32 FMA on a CPU, a bf16 matmul on a GPU (0: not measured)
  local peak, kind = m.fma_gflops, "fma_f32"
  if dev.kind == "cuda" then peak, kind = m.matmul_gflops, "matmul_bf16" end
  local peak_text = string.format("%s %.1f GFLOP/s", kind, peak or 0)
  if not peak or peak <= 0 then
    peak_text = kind .. " not measured (compute-bound rows get no ratio)"
    peak = nil
  end
  local c = { read_gbps = m.read_gbps, copy_gbps = m.copy_gbps, peak_gflops = peak,
              peak_kind = peak and kind or nil }
  progress:line(string.format("  read %.1f GB/s, copy %.1f GB/s, %s", c.read_gbps, c.copy_gbps, peak_text))
  return c, spent
end

-- Times one point: returns the case its measure built and its statistics, or raises.
local function measure_point(S, pt, dev, c, lib, cfg)
  local env = { device = dev, pa = lib, ceilings = c, index = pt.index, sweep = S }
  local case, merr = S.measure(pt.values, env)
  if case == nil then error(merr or "measure returned nothing", 0) end
  local st
  if case.run then
    st = stats.time(case.run, function() dev:synchronize() end, cfg, lib.clock)
  elseif case.seconds then
    st = stats.stats(type(case.seconds) == "table" and case.seconds or { case.seconds })
  else
    error("measure returned neither run nor seconds", 0)
  end
  if case.metrics then
    local allowed = {}
    for _, col in ipairs(S.columns) do allowed[col] = true end
    for k in pairs(case.metrics) do
      if not allowed[k] then
        error("measure returned metric '" .. tostring(k) .. "', which is not in the sweep's columns", 0)
      end
    end
  end
  return case, st
end

-- The row of a point: its axes, where it ran, and its statistics or its error.
-- Returns the row and the message for the progress line.
local function row_of(S, pt, dev, c, ok, case, st, err, opts, version)
  local row = { sweep = S.name, finished = os.date("!%Y-%m-%dT%H:%M:%SZ"), host = util.hostname(),
                version = version }
  for _, a in ipairs(S.axes) do row[a] = fmt_value(pt.values[a]) end
  if dev then row.device, row.device_desc = dev.name, dev.description
  else row.device = pt.values.device or opts.device or "" end
  if c then
    row.ceil_read_gbps = fmt_metric(c.read_gbps)
    row.ceil_peak_gflops = fmt_metric(c.peak_gflops)
    row.ceil_peak_kind = c.peak_kind
  end
  if not ok then
    row.status = "error"
    row.error = first_line(err, 400)
    return row, "FAILED: " .. first_line(err, 200)
  end
  local gbps, gflops, bound, ratio = ratio_of(case, st, c)
  row.status = "ok"
  row.median_s, row.min_s, row.max_s = fmt_metric(st.median), fmt_metric(st.min), fmt_metric(st.max)
  row.q1_s, row.q3_s = fmt_metric(st.q1), fmt_metric(st.q3)
  row.spread, row.repeats = fmt_metric(st.spread), fmt_metric(st.repeats)
  row.gbps, row.gflops, row.bound, row.ratio = fmt_metric(gbps), fmt_metric(gflops), bound or "", fmt_metric(ratio)
  for k, v in pairs(case.metrics or {}) do row[k] = fmt_metric(v) end
  local rate = bound == "compute" and gflops and string.format("%.1f GFLOP/s", gflops)
    or gbps and string.format("%.1f GB/s", gbps)
    or gflops and string.format("%.1f GFLOP/s", gflops) or ""
  return row, string.format("%8.3f ms %s%s", st.median * 1e3, rate,
    ratio and string.format(" (%.2f of %s)", ratio, bound == "memory" and "read" or "peak") or "")
end

-- Runs the selected points of a sweep that are not yet in the CSV.
--   opts.csv          results file (appended to; default results/<name>.csv)
--   opts.device       device name for points without a device axis (nil: default)
--   opts.shard        {i, n}; opts.points: list of indices
--   opts.retry_failed run points recorded as failed again
--   opts.ceilings     nil: each device's ceilings from pagedattn.ceilings (measured
--                     for opts.ceilings_seconds, default 0.5, when none are cached or
--                     with opts.refresh_ceilings; opts.ceilings_dir: where they are
--                     kept, "off" for nowhere); false: no ratios; a table: these values
--   opts.budget, warmup, repeats, max_repeats: override the sweep's
--   opts.progress     "auto" | "bar" | "lines" | "none"; opts.out: stream (stderr)
--   opts.preset, opts.set, opts.only: as in sweep.define
-- Returns a summary {total, selected, skipped, ran, ok, failed, csv, seconds}.
-- An interrupt (Ctrl-C) stops the run without recording the running point.
function M.run(def, opts)
  opts = opts or {}
  local S = def.defined and def or points.define(def, opts)
  local path = opts.csv or ("results/" .. S.name .. ".csv")
  local cfg = {
    warmup = opts.warmup or S.warmup, repeats = opts.repeats or S.repeats,
    max_repeats = opts.max_repeats or S.max_repeats, budget = opts.budget or S.budget,
  }
  local selected = points.select(S, opts)
  local done = points.done_keys(S, { path }, opts.retry_failed)
  local todo = {}
  for _, pt in ipairs(selected) do
    if not done[pt.key] then todo[#todo + 1] = pt end
  end
  local summary = { total = #S.points, selected = #selected, skipped = #selected - #todo,
                    ran = 0, ok = 0, failed = 0, csv = path, sweep = S }
  local progress = progress_m.new(opts.progress, #todo, opts.out)
  if summary.skipped > 0 then
    progress:line(string.format("%s: %d of %d points already in %s; %d to run", S.name,
      summary.skipped, #selected, path, #todo))
  end
  if #todo == 0 then
    summary.seconds = 0
    return summary
  end

  local lib = util.pa()
  local clock = lib.clock
  local ceilings = {}     -- by device name; false: none to be had
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

  local function get_ceilings(dev)
    if opts.ceilings == false then return nil end
    if type(opts.ceilings) == "table" then return opts.ceilings end
    if ceilings[dev.name] == nil then
      local c, spent = device_ceilings(dev, opts, progress, S.name, clock)
      overhead = overhead + spent
      ceilings[dev.name] = c or false
    end
    return ceilings[dev.name] or nil
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
  local f = csv.open_append(path, S.header_line)

  for n, pt in ipairs(todo) do
    local label = points.describe_point(S, pt.values)
    progress:bar(clock() - start - overhead, label)
    local t_point, overhead_before = clock(), overhead
    local dev, c, case, st
    local ok, err = pcall(function()
      dev = get_device(pt.values.device or opts.device)
      c = get_ceilings(dev)
      case, st = measure_point(S, pt, dev, c, lib, cfg)
    end)
    if not ok and interrupted(err) then
      progress:finish()
      f:close()
      progress:line(string.format("%s: interrupted; %d points recorded in %s by this run; the same command resumes",
        S.name, summary.ran, path))
      error(err, 0)
    end

    local row, msg = row_of(S, pt, dev, c, ok, case, st, err, opts, lib.version)
    if ok then summary.ok = summary.ok + 1 else summary.failed = summary.failed + 1 end
    local fields = {}
    for i, col in ipairs(S.header) do fields[i] = row[col] or "" end
    f:write(csv.csv_line(fields), "\n")
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
    summary.ran, summary.ok, summary.failed, util.fmt_duration(summary.seconds), path))
  return summary
end

return M
