-- examples/serve.lua: a continuous-batching LLM serving simulation on a paged
-- KV cache, with a pluggable scheduling policy.
--
--   scripts/run examples/serve.lua                      small, checked against the reference
--   scripts/run examples/serve.lua --size medium --policy sjf
--   scripts/run examples/serve.lua --help
--
-- A synthetic trace (Poisson arrivals, uniform prompt and output lengths, a
-- seed) feeds an engine that, every step, asks the policy which requests run
-- and with how many tokens, stages them as one batch (pa.kv_cache, batch:stage)
-- and runs real attention on the default device: random q/k/v stand in for a
-- model, appended with rotary embedding into the pages, one attention_varlen
-- call per layer for the whole mixed batch of prefill chunks and decodes.
-- Every request starts as a fork of a shared system prompt (prefix sharing;
-- its partial last page is copied on the first write). When pages run out the
-- policy preempts requests, which later recompute their tokens.
--
-- The clock is the engine's step: arrival times are in steps, so a seed gives
-- the same schedule on every machine; wall time is measured for the report.
-- With --check (the default for --size small) every step's attention output is
-- compared with pagedattn.reference, which sees each request's history as a
-- plain contiguous cache rebuilt from what earlier steps appended.
--
-- A policy is a Lua file in examples/policies/ (or any path) returning
-- { name =, about =, step = function(engine) ... end }; see policies/fcfs.lua.
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local ffi = require "ffi"

local here = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./")

---------------------------------------------------------------------------
-- configuration

local SIZES = {
  small = { requests = 48, rate = 1.0, prompt = { 6, 40 }, output = { 4, 24 }, system = 18,
    page_size = 4, pages = 80, heads = 4, kv_heads = 2, head_dim = 32, dtype = "f32", layers = 1,
    budget = 48, max_batch = 12, check = true },
  medium = { requests = 256, rate = 0.5, prompt = { 32, 512 }, output = { 16, 256 }, system = 100,
    page_size = 16, pages = 1280, heads = 8, kv_heads = 2, head_dim = 64, dtype = "bf16", layers = 2,
    budget = 512, max_batch = 64, check = false },
  large = { requests = 2000, rate = 0.8, prompt = { 64, 2048 }, output = { 32, 512 }, system = 500,
    page_size = 16, pages = 16384, heads = 32, kv_heads = 8, head_dim = 128, dtype = "bf16", layers = 1,
    budget = 4096, max_batch = 256, check = false },
}

local HELP = [[
usage: scripts/run examples/serve.lua [options]
  --size small|medium|large  preset (default small: checked against the reference)
  --policy NAME|FILE         fcfs (default), sjf, or a policy file
  --seed N                   trace and data seed (default 1)
  --requests N               requests in the trace
  --rate R                   mean arrivals per step (Poisson)
  --prompt LO:HI             prompt lengths (uniform)
  --output LO:HI             output lengths (uniform)
  --system N                 shared system prompt tokens (0 = none)
  --no-share                 every request prefills the system prompt itself
  --page-size N --pages N    the KV cache
  --heads H --kv-heads HK --head-dim D --dtype f32|f16|bf16 --layers L
  --budget N                 tokens per step (chunked prefill)
  --max-batch N              sequences per step
  --device NAME              cpu, cuda, cuda:N (default: pa.device())
  --check / --no-check       compare attention with pagedattn.reference every step
  --progress N               a progress line every N steps (default: a bar on a
                             terminal, else every 50 steps; 0 = none)
]]

