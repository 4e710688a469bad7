-- pagedattn.sweep.stats: timing a point and summing up its repeats (median,
-- extremes, quartiles and their spread), also used by scripts/bench*.lua.
local M = {}

-- Linear interpolation between the order statistics of a sorted list.
local function quantile(sorted, q)
  local n = #sorted
  if n == 0 then return 0 / 0 end
  local pos = 1 + (n - 1) * q
  local lo = math.floor(pos)
  local hi = math.min(lo + 1, n)
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo)
end
M.quantile = quantile

-- {median, min, max, q1, q3, spread = (q3 - q1) / median, repeats} of a list of times.
function M.stats(times)
  local s = {}
  for i, t in ipairs(times) do s[i] = t end
  table.sort(s)
  local median = quantile(s, 0.5)
  local q1, q3 = quantile(s, 0.25), quantile(s, 0.75)
  return {
    median = median, min = s[1], max = s[#s], q1 = q1, q3 = q3, repeats = #s,
    spread = median > 0 and (q3 - q1) / median or 0,
  }
end

-- Times run(): `warmup` calls, then at least `repeats` calls and until
-- `budget` seconds have passed (at most max_repeats); sync() after each call,
-- so that queued GPU work is counted. cfg = {warmup, repeats, budget, max_repeats}.
function M.time(run, sync, cfg, clock)
  for _ = 1, cfg.warmup do run() end
  sync()
  local times = {}
  local start = clock()
  repeat
    local t0 = clock()
    run()
    sync()
    times[#times + 1] = clock() - t0
  until (#times >= cfg.repeats and clock() - start >= cfg.budget) or #times >= cfg.max_repeats
  return M.stats(times)
end

return M
