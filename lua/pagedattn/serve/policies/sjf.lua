-- pagedattn/serve/policies/sjf.lua: shortest job first. Running requests go on as
-- in fcfs; among the waiting ones, the least prefill work starts first (lower
-- mean time to first token; long prompts can wait longer). The whole policy:
local fcfs = (...).policy("fcfs")

return {
  name = "sjf",
  about = "running requests as fcfs; waiting ones shortest prefill first",
  step = function(e)
    fcfs.continue_running(e)
    table.sort(e.waiting, function(a, b)
      if a.todo ~= b.todo then return a.todo < b.todo end
      return a.id < b.id
    end)
    fcfs.admit(e)
  end,
}