local function parse_args(argv)
  local o = { size = "small", policy = "fcfs", seed = 1, share = true }
  local i = 1
  local function value(name)
    local v = argv[i + 1]
    if v == nil then error("serve: " .. name .. " needs a value (see --help)", 0) end
    i = i + 1
    return v
  end
  local function num(name)
    local v = tonumber(value(name))
    if not v then error("serve: " .. name .. " needs a number", 0) end
    return v
  end
  local function range(name)
    local lo, hi = value(name):match("^(%d+):(%d+)$")
    if not lo or tonumber(lo) > tonumber(hi) or tonumber(lo) < 1 then
      error("serve: " .. name .. " expects LO:HI with 1 <= LO <= HI", 0)
    end
    return { tonumber(lo), tonumber(hi) }
  end
  -- flag -> the option it sets, how its value is read, and whether it
  -- overrides the size preset (set) or stands beside it (o)
  local flags = {
    ["--size"] = { "size", value }, ["--policy"] = { "policy", value }, ["--seed"] = { "seed", num },
    ["--device"] = { "device", value }, ["--progress"] = { "progress", num },
    ["--requests"] = { "requests", num, true }, ["--rate"] = { "rate", num, true },
    ["--prompt"] = { "prompt", range, true }, ["--output"] = { "output", range, true },
    ["--system"] = { "system", num, true }, ["--page-size"] = { "page_size", num, true },
    ["--pages"] = { "pages", num, true }, ["--heads"] = { "heads", num, true },
    ["--kv-heads"] = { "kv_heads", num, true }, ["--head-dim"] = { "head_dim", num, true },
    ["--dtype"] = { "dtype", value, true }, ["--layers"] = { "layers", num, true },
    ["--budget"] = { "budget", num, true }, ["--max-batch"] = { "max_batch", num, true },
  }
  local switches = { ["--no-share"] = { "share", false }, ["--check"] = { "check", true, true },
    ["--no-check"] = { "check", false, true } }
  local set = {}
  while i <= #argv do
    local a = argv[i]
    local f, sw = flags[a], switches[a]
    if a == "--help" or a == "-h" then io.write(HELP) os.exit(0)
    elseif f then (f[3] and set or o)[f[1]] = f[2](a)
    elseif sw then (sw[3] and set or o)[sw[1]] = sw[2]
    else error("serve: unknown option " .. a .. " (see --help)", 0) end
    i = i + 1
  end
  local preset = SIZES[o.size]
  if not preset then error("serve: --size must be small, medium or large", 0) end
  for k, v in pairs(preset) do o[k] = v end
  for k, v in pairs(set) do o[k] = v end
  if o.budget < 1 or o.max_batch < 1 then error("serve: --budget and --max-batch must be >= 1", 0) end
  if o.heads % o.kv_heads ~= 0 then error("serve: --heads must be a multiple of --kv-heads", 0) end
  return o
end

---------------------------------------------------------------------------
-- the trace

local function make_trace(o)
  local rng = ref.rng(o.seed)
  local reqs, t = {}, 0
  for id = 1, o.requests do
    t = t - math.log(1 - rng:uniform()) / o.rate -- exponential gaps: Poisson arrivals
    reqs[id] = {
      id = id, arrival = t,
      prompt_len = rng:int(o.prompt[1], o.prompt[2]),
      output_len = rng:int(o.output[1], o.output[2]),
      generated = 0, preemptions = 0,
    }
  end
  return reqs
end

---------------------------------------------------------------------------
-- checking against the reference

-- Each request (and the system prompt) keeps a shadow of its layer-1 history:
-- the rotated k and the v rows that the reference appended, one per token.
local Checker = {}
Checker.__index = Checker

local function new_checker(o, cos, sin)
  return setmetatable({ o = o, cos = cos, sin = sin, steps = 0, worst = 0, worst_ratio = 0 }, Checker)
end

-- entries: { shadow = {k = rows, v = rows}, before = keys, n = new tokens }
function Checker:step(entries, q, k, v, out)
  local o = self.o
  local Hk, D, dt = o.kv_heads, o.head_dim, o.dtype
  local tok = Hk * D
  local B, maxk = #entries, 1
  for _, e in ipairs(entries) do if e.before + e.n > maxk then maxk = e.before + e.n end end
  local qr = ref.tensor(q.shape, q:to_table())
  local kr = ref.tensor(k.shape, k:to_table())
  local vr = ref.tensor(v.shape, v:to_table())
  local cu, used = { 0 }, {}
  for b, e in ipairs(entries) do cu[b + 1] = cu[b] + e.n; used[b] = e.before + e.n end
  local function run(precision)
    local kd, vd = {}, {}
    for x = 1, B * maxk * tok do kd[x], vd[x] = 0, 0 end
    for b, e in ipairs(entries) do
      for t = 1, e.before do
        local base, krow, vrow = ((b - 1) * maxk + t - 1) * tok, e.shadow.k[t], e.shadow.v[t]
        for x = 1, tok do kd[base + x], vd[base + x] = krow[x], vrow[x] end
      end
    end
    local kc, vc = ref.tensor({ B, maxk, Hk, D }, kd), ref.tensor({ B, maxk, Hk, D }, vd)
    local res = ref.attention_varlen(qr, kc, vc, {
      cu_seqlens_q = cu, seqused_k = used, k = kr, v = vr, causal = true,
      rotary_cos = self.cos, rotary_sin = self.sin, rotary_interleaved = false,
      precision = precision, cache_dtype = dt })
    return res, kc, vc
  end
  local exact, kc, vc = run("f64")
  local naive = run(dt)
  for b, e in ipairs(entries) do
    for t = e.before, e.before + e.n - 1 do
      local base, krow, vrow = ((b - 1) * maxk + t) * tok, {}, {}
      for x = 1, tok do krow[x], vrow[x] = kc.data[base + x], vc.data[base + x] end
      e.shadow.k[t + 1], e.shadow.v[t + 1] = krow, vrow
    end
  end
  local err = ref.max_abs_diff(out:to_table(), exact.data)
  local tol = ref.tolerance(dt, ref.max_abs_diff(naive.data, exact.data))
  self.steps = self.steps + 1
  if err > self.worst then self.worst = err end
  if err / tol > self.worst_ratio then self.worst_ratio = err / tol end
  return err <= tol, err, tol
