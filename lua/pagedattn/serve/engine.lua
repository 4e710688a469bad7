-- pagedattn.serve.engine: a continuous-batching serving engine over a paged
-- KV cache (pa.kv_cache), driven by a policy, timed by a clock. Each step the
-- policy picks which requests run and how many of their tokens; the engine
-- stages them as one batch, runs real attention on the device (random q/k/v
-- stand in for the model's projections, rotated and appended into the pages,
-- one attention_varlen call per layer for the mixed batch of prefill chunks
-- and decodes), advances the clock and the requests, and keeps the records.
--
-- What a policy sees (README, "The policy API", is the reference):
--   e.running, e.waiting       lists of requests; a policy may reorder both
--                              (sort them) but adds or removes nothing itself
--   e.now, e.step, e.opts      the clock (seconds), steps run, the configuration
--   e:schedule(req, n)         run n tokens of req this step (true, or false, why)
--   e:preempt(req)             free a running request's pages; it waits at the front
--   e:tokens_left(), e:batch_left(), e:free_pages(), e:pages_for(req, n),
--   e:cached_tokens(req)
-- and of a request: id, arrival, prompt_tokens, output_tokens, generated,
-- todo, priority, preemptions, cached_tokens, running (it holds pages),
-- scheduled (tokens scheduled this step, or nil).
local ffi = require "ffi"
local core = require "pagedattn.core"
local clockm = require "pagedattn.serve.clock"

local C = core.C
local floor, min, max = math.floor, math.min, math.max
local u64_array = ffi.typeof("uint64_t[?]")
local i32_array = ffi.typeof("int32_t[?]")

local M = {}

local Engine = {}
Engine.__index = Engine
M.Engine = Engine

local function remove(list, x)
  for i = 1, #list do if list[i] == x then table.remove(list, i) return true end end
  return false
end

local function ceil_div(a, b) return floor((a + b - 1) / b) end

