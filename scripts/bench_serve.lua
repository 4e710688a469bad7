-- scripts/bench_serve.lua: the serving engine's own host time per step
-- (policy, batch staging, prefix-cache lookups and inserts, metrics; not the
-- attention) with 256 requests decoding, and whether that per-step path
-- compiles to LuaJIT traces (no NYI, no trace abort).
--   scripts/run scripts/bench_serve.lua [--requests 256] [--policy fcfs] [--prefix-cache]
--                                       [--steps 1500] [--device cpu]
-- The engine runs bookkeeping only (layers 0) on the steps clock, so the
-- figures are the host's alone: 256 requests arrive at once with 1024-token
-- prompts and 2000-token outputs; the steps after the prefills, when all
-- 256 decode, are timed (median over steps, and over blocks of 100 steps).
-- The target (issue 47) is at most 50 us per step, judged on the median
-- step (robust to the preemption by other processes that a shared machine's
-- blocks of steps include). A benchmark, not a test: it prints figures and
-- never fails.
local serve = require "pagedattn.serve"

local args = { requests = 256, policy = "fcfs", steps = 1500, device = "cpu", ["prefix-cache"] = false }
local i = 1
while i <= #arg do
  local k = arg[i]:match("^%-%-(.+)$")
  if k == "prefix-cache" then
    args[k] = true
    i = i + 1
  elseif k and args[k] ~= nil then
    args[k] = tonumber(arg[i + 1]) or arg[i + 1]
    i = i + 2
  else
    io.stderr:write("usage: bench_serve.lua [--requests N] [--policy NAME] [--prefix-cache] [--steps N] [--device NAME]\n")
    os.exit(2)
  end
end

local N, prompt, output = args.requests, 1024, 2000
local reqs = {}
for r = 1, N do reqs[r] = { arrival = 0, prompt_tokens = prompt, output_tokens = output } end
local run = { trace = reqs, policy = args.policy, device = args.device, layers = 0, clock = "steps",
  page_size = 16, pages = N * math.ceil((prompt + output) / 16) + 16, budget = 8192, max_batch = N,
  prefix_cache = args["prefix-cache"] }

-- the per-step path must compile: watch the traces of the engine's files
local watched = { ["engine.lua"] = true, ["serve.lua"] = true, ["fcfs.lua"] = true, ["sjf.lua"] = true,
  ["lpm.lua"] = true, ["priority.lua"] = true, ["batch.lua"] = true, ["cache.lua"] = true }
local problems, traced, leaves = {}, 0, 0
local jutil = require "jit.util"
local has_vmdef, vmdef = pcall(require, "jit.vmdef")
if not has_vmdef then vmdef = { traceerr = {} } end
local starts = {}
local function where(func, pc)
  local info = jutil.funcinfo(func, pc)
  local src = info.source or "?"
  return src:match("([^/]+)$") or src, info.currentline or info.linedefined or 0
end
local function on_trace(what, tr, func, pc, otr, oex)
  if what == "start" then
    starts[tr] = { where(func, pc) }
  elseif what == "stop" then
    local s = starts[tr]
    if s and watched[s[1]] then
      traced = traced + 1
      if jutil.traceinfo(tr).linktype == "stitch" then
        problems[#problems + 1] = string.format("trace %d at %s:%d stitches (an NYI builtin)", tr, s[1], s[2])
      end
    end
  elseif what == "abort" then
    local file, line = where(func, pc)
    local msg = vmdef.traceerr[otr] or ("trace error " .. tostring(otr))
    if type(oex) == "number" or type(oex) == "string" then msg = string.format(msg, oex) end
    if watched[file] then
      -- a recording that began at a loop's last iteration leaves the loop
      -- before closing it: LuaJIT records that loop again from another
      -- iteration, so this says where recording started, not that code fails
      if msg:find("leaving loop in root trace", 1, true) then leaves = leaves + 1
      else problems[#problems + 1] = string.format("trace %d aborted at %s:%d: %s", tr, file, line, msg) end
    end
  end
end

-- steady state: the JIT starts afresh once every request decodes, and its
-- traces are watched for a few hundred steps
local steady = math.ceil(N * prompt / run.budget) + 100
run.progress = function(e)
  if e.step == steady then
    jit.flush()
    jit.attach(on_trace, "trace")
  elseif e.step == steady + 400 then
    jit.attach(on_trace)
  end
end
local res = serve.run(run)
jit.attach(on_trace)

local st = res.report.step_host
local decode = {}
local from, to = steady + 401, math.min(#st - 10, steady + 400 + args.steps)
for s = from, to do decode[#decode + 1] = st[s] * 1e6 end
local q = serve.metrics.quantile
local blocks = {}
for b = 0, math.floor(#decode / 100) - 1 do
  local sum = 0
  for j = 1, 100 do sum = sum + decode[b * 100 + j] end
  blocks[#blocks + 1] = sum / 100
end
print(string.format("bench_serve: %d requests decoding (prompts %d, outputs %d), policy %s%s, bookkeeping only, %s",
  N, prompt, output, args.policy, args["prefix-cache"] and ", prefix cache on" or "", res.report.device.description))
print(string.format("  host time per step, steps %d..%d (%d steps): median %.1f us, p90 %.1f, p99 %.1f; " ..
  "blocks of 100 steps: median %.1f us", from, to, #decode, q(decode, 0.5), q(decode, 0.9), q(decode, 0.99),
  q(blocks, 0.5) or 0))
print(string.format("  whole run: %d steps, %.1f us a step on average (prefill steps included)", res.summary.run.steps,
  res.summary.run.host_us_per_step))
print(string.format("  LuaJIT %s, steps %d..%d recorded afresh: %d traces in the engine's files, %s", jit.version,
  steady, steady + 400, traced,
  (#problems == 0 and "no NYI, no trace abort" or (#problems .. " problems:\n    " .. table.concat(problems, "\n    "))) ..
  (leaves > 0 and string.format(" (%d recording(s) started at a loop's last iteration, recorded again)", leaves) or "")))
print(string.format("  target: <= 50 us per step of 256 decoding requests: %.1f us (median step), %s", q(decode, 0.5),
  q(decode, 0.5) <= 50 and "met" or "NOT met"))
