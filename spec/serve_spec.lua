-- spec/serve_spec.lua -- pagedattn.serve: the clock (a step's modelled time
-- from known ceilings), the metrics (on a schedule computed by hand), runs
-- (bookkeeping only, checked against the reference, with the prefix cache,
-- every policy), policy errors at the policy's line, and the command line's
-- output files.
local H = require "helpers"
local serve = require "pagedattn.serve"
local clock = serve.clock
local metrics = serve.metrics

local SPEC = "spec/serve_spec.lua"

local function near(want, got, rel, what)
  assert(math.abs(got - want) <= rel * math.abs(want),
    string.format("%s: got %.10g, expected %.10g", what or "value", got, want))
end

describe("serve clock", function()
  local m = clock.model{ name = "t", layers = 2, heads = 4, kv_heads = 2, head_dim = 8, hidden = 16, mlp = 32,
    vocab = 100, dtype = "f32", overhead_ms = 1 }
  local rates = clock.rates({ fma_gflops = 1, read_gbps = 0.1, matmul_gflops = 50 }, "cpu")

  it("takes the CPU's FMA rate and the GPU's matmul rate", function()
    assert.are.equal(1e9, rates.flops)
    assert.are.equal(1e8, rates.bytes)
    assert.are.equal(50e9, clock.rates({ fma_gflops = 1, read_gbps = 0.1, matmul_gflops = 50 }, "cuda").flops)
    assert.matches("compute ceiling was not measured", H.error_of(clock.rates, { read_gbps = 1 }, "cuda"))
  end)

  it("counts Llama 3 8B's and 70B's parameters", function()
    near(8.03e9, clock.params(clock.model("llama3-8b")), 0.005, "llama3-8b")
    near(70.55e9, clock.params(clock.model("llama3-70b")), 0.005, "llama3-70b")
  end)

  it("times a step: attention x layers + max(FLOPs / rate, bytes / rate) + overhead", function()
    -- a layer: q and o 2 x 16 x 32, k and v 2 x 16 x 16, the MLP 3 x 16 x 32 = 3072 weights;
    -- 10 tokens, 2 logits: 2 x 10 x 3072 x 2 + 2 x 2 x 16 x 100 = 129280 FLOPs (1.2928e-4 s);
    -- weights read (2 x 3072 + 16 x 100) x 4 bytes = 30976 bytes (3.0976e-4 s): memory-bound
    near(3.0976e-4, clock.dense_seconds(m, rates, 10, 2), 1e-12, "dense")
    -- 1 ms of attention a layer x 2 layers + 0.31 ms + 1 ms
    near(3.30976e-3, clock.step_seconds(m, rates, 1e-3, 10, 2, 0, {}, {}), 1e-12, "step")
    -- 10000 tokens: 2 x 10000 x 3072 x 2 + 6400 = 1.228864e8 FLOPs: compute-bound
    near(0.1228864, clock.dense_seconds(m, rates, 10000, 2), 1e-9, "dense, compute-bound")
  end)

  it("estimates attention without a measurement: max(FLOPs, KV bytes)", function()
    -- 3 new queries on 5 keys: 3 x 2 + 1 + 2 + 3 = 12 (query, key) pairs x 4 x 4 heads x 8 = 1536 FLOPs;
    -- 5 keys x 2 (k, v) x 2 heads x 8 x 4 bytes = 640 bytes: 6.4e-6 s
    near(6.4e-6, clock.attention_estimate(m, rates, 1, { 3 }, { 5 }), 1e-12, "estimate")
    local tp2 = clock.model{ layers = 1, heads = 4, kv_heads = 2, head_dim = 8, hidden = 16, mlp = 32, vocab = 100,
      dtype = "f32", tp = 2 }
    near(3.2e-6, clock.attention_estimate(tp2, rates, 1, { 3 }, { 5 }), 1e-12, "tp 2")
  end)

  it("names a bad model field", function()
    assert.matches("heads %(6%) must be a multiple of kv_heads %(4%)",
      H.error_of(clock.model, { layers = 1, heads = 6, kv_heads = 4, head_dim = 8, hidden = 8, mlp = 8, vocab = 8 }))
    assert.matches("mlp: expected a whole number", H.error_of(clock.model,
      { layers = 1, heads = 4, kv_heads = 4, head_dim = 8, hidden = 8, vocab = 8 }))
    assert.matches("no preset 'llama9'", H.error_of(clock.model, "llama9"))
  end)
end)

