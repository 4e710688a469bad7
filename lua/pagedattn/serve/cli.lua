-- pagedattn.serve.cli: the command line of examples/serve.lua (cli.main(arg)):
-- flags -> serve.run options, a progress line, the printed report, and the
-- --requests-out / --summary-out files.
local serve = require "pagedattn.serve"
local metrics = require "pagedattn.serve.metrics"

local M = {}

-- The synthetic runs by size (small is the README's default: checked against
-- the reference every step) and the defaults of a trace replay.
M.SIZES = {
  small = { synthetic = { requests = 48, rate = 100, prompt = { 6, 40 }, output = { 4, 24 }, system = 18 },
    page_size = 4, pages = 80, model = "tiny", layers = 1, budget = 48, max_batch = 12, check = true },
  medium = { synthetic = { requests = 256, rate = 50, prompt = { 32, 512 }, output = { 16, 256 }, system = 100 },
    page_size = 16, pages = 1280, model = "tiny", heads = 8, kv_heads = 2, head_dim = 64, dtype = "bf16",
    layers = 2, budget = 512, max_batch = 64 },
  large = { synthetic = { requests = 2000, rate = 80, prompt = { 64, 2048 }, output = { 32, 512 }, system = 500 },
    page_size = 16, pages = 16384, model = "llama3-8b", layers = 1, budget = 4096, max_batch = 256 },
  trace = { page_size = 16, pages = 4096, model = "tiny", layers = 1, budget = 2048, max_batch = 64 },
}

