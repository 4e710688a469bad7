-- spec/serve_trace_spec.lua -- pagedattn.serve's trace readers: each public
-- format (the samples in examples/traces/ and hand-written lines), bad lines
-- (an error naming the file, the line and the field), the time scale and
-- the first N, and the synthetic generator (rates, bursts, sessions).
local H = require "helpers"
local trace = require "pagedattn.serve.trace"

local dir
local function file(name, text)
  local path = dir .. "/" .. name
  H.write_file(path, text)
  return path
end

describe("serve traces", function()
  setup(function() dir = H.tmpdir() end)
  teardown(function() H.sh("rm -rf '" .. dir .. "'") end)

  it("reads Azure CSV: dates to seconds from the first request, ids in row order", function()
    local p = file("azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n" ..
      "2023-11-16 18:15:46.6805900,374,44\n" ..
      "2023-11-16 18:15:50.9951690,396,109\n" ..
      "2023-11-16 23:59:59.5000000,20,7\n" ..
      "2023-11-17 00:00:00.2500000,12,1\n")
    local reqs, info = trace.read(p)
    assert.are.equal("azure", info.format)
    assert.are.equal(4, #reqs)
    assert.are.same({ 1, 2, 3, 4 }, { reqs[1].id, reqs[2].id, reqs[3].id, reqs[4].id })
    assert.are.equal(0, reqs[1].arrival)
    assert.is_true(math.abs(reqs[2].arrival - 4.314579) < 1e-6)
    -- across midnight: 23:59:59.5 -> 00:00:00.25 is 0.75 s
    assert.is_true(math.abs(reqs[4].arrival - reqs[3].arrival - 0.75) < 1e-6)
    assert.are.equal(374, reqs[1].prompt_tokens)
    assert.are.equal(109, reqs[2].output_tokens)
  end)

  it("reads BurstGPT CSV and skips its failed requests (0 response tokens)", function()
    local p = file("burst.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" ..
      "5,ChatGPT,472,18,490,Conversation log\n" ..
      "45,ChatGPT,1087,230,1317,Conversation log\n" ..
      "118,GPT-4,417,0,417,API log\n" ..
      "120,GPT-4,300,40,340,API log\n")
    local reqs, info = trace.read(p)
    assert.are.equal("burstgpt", info.format)
    assert.are.equal(1, info.skipped)
    assert.are.equal(3, #reqs)
    assert.are.same({ 1, 2, 4 }, { reqs[1].id, reqs[2].id, reqs[3].id })
    assert.are.same({ 0, 40, 115 }, { reqs[1].arrival, reqs[2].arrival, reqs[3].arrival })
  end)

  it("reads Mooncake JSONL: milliseconds, hash ids, the block size", function()
    local p = file("moon.jsonl",
      '{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59]}\n' ..
      '{"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 60, 61]}\n')
    local reqs, info = trace.read(p)
    assert.are.equal("mooncake", info.format)
    assert.are.equal(0, reqs[1].arrival)
    assert.is_true(math.abs(reqs[2].arrival - 3.053) < 1e-9)
    assert.are.equal(14, #reqs[1].hash_ids)
    assert.are.equal(512, reqs[1].block_tokens)
    -- blocks of 256 tokens would need more ids: fine; blocks of 1024, fewer: too many ids
    assert.matches("line 1: hash_ids: 14 ids for 6955 input tokens in blocks of 1024",
      H.error_of(trace.read, p, { block_tokens = 1024 }))
  end)

  it("reads the samples in examples/traces", function()
    for name, fmt in pairs({ ["azure_conv.csv"] = "azure", ["burstgpt.csv"] = "burstgpt", ["mooncake.jsonl"] = "mooncake" }) do
      local reqs, info = trace.read(H.root .. "/examples/traces/" .. name)
      assert.are.equal(fmt, info.format)
      assert.is_true(#reqs >= 30, name)
      for i = 2, #reqs do assert.is_true(reqs[i].arrival >= reqs[i - 1].arrival, name) end
    end
  end)

  it("stretches arrivals with time_scale and keeps the first N requests", function()
    local p = file("burst2.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" ..
      "10,ChatGPT,5,5,10,x\n12,ChatGPT,5,5,10,x\n20,ChatGPT,5,5,10,x\n")
    local reqs = trace.read(p, { time_scale = 0.5, requests = 2 })
    assert.are.equal(2, #reqs)
    assert.are.same({ 0, 1 }, { reqs[1].arrival, reqs[2].arrival })
    assert.matches("time_scale: expected a number > 0", H.error_of(trace.read, p, { time_scale = 0 }))
  end)

  it("names the file, the line and the field of a malformed line", function()
    local cases = {
      { "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,5\n2023-11-16 18:15:4x,10,5\n",
        "line 3: TIMESTAMP: expected a date and time" },
      { "b.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,ten,5\n",
        "line 2: ContextTokens: expected a whole number >= 1, got 'ten'" },
      { "c.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10\n",
        "line 2: GeneratedTokens: missing" },
      { "d.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,12,-3,9,x\n",
        "line 2: Response tokens: expected a whole number >= 0, got '-3'" },
      { "e.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\nsoon,ChatGPT,12,3,15,x\n",
        "line 2: Timestamp: expected seconds" },
      { "f.jsonl", '{"timestamp": 1, "input_length": 10, "output_length": 2}\n{"timestamp": 2, "input_length": 10,\n',
        "line 2: line: not a JSON object" },
      { "g.jsonl", '{"timestamp": "now", "input_length": 10, "output_length": 2}\n', "line 1: timestamp: expected milliseconds" },
      { "h.jsonl", '{"timestamp": 1, "input_length": 10, "output_length": 2, "hash_ids": [1, "x"]}\n',
        "line 1: hash_ids: entry 2: expected a whole number >= 0" },
      { "i.jsonl", '{"timestamp": 1, "input_length": 0, "output_length": 2}\n', "line 1: input_length: expected a whole number >= 1" },
      { "j.csv", "when,prompt,output\n1,2,3\n", "line 1: header: unknown format" },
    }
    for _, c in ipairs(cases) do
      local p = file(c[1], c[2])
      local err = H.error_of(trace.read, p)
      assert.matches("serve: trace " .. p .. " " .. c[3], err, 1, true)
    end
  end)

  -- The arrival tests draw with a fresh seed on every run, so each bound is six
  -- standard errors of its estimate (a false alarm about once in 10^8 runs); the
  -- earlier fixed bounds were 2.6 errors and failed about one run in a hundred.
  it("generates Poisson arrivals at the rate asked", function()
    local reqs = trace.synthetic{ requests = 20000, rate = 50, prompt = { 10, 20 }, output = { 1, 5 }, seed = H.seed("trace-poisson") }
    local n = #reqs - 1
    local mean = reqs[#reqs].arrival / n
    -- exponential gaps: the mean's relative standard error is 1 / sqrt(n)
    assert(math.abs(mean * 50 - 1) < 6 / math.sqrt(n), "mean gap " .. mean .. " for rate 50; " .. H.rerun("spec/serve_trace_spec.lua"))
    for i = 1, #reqs do assert.are.equal(i, reqs[i].id) end
  end)

  it("generates bursty gamma arrivals: the same rate, the gaps' spread as asked", function()
    for _, cv in ipairs({ 0.5, 3 }) do
      local reqs = trace.synthetic{ requests = 100000, rate = 10, arrival = "gamma", burstiness = cv, prompt = { 1, 1 },
        output = { 1, 1 }, seed = H.seed("trace-gamma", cv * 10) }
      local gaps, sum = {}, 0
      for i = 2, #reqs do gaps[#gaps + 1] = reqs[i].arrival - reqs[i - 1].arrival; sum = sum + gaps[#gaps] end
      local n = #gaps
      local mean = sum / n
      local var = 0
      for _, g in ipairs(gaps) do var = var + (g - mean) ^ 2 end
      local got_cv = math.sqrt(var / n) / mean
      -- relative standard errors for gamma gaps of shape k = 1/cv^2: the mean's is
      -- cv / sqrt(n); the standard deviation's is sqrt((2 + 6/k) / 4n) (excess
      -- kurtosis 6/k), added in quadrature to the mean's for their ratio
      local k = 1 / (cv * cv)
      local se_mean = cv / math.sqrt(n)
      local se_cv = math.sqrt(((2 + 6 / k) / 4 + cv * cv) / n)
      assert(math.abs(mean * 10 - 1) < 6 * se_mean, "cv " .. cv .. ": mean gap " .. mean .. "; " .. H.rerun("spec/serve_trace_spec.lua"))
      assert(math.abs(got_cv / cv - 1) < 6 * se_cv, "cv " .. cv .. ": measured " .. got_cv .. "; " .. H.rerun("spec/serve_trace_spec.lua"))
    end
  end)

  it("generates sessions whose turns extend the previous turn's prompt and output", function()
    local reqs = trace.synthetic{ requests = 60, rate = 2, prompt = { 5, 9 }, output = { 3, 4 }, system = 7,
      turns = { 3, 3 }, think_s = 1, seed = H.seed("trace-sessions") }
    local by_out = {}
    for _, r in ipairs(reqs) do by_out[r.output_segment] = r end
    local later = 0
    for _, r in ipairs(reqs) do
      assert.are.same({ 0, 7 }, r.segments[1])
      local len = 0
      for _, s in ipairs(r.segments) do len = len + s[2] end
      assert.are.equal(r.prompt_tokens, len)
      if r.turn > 1 then
        later = later + 1
        -- the segment before the new text is an earlier turn's output
        local prev = by_out[r.segments[#r.segments - 1][1]]
        if prev then
          assert.are.equal(prev.prompt_tokens + prev.output_tokens, r.prompt_tokens - r.segments[#r.segments][2])
          assert.is_true(prev.arrival < r.arrival)
        end
      end
    end
    assert.is_true(later > 20)
  end)
end)