end

---------------------------------------------------------------------------
-- the engine (what a policy sees)
--
--   e.running        requests holding pages, in the order they started
--   e.waiting        arrived requests without pages: preempted ones first,
--                    then in arrival order
--   e.step           the current step (the clock)
--   e.opts           the configuration (budget, max_batch, ...)
--   req.todo         tokens still to prefill (0: decoding, 1 token per step)
--   req.prompt_len, req.output_len, req.generated, req.arrival
--   e:schedule(req, n)   run n tokens of req in this step, starting it if it
--                        waits; true, or false and why ("pages", "budget",
--                        "batch", "scheduled") and nothing changes
--   e:preempt(req)       free req's pages; it waits at the front, to recompute
--   e:tokens_left()      budget left in this step
--   e:pages_for(req, n)  pages n more tokens of req would take now
--   e:free_pages()       pages free once this step's schedule is staged

local Engine = {}
Engine.__index = Engine

local function pages_for(tokens, ps) return math.floor((tokens + ps - 1) / ps) end

function Engine:free_pages() return self.cache:free_pages() - self.step_pages end
function Engine:tokens_left() return self.opts.budget - self.step_tokens end

function Engine:pages_for(req, n)
  if req.seq then return req.seq:pages_needed(n) end
  if n == 0 then return 0 end
  local S, ps = self.prefix and self.opts.system or 0, self.opts.page_size
  -- a fork shares the prefix's pages; its first write copies a partial one
  return pages_for(S + n, ps) - pages_for(S, ps) + (S % ps ~= 0 and 1 or 0)
end

local function remove(list, x)
  for i = 1, #list do if list[i] == x then table.remove(list, i) return true end end
  return false
end

