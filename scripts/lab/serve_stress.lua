-- scripts/lab/serve_stress.lua -- random serving configurations through
-- pagedattn.serve, small enough for 2 CPU cores, each checked against the
-- reference every step: page sizes 1-16, tight pools (preemption), budgets
-- and batch limits, every policy, prefix caching, cascade, fp8 caches,
-- sessions of several turns, priorities, layers 0-2, both clocks. A run
-- that raises (an engine assertion, a leaked page or sequence, a reference
-- mismatch) is printed with its configuration; exit status 1 if any did.
--   scripts/run scripts/lab/serve_stress.lua [SEED] [RUNS] [DEVICE]
local serve = require "pagedattn.serve"
local seed0, n, device = tonumber(arg[1]) or 1, tonumber(arg[2]) or 50, arg[3] or "cpu"
local rng = require("pagedattn.reference").rng(seed0)
local function pick(t) return t[rng:int(1, #t)] end
local fails = 0
for i = 1, n do
  local ps = pick({ 1, 2, 3, 4, 5, 16 })
  local o = {
    model = "tiny", device = device, seed = rng:int(1, 1e6), layers = pick({ 0, 1, 1, 2 }),
    policy = pick({ "fcfs", "sjf", "lpm", "priority" }),
    prefix_cache = rng:uniform() < 0.5, cascade = rng:uniform() < 0.4,
    page_size = ps, pages = rng:int(8, 120), budget = pick({ 8, 16, 48, 200 }), max_batch = pick({ 1, 2, 4, 12, 64 }),
    kv_dtype = pick({ false, false, "fp8_e4m3", "fp8_e5m2" }) or nil,
    clock = pick({ "steps", "model" }), check = true, share_system = rng:uniform() < 0.7,
    synthetic = { requests = rng:int(1, 40), rate = pick({ 10, 100, 1000 }), prompt = { 1, rng:int(1, 60) },
      output = { 1, rng:int(1, 30) }, system = pick({ 0, 0, 5, 18, 40 }), arrival = pick({ "poisson", "gamma" }),
      turns = rng:uniform() < 0.3 and { 1, rng:int(1, 4) } or nil, think_s = 0.05,
      priorities = rng:uniform() < 0.3 and 3 or nil },
  }
  if o.kv_dtype then o.dtype = "bf16" end
  if o.cascade then o.cascade_min_saved = pick({ 0, 0, 1, 5 }) end
  local desc = string.format("#%d page %d, %d pages, budget %d, max batch %d, layers %d, %s%s%s%s, %d requests, system %d%s",
    i, ps, o.pages, o.budget, o.max_batch, o.layers, o.policy, o.prefix_cache and ", prefix cache" or "",
    o.cascade and ", cascade" or "", o.kv_dtype and (", " .. o.kv_dtype) or "", o.synthetic.requests,
    o.synthetic.system, o.synthetic.turns and (", turns " .. table.concat(o.synthetic.turns, ":")) or "")
  local t0 = os.clock()
  local ok, res = pcall(serve.run, o)
  if not ok and tostring(res):find("cannot hold the longest request", 1, true) then
    print("refused (too few pages for a request): " .. desc)
  elseif not ok then
    fails = fails + 1
    print("FAIL " .. desc .. "\n  " .. tostring(res))
  else
    print(string.format("ok   %s: %d requests in %.2f s", desc, #res.records, os.clock() - t0))
  end
end
print(string.format("serve_stress: seed %d, %d runs, %d failed", seed0, n, fails))
os.exit(fails == 0 and 0 or 1)
