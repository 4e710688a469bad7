-- pagedattn/serve/policies/priority.lua: strict priority (the trace's or the
-- generator's `priority` field; lower values first, none = 0; ties by
-- arrival), as vLLM's priority scheduling. Running requests continue most
-- important first, and when pages run out the least important one is
-- preempted. A waiting request that does not fit preempts running requests
-- less important than itself until it fits (or none is left).
local fcfs = (...).policy("fcfs")

local function prio(r) return r.priority or 0 end

-- a runs before b
local function before(a, b)
  local pa, pb = prio(a), prio(b)
  if pa ~= pb then return pa < pb end
  if a.arrival ~= b.arrival then return a.arrival < b.arrival end
  return a.id < b.id
end

return {
  name = "priority",
  about = "lower priority value first; preempts less important running requests for more important ones",
  step = function(e)
    table.sort(e.running, before) -- fcfs preempts from the end: the least important
    fcfs.continue_running(e)
    table.sort(e.waiting, before)
    while #e.waiting > 0 and e:tokens_left() > 0 do
      local r = e.waiting[1]
      local ok, why = e:schedule(r, math.min(r.todo, e:tokens_left()))
      if not ok then
        local victim = e.running[#e.running]
        if (why ~= "pages" and why ~= "batch") or not victim or not before(r, victim) then return end
        e:preempt(victim) -- it waits again, behind r
        table.sort(e.waiting, before)
      end
    end
  end,
}