describe("serve metrics", function()
  it("percentiles interpolate between order statistics", function()
    assert.are.equal(2.5, metrics.quantile({ 4, 1, 3, 2 }, 0.5))
    near(3.97, metrics.quantile({ 4, 1, 3, 2 }, 0.99), 1e-12)
    assert.are.equal(7, metrics.quantile({ 7 }, 0.9))
  end)

  -- Two requests, steps of 10 ms, fcfs, bookkeeping only:
  --   step 0 [0, 10 ms):  r1 prefills 4 tokens -> its first token at 10 ms
  --   step 1 [10, 20):    r1 decodes (r2 arrives at 15 ms, after the step began)
  --   step 2 [20, 30):    r1 decodes its 3rd token: done at 30; r2 prefills: first token at 30
  --   step 3 [30, 40):    r2 decodes its 2nd token: done at 40
  it("times a schedule computed by hand", function()
    local res = serve.run{ trace = { { arrival = 0, prompt_tokens = 4, output_tokens = 3 },
                                     { arrival = 0.015, prompt_tokens = 2, output_tokens = 2 } },
      clock = "steps", step_ms = 10, layers = 0, page_size = 4, pages = 8, budget = 8, max_batch = 4,
      device = "cpu", slo_ttft_ms = 12 }
    local r1, r2 = res.records[1], res.records[2]
    near(10, r1.ttft_ms, 1e-9, "r1 ttft")
    near(10, r1.tpot_ms, 1e-9, "r1 tpot")
    near(30, r1.e2e_ms, 1e-9, "r1 e2e")
    near(0.03, r1.finish_s, 1e-9, "r1 finish")
    assert.are.equal(0, r1.queue_ms)
    near(15, r2.ttft_ms, 1e-9, "r2 ttft")
    near(10, r2.tpot_ms, 1e-9, "r2 tpot")
    near(25, r2.e2e_ms, 1e-9, "r2 e2e")
    near(5, r2.queue_ms, 1e-9, "r2 queue")
    local s = res.summary
    assert.are.equal(4, s.run.steps)
    near(12.5, s.ttft_ms.p50, 1e-9, "p50 ttft")
    near(14.5, s.ttft_ms.p90, 1e-9, "p90 ttft")
    near(27.5, s.e2e_ms.p50, 1e-9, "p50 e2e")
    near(50, s.throughput.requests_per_s, 1e-9, "requests/s")
    near(125, s.throughput.output_tokens_per_s, 1e-9, "tokens/s")
    assert.are.equal(1, s.goodput.requests)
    near(25, s.goodput.requests_per_s, 1e-9, "goodput")
  end)

  it("times a step by the model clock", function()
    local m = clock.model{ layers = 2, heads = 4, kv_heads = 2, head_dim = 8, hidden = 16, mlp = 32, vocab = 100,
      dtype = "f32", overhead_ms = 1 }
    local ceil = { fma_gflops = 1, read_gbps = 0.1 }
    local res = serve.run{ trace = { { arrival = 0, prompt_tokens = 4, output_tokens = 1 } }, model = m, ceilings = ceil,
      clock = "model", layers = 0, page_size = 4, pages = 4, device = "cpu" }
    local want = clock.step_seconds(m, clock.rates(ceil, "cpu"), nil, 4, 1, 1, { 4 }, { 4 })
    near(want * 1e3, res.records[1].e2e_ms, 1e-9, "one step")
    assert.is_true(want > 1e-3)
  end)
end)