---------------------------------------------------------------------------
-- prefix-cache keys of a request's content
--
-- Page i of a request holds tokens [i * ps, (i + 1) * ps). Its key names
-- that page's content given the pages before it; the pool chains the keys
-- into hashes that name whole prefixes. Content the trace describes gets
-- shared keys (Mooncake block ids, token ids, the generator's segments);
-- anything else (an output a trace knows nothing about) a key of its own,
-- which only the request itself hits again (after a preemption).

local UNIQUE = 0x8000000000000000ULL

local function unique_key(r, i)
  -- the request's own space: bit 63, its id, the page
  return UNIQUE + ffi.cast("uint64_t", r.id) * 0x100000000ULL + i
end

local function virtual_tokens(r, total)
  -- the generator's segments as token ids: (segment, offset) pairs, so that
  -- equal runs of equal segments are equal tokens
  local buf = i32_array(total)
  local at = 0
  local function put(id, len)
    for o = 0, len - 1 do
      if at >= total then return end
      buf[at] = bit.tobit(id * 1000003 + o)
      at = at + 1
    end
  end
  for _, s in ipairs(r.segments) do put(s[1], s[2]) end
  put(r.output_segment or -r.id, r.output_tokens)
  return buf
end

-- r.hashes (uint64_t[r.nhash]): the chain hashes of every full page of the
-- request's prompt and output.
function Engine:hash_request(r)
  if r.hashes then return r.hashes end
  local ps = self.page_size
  local np = floor((r.prompt_tokens + r.output_tokens) / ps)
  local out = u64_array(max(np, 1))
  if np > 0 then
    local keys = u64_array(np)
    local from_tokens = 0 -- pages [0, from_tokens) are hashed from token ids
    local tokens
    if r.segments then
      tokens = virtual_tokens(r, np * ps)
      from_tokens = np
    elseif r.tokens then
      local n = min(#r.tokens, r.prompt_tokens)
      from_tokens = floor(n / ps)
      tokens = i32_array(max(from_tokens * ps, 1))
      for t = 0, from_tokens * ps - 1 do tokens[t] = r.tokens[t + 1] end
    end
    for i = from_tokens, np - 1 do
      local last = (i + 1) * ps - 1
      local ids = r.hash_ids
      local b = ids and floor(last / r.block_tokens)
      if ids and last < r.prompt_tokens and b < #ids then
        keys[i] = ffi.cast("uint64_t", ids[b + 1]) + 1
      else
        keys[i] = unique_key(r, i)
      end
    end
    if from_tokens > 0 then
      self.cache:prefix_hashes{ num_pages = from_tokens, page_size = ps, tokens = tokens, out = out }
    end
    if np > from_tokens then
      local parent = from_tokens > 0 and out[from_tokens - 1] or 0ULL
      self.cache:prefix_hashes{ num_pages = np - from_tokens, keys = keys + from_tokens, parent = parent,
                                out = out + from_tokens }
    end
  end
  r.hashes, r.nhash = out, np
  return out
end

-- Pages a start may take from the cache: whole pages of the content known
-- so far, less one token that must be computed to produce the next one.
local function attach_limit(e, r)
  local known = r.prompt_tokens + r.generated
  return min(floor((known - 1) / e.page_size), r.nhash)
end

---------------------------------------------------------------------------
-- the policy API

function Engine:free_pages() return self.cache:free_pages() - self.step_pages end
function Engine:tokens_left() return self.opts.budget - self.step_tokens end
function Engine:batch_left() return self.opts.max_batch - self.nlist end

local function check_req(e, req, fname)
  if type(req) ~= "table" or req.prompt_tokens == nil then
    error("serve: engine:" .. fname .. ": req: expected a request of e.running or e.waiting, got " .. type(req), 3)
  end
end

-- Prompt tokens (and recomputed output) that starting req now would take
-- from the prefix cache instead of computing; for a running request, what
-- its starts took. 0 without a prefix cache.
function Engine:cached_tokens(req)
  check_req(self, req, "cached_tokens")
  if req.seq or not self.prefix_cache then return req.cached_tokens end
  self:hash_request(req)
  local m = self.cache:prefix_lookup(attach_limit(self, req), req.hashes)
  return m * self.page_size
end

-- Pages that n more tokens of req take now (a waiting request: its start,
-- with what the prefix cache or the shared system prompt give it).
function Engine:pages_for(req, n)
  check_req(self, req, "pages_for")
  if req.seq then return tonumber(C.pa_seq_pages_needed(self.cache.handle, req.seq.id, n)) end
  if n <= 0 then return 0 end
  if self.prefix_cache then
    self:hash_request(req)
    local m, idle = self.cache:prefix_lookup(attach_limit(self, req), req.hashes)
    local left = req.todo - m * self.page_size
    return idle + ceil_div(min(n, left), self.page_size)
  end
  local S, ps = self.shared_prefix and self.shared_prefix.len or 0, self.page_size
  -- a fork shares the prefix's pages; its first write copies a partial one
  return ceil_div(S + n, ps) - ceil_div(S, ps) + (S % ps ~= 0 and 1 or 0)
end

-- Runs n tokens of req in this step (a waiting request starts). Returns
-- true, or false and why ("budget", "batch", "pages", "scheduled", "done")
-- and then changes nothing.
function Engine:schedule(req, n)
  check_req(self, req, "schedule")
  if type(n) ~= "number" or n ~= floor(n) then
    error("serve: engine:schedule: n: expected a whole number, got " .. tostring(n), 2)
  end
  if req.scheduled then return false, "scheduled" end
  if req.finish then return false, "done" end
  if n < 1 or n > self.opts.budget - self.step_tokens then return false, "budget" end
  if self.nlist >= self.opts.max_batch then return false, "batch" end
  if req.todo > 0 and n > req.todo then n = req.todo end
  if req.todo == 0 and n > 1 then n = 1 end -- decoding: one token a step
  local seq = req.seq
  if seq then
    local need = tonumber(C.pa_seq_pages_needed(self.cache.handle, seq.id, n))
    if need > self.cache:free_pages() - self.step_pages then return false, "pages" end
    self.step_pages = self.step_pages + need
  else
    -- a start: with the prefix cache, the cached pages come first
    local m, idle = 0, 0
    local limit
    if self.prefix_cache then
      self:hash_request(req)
      limit = attach_limit(self, req)
      m, idle = self.cache:prefix_lookup(limit, req.hashes)
      n = min(n, req.todo - m * self.page_size)
    end
    local fresh = self.prefix_cache and ceil_div(n, self.page_size) or self:pages_for(req, n)
    if idle + fresh > self.cache:free_pages() - self.step_pages then return false, "pages" end
    if self.shared_prefix then
      seq = assert(self.shared_prefix.seq:fork())
    else
      seq = assert(self.cache:sequence())
    end
    if self.prefix_cache then
      local got = seq:prefix_attach(limit, req.hashes)
      assert(got == m, "serve: the prefix cache matched a different prefix than it looked up")
      req.todo = req.todo - m * self.page_size
      req.cached_tokens = req.cached_tokens + m * self.page_size
      req.inserted = m
      if self.checker then self.checker:attach(req, m) end
    elseif self.shared_prefix then
      req.cached_tokens = req.cached_tokens + self.shared_prefix.len
      if self.checker then self.checker:fork(req, self.shared_prefix) end
    elseif self.checker then
      self.checker:fresh(req)
    end
    req.seq = seq
    req.running = true
    remove(self.waiting, req)
    self.running[#self.running + 1] = req
    if req.first_scheduled == nil then req.first_scheduled = self.now end
    self.step_pages = self.step_pages + fresh
  end
  req.scheduled = n
  local k = self.nlist + 1
  self.nlist = k
  self.list[k] = req
  self.step_tokens = self.step_tokens + n
  return true
end

-- Frees a running request's pages; it waits at the front of e.waiting and
-- recomputes its tokens when it starts again.
function Engine:preempt(req)
  check_req(self, req, "preempt")
  if not req.seq then error("serve: engine:preempt: req: request " .. tostring(req.id) .. " is not running", 2) end
  if req.scheduled then -- scheduled already this step: take it back
    local list, n = self.list, self.nlist
    for i = 1, n do
      if list[i] == req then
        for j = i, n - 1 do list[j] = list[j + 1] end
        break
      end
    end
    list[n] = nil
    self.nlist = n - 1
    self.step_tokens = self.step_tokens - req.scheduled
    req.scheduled = nil
    local pages = 0
    for i = 1, self.nlist do
      local r = self.list[i]
      pages = pages + tonumber(C.pa_seq_pages_needed(self.cache.handle, r.seq.id, r.scheduled))
    end
    self.step_pages = pages
  end
  local held = req.seq:len() - (self.shared_prefix and self.shared_prefix.len or 0)
  self.stats.recomputed = self.stats.recomputed + max(0, held)
  if self.prefix_cache then self:insert_pages(req) end
  req.seq:free()
  req.seq, req.running = nil, false
  if self.checker then self.checker:drop(req) end
  req.todo = req.prompt_tokens + req.generated - (self.shared_prefix and self.shared_prefix.len or 0)
  req.preemptions = req.preemptions + 1
  self.stats.preemptions = self.stats.preemptions + 1
  remove(self.running, req)
  table.insert(self.waiting, 1, req)
end

-- Registers req's full pages, past those already registered, in the prefix cache.
function Engine:insert_pages(r)
  local full = min(floor(r.seq:len() / self.page_size), r.nhash)
  if full > r.inserted then
    if self.checker then self.checker:insert(r, r.inserted, full) end
    r.seq:prefix_insert(r.inserted, full - r.inserted, r.hashes)
    r.inserted = full
  end
end

---------------------------------------------------------------------------

-- A policy by name (a built-in: lua/pagedattn/serve/policies/NAME.lua), a
-- path to a .lua file, or a table. The file is loaded with loadfile, so an
-- error in it names its file and line; it receives `api` as `...`
-- (api.policy(name) loads another policy, e.g. to reuse fcfs's parts).
function M.load_policy(name, api)
  api = api or {}
  api.policy = api.policy or function(n) return M.load_policy(n, api) end
  if type(name) == "table" then
    if type(name.step) ~= "function" then error("serve: policy: a table policy needs a step(engine) function", 0) end
    name.name = name.name or "custom"
    return name
  end
  if type(name) ~= "string" then error("serve: policy: expected a name, a .lua file or a table, got " .. type(name), 0) end
  local path = name
  if not name:match("%.lua$") then
    path = package.searchpath("pagedattn.serve.policies." .. name, package.path)
    if not path then
      error("serve: policy: no built-in policy '" .. name .. "' (fcfs, sjf, lpm, priority) and not a .lua file", 0)
    end
  end
  local chunk, err = loadfile(path)
  if not chunk then error("serve: policy '" .. name .. "': " .. err, 0) end
  local p = chunk(api)
  if type(p) ~= "table" or type(p.step) ~= "function" then
    error("serve: policy " .. path .. " must return a table with a step(engine) function", 0)
  end
  p.name = p.name or name
  p.path = path
  return p
end

---------------------------------------------------------------------------
-- the run

-- M.new(o): an engine over a pool that the caller made. o: cache, batch,
-- opts (budget, max_batch, page_size), prefix_cache, shared_prefix, checker.
function M.new(o)
  local e = setmetatable({
    cache = o.cache, batch = o.batch, opts = o.opts, page_size = o.opts.page_size,
    prefix_cache = o.prefix_cache or false, shared_prefix = o.shared_prefix, checker = o.checker,
    running = {}, waiting = {}, now = 0, step = 0,
    list = {}, nlist = 0, step_pages = 0, step_tokens = 0,
    stats = { preemptions = 0, recomputed = 0 },
  }, Engine)
  return e
end

-- One step's policy pass: resets the step, lets the policy schedule, and
-- checks that it kept the lists whole. Returns the number scheduled.
function Engine:plan(policy)
  self.nlist, self.step_pages, self.step_tokens = 0, 0, 0 -- (list entries past nlist are stale)
  local nr, nw = #self.running, #self.waiting
  policy.step(self)
  if #self.running + #self.waiting ~= nr + nw then
    error(string.format("serve: policy %s changed e.running / e.waiting (%d + %d requests became %d + %d): " ..
      "a policy may reorder them, and start or preempt requests only through e:schedule and e:preempt",
      policy.name, nr, nw, #self.running, #self.waiting), 0)
  end
  return self.nlist
end

-- Stages the scheduled requests as one batch (appends to every sequence).
function Engine:stage()
  local b = self.batch
  b:clear()
  local list = self.list
  for i = 1, self.nlist do
    local r = list[i]
    b:add(r.seq, r.scheduled)
  end
  local ok, err = b:stage()
  if not ok then error("serve: staging failed although the policy counted the pages: " .. tostring(err), 0) end
end

-- Advances the scheduled requests by the step that ended at e.now: prefill
-- progress, generated tokens, first-token and finish times; frees the
-- finished ones. Returns how many finished.
function Engine:advance(done)
  local list, finished = self.list, 0
  local totals = self.stats
  local pc = self.prefix_cache
  for i = 1, self.nlist do
    local r = list[i]
    local n = r.scheduled
    r.scheduled = nil
    if r.todo > 0 then
      totals.prefill = totals.prefill + n
      r.todo = r.todo - n
      if r.todo == 0 then r.generated = r.generated + 1 end
    else
      totals.decode = totals.decode + n
      r.generated = r.generated + 1
    end
    if r.first_token == nil and r.generated >= 1 then r.first_token = self.now end
    if pc and floor(tonumber(C.pa_seq_len(self.cache.handle, r.seq.id)) / self.page_size) > r.inserted then
      self:insert_pages(r)
    end
    if r.generated >= r.output_tokens then
      r.finish = self.now
      r.seq:free()
      r.seq, r.running = nil, false
      if self.checker then self.checker:drop(r) end
      r.hashes = nil
      remove(self.running, r)
      finished = finished + 1
      done[#done + 1] = r
    end
  end
  return finished
end

return M
