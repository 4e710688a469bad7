-- examples/serve_study.lua -- a policy x load study in one command: every
-- scheduling policy (fcfs, sjf, lpm, priority) at a range of arrival rates,
-- each point a serving replay (pagedattn.serve) with the prefix cache on, run
-- through the sweep runner (one CSV row per point, resumed when rerun,
-- --shard / --emit-jobs to spread it); then p99 TTFT and goodput against the
-- arrival rate, one line per policy, drawn with gnuplot (scripts/plot).
--
--   scripts/run examples/serve_study.lua                    # ~2 minutes on 2 idle CPU cores
--   scripts/run examples/serve_study.lua --preset estimate  # attention from the cost model: seconds
--   scripts/run examples/serve_study.lua --device cuda      # llama3-8b on the GPU (preset gpu)
--   scripts/run examples/serve_study.lua --set rate=5,10,20 --only policy=fcfs,lpm
--
-- The workload: bursty (gamma) session starts at `rate` per second, 1-3
-- turns a session (a turn's prompt extends the previous turn's prompt and
-- output: shared prefixes), a 200-token system prompt, two priorities;
-- fewer pages than the load wants, so preemption and eviction matter.
-- Writes results/serve_study.csv, results/serve_study-ttft_p99_ms.png and
-- results/serve_study-goodput_rps.png (--svg: SVG). Every option of
-- scripts/sweep.lua works here.
local sweep = require "pagedattn.sweep"
local serve = require "pagedattn.serve"

local POLICIES = { "fcfs", "sjf", "lpm", "priority" }

local function workload(p, o)
  return {
    device = o.device, policy = p.policy, model = o.model, layers = o.layers, clock = "model",
    prefix_cache = true, pages = o.pages, page_size = 16, budget = o.budget, max_batch = o.max_batch,
    seed = p.seed or 1, slo_ttft_ms = o.slo_ttft_ms, slo_tpot_ms = o.slo_tpot_ms,
    synthetic = { requests = o.requests, rate = p.rate, arrival = "gamma", burstiness = 2, prompt = o.prompt,
                  output = o.output, system = 200, turns = { 1, 3 }, think_s = o.think_s, priorities = 2 },
  }
end

local PRESETS = {
  -- the tiny model on this machine, real attention on one layer
  small = { model = "tiny", layers = 1, requests = 200, pages = 768, budget = 1024, max_batch = 64,
    prompt = { 32, 384 }, output = { 16, 128 }, think_s = 0.05, slo_ttft_ms = 500, slo_tpot_ms = 25,
    rates = { 5, 10, 15, 20, 30, 40 } },
  -- the same with attention estimated from the ceilings (layers 0): seconds
  estimate = { model = "tiny", layers = 0, requests = 300, pages = 1024, budget = 1024, max_batch = 64,
    prompt = { 32, 512 }, output = { 16, 256 }, think_s = 0.05, slo_ttft_ms = 200, slo_tpot_ms = 5,
    rates = { 10, 20, 30, 40, 50, 60, 70 } },
  -- llama3-8b on a GPU: the TTFT / TPOT SLOs that serving papers use for it
  gpu = { model = "llama3-8b", layers = 1, requests = 1000, pages = 16384, budget = 4096, max_batch = 256,
    prompt = { 64, 2048 }, output = { 32, 512 }, think_s = 5, slo_ttft_ms = 500, slo_tpot_ms = 50,
    rates = { 2, 4, 6, 8, 10, 12, 14, 16 } },
}

local function preset_points(name)
  return sweep.product({ policy = POLICIES, rate = PRESETS[name].rates }, { "policy", "rate" })
end

local COLUMNS = { "ttft_p50_ms", "ttft_p99_ms", "tpot_p99_ms", "e2e_p99_ms", "throughput_rps", "goodput_rps",
  "goodput_fraction", "hit_rate", "preemptions", "modelled_s", "host_us_per_step" }

