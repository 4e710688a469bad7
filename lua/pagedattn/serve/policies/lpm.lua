-- pagedattn/serve/policies/lpm.lua: longest prefix match first (SGLang's
-- cache-aware `lpm`). Running requests go on as in fcfs; among the waiting
-- ones, those whose prompt the prefix cache holds most of start first, so a
-- shared prefix is used while it is cached instead of being evicted and
-- computed again. Ties (and runs without --prefix-cache, where nothing is
-- cached) keep arrival order. Like SGLang, a queue longer than 128 requests
-- is served first come first served: the lookups would cost more than the
-- order gains.
local fcfs = (...).policy("fcfs")

local MAX_SORTED = 128
local cached = setmetatable({}, { __mode = "k" }) -- request -> tokens cached, this step

local function before(a, b)
  local ca, cb = cached[a], cached[b]
  if ca ~= cb then return ca > cb end
  if a.arrival ~= b.arrival then return a.arrival < b.arrival end
  return a.id < b.id
end

return {
  name = "lpm",
  about = "running requests as fcfs; waiting ones with the longest cached prefix first",
  step = function(e)
    fcfs.continue_running(e)
    local w = e.waiting
    if #w > 1 and #w <= MAX_SORTED then
      for i = 1, #w do cached[w[i]] = e:cached_tokens(w[i]) end
      table.sort(w, before)
    end
    fcfs.admit(e)
  end,
}