function Engine:schedule(req, n)
  if req.step_n then return false, "scheduled" end
  if n < 1 then return false, "budget" end
  if n > self:tokens_left() then return false, "budget" end
  if #self.step_list >= self.opts.max_batch then return false, "batch" end
  local need = self:pages_for(req, n)
  if need > self:free_pages() then return false, "pages" end
  if not req.seq then
    -- start (or restart) the request: a fork of the shared system prompt
    local seq = self.prefix and assert(self.prefix.seq:fork()) or assert(self.cache:sequence())
    req.seq = seq
    if self.checker then
      req.shadow = { k = {}, v = {} }
      if self.prefix then
        for t = 1, self.opts.system do
          req.shadow.k[t], req.shadow.v[t] = self.prefix.shadow.k[t], self.prefix.shadow.v[t]
        end
      end
    end
    remove(self.waiting, req)
    self.running[#self.running + 1] = req
    if req.first_start == nil then req.first_start = self.step end
  end
  req.step_n = n
  self.step_list[#self.step_list + 1] = req
  self.step_pages = self.step_pages + need
  self.step_tokens = self.step_tokens + n
  return true
end

function Engine:preempt(req)
  assert(req.seq, "preempt: the request is not running")
  if req.step_n then -- scheduled already this step: take it back
    remove(self.step_list, req)
    self.step_tokens = self.step_tokens - req.step_n
    req.step_n = nil
    self.step_pages = 0
    for _, r in ipairs(self.step_list) do self.step_pages = self.step_pages + r.seq:pages_needed(r.step_n) end
  end
  local held = req.seq:len() - (self.prefix and self.opts.system or 0)
  self.stats.recomputed = self.stats.recomputed + math.max(0, held)
  req.seq:free()
  req.seq, req.shadow = nil, nil
  req.todo = req.prompt_len + req.generated + (self.prefix and 0 or self.opts.system)
  req.preemptions = req.preemptions + 1
  self.stats.preemptions = self.stats.preemptions + 1
  remove(self.running, req)
  table.insert(self.waiting, 1, req)
end

---------------------------------------------------------------------------

local function load_policy(name, api)
  local path = name:match("%.lua$") and name or (here .. "policies/" .. name .. ".lua")
  local chunk, err = loadfile(path)
  if not chunk then error("serve: cannot load policy '" .. name .. "': " .. err, 0) end
  local p = chunk(api)
  if type(p) ~= "table" or type(p.step) ~= "function" then
    error("serve: policy " .. path .. " must return a table with a step(engine) function", 0)
  end
  p.name = p.name or name
  return p
end

local function isatty()
  pcall(ffi.cdef, "int isatty(int fd);")
  local ok, r = pcall(function() return ffi.C.isatty(1) end)
  return ok and r == 1
end

local clock = pa.clock -- seconds, monotonic

local function percentile(list, p)
  if #list == 0 then return 0 end
  local s = {}
  for i = 1, #list do s[i] = list[i] end
  table.sort(s)
  return s[math.max(1, math.ceil(p * #s))]
end

local function mean(list)
  local sum = 0
  for i = 1, #list do sum = sum + list[i] end
  return #list > 0 and sum / #list or 0
end

---------------------------------------------------------------------------

local function main(argv)
  local o = parse_args(argv)
  local dev = assert(pa.device(o.device))
  local api = {}
  api.policy = function(name) return load_policy(name, api) end
  local policy = load_policy(o.policy, api)
  local reqs = make_trace(o)
  local max_pos = o.system + o.prompt[2] + o.output[2] + 1

  -- the model stand-in: rotary tables (GPT-NeoX style, full head dim)
  local half, cs, sn = math.floor(o.head_dim / 2), {}, {}
  for p = 0, max_pos - 1 do
    for j = 0, half - 1 do
      local th = p * 10000 ^ (-2 * j / (2 * half))
      cs[p * half + j + 1], sn[p * half + j + 1] = math.cos(th), math.sin(th)
    end
  end
  local cos = assert(pa.from_table(cs, { max_pos, half }, o.dtype, dev))
  local sin = assert(pa.from_table(sn, { max_pos, half }, o.dtype, dev))

  local cache = assert(pa.kv_cache{ num_pages = o.pages, page_size = o.page_size, kv_heads = o.kv_heads,
    head_dim = o.head_dim, dtype = o.dtype, device = dev, layers = o.layers })
  local batch = assert(cache:batch({ capacity = o.max_batch }))
  local checker = o.check and new_checker(o, ref.tensor({ max_pos, half }, cos:to_table()),
    ref.tensor({ max_pos, half }, sin:to_table())) or nil
  local e = setmetatable({
    opts = o, cache = cache, running = {}, waiting = {}, step = 0, checker = checker,
    step_list = {}, step_pages = 0, step_tokens = 0,
    stats = { preemptions = 0, recomputed = 0 },
  }, Engine)

  print(string.format("serve: %d requests (seed %d), policy %s%s", o.requests, o.seed, policy.name,
    policy.about and (": " .. policy.about) or ""))
  print(string.format("  %s; %s, %d layer(s), H=%d Hk=%d D=%d; %d pages of %d tokens; budget %d tokens, batch <= %d",
    dev.description, o.dtype, o.layers, o.heads, o.kv_heads, o.head_dim, o.pages, o.page_size, o.budget, o.max_batch))
  print(string.format("  trace: rate %.2g/step, prompts %d-%d, outputs %d-%d, system prompt %d tokens (%s)%s",
    o.rate, o.prompt[1], o.prompt[2], o.output[1], o.output[2], o.system,
    o.system > 0 and (o.share and "shared by fork" or "not shared") or "none",
    checker and "; checking every step against pagedattn.reference" or ""))

  -- one step of compute: stage the scheduled requests, attend on every layer
  local step_times, ok_check = {}, true
  local totals = { prefill = 0, decode = 0, util = 0, saved = 0, saved_peak = 0, frag = 0, frag_n = 0 }
  local function compute(list, counts)
    batch:clear()
    for i, seq in ipairs(list) do batch:add(seq, counts[i]) end
    local staged, err = batch:stage()
    if not staged then error("serve: staging failed although the policy counted the pages: " .. err, 0) end
    local T, H, Hk, D = batch.total_q, o.heads, o.kv_heads, o.head_dim
    local seed = o.seed * 1000003 + e.step * 64
    local out, q1, k1, v1
    for l = 1, o.layers do
      local q = assert(pa.randn({ T, H, D }, o.dtype, dev, seed + 3 * l))
      local k = assert(pa.randn({ T, Hk, D }, o.dtype, dev, seed + 3 * l + 1))
      local v = assert(pa.randn({ T, Hk, D }, o.dtype, dev, seed + 3 * l + 2))
      local res, aerr = batch:attention(q, k, v, { layer = l, rotary_cos = cos, rotary_sin = sin,
        rotary_interleaved = false })
      if not res then error("serve: attention failed: " .. tostring(aerr), 0) end
      if l == 1 then out, q1, k1, v1 = res, q, k, v end
    end
    dev:synchronize()
    return out, q1, k1, v1
  end

  -- the system prompt, once (prefill through the same path)
  local t_start = clock()
  if o.system > 0 and o.share then
    if pages_for(o.system, o.page_size) >= o.pages then
      error("serve: the system prompt alone fills the " .. o.pages .. " pages of the pool (raise --pages)", 0)
    end
    e.prefix = { seq = assert(cache:sequence()), shadow = { k = {}, v = {} } }
    local out, q, k, v = compute({ e.prefix.seq }, { o.system })
    totals.prefill = totals.prefill + o.system
    if checker then
      local good = checker:step({ { shadow = e.prefix.shadow, before = 0, n = o.system } }, q, k, v, out)
      ok_check = ok_check and good
    end
  end
  for _, r in ipairs(reqs) do r.todo = r.prompt_len + ((o.system > 0 and not o.share) and o.system or 0) end

  local tty = isatty()
  local every = o.progress or (tty and -1 or 50)
  local next_arrival, finished, last_bar = 1, 0, 0
  local engine_time = 0
  local function progress(final)
    local s = cache:stats()
    local line = string.format("step %5d  done %4d/%d  running %3d  waiting %3d  pages %5.1f%%  preempted %d",
      e.step, finished, #reqs, #e.running, #e.waiting, 100 * s.used_pages / s.num_pages, e.stats.preemptions)
    if every < 0 then
      local width, frac = 30, finished / #reqs
      local bar = string.rep("#", math.floor(frac * width)) .. string.rep(".", width - math.floor(frac * width))
      io.write("\r[", bar, "] ", line, final and "\n" or "")
      io.flush()
    else
      print("  " .. line)
    end
  end

  while finished < #reqs do
    -- arrivals
    while next_arrival <= #reqs and reqs[next_arrival].arrival <= e.step do
      e.waiting[#e.waiting + 1] = reqs[next_arrival]
      next_arrival = next_arrival + 1
    end
    if #e.running == 0 and #e.waiting == 0 then
      e.step = math.ceil(reqs[next_arrival].arrival) -- idle: skip to the next arrival
    else
      local t0 = clock()
      e.step_list, e.step_pages, e.step_tokens = {}, 0, 0
      policy.step(e)
      local list = e.step_list
      if #list == 0 then
        local head = e.waiting[1]
        if #e.running == 0 and head then
          error(string.format("serve: request %d needs %d pages for %d tokens, more than the %d pages of the pool " ..
            "(raise --pages or lower --budget)", head.id, e:pages_for(head, math.min(head.todo, o.budget)),
            math.min(head.todo, o.budget), o.pages), 0)
        end
        error("serve: policy " .. policy.name .. " scheduled nothing with " .. #e.running .. " requests running", 0)
      end
      local seqs, counts, entries = {}, {}, {}
      for i, r in ipairs(list) do
        seqs[i], counts[i] = r.seq, r.step_n
        if checker then entries[i] = { shadow = r.shadow, before = r.seq:len(), n = r.step_n } end
      end
      local out, q, k, v = compute(seqs, counts)
      local t1 = clock()
      engine_time = engine_time + (t1 - t0)
      step_times[#step_times + 1] = t1 - t0
      if checker then
        local good, err, tol = checker:step(entries, q, k, v, out)
        if not good then
          ok_check = false
          print(string.format("  CHECK FAILED at step %d: max |err| %.3g > tolerance %.3g " ..
            "(rerun: scripts/run examples/serve.lua --size %s --seed %d --policy %s)", e.step, err, tol, o.size, o.seed, o.policy))
        end
      end
      -- page statistics, as the step leaves them
      local s = cache:stats()
      totals.util = totals.util + s.used_pages / s.num_pages
      local saved = s.page_refs - s.used_pages
      totals.saved = totals.saved + saved
      if saved > totals.saved_peak then totals.saved_peak = saved end
      if #step_times % 8 == 1 then
        totals.frag = totals.frag + cache:unused_slots() / math.max(1, s.used_pages * s.page_size)
        totals.frag_n = totals.frag_n + 1
      end
      -- advance the requests
      for _, r in ipairs(list) do
        local n = r.step_n
        r.step_n = nil
        if r.todo > 0 then
          totals.prefill = totals.prefill + n
          r.todo = r.todo - n
          if r.todo == 0 then r.generated = r.generated + 1 end
        else
          totals.decode = totals.decode + n
          r.generated = r.generated + 1
        end
        if r.generated == 1 and r.first_token == nil then r.first_token = e.step end
        if r.generated >= r.output_len then
          r.finish = e.step
          r.seq:free()
          r.seq, r.shadow = nil, nil
          remove(e.running, r)
          finished = finished + 1
        end
      end
      e.step = e.step + 1
      if every > 0 and e.step % every == 0 then progress() end
      if every < 0 and clock() - last_bar > 0.1 then progress() last_bar = clock() end
    end
  end
  local wall = clock() - t_start
  if every < 0 then progress(true) end

  -- report
  local ttft, latency, tpot = {}, {}, {}
  for _, r in ipairs(reqs) do
    ttft[#ttft + 1] = r.first_token - r.arrival + 1
    latency[#latency + 1] = r.finish - r.arrival + 1
    if r.output_len > 1 then tpot[#tpot + 1] = (r.finish - r.first_token) / (r.output_len - 1) end
  end
  local nsteps = #step_times
  local ms = {}
  for i = 1, nsteps do ms[i] = step_times[i] * 1e3 end
  local s = cache:stats()
  print(string.format("serve: done in %d steps, %.2f s (%.2f s in engine steps)", nsteps, wall, engine_time))
  local generated = 0
  for _, r in ipairs(reqs) do generated = generated + r.output_len end
  print(string.format("  throughput   %.0f tokens/s processed (%d prefill, of which %d recomputed; %d decode), %.0f generated tokens/s",
    (totals.prefill + totals.decode) / engine_time, totals.prefill, e.stats.recomputed, totals.decode,
    generated / engine_time))
  print(string.format("  step time    mean %.2f ms, p50 %.2f ms, p99 %.2f ms",
    mean(ms), percentile(ms, 0.5), percentile(ms, 0.99)))
  print(string.format("  latency      TTFT mean %.1f steps (p90 %.1f), time per output token %.2f steps, end to end mean %.1f steps",
    mean(ttft), percentile(ttft, 0.9), mean(tpot), mean(latency)))
  print(string.format("  pages        utilization mean %.1f%% (peak %d of %d), fragmentation %.1f%% of used slots empty",
    100 * totals.util / nsteps, s.peak_used_pages, s.num_pages, 100 * totals.frag / math.max(1, totals.frag_n)))
  print(string.format("  preemptions  %d (%d tokens recomputed)", e.stats.preemptions, e.stats.recomputed))
  if o.system > 0 then
    if o.share then
      print(string.format("  prefix       system prompt %d tokens in %d pages, shared by fork: %.1f pages saved per step (peak %d), %d copy-on-write copies",
        o.system, pages_for(o.system, o.page_size), totals.saved / nsteps, totals.saved_peak, s.cow_copies))
    else
      print(string.format("  prefix       system prompt %d tokens prefilled by every request (--no-share)", o.system))
    end
  end
  if e.prefix then e.prefix.seq:free() end
  assert(s.sequences == (e.prefix and 1 or 0), "serve: sequences left behind")
  cache:validate()
  local left = cache:stats()
  assert(left.used_pages == 0, "serve: pages left behind")
  if checker then
    print(string.format("  check        %d steps against pagedattn.reference: %s (worst |err| %.3g, %.0f%% of its tolerance)",
      checker.steps, ok_check and "all match" or "MISMATCH", checker.worst, 100 * checker.worst_ratio))
  end
  cache:close()
  return ok_check
end

local ok, res = pcall(main, arg)
if not ok then
  io.stderr:write(tostring(res), "\n")
  os.exit(2)
end
os.exit(res and 0 or 1)