describe("serve runs", function()
  it("runs bookkeeping only (layers 0) on the synthetic trace", function()
    local res = serve.run{ layers = 0, device = "cpu", synthetic = { requests = 30, rate = 100, prompt = { 6, 40 },
      output = { 4, 24 }, system = 18 }, page_size = 4, pages = 80, budget = 48, max_batch = 12 }
    assert.are.equal(30, #res.records)
    assert.is_true(res.summary.run.steps > 30)
    assert.is_nil(res.report.check)
  end)

  local small = { device = "cpu", check = true, page_size = 4, pages = 80, budget = 48, max_batch = 12,
    synthetic = { requests = 24, rate = 100, prompt = { 6, 40 }, output = { 4, 24 }, system = 18 } }
  local function with(t)
    local o = {}
    for k, v in pairs(small) do o[k] = v end
    for k, v in pairs(t) do o[k] = v end
    return o
  end

  for _, policy in ipairs({ "fcfs", "sjf", "lpm", "priority" }) do
    it("checks every step against the reference: policy " .. policy, function()
      local seed = H.seed("serve-" .. policy)
      local res = serve.run(with{ policy = policy, seed = seed, prefix_cache = policy == "lpm",
        synthetic = { requests = 24, rate = 100, prompt = { 6, 40 }, output = { 4, 24 }, system = 18, priorities = 3,
                      turns = { 1, 2 }, think_s = 0.05 } })
      local c = res.report.check
      assert(c and c.steps > 10 and not c.failed, string.format("policy %s, seed %d: %s; %s", policy, seed,
        c and (c.failed and "MISMATCH" or c.steps .. " steps") or "no check", H.rerun(SPEC)))
      assert.are.equal(24, #res.records)
      assert.is_true(res.summary.run.recomputed_tokens > 0 or res.report.preemptions == 0)
    end)
  end

  it("the prefix cache shares the system prompt and earlier turns, checked", function()
    local seed = H.seed("serve-prefix")
    local off = serve.run(with{ seed = seed, share_system = false,
      synthetic = { requests = 24, rate = 100, prompt = { 6, 40 }, output = { 4, 24 }, system = 18, turns = { 2, 3 }, think_s = 0.05 } })
    local on = serve.run(with{ seed = seed, prefix_cache = true,
      synthetic = { requests = 24, rate = 100, prompt = { 6, 40 }, output = { 4, 24 }, system = 18, turns = { 2, 3 }, think_s = 0.05 } })
    assert(not on.report.check.failed, "prefix cache run: MISMATCH; seed " .. seed .. "; " .. H.rerun(SPEC))
    local pc = on.summary.prefix_cache
    assert.is_true(pc.hits > 0)
    assert.is_true(pc.cached_tokens > 0)
    assert.are.equal(0, off.summary.prefix_cache.cached_tokens)
    assert.is_true(on.summary.run.prefill_tokens < off.summary.run.prefill_tokens)
  end)

  it("raises the hit count on the Mooncake sample (shared prefixes)", function()
    local base = { trace = H.root .. "/examples/traces/mooncake.jsonl", device = "cpu", layers = 0, clock = "steps",
      requests = 20, pages = 4096 }
    local off = serve.run(base)
    base.prefix_cache = true
    local on = serve.run(base)
    assert.is_nil(off.summary.prefix_cache.hits)
    assert.is_true(on.summary.prefix_cache.hits > 100)
    assert.is_true(on.summary.prefix_cache.hit_rate > 0.3)
    assert.is_true(on.summary.run.prefill_tokens < 0.7 * off.summary.run.prefill_tokens)
  end)

  it("reads shared prefixes once (cascade), checked against the reference, and reports the time saved", function()
    local seed = H.seed("serve-cascade")
    for _, pc in ipairs { false, true } do -- the system prompt shared by fork, then by the prefix cache
      local res = serve.run(with{ seed = seed, cascade = true, prefix_cache = pc,
        synthetic = { requests = 24, rate = 100, prompt = { 6, 40 }, output = { 4, 24 }, system = 18, turns = { 1, 3 },
                      think_s = 0.05 } })
      local c = res.report.check
      assert(c and c.steps > 10 and not c.failed, string.format("cascade, prefix cache %s, seed %d: %s; %s",
        tostring(pc), seed, c and (c.failed and "MISMATCH" or c.steps .. " steps") or "no check", H.rerun(SPEC)))
      local cs = res.summary.cascade
      assert.is_true(cs.steps_shared > 0)
      assert.are.equal(res.summary.run.steps, cs.steps)
      assert.is_true(cs.page_reads_saved_fraction > 0 and cs.page_reads_saved_fraction < 1)
      assert.is_true(cs.attention_ms_per_step > 0 and cs.plain_attention_ms_per_step > 0)
      assert.is_nil(cs.modelled_s_saved) -- (the steps clock: no modelled time to save)
    end
    local mc = serve.run{ trace = H.root .. "/examples/traces/mooncake.jsonl", device = "cpu", requests = 20,
      pages = 4096, prefix_cache = true, cascade = true, time_scale = 0.05,
      ceilings = { read_gbps = 10, fma_gflops = 100 } }
    assert.is_true(mc.summary.cascade.steps_shared > 0)
    assert.is_number(mc.summary.cascade.modelled_s_saved)
    assert.is_nil(serve.run(with{ seed = seed, check = false }).summary.cascade)
    assert.matches("serve.run: cascade: expected a boolean", H.error_of(serve.run, with{ cascade = 1 }))
  end)

  it("points a policy's error at the policy's file and line", function()
    local dir = H.tmpdir()
    local p = dir .. "/bad.lua"
    H.write_file(p, "return { name = 'bad', step = function(e)\n  local r = e.waiting[1]\n  e:schedule(r, 'x')\nend }\n")
    local err = H.error_of(serve.run, with{ policy = p, check = false })
    assert.matches(p .. ":3: serve: engine:schedule: n: expected a whole number", err, 1, true)
    H.write_file(p, "return { name = 'bad', step = function(e)\n  e.waiting[1] = nil\nend }\n")
    err = H.error_of(serve.run, with{ policy = p, check = false })
    assert.matches("policy bad changed e.running / e.waiting", err, 1, true)
    H.write_file(p, "return { name = 'bad', step = function(e)\n  return e.nothing.here\nend }\n")
    err = H.error_of(serve.run, with{ policy = p, check = false })
    assert.matches(p .. ":2:", err, 1, true)
    H.sh("rm -rf '" .. dir .. "'")
  end)

  it("names a bad option and runs nothing", function()
    assert.matches("serve.run: budgett: unknown option", H.error_of(serve.run, { budgett = 4 }))
    assert.matches("serve.run: pages: 4 pages of 16 tokens cannot hold the longest request",
      H.error_of(serve.run, { trace = { { arrival = 0, prompt_tokens = 100, output_tokens = 1 } }, pages = 4, layers = 0,
        device = "cpu", clock = "steps" }))
    assert.matches("trace%[2%]%.output_tokens", H.error_of(serve.run, { trace = {
      { arrival = 0, prompt_tokens = 1, output_tokens = 1 }, { arrival = 1, prompt_tokens = 1, output_tokens = 0 } },
      device = "cpu" }))
  end)
end)

describe("serve command line", function()
  local dir
  setup(function() dir = H.tmpdir() end)
  teardown(function() H.sh("rm -rf '" .. dir .. "'") end)

  local function serve_cmd(args)
    return H.sh(string.format("cd '%s' && luajit examples/serve.lua --progress 0 %s", H.root, args))
  end

  it("runs --layers 0 (bookkeeping only)", function()
    local rc, out = serve_cmd("--layers 0")
    assert.are.equal(0, rc, out)
    assert.matches("attention not run", out, 1, true)
  end)

  it("writes --requests-out and --summary-out", function()
    local csv, json = dir .. "/req.csv", dir .. "/sum.json"
    local rc, out = serve_cmd(string.format("--trace examples/traces/burstgpt.csv --layers 0 --clock steps " ..
      "--requests-out %s --summary-out %s --slo-ttft-ms 200 --slo-tpot-ms 20", csv, json))
    assert.are.equal(0, rc, out)
    local lines = {}
    for l in H.read_file(csv):gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.are.equal("id,arrival_s,first_token_s,finish_s,ttft_ms,tpot_ms,e2e_ms,queue_ms,prompt_tokens," ..
      "output_tokens,cached_tokens,preemptions,priority", lines[1])
    assert.are.equal(40, #lines) -- 40 rows, one with 0 output tokens skipped
    assert.matches("^1,0,", lines[2])
    local s = require("dkjson").decode(H.read_file(json))
    for _, k in ipairs({ "ttft_ms", "tpot_ms", "e2e_ms" }) do
      for _, p in ipairs({ "p50", "p90", "p99" }) do assert.is_number(s[k][p], k .. "." .. p) end
    end
    assert.is_number(s.throughput.requests_per_s)
    assert.is_number(s.throughput.output_tokens_per_s)
    assert.are.equal(200, s.goodput.slo_ttft_ms)
    assert.is_number(s.goodput.requests_per_s)
    assert.are.equal(39, s.requests)
  end)

  it("reports what --cascade saved, in the report and the summary", function()
    local json = dir .. "/cascade.json"
    local rc, out = serve_cmd("--cascade --summary-out " .. json)
    assert.are.equal(0, rc, out)
    assert.matches("cascade on", out, 1, true)
    assert.matches("  cascade      shared level on %d+ of %d+ steps .*%% of page reads saved; attention [%d.]+ ms a step " ..
      "against [%d.]+ ms plain", out)
    assert.matches("check        %d+ steps against pagedattn.reference: all match", out)
    local s = require("dkjson").decode(H.read_file(json))
    assert.is_number(s.cascade.page_reads_saved_fraction)
    assert.is_number(s.cascade.plain_attention_ms_per_step)
  end)

  it("fails on an output file it cannot write before running anything", function()
    local rc, out = serve_cmd("--summary-out " .. dir .. "/no/such/dir/s.json")
    assert.are.equal(2, rc)
    assert.matches("serve: --summary-out: cannot write", out, 1, true)
    assert.is_nil(out:find("serve: done", 1, true))
  end)

  it("fails on a malformed trace before running anything", function()
    local p = dir .. "/bad.csv"
    H.write_file(p, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,5\n2023-11-16 18:15:47.00,10\n")
    local rc, out = serve_cmd("--trace " .. p)
    assert.are.equal(2, rc)
    assert.matches("serve: trace " .. p .. " line 3: GeneratedTokens: missing", out, 1, true)
    assert.is_nil(out:find("serve: done", 1, true))
  end)
end)