local def = {
  name = "serve_study",
  columns = COLUMNS,
  warmup = 0, repeats = 1, max_repeats = 1,
  presets = {
    small = { points = preset_points("small") },
    estimate = { points = preset_points("estimate") },
    gpu = { points = preset_points("gpu") },
  },
  default_preset = function(dev) return dev.kind == "cuda" and "gpu" or "small" end,
  -- a point is one replay: its wall time is the row's time, its results the columns
  measure = function(p, env)
    local o = PRESETS[env.sweep.preset or "small"]
    local opts = {}
    for k, v in pairs(o) do opts[k] = v end
    opts.device = env.device
    local t0 = env.pa.clock()
    local res = serve.run(workload(p, opts))
    local s = res.summary
    return {
      seconds = env.pa.clock() - t0,
      metrics = {
        ttft_p50_ms = s.ttft_ms.p50, ttft_p99_ms = s.ttft_ms.p99, tpot_p99_ms = s.tpot_ms and s.tpot_ms.p99,
        e2e_p99_ms = s.e2e_ms.p99, throughput_rps = s.throughput.requests_per_s,
        goodput_rps = s.goodput.requests_per_s, goodput_fraction = s.goodput.fraction,
        hit_rate = s.prefix_cache.hit_rate, preemptions = s.preemptions, modelled_s = s.run.modelled_s,
        host_us_per_step = s.run.host_us_per_step,
      },
    }
  end,
}

if sweep.loading then return def end

local argv, svg = {}, false
for _, a in ipairs(arg) do
  if a == "--svg" then svg = true else argv[#argv + 1] = a end
end
local r = sweep.main(argv, def, arg[0])
if not r.ran then os.exit(r.code) end
if r.summary.selected < r.summary.total then
  io.stderr:write("(no charts for a subset; run again without --shard/--point to draw them)\n")
  os.exit(r.code)
end

local function quote(x) return "'" .. tostring(x):gsub("'", "'\\''") .. "'" end

-- the charts, through scripts/plot (gnuplot)
local here = (arg[0]:match("^(.*)/[^/]*$") or ".")
local plot = here .. "/../scripts/plot"
local base = r.csv:gsub("%.csv$", "")
local preset = r.summary.sweep.preset
local o = PRESETS[preset]
local charts = {
  { y = "ttft_p99_ms", ylabel = "p99 TTFT (ms)",
    title = string.format("p99 time to first token against load (%s, %s)", o.model, preset) },
  { y = "goodput_rps", ylabel = "goodput (requests/s)",
    title = string.format("goodput (TTFT <= %g ms, TPOT <= %g ms) against load (%s, %s)",
      o.slo_ttft_ms, o.slo_tpot_ms, o.model, preset) },
}
for _, c in ipairs(charts) do
  local out = base .. "-" .. c.y .. (svg and ".svg" or ".png")
  local cmd = string.format("luajit %s %s -x rate -y %s --by policy --title %s --xlabel %s --ylabel %s -o %s",
    quote(plot), quote(r.csv), c.y, quote(c.title),
    quote("session starts per second"), quote(c.ylabel), quote(out))
  local ok = os.execute(cmd)
  if ok ~= 0 and ok ~= true then io.stderr:write("no chart: " .. cmd .. " failed\n") end
end

-- the knee: per policy, the highest rate whose goodput keeps 90% of requests
local rows = sweep.read_csv(r.csv)
local best = {}
for _, row in ipairs(rows) do
  if row.sweep == "serve_study" and row.status == "ok" and tonumber(row.goodput_fraction or "") then
    local rate = tonumber(row.rate)
    if tonumber(row.goodput_fraction) >= 0.9 and rate > (best[row.policy] or 0) then best[row.policy] = rate end
  end
end
for _, pol in ipairs(POLICIES) do
  print(string.format("%-9s highest rate with >= 90%% of requests within the SLOs: %s", pol,
    best[pol] and tostring(best[pol]) or "none"))
end
os.exit(r.code)