M.HELP = [[
usage: scripts/run examples/serve.lua [options]
workload
  --trace FILE               replay a trace: Azure CSV, BurstGPT CSV or Mooncake JSONL
                             (told from the header); without it, the synthetic generator
  --trace-block N            Mooncake: tokens per hash id (default 512)
  --time-scale X             multiply inter-arrival times by X (2 = half the rate)
  --requests N               the first N requests (synthetic: how many)
  --size small|medium|large  synthetic presets (default small: checked against the reference)
  --rate R                   synthetic: requests per second
  --arrival poisson|gamma    synthetic arrivals (gamma: bursty, see --burstiness)
  --burstiness CV            gamma arrivals: coefficient of variation of the gaps (default 2)
  --turns LO:HI              synthetic sessions of LO..HI turns; a turn's prompt extends the
                             previous turn's prompt and output (a shared prefix)
  --think-s S                mean seconds between a session's turns (default 10)
  --priorities P             synthetic: priorities 0..P-1 per session (for --policy priority)
  --prompt LO:HI --output LO:HI   synthetic lengths (uniform)
  --system N                 synthetic: a system prompt of N tokens every request starts with
  --no-share                 every request prefills the system prompt itself (no fork)
  --seed N                   trace and data seed (default 1)
engine
  --policy NAME|FILE         fcfs (default), sjf, lpm, priority, or a policy file
  --prefix-cache             automatic prefix caching in the pool (hash-matched pages reused)
  --cascade                  read shared prefixes once (batch{cascade = true}); each step with
                             shared pages also times the plain call, and the report says
                             the attention (and modelled) time saved
  --cascade-min-saved N      only groups that save N page reads a step or more (default 0)
  --page-size N --pages N    the KV cache
  --budget N                 tokens per step (chunked prefill)
  --max-batch N              sequences per step
model and clock
  --model NAME|FILE          tiny (default), llama3-8b, llama3-70b, or a .lua file returning a table
  --tp N                     tensor parallel degree (heads, weights and FLOPs split N ways)
  --heads H --kv-heads HK --head-dim D --dtype f32|f16|bf16   change the model's shape
  --kv-dtype fp8_e4m3|fp8_e5m2   an fp8 KV cache (half a 16-bit cache's bytes a token)
  --k-scale X --v-scale X    the fp8 cache's scales (it holds x / scale; default 1)
  --layers L                 attention layers run per step (default 1; time x the model's
                             layers); 0: bookkeeping only, attention time estimated
  --attention-heads N        run attention with N query heads (the model's grouping) and
                             scale its time to the model's heads (a smaller compute shape)
  --clock model|steps        model: seconds from measured attention and a cost model
                             (default with --trace); steps: every step lasts --step-ms
  --step-ms MS               the steps clock's step (default 10)
  --device NAME              cpu, cuda, cuda:N (default: pa.device())
outputs
  --requests-out FILE.csv    one row per request (id, arrival_s, ..., ttft_ms, tpot_ms, ...)
  --summary-out FILE.json    percentiles, throughput, goodput, prefix-cache hit rate
  --slo-ttft-ms MS --slo-tpot-ms MS   goodput: requests meeting these
  --check / --no-check       compare attention with pagedattn.reference every step
  --progress N               a progress line every N steps (default: a bar on a terminal,
                             else every 200 steps; 0 = none)
]]

local function usage(msg) error("serve: " .. msg .. " (see --help)", 0) end

function M.parse_args(argv)
  local o = { seed = 1 }
  local set, syn = {}, {}
  local i = 1
  local function value(name)
    local v = argv[i + 1]
    if v == nil then usage(name .. " needs a value") end
    i = i + 1
    return v
  end
  local function num(name)
    local s = value(name)
    local v = tonumber(s)
    if not v then usage(name .. " needs a number, got '" .. s .. "'") end
    return v
  end
  local function range(name)
    local lo, hi = value(name):match("^(%d+):(%d+)$")
    if not lo or tonumber(lo) > tonumber(hi) or tonumber(lo) < 1 then usage(name .. " expects LO:HI with 1 <= LO <= HI") end
    return { tonumber(lo), tonumber(hi) }
  end
  -- flag -> where its value goes: o (the command line's own), set (a
  -- serve.run option over the preset) or syn (the generator's)
  local flags = {
    ["--size"] = { o, "size", value }, ["--policy"] = { set, "policy", value }, ["--seed"] = { o, "seed", num },
    ["--device"] = { set, "device", value }, ["--progress"] = { o, "progress", num },
    ["--trace"] = { set, "trace", value }, ["--trace-block"] = { set, "trace_block", num },
    ["--time-scale"] = { set, "time_scale", num }, ["--requests"] = { o, "requests", num },
    ["--rate"] = { syn, "rate", num }, ["--arrival"] = { syn, "arrival", value },
    ["--burstiness"] = { syn, "burstiness", num }, ["--turns"] = { syn, "turns", range },
    ["--think-s"] = { syn, "think_s", num }, ["--priorities"] = { syn, "priorities", num },
    ["--prompt"] = { syn, "prompt", range }, ["--output"] = { syn, "output", range },
    ["--system"] = { syn, "system", num },
    ["--page-size"] = { set, "page_size", num }, ["--pages"] = { set, "pages", num },
    ["--budget"] = { set, "budget", num }, ["--max-batch"] = { set, "max_batch", num },
    ["--model"] = { set, "model", value }, ["--tp"] = { set, "tp", num },
    ["--heads"] = { set, "heads", num }, ["--kv-heads"] = { set, "kv_heads", num },
    ["--head-dim"] = { set, "head_dim", num }, ["--dtype"] = { set, "dtype", value },
    ["--kv-dtype"] = { set, "kv_dtype", value },
    ["--k-scale"] = { set, "k_scale", num }, ["--v-scale"] = { set, "v_scale", num },
    ["--layers"] = { set, "layers", num }, ["--attention-heads"] = { set, "attention_heads", num },
    ["--clock"] = { set, "clock", value }, ["--step-ms"] = { set, "step_ms", num },
    ["--requests-out"] = { o, "requests_out", value }, ["--summary-out"] = { o, "summary_out", value },
    ["--slo-ttft-ms"] = { set, "slo_ttft_ms", num }, ["--slo-tpot-ms"] = { set, "slo_tpot_ms", num },
    ["--cascade-min-saved"] = { set, "cascade_min_saved", num },
  }
  local switches = {
    ["--no-share"] = { set, "share_system", false }, ["--check"] = { set, "check", true },
    ["--no-check"] = { set, "check", false }, ["--prefix-cache"] = { set, "prefix_cache", true },
    ["--cascade"] = { set, "cascade", true },
  }
  while i <= #argv do
    local a = argv[i]
    local flag, inline = a:match("^(%-%-[%w-]+)=(.*)$")
    if flag then
      a = flag
      table.insert(argv, i + 1, inline)
    end
    local f, sw = flags[a], switches[a]
    if a == "--help" or a == "-h" then o.help = true
    elseif f then f[1][f[2]] = f[3](a)
    elseif sw then sw[1][sw[2]] = sw[3]
    else usage("unknown option " .. a) end
    i = i + 1
  end
  if o.help then return o end
  -- the output files must be writable before minutes of replay, not after
  for _, k in ipairs({ "requests_out", "summary_out" }) do
    local path = o[k]
    if path then
      local existed = io.open(path, "rb")
      if existed then existed:close() end
      local f, err = io.open(path, "ab")
      if not f then usage("--" .. k:gsub("_", "-") .. ": cannot write " .. tostring(err)) end
      f:close()
      if not existed then os.remove(path) end
    end
  end
  if o.summary_out and not pcall(require, "dkjson") then
    usage("--summary-out needs the JSON library dkjson (Debian: apt-get install lua-dkjson; scripts/setup does)")
  end
  local size = o.size or (set.trace and "trace" or "small")
  local preset = M.SIZES[size]
  if not preset then usage("--size must be small, medium or large") end
  if set.trace and next(syn) then
    local k = next(syn)
    usage("--" .. k:gsub("_", "-") .. " is for the synthetic generator, not with --trace")
  end
  -- the preset, then the flags
  local run = {}
  for k, v in pairs(preset) do run[k] = v end
  local s = {}
  for k, v in pairs(preset.synthetic or {}) do s[k] = v end
  for k, v in pairs(syn) do s[k] = v end
  for k, v in pairs(set) do run[k] = v end
  if not set.trace then
    s.seed = o.seed
    if o.requests then s.requests = o.requests end
    run.synthetic = s
  else
    run.synthetic = nil
    run.requests = o.requests
    if set.check == nil then run.check = nil end
  end
  run.seed = o.seed
  -- the model, with the shape flags applied to a copy
  local model = serve.clock.model(run.model or "tiny")
  local changed = {}
  for _, k in ipairs({ "heads", "kv_heads", "head_dim", "dtype", "kv_dtype", "tp" }) do
    if run[k] ~= nil then
      if model[k] ~= run[k] then changed[#changed + 1] = k .. "=" .. tostring(run[k]) end
      model[k] = run[k]
      run[k] = nil
    end
  end
  if #changed > 0 then model.name = model.name .. " (" .. table.concat(changed, " ") .. ")" end
  run.model = serve.clock.model(model)
  o.run = run
  o.size_name = size
  return o
end

local function isatty()
  local ffi = require "ffi"
  pcall(ffi.cdef, "int isatty(int fd);")
  local ok, r = pcall(function() return ffi.C.isatty(1) end)
  return ok and r == 1
end

local function ms(v) return v and string.format("%.1f", v) or "-" end

local function print_report(res, o)
  local r, s = res.report, res.summary
  local run = s.run
  local steps_clock = run.clock == "steps"
  local function t(v) -- a time in ms, and in steps on the steps clock
    if v == nil then return "-" end
    if steps_clock then return string.format("%.1f ms (%.1f steps)", v, v / run.step_ms) end
    return string.format("%.1f ms", v)
  end
  print(string.format("serve: done: %d requests in %d steps; %.2f s of %s busy time (%.1f steps/s), " ..
    "%.2f s wall (%.1f steps/s; %.2f s in attention, %.2f s of it making kernels ready: not timed)",
    s.requests, run.steps, run.modelled_s, steps_clock and "steps-clock" or "modelled",
    run.steps / math.max(run.modelled_s, 1e-12), run.wall_s, run.steps / math.max(run.wall_s, 1e-12), r.attn_wall_s,
    run.kernel_setup_s))
  local tp = s.throughput
  print(string.format("  throughput   %.2f requests/s, %.0f output tokens/s (%d prefill tokens, of which %d recomputed; %d decode)",
    tp.requests_per_s or 0, tp.output_tokens_per_s or 0, run.prefill_tokens, run.recomputed_tokens, run.decode_tokens))
  for _, m in ipairs({ { "TTFT", s.ttft_ms }, { "TPOT", s.tpot_ms }, { "end to end", s.e2e_ms }, { "queue", s.queue_ms } }) do
    local d = m[2]
    if d then
      print(string.format("  %-12s p50 %s, p90 %s, p99 %s (mean %s)", m[1], t(d.p50), t(d.p90), t(d.p99), t(d.mean)))
    end
  end
  local g = s.goodput
  if g.slo_ttft_ms or g.slo_tpot_ms then
    print(string.format("  goodput      %.2f requests/s (%d of %d, %.0f%%) met TTFT <= %s ms and TPOT <= %s ms",
      g.requests_per_s or 0, g.requests, s.requests, 100 * (g.fraction or 0), ms(g.slo_ttft_ms), ms(g.slo_tpot_ms)))
  end
  print(string.format("  engine       host time %.1f us a step (median %.1f; policy, staging, prefix lookups, metrics), " ..
    "%.2f%% of the modelled step", run.host_us_per_step, run.host_us_per_step_p50, 100 * run.host_share))
  print(string.format("  pages        utilization mean %.1f%% (peak %d of %d), fragmentation %.1f%% of used slots empty",
    100 * r.util, r.peak, run.pages, 100 * r.frag))
  print(string.format("  preemptions  %d (%d tokens recomputed)", r.preemptions, r.recomputed))
  local pc = s.prefix_cache
  if run.prefix_cache then
    print(string.format("  prefix cache hit rate %.1f%% of looked-up pages (%d hits, %d misses, %d evictions); " ..
      "%d prompt tokens (%.1f%%) taken from the cache", 100 * pc.hit_rate, pc.hits, pc.misses, pc.evictions,
      pc.cached_tokens, 100 * pc.cached_token_fraction))
  elseif r.system > 0 then
    if r.share then
      print(string.format("  prefix       system prompt %d tokens shared by fork: %.1f pages saved per step (peak %d), %d copy-on-write copies",
        r.system, r.saved, r.saved_peak, r.cow))
    else
      print(string.format("  prefix       system prompt %d tokens prefilled by every request (no sharing)", r.system))
    end
  end
  local cs = s.cascade
  if cs then
    local line = string.format("  cascade      shared level on %d of %d steps (%.1f groups), %.1f%% of page reads saved",
      cs.steps_shared, cs.steps, cs.groups_per_shared_step, 100 * cs.page_reads_saved_fraction)
    if cs.attention_ms_per_step then
      line = line .. string.format("; attention %.3f ms a step against %.3f ms plain (%.1f%% saved, the plain call " ..
        "timed on the same steps)", cs.attention_ms_per_step, cs.plain_attention_ms_per_step,
        100 * cs.attention_saved_fraction)
    end
    if cs.modelled_s_saved then
      line = line .. string.format("; modelled time %.2f s less (%.1f%% of the run)", cs.modelled_s_saved,
        100 * cs.modelled_s_saved / math.max(run.modelled_s + cs.modelled_s_saved, 1e-12))
    end
    print(line)
  end
  if r.check then
    local c = r.check
    print(string.format("  check        %d steps against pagedattn.reference: %s (worst |err| %.3g, %.0f%% of its tolerance)",
      c.steps, c.failed and "MISMATCH" or "all match", c.worst, 100 * c.ratio))
    if c.failed and c.failed.step >= 0 then
      print(string.format("  CHECK FAILED first at step %d: max |err| %.3g > tolerance %.3g", c.failed.step, c.failed.err, c.failed.tol))
    end
  end
end

function M.main(argv)
  local args = {}
  for i = 1, #(argv or {}) do args[i] = argv[i] end
  local ok, res = pcall(function()
    local o = M.parse_args(args)
    if o.help then io.write(M.HELP) return 0 end
    local run = o.run
    local model = run.model
    -- the header: what runs
    local tty = isatty()
    local every = o.progress or (tty and -1 or 200)
    local last_bar = 0
    local clock = require("pagedattn").clock
    if every ~= 0 then
      run.progress = function(e, finished, total)
        if every > 0 then
          if e.step % every == 0 then
            print(string.format("  step %6d  t %8.2f s  done %5d/%d  running %4d  waiting %4d", e.step, e.now,
              finished, total, #e.running, #e.waiting))
          end
        elseif clock() - last_bar > 0.1 or finished == total then
          last_bar = clock()
          local width, frac = 30, finished / total
          io.write("\r[", string.rep("#", math.floor(frac * width)), string.rep(".", width - math.floor(frac * width)),
            string.format("] step %6d  t %8.2f s  done %5d/%d  running %4d  waiting %4d", e.step, e.now, finished,
            total, #e.running, #e.waiting), finished == total and "\n" or "")
          io.flush()
        end
      end
    end
    local policy = serve.policy(run.policy or "fcfs")
    run.policy = policy
    local pa = require "pagedattn"
    local dev, derr = pa.device(run.device)
    if not dev then error("serve: --device: " .. tostring(derr), 0) end
    run.device = dev
    local src = run.trace and ("trace " .. run.trace) or string.format("synthetic (%s, seed %d)", o.size_name, o.seed)
    print(string.format("serve: %s, policy %s%s", src, policy.name, policy.about and (": " .. policy.about) or ""))
    local Hq = model.heads / model.tp
    local Hq_run = run.attention_heads or Hq
    local Hk_run = math.max(1, math.floor(Hq_run * math.max(1, math.floor(model.kv_heads / model.tp)) / Hq))
    local clock_kind = run.clock or (run.trace and "model" or "steps")
    print(string.format("  %s; model %s (%d layers, H=%d Hk=%d D=%d, %s%s, tp %d); attention %s",
      dev.description, model.name, model.layers, model.heads, model.kv_heads, model.head_dim, model.dtype,
      model.kv_dtype ~= model.dtype and (", KV cache " .. model.kv_dtype) or "", model.tp,
      run.layers == 0 and "not run (--layers 0: bookkeeping only, its time estimated)" or
      string.format("run on %d layer(s) with H=%d Hk=%d%s", run.layers, Hq_run, Hk_run,
        Hq_run ~= Hq and string.format(", time x %g for the model's heads", Hq / Hq_run) or "")))
    print(string.format("  %d pages of %d tokens; budget %d tokens, batch <= %d; clock %s%s%s",
      run.pages, run.page_size, run.budget, run.max_batch, clock_kind,
      clock_kind == "steps" and string.format(" (%g ms a step)", run.step_ms or 10) or "",
      (run.prefix_cache and "; prefix cache on" or "") .. (run.cascade and "; cascade on" or "")))
    local res = serve.run(run)
    local r, s = res.report, res.summary
    local info = r.info
    print(string.format("  trace: %s, %d requests over %.2f s%s", info.format, s.requests, info.duration or 0,
      info.skipped > 0 and string.format(" (%d rows with 0 output tokens skipped)", info.skipped) or ""))
    print_report(res, o)
    if o.requests_out then
      metrics.write_requests_csv(o.requests_out, res.records)
      print("  requests     " .. o.requests_out)
    end
    if o.summary_out then
      metrics.write_summary_json(o.summary_out, s)
      print("  summary      " .. o.summary_out)
    end
    return (r.check and r.check.failed) and 1 or 0
  end)
  if not ok then
    io.stderr:write(tostring(res), "\n")
    return 2
  end
  return res
end

return M
