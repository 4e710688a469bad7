-- pagedattn/serve/policies/fcfs.lua: first come, first served, with chunked
-- prefill under the step's token budget and preemption by recompute.
--
-- Every step: the running requests, oldest first, each get their next tokens
-- (1 when decoding, else a prefill chunk as large as the budget allows); when
-- the pool cannot hold them, the youngest running request is preempted (its
-- pages freed; it waits at the front and recomputes later), as vLLM does.
-- Then waiting requests start, in order, while budget and pages last; the
-- first one that does not fit stops admission (no overtaking).
--
-- A policy file returns { name, about, step(engine) }; README.md ("The policy
-- API") documents what the engine offers. sjf, lpm and priority reuse these parts.
local P = {
  name = "fcfs",
  about = "first come first served, chunked prefill under the token budget, preempt the youngest (recompute)",
}

-- Next tokens of every running request, oldest first.
function P.continue_running(e)
  local i = 1
  while i <= #e.running and e:tokens_left() > 0 do
    local r = e.running[i]
    local n = math.min(r.todo > 0 and r.todo or 1, e:tokens_left())
    local ok, why = e:schedule(r, n)
    while not ok and why == "pages" do
      local victim = e.running[#e.running]
      e:preempt(victim)
      if victim == r then break end
      ok, why = e:schedule(r, n)
    end
    if not ok and why == "batch" then return end
    if ok or why ~= "pages" then i = i + 1 end -- (preempted itself: the list got shorter)
  end
end

-- Start waiting requests, in their order, while they fit.
function P.admit(e)
  while #e.waiting > 0 and e:tokens_left() > 0 do
    local r = e.waiting[1]
    if not e:schedule(r, math.min(r.todo, e:tokens_left())) then return end
  end
end

function P.step(e)
  P.continue_running(e)
  P.admit(e)
end

return P
