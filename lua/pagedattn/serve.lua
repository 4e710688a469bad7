-- pagedattn.serve: serving experiments as a library. A run replays a request
-- trace (Azure, BurstGPT, Mooncake, or the synthetic generator) through a
-- continuous-batching engine with a scheduling policy, real attention on the
-- device, a clock in seconds, optional prefix caching in the pool, and
-- returns per-request records and a summary (TTFT / TPOT / end-to-end
-- percentiles, throughput, goodput, prefix-cache hit rate).
--
--   local serve = require "pagedattn.serve"
--   local res = serve.run{ trace = "examples/traces/azure_conv.csv", policy = "sjf",
--                          model = "tiny", device = "cpu", prefix_cache = true }
--   print(res.summary.ttft_ms.p99, #res.records)
--   serve.metrics.write_requests_csv("requests.csv", res.records)
--
-- examples/serve.lua is the command line (pagedattn.serve.cli); README.md documents
-- the options, the outputs and the policy API.
local M = {}

M.trace = require "pagedattn.serve.trace"
M.clock = require "pagedattn.serve.clock"
M.metrics = require "pagedattn.serve.metrics"
M.engine = require "pagedattn.serve.engine"
M.models = M.clock.models

local floor, min, max = math.floor, math.min, math.max

-- A policy by name, path or table (see engine.load_policy).
function M.policy(name) return M.engine.load_policy(name) end

local OPTIONS = {
  trace = true, synthetic = true, time_scale = true, requests = true, trace_block = true,
  policy = true, model = true, device = true, clock = true, step_ms = true, layers = true,
  attention_heads = true, page_size = true, pages = true, budget = true, max_batch = true,
  prefix_cache = true, share_system = true, check = true, seed = true, slo_ttft_ms = true,
  slo_tpot_ms = true, ceilings = true, progress = true, dtype = true, kv_dtype = true,
  k_scale = true, v_scale = true, cascade = true, cascade_min_saved = true,
}

local function argerr(name, msg) error("serve.run: " .. name .. ": " .. msg, 3) end

local function whole(o, name, default, lo)
  local v = o[name]
  if v == nil then return default end
  if type(v) ~= "number" or v ~= floor(v) or v < lo or v > 2 ^ 31 - 1 then
    argerr(name, "expected a whole number >= " .. lo .. ", got " .. tostring(v))
  end
  return v
end

local function positive(o, name, default)
  local v = o[name]
  if v == nil then return default end
  if type(v) ~= "number" or not (v > 0) or v == math.huge then argerr(name, "expected a number > 0, got " .. tostring(v)) end
  return v
end

-- The requests of a run as the engine's own tables (a trace's are not changed).
local function requests_of(o)
  local reqs, info
  local scale = positive(o, "time_scale", 1)
  local limit = o.requests ~= nil and whole(o, "requests", nil, 1) or nil
  if type(o.trace) == "string" then
    reqs, info = M.trace.read(o.trace, { time_scale = scale, requests = limit,
      block_tokens = whole(o, "trace_block", 512, 1) })
    return reqs, info
  elseif type(o.trace) == "table" then
    reqs, info = {}, { format = "table", rows = #o.trace, skipped = 0 }
    for i, r in ipairs(o.trace) do
      if limit and i > limit then break end
      if type(r) ~= "table" then argerr("trace[" .. i .. "]", "expected a request table") end
      for _, f in ipairs({ "arrival", "prompt_tokens", "output_tokens" }) do
        if type(r[f]) ~= "number" or r[f] ~= r[f] then argerr("trace[" .. i .. "]." .. f, "expected a number, got " .. tostring(r[f])) end
      end
      if r.prompt_tokens < 1 or r.prompt_tokens ~= floor(r.prompt_tokens) then
        argerr("trace[" .. i .. "].prompt_tokens", "expected a whole number >= 1")
      end
      if r.output_tokens < 1 or r.output_tokens ~= floor(r.output_tokens) then
        argerr("trace[" .. i .. "].output_tokens", "expected a whole number >= 1")
      end
      if i > 1 and r.arrival < o.trace[i - 1].arrival then argerr("trace[" .. i .. "].arrival", "arrivals must not decrease") end
      if r.hash_ids ~= nil and type(r.hash_ids) ~= "table" then argerr("trace[" .. i .. "].hash_ids", "expected a list") end
      if r.tokens ~= nil and type(r.tokens) ~= "table" then argerr("trace[" .. i .. "].tokens", "expected a list of token ids") end
      local c = {}
      for k, v in pairs(r) do c[k] = v end
      c.id = r.id or i
      c.arrival = (r.arrival - o.trace[1].arrival) * scale
      if c.hash_ids then c.block_tokens = c.block_tokens or whole(o, "trace_block", 512, 1) end
      reqs[#reqs + 1] = c
    end
    if #reqs == 0 then argerr("trace", "no requests") end
    info.duration = reqs[#reqs].arrival
  elseif o.trace == nil then
    local s = o.synthetic or {}
    local so = {}
    for k, v in pairs(s) do so[k] = v end
    so.seed = so.seed or o.seed or 1
    so.requests = so.requests or limit or 48
    so.rate = so.rate or 100
    so.prompt = so.prompt or { 6, 40 }
    so.output = so.output or { 4, 24 }
    reqs, info = M.trace.synthetic(so)
    for _, r in ipairs(reqs) do r.arrival = r.arrival * scale end
    info.duration = reqs[#reqs].arrival
    info.synthetic = so
  else
    argerr("trace", "expected a file name, a list of requests, or nil (synthetic), got " .. type(o.trace))
  end
  return reqs, info
end

-- Rotary tables (GPT-NeoX halves over the whole head) for positions [0, n).
local function rope(pa, dev, n, D, dtype)
  local half, cs, sn = floor(D / 2), {}, {}
  for p = 0, n - 1 do
    for j = 0, half - 1 do
      local th = p * 10000 ^ (-2 * j / (2 * half))
      cs[p * half + j + 1], sn[p * half + j + 1] = math.cos(th), math.sin(th)
    end
  end
  return assert(pa.from_table(cs, { n, half }, dtype, dev)), assert(pa.from_table(sn, { n, half }, dtype, dev)), half
end

-- serve.run(o) -> result. Options (README, "The serving experiment", lists them):
--   trace (file | list | nil = synthetic), synthetic = {requests, rate, prompt, output,
--   system, arrival, burstiness, turns, think_s, priorities}, time_scale, requests,
--   trace_block, policy, model, device, clock ("model" | "steps"), step_ms, layers,
--   attention_heads, page_size, pages, budget, max_batch, prefix_cache,
--   share_system, check, seed, slo_ttft_ms, slo_tpot_ms, ceilings, progress, dtype,
--   kv_dtype (the cache's: dtype, fp8_e4m3 or fp8_e5m2), k_scale, v_scale (fp8),
--   cascade (shared prefixes read once: batch{cascade = true}; each step whose
--   batch shares pages also times the plain call, for the report),
--   cascade_min_saved (batch{cascade_min_saved =}: only groups that save that many page reads).
-- result: records (one per request, metrics.REQUEST_COLUMNS), summary
-- (metrics.summary plus the run's settings), report (what the command line prints).
function M.run(o)
  if type(o) ~= "table" then error("serve.run: expected a table of options, got " .. type(o), 2) end
  for k in pairs(o) do
    if not OPTIONS[k] then argerr(tostring(k), "unknown option") end
  end
  local pa = require "pagedattn"
  local check_mod = require "pagedattn.serve.check"
  local clock_now = pa.clock

  local dev = o.device
  if dev == nil or type(dev) == "string" then
    local d, err = pa.device(dev)
    if not d then argerr("device", tostring(err)) end
    dev = d
  end
  local model = M.clock.model(o.model or "tiny")
  local policy = M.engine.load_policy(o.policy or "fcfs")
  local reqs, info = requests_of(o)

  local page_size = whole(o, "page_size", 16, 1)
  local layers = whole(o, "layers", 1, 0)
  local budget = whole(o, "budget", 2048, 1)
  local max_batch = whole(o, "max_batch", 64, 1)
  local dtype = o.dtype or model.dtype
  if dtype ~= "f32" and dtype ~= "f16" and dtype ~= "bf16" then argerr("dtype", "f32, f16 or bf16, got " .. tostring(dtype)) end
  -- the cache: the model's dtype, or fp8 (half the bytes of a 16-bit cache a token)
  local kv_dtype = o.kv_dtype or (model.kv_dtype ~= model.dtype and model.kv_dtype) or dtype
  local fp8 = kv_dtype == "fp8_e4m3" or kv_dtype == "fp8_e5m2"
  if kv_dtype ~= dtype and not fp8 then
    argerr("kv_dtype", "fp8_e4m3, fp8_e5m2 or the dtype (" .. dtype .. "), got " .. tostring(kv_dtype))
  end
  model.kv_dtype = kv_dtype
  local k_scale, v_scale = positive(o, "k_scale", nil), positive(o, "v_scale", nil)
  if (k_scale or v_scale) and not fp8 then argerr(k_scale and "k_scale" or "v_scale", "scales apply to fp8 caches (kv_dtype)") end
  local clock_kind = o.clock or (type(o.trace) == "string" or type(o.trace) == "table") and "model" or "steps"
  if clock_kind ~= "model" and clock_kind ~= "steps" then argerr("clock", "model or steps, got " .. tostring(clock_kind)) end
  local step_s = positive(o, "step_ms", 10) / 1e3
  local prefix_cache = o.prefix_cache == true
  if o.cascade ~= nil and type(o.cascade) ~= "boolean" then argerr("cascade", "expected a boolean, got " .. type(o.cascade)) end
  local cascade = o.cascade == true
  if o.cascade_min_saved ~= nil then
    local m = o.cascade_min_saved
    if not cascade then argerr("cascade_min_saved", "applies with cascade = true") end
    if type(m) ~= "number" or m < 0 or m ~= math.floor(m) or m >= 2 ^ 53 then
      argerr("cascade_min_saved", "expected a whole number of page reads >= 0, got " .. tostring(m))
    end
  end
  local slo_ttft, slo_tpot = o.slo_ttft_ms, o.slo_tpot_ms
  if slo_ttft ~= nil then positive(o, "slo_ttft_ms") end
  if slo_tpot ~= nil then positive(o, "slo_tpot_ms") end

  -- the attention that runs: the model's heads on one GPU of its tp group, or
  -- a smaller compute shape whose measured time is scaled up (linear in heads)
  local Hq = model.heads / model.tp
  local Hk = max(1, floor(model.kv_heads / model.tp))
  local Hq_run = whole(o, "attention_heads", Hq, 1)
  local Hk_run = max(1, floor(Hq_run * Hk / Hq))
  if Hq_run % Hk_run ~= 0 or Hq_run > Hq then
    argerr("attention_heads", string.format("%d heads do not keep the model's %d:%d grouping (at most %d)", Hq_run, Hq, Hk, Hq))
  end
  local attn_scale = Hq / Hq_run
  local D = model.head_dim

  -- the system prompt shared by fork (the generator's segment 0), unless
  -- the prefix cache shares prefixes
  local system = 0
  for _, r in ipairs(reqs) do
    local s = r.system_tokens or 0
    if s > 0 then system = s end
  end
  local share = system > 0 and o.share_system ~= false and not prefix_cache
  local max_len = 1
  for _, r in ipairs(reqs) do
    r.generated, r.preemptions, r.cached_tokens, r.inserted = 0, 0, 0, 0
    r.todo = r.prompt_tokens - (share and system or 0)
    r.running = false
    if r.prompt_tokens + r.output_tokens > max_len then max_len = r.prompt_tokens + r.output_tokens end
  end
  local pages = whole(o, "pages", nil, 1) or 2048
  if floor((max_len - 1) / page_size) + 1 > pages then
    -- a request that cannot fit alone would stall the run: say so up front
    argerr("pages", string.format("%d pages of %d tokens cannot hold the longest request (%d tokens)", pages,
      page_size, max_len))
  end

  local cache
  if layers > 0 then
    cache = assert(pa.kv_cache{ num_pages = pages, page_size = page_size, kv_heads = Hk_run, head_dim = D,
      dtype = kv_dtype, device = dev, layers = layers, k_scale = k_scale, v_scale = v_scale })
  else
    cache = assert(pa.kv_cache{ num_pages = pages, page_size = page_size, layers = 0 })
  end
  if prefix_cache then cache:enable_prefix_cache(true) end
  local batch = assert(cache:batch({ capacity = max_batch, device = dev, cascade = cascade,
    cascade_min_saved = cascade and o.cascade_min_saved or nil }))
  local check = o.check == true and layers > 0
  local cos, sin, half
  if layers > 0 then cos, sin, half = rope(pa, dev, max_len + 1, D, dtype) end
  local checker
  if check then
    local ref = require "pagedattn.reference"
    checker = check_mod.new({ kv_heads = Hk_run, head_dim = D, dtype = dtype, page_size = page_size,
                              kv_dtype = kv_dtype, k_scale = k_scale, v_scale = v_scale },
      ref.tensor({ max_len + 1, half }, cos:to_table()), ref.tensor({ max_len + 1, half }, sin:to_table()), cache)
  end

  local rates
  if clock_kind == "model" then
    local c = o.ceilings
    if c == nil then
      local err
      c, err = require("pagedattn.ceilings").get(dev)
      if not c then error("serve: clock: cannot measure the device's ceilings: " .. tostring(err), 0) end
    end
    rates = M.clock.rates(c, dev.kind)
  end

  local e = M.engine.new({ cache = cache, batch = batch, prefix_cache = prefix_cache, checker = checker,
    opts = { budget = budget, max_batch = max_batch, page_size = page_size, pages = pages, layers = layers,
             model = model, clock = clock_kind } })
  local seed = o.seed or 1

  -- one step of compute: attention on every layer; returns the seconds of
  -- one layer's attention (measured, scaled to the model's heads) and the
  -- first layer's tensors for the check. With cascade, where the batch shares
  -- pages, the plain call runs too, on the same tensors (its append writes
  -- what the cascade's wrote), first on odd steps and last on even ones
  -- (neither profits from the other's warm caches every time); the fifth
  -- result is its time, as the first's.
  -- seconds since t0, less the kernels' one-time setup since s0 (a first
  -- use compiles or loads a kernel: not part of the step's time)
  local setup_s = 0
  local function untimed(t0, s0)
    local s = dev:setup_seconds() - s0
    setup_s = setup_s + s
    return math.max(0, clock_now() - t0 - s)
  end
  local function attend(step_seed, step)
    step = step or 0
    local T = batch.total_q
    local both = cascade and batch.cascade_groups > 0
    local attn_s, plain_s, out, q1, k1, v1 = 0, 0, nil, nil, nil, nil
    for l = 1, layers do
      local q = assert(pa.randn({ T, Hq_run, D }, dtype, dev, step_seed + 3 * l))
      local k = assert(pa.randn({ T, Hk_run, D }, dtype, dev, step_seed + 3 * l + 1))
      local v = assert(pa.randn({ T, Hk_run, D }, dtype, dev, step_seed + 3 * l + 2))
      local function plain()
        dev:synchronize()
        local t0, s0 = clock_now(), dev:setup_seconds()
        assert(pa.attention_varlen(q, cache.k_caches[l], cache.v_caches[l], { k = k, v = v,
          block_table = batch.block_table, cu_seqlens_q = batch.cu_seqlens_q, seqused_k = batch.seqused_k,
          max_seqlen_q = batch.max_seqlen_q, causal = true, rotary_cos = cos, rotary_sin = sin,
          rotary_interleaved = false }))
        dev:synchronize()
        plain_s = plain_s + untimed(t0, s0)
      end
      if both and step % 2 == 1 then plain() end
      dev:synchronize()
      local t0, s0 = clock_now(), dev:setup_seconds()
      local res, aerr = batch:attention(q, k, v, { layer = l, rotary_cos = cos, rotary_sin = sin,
        rotary_interleaved = false })
      if not res then error("serve: attention failed: " .. tostring(aerr), 0) end
      dev:synchronize()
      local dt = untimed(t0, s0)
      attn_s = attn_s + dt
      if both and step % 2 == 0 then plain() end
      if not both then plain_s = plain_s + dt end
      if l == 1 then out, q1, k1, v1 = res, q, k, v end
    end
    if layers == 0 then return nil, out, q1, k1, v1, nil end
    return attn_s / layers * attn_scale, out, q1, k1, v1, plain_s / layers * attn_scale
  end
  -- what the cascade did, over the run
  local cstats = { steps = 0, used = 0, attn_s = 0, plain_s = 0, saved_pages = 0, prefix_pages = 0, groups = 0,
    model_saved_s = 0, read_pages = 0 }

  -- the shared system prompt, prefilled once before the first arrival
  if share then
    local pseq = assert(cache:sequence())
    e.shared_prefix = { seq = pseq, len = system, shadow = { k = {}, v = {} } }
    batch:clear():add(pseq, system)
    assert(batch:stage())
    if layers > 0 then
      local _, out, q, k, v = attend(seed * 1000003 - 64)
      if checker then
        local good = checker:step({ { shadow = e.shared_prefix.shadow, before = 0, n = system, seq = pseq } },
          q, k, v, out)
        if not good then e.check_failed = true end
      end
    end
  end

  local N = #reqs
  local next_arrival, finished = 1, 0
  local done = {}
  local host_s, attn_wall_s, model_s = 0, 0, 0
  local step_host = {}
  local totals = { util = 0, saved = 0, saved_peak = 0, frag = 0, frag_n = 0 }
  e.stats.prefill, e.stats.decode = 0, 0
  local st = {}
  local qbuf, kbuf = {}, {}
  local progress = o.progress
  local t_start = clock_now()
  local check_fail_at

  while finished < N do
    while next_arrival <= N and reqs[next_arrival].arrival <= e.now do
      e.waiting[#e.waiting + 1] = reqs[next_arrival]
      next_arrival = next_arrival + 1
    end
    if #e.running == 0 and #e.waiting == 0 then
      e.now = max(e.now, reqs[next_arrival].arrival) -- idle: on to the next arrival
    else
      local t0 = clock_now()
      if e:plan(policy) == 0 then
        local head = e.waiting[1]
        if #e.running == 0 and head then
          error(string.format("serve: request %d needs %d pages for %d tokens, more than the %d free of %d pages " ..
            "(raise --pages or lower --budget)", head.id, e:pages_for(head, min(head.todo, budget)),
            min(head.todo, budget), cache:free_pages(), pages), 0)
        end
        error("serve: policy " .. policy.name .. " scheduled nothing with " .. #e.running .. " requests running", 0)
      end
      local entries
      if checker then
        entries = {}
        for i = 1, e.nlist do
          local r = e.list[i]
          entries[i] = { shadow = r.shadow, before = r.seq:len(), n = r.scheduled, seq = r.seq }
        end
      end
      e:stage()
      local t1 = clock_now()
      local attn_layer_s, out, q, k, v, plain_layer_s
      if layers > 0 then
        attn_layer_s, out, q, k, v, plain_layer_s = attend(seed * 1000003 + e.step * 64, e.step)
      end
      if cascade then
        local ci = batch:cascade_info()
        cstats.steps = cstats.steps + 1
        if ci.groups > 0 then
          cstats.used = cstats.used + 1
          cstats.groups = cstats.groups + ci.groups
          cstats.saved_pages = cstats.saved_pages + ci.saved_pages
          cstats.prefix_pages = cstats.prefix_pages + ci.prefix_pages
        end
        -- page reads of the plain call: every entry's pages
        for i = 1, e.nlist do cstats.read_pages = cstats.read_pages + e.list[i].seq:num_pages() end
        if attn_layer_s then
          cstats.attn_s = cstats.attn_s + attn_layer_s
          cstats.plain_s = cstats.plain_s + plain_layer_s
        end
      end
      local t2 = clock_now()
      attn_wall_s = attn_wall_s + (t2 - t1)
      if checker then
        local good, err, tol = checker:step(entries, q, k, v, out)
        if not good and not check_fail_at then
          check_fail_at = { step = e.step, err = err, tol = tol }
        end
      end
      local t3 = clock_now()
      -- the step's modelled time
      local dt
      if clock_kind == "steps" then
        dt = step_s
      else
        local logits = 0
        for i = 1, e.nlist do
          local r = e.list[i]
          if r.todo <= r.scheduled then logits = logits + 1 end
        end
        if attn_layer_s == nil then
          for i = 1, e.nlist do
            local r = e.list[i]
            qbuf[i], kbuf[i] = r.scheduled, r.seq:len()
          end
        end
        dt = M.clock.step_seconds(model, rates, attn_layer_s, e.step_tokens, logits, e.nlist, qbuf, kbuf)
        if cascade and plain_layer_s then
          cstats.model_saved_s = cstats.model_saved_s +
            M.clock.step_seconds(model, rates, plain_layer_s, e.step_tokens, logits, e.nlist, qbuf, kbuf) - dt
        end
      end
      e.now = e.now + dt
      model_s = model_s + dt
      -- page statistics, as the step leaves them
      cache:stats(st)
      totals.util = totals.util + st.used_pages / st.num_pages
      local saved = st.page_refs - st.used_pages
      totals.saved = totals.saved + saved
      if saved > totals.saved_peak then totals.saved_peak = saved end
      if e.step % 64 == 0 then
        totals.frag = totals.frag + cache:unused_slots() / max(1, st.used_pages * st.page_size)
        totals.frag_n = totals.frag_n + 1
      end
      finished = finished + e:advance(done)
      e.step = e.step + 1
      local t4 = clock_now()
      local h = (t1 - t0) + (t4 - t3)
      host_s = host_s + h
      step_host[#step_host + 1] = h
      if progress then progress(e, finished, N) end
    end
  end
  local wall = clock_now() - t_start

  -- records and summary
  local records = {}
  for i, r in ipairs(done) do records[i] = M.metrics.record(r) end
  table.sort(records, function(a, b) return a.id < b.id end)
  local s = cache:stats()
  local summary = M.metrics.summary(records, {
    slo_ttft_ms = slo_ttft, slo_tpot_ms = slo_tpot,
    prefix = prefix_cache and { hits = s.prefix_hits, misses = s.prefix_misses, evictions = s.prefix_evictions } or nil,
  })
  local nsteps = e.step
  summary.run = {
    policy = policy.name, model = model.name, clock = clock_kind, step_ms = clock_kind == "steps" and step_s * 1e3 or nil,
    device = dev.name, trace = info.path or info.format, format = info.format, steps = nsteps,
    layers = layers, attention_heads = Hq_run, page_size = page_size, pages = pages, budget = budget,
    max_batch = max_batch, prefix_cache = prefix_cache,
    wall_s = wall, modelled_s = model_s,
    host_us_per_step = nsteps > 0 and host_s / nsteps * 1e6 or 0,
    host_us_per_step_p50 = M.metrics.quantile(step_host, 0.5) and M.metrics.quantile(step_host, 0.5) * 1e6 or 0,
    attention_wall_s = attn_wall_s,
    kernel_setup_s = setup_s, -- compiles and module loads inside timed calls, left out of their times
    host_share = model_s > 0 and host_s / model_s or 0,
    prefill_tokens = e.stats.prefill, decode_tokens = e.stats.decode, recomputed_tokens = e.stats.recomputed,
    cascade = cascade, cascade_min_saved = cascade and (o.cascade_min_saved or 0) or nil,
  }
  if cascade then
    -- per step of the run; the plain call measured on the same steps
    summary.cascade = {
      steps_shared = cstats.used, steps = cstats.steps,
      groups_per_shared_step = cstats.used > 0 and cstats.groups / cstats.used or 0,
      page_reads_saved_fraction = cstats.read_pages > 0 and cstats.saved_pages / cstats.read_pages or 0,
      attention_ms_per_step = layers > 0 and cstats.attn_s / max(1, cstats.steps) * 1e3 or nil,
      plain_attention_ms_per_step = layers > 0 and cstats.plain_s / max(1, cstats.steps) * 1e3 or nil,
      attention_saved_fraction = cstats.plain_s > 0 and 1 - cstats.attn_s / cstats.plain_s or 0,
      modelled_s_saved = clock_kind == "model" and layers > 0 and cstats.model_saved_s or nil,
    }
  end
  local report = {
    info = info, model = model, policy = policy, device = dev, nsteps = nsteps, wall = wall, host_s = host_s,
    attn_wall_s = attn_wall_s, util = nsteps > 0 and totals.util / nsteps or 0, peak = s.peak_used_pages,
    frag = totals.frag / max(1, totals.frag_n), saved = nsteps > 0 and totals.saved / nsteps or 0,
    saved_peak = totals.saved_peak, cow = s.cow_copies, share = share, system = system, stats = s,
    preemptions = e.stats.preemptions, recomputed = e.stats.recomputed,
    check = checker and { steps = checker.steps, worst = checker.worst, ratio = checker.worst_ratio,
                          failed = check_fail_at or (e.check_failed and { step = -1 }) or nil } or nil,
    Hq_run = Hq_run, Hk_run = Hk_run, attn_scale = attn_scale, clock = clock_kind, step_s = step_s,
    step_host = step_host, -- seconds of host time of each step
  }

  if e.shared_prefix then e.shared_prefix.seq:free() end
  assert(s.sequences == (e.shared_prefix and 1 or 0), "serve: sequences left behind")
  cache:validate()
  assert(cache:stats().used_pages == 0, "serve: pages left behind")
  cache:close()
  return { records = records, summary = summary, report = report }
end

return M
