-- spec/fuzz/pool.lua -- a seeded fuzzer of the page pool (pa.kv_cache):
-- random operations on sequences and batches, each compared with a plain
-- Lua model, and every mistake it can make must be refused without effect.
--
-- The model knows every live sequence's pages and, for each token, a tag that
-- the fuzzer writes into the k cache (as an attention append would), so
-- copy-on-write, sharing, truncation and unstaging are checked on the data
-- too. After every operation: each page's refcount against the references the
-- model counts, each sequence's pages and length, the stats, and
-- cache:validate(). Operations: create, append, reserve (with pages_needed
-- first), fork, truncate, free, batch stages (with a sequence listed twice, a
-- dead one, lengths past 2^30, out of pages) and unstage (the undo record of
-- the last good stage, whatever failed since), stale ids after free (they
-- must stay dead: no id is ever issued twice), bad arguments, closing a batch
-- (its views die), churns of thousands of create/free cycles, and, in half
-- the pools, the prefix cache: inserts of full pages under hashes, attaches
-- of new sequences to cached prefixes, lookups, turning it off and on, and
-- their mistakes. The model knows which page is cached under which hash and
-- the tags each cached page held when it was inserted: a cached page must
-- keep them (nobody writes it; a write into a cached partial page copies it),
-- an attach must find exactly the model's pages, and an allocation may evict
-- only as many idle cached pages as the uncached free ones fall short (which
-- ones is spec/prefix_cache_spec.lua's to check). A call that
-- fails must raise "pagedattn.<fn>: <arg>: ..." or return nil, "...out of
-- pages...", and leave the stats, every sequence, the staged views and the
-- undo record as they were.
--
--   local fuzz = require "spec.fuzz.pool"   -- busted: require "fuzz.pool"
--   local s = fuzz.run{ seed = 1, iters = 2000, device = "cpu", log = print }
--   -- s.ops[name] = {ok =, refused =, out_of_pages =}, s.events, s.seconds
--   fuzz.episode{ seed =, page_size =, num_pages =, steps =, ... }  -- one pool
--
-- A violation raises an error with the seed, the last operations and the
-- command that reruns it. Deterministic for a seed.
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local cache_mod = require "pagedattn.cache"

local M = {}

local floor = math.floor
local MAXSEQ = 2 ^ 30 -- PA_MAX_SEQLEN
local I32_MAX = 2147483647

local function pages_for(n, ps) return floor((n + ps - 1) / ps) end

local function same_list(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local function list_str(t)
  if #t > 12 then return "{" .. table.concat(t, ",", 1, 12) .. ",... (" .. #t .. ")}" end
  return "{" .. table.concat(t, ",") .. "}"
end

local function pick(rng, list) return list[rng:int(1, #list)] end

-- Library bugs this fuzzer found and steps around unless run{strict = true}.
M.KNOWN_BUGS = {} -- (none now: each one found is fixed, with a case in spec/hardening_spec.lua)

function M.rerun(seed, iters, device)
  return string.format("scripts/run scripts/fuzz.lua pool --seed %d --iters %d --device %s", seed, iters, device)
end

-- Functions whose errors the fuzzer may see, and the arguments they may name.
local FNAMES = {}
for _, f in ipairs({ "seq:append", "seq:reserve", "seq:truncate", "seq:fork", "seq:free", "seq:len",
  "seq:pages", "seq:num_pages", "seq:pages_needed", "refcount", "batch:add", "batch:stage",
  "batch:unstage", "to_table", "sequence", "free", "seq:prefix_attach", "seq:prefix_insert", "prefix_lookup",
  "enable_prefix_cache" }) do FNAMES[f] = true end
local ARGS = { seq = true, n = true, len = true, page = true, parent = true, seqs = true, num_new = true,
  batch = true, cache = true, tensor = true, hashes = true, first = true, pool = true, on = true }

-- The argument a raised message names, or nil and why the message is wrong.
local function parse_error(msg)
  if type(msg) ~= "string" then return nil, "the error is a " .. type(msg) end
  local loc, body = msg:match("^([^\n]-:%d+): (.*)$")
  if loc and loc:find("lua/pagedattn/", 1, true) then
    return nil, "the error points inside the package (" .. loc .. ")"
  end
  body = body or msg
  local fname, arg = body:match("^pagedattn%.([%w_:]+): ([%w_]+)[%[%]%d]*:")
  if not fname then return nil, "the message does not start with 'pagedattn.<function>: <argument>:'" end
  if not FNAMES[fname] then return nil, "the message names function '" .. fname .. "'" end
  if not ARGS[arg] then return nil, "the message names '" .. arg .. "', not an argument" end
  return arg
end

---------------------------------------------------------------------------
-- one pool, `steps` operations

-- o: seed, page_size, num_pages, steps, device, layers (0: bookkeeping only;
-- default 1), events (a table counting what happened), ops (per operation
-- outcomes), rerun (text for failures), big (page sizes near 2^20: lengths
-- near 2^30), churn (allow create/free churns), strict (run into the known
-- bugs too), known (a table counting the known bugs stepped around),
-- prefix (the prefix cache is on at the start and its operations run).
function M.episode(o)
  local seed = o.seed
  local rng = ref.rng(seed)
  local ps, N = o.page_size, o.num_pages
  local layers = o.layers == nil and 1 or o.layers
  local Hk, D = 1, 2
  local dev = o.device
  local c
  if layers > 0 then
    c = assert(pa.kv_cache{ num_pages = N, page_size = ps, kv_heads = Hk, head_dim = D, device = dev, layers = layers })
  else
    c = assert(pa.kv_cache{ num_pages = N, page_size = ps, layers = 0 })
  end
  local kc = c.k_cache
  -- the prefix cache while on: page_of[hash] = page, hash_of[page] = hash,
  -- held[page] = {[slot + 1] = tag} (the tags it held when inserted); chains:
  -- hash lists that inserts used (attaches draw from them)
  local pc = nil
  local chains = {}
  if o.prefix then
    assert(c:enable_prefix_cache(true))
    pc = { page_of = {}, hash_of = {}, held = {}, n = 0 }
  end
  local function uncache(p)
    local h = pc.hash_of[p]
    pc.page_of[h], pc.hash_of[p], pc.held[p] = nil, nil, nil
    pc.n = pc.n - 1
  end
  local tok = Hk * D
  -- live sequences: { seq =, pages = {...}, len =, tags = {[t] = tag} } (tags of
  -- the tokens written into the cache; sparse: huge appends write none)
  local model = {}
  local ghosts = {}  -- freed sequences: { obj = the freed Lua object, id = its old id }
  local issued = {}  -- every id handed out by this pool
  local next_tag = 1
  local batches = {} -- { b =, undo = nil | { entries = { {m =, before_len =, before_pages =, num_new =, fresh =} } } }
  local log = {}
  local events = o.events or {}
  local ops = o.ops or {}
  local known = o.known or {}
  local function count(what) events[what] = (events[what] or 0) + 1 end
  local function outcome(op, how)
    ops[op] = ops[op] or { ok = 0, refused = 0, out_of_pages = 0 }
    ops[op][how] = ops[op][how] + 1
  end

  local function fail(msg)
    error(string.format("pool fuzzer: %s\n  after: %s\n  episode seed %d, page_size %d, %d pages, %d layer(s)\n  %s",
      msg, table.concat(log, " ", math.max(1, #log - 16)), seed, ps, N, layers, o.rerun or ""), 0)
  end

  local function new_id(id)
    if issued[id] then fail("sequence id " .. id .. " issued twice (a stale id would answer for it)") end
    issued[id] = true
  end

  local function refcounts()
    local rc = {}
    for p = 0, N - 1 do rc[p] = 0 end
    for _, m in ipairs(model) do
      for _, p in ipairs(m.pages) do
        if p < 0 or p >= N then fail("page id " .. p .. " outside the pool") end
        rc[p] = rc[p] + 1
      end
    end
    return rc
  end

  local function free_count(rc)
    local n = 0
    for p = 0, N - 1 do if rc[p] == 0 then n = n + 1 end end
    return n
  end

  local function check_all()
    local rc = refcounts()
    local used, shared, refs, tokens = 0, 0, 0, 0
    for p = 0, N - 1 do
      if c:refcount(p) ~= rc[p] then
        fail(string.format("page %d: refcount %d, the model counts %d references", p, c:refcount(p), rc[p]))
      end
      if rc[p] > 0 then used = used + 1 end
      if rc[p] > 1 then shared = shared + 1 end
      refs = refs + rc[p]
    end
    for _, m in ipairs(model) do
      if not same_list(m.seq:pages(), m.pages) then
        fail("sequence " .. m.seq.id .. ": pages " .. list_str(m.seq:pages()) .. ", model " .. list_str(m.pages))
      end
      if m.seq:len() ~= m.len then fail("sequence " .. m.seq.id .. ": length " .. m.seq:len() .. ", model " .. m.len) end
      if m.seq:num_pages() ~= #m.pages then fail("sequence " .. m.seq.id .. ": num_pages " .. m.seq:num_pages()) end
      -- pages past the tokens (reserved) are held by this sequence alone
      for j = pages_for(m.len, ps) + 1, #m.pages do
        if rc[m.pages[j]] ~= 1 then fail("reserved page " .. m.pages[j] .. " is shared") end
      end
      tokens = tokens + m.len
    end
    local s = c:stats()
    if s.used_pages ~= used or s.free_pages ~= N - used or s.shared_pages ~= shared or
       s.page_refs ~= refs or s.sequences ~= #model or s.tokens ~= tokens then
      fail(string.format("stats used %d free %d shared %d refs %d seqs %d tokens %d; model %d %d %d %d %d %d",
        s.used_pages, s.free_pages, s.shared_pages, s.page_refs, s.sequences, s.tokens,
        used, N - used, shared, refs, #model, tokens))
    end
    if s.peak_used_pages < used then fail("peak_used_pages " .. s.peak_used_pages .. " < used " .. used) end
    if s.cached_pages ~= (pc and pc.n or 0) then
      fail("stats cached_pages " .. s.cached_pages .. ", the model caches " .. (pc and pc.n or 0))
    end
    local ok, err = pcall(c.validate, c)
    if not ok then fail(tostring(err)) end
  end

  -- every token's tag must be in its slot: sharing, copies and undo kept the data
  local function check_data()
    if not kc then return end
    local all = kc:to_table()
    -- (numeric loops: LuaJIT 2.1.0-beta3, as Debian 12 ships it, compiled a
    -- load indexed by keys from nested pairs() wrong here: it read all[1])
    for p = 0, pc and N - 1 or -1 do
      local held = pc.held[p]
      for slot = 1, held and ps or 0 do
        local tag = held[slot]
        local got = tag and all[(p * ps + slot - 1) * tok + 1]
        if got ~= tag then
          fail(string.format("cached page %d slot %d holds %s, %d when it was cached under %s (a cached page was written)",
            p, slot - 1, tostring(got), tag, tostring(pc.hash_of[p])))
        end
      end
    end
    for _, m in ipairs(model) do
      for t1, tag in pairs(m.tags) do
        local t = t1 - 1
        if t >= m.len then fail("the model keeps a tag past the length of sequence " .. m.seq.id) end
        local p = m.pages[floor(t / ps) + 1]
        local got = all[(p * ps + t % ps) * tok + 1]
        if got ~= tag then
          fail(string.format("sequence %d token %d (page %d slot %d) holds %s, expected %d",
            m.seq.id, t, p, t % ps, tostring(got), tag))
        end
      end
    end
  end

  -- pages a write of n tokens into m takes, given the references already
  -- dropped (drops[p]) by earlier writers of the same batch
  local function plan(m, n, rc, drops)
    if n == 0 then return 0, false, 0 end
    local len = m.len
    local fresh = math.max(0, pages_for(len + n, ps) - #m.pages)
    local cow = false
    if len % ps ~= 0 then
      local p = m.pages[floor(len / ps) + 1]
      -- (a cached page is never written: a write into it copies it first)
      if rc[p] - (drops[p] or 0) > 1 or (pc and pc.hash_of[p]) then
        if rc[p] - (drops[p] or 0) <= 1 then count("copy_of_cached_page") end
        cow = true
        drops[p] = (drops[p] or 0) + 1
      end
    end
    return fresh + (cow and 1 or 0), cow, fresh
  end

  -- after a successful write: C's new page list is the old one with the shared
  -- partial page replaced (if cow) and fresh pages added, all free before
  local function adopt(m, n, cow, was_free, taken)
    local len = m.len
    local got = m.seq:pages()
    local want_len = n == 0 and #m.pages or math.max(#m.pages, pages_for(len + n, ps))
    if #got ~= want_len then fail("sequence " .. m.seq.id .. ": " .. #got .. " pages, expected " .. want_len) end
    local cow_idx = cow and floor(len / ps) + 1 or -1
    for j = 1, want_len do
      if j <= #m.pages and j ~= cow_idx then
        if got[j] ~= m.pages[j] then fail("sequence " .. m.seq.id .. ": page " .. j .. " changed") end
      else
        if not was_free[got[j]] or taken[got[j]] then
          fail("sequence " .. m.seq.id .. ": new page " .. tostring(got[j]) .. " was not free, or taken twice")
        end
        taken[got[j]] = true
      end
    end
    m.pages = got
  end

  -- tags for n new tokens of m (written into the cache when there is one;
  -- a bookkeeping-only pool or a huge append keeps the count only)
  local function write_tokens(m, n)
    local len = m.len
    if kc and n <= 4 * ps + 64 then
      for t = len, len + n - 1 do
        local p = m.pages[floor(t / ps) + 1]
        local vals = {}
        for e = 1, tok do vals[e] = next_tag end
        assert(kc:write(vals, (p * ps + t % ps) * tok))
        m.tags[t + 1] = next_tag
        next_tag = next_tag + 1
      end
    end
    m.len = len + n
  end

  -- the model of a sequence cut to len tokens (its pages are the caller's)
  local function cut(m, len)
    for t in pairs(m.tags) do if t > len then m.tags[t] = nil end end
    m.len = len
  end

  local function free_set()
    local s = {}
    for p = 0, N - 1 do if c:refcount(p) == 0 then s[p] = true end end
    return s
  end

  -- everything a failed call must leave as it was: stats, sequences, the
  -- staged views of every open batch (its undo record is checked by use)
  local function snapshot()
    local snap = { stats = c:stats(), pages = {}, lens = {}, views = {} }
    for i, m in ipairs(model) do snap.pages[i], snap.lens[i] = m.seq:pages(), m.seq:len() end
    for i, bb in ipairs(batches) do
      if bb.b.handle ~= nil then
        snap.views[i] = { bb.b.block_table:to_table(), bb.b.cu_seqlens_q:to_table(), bb.b.positions:to_table(),
          bb.b.kv_indices:to_table() }
      end
    end
    return snap
  end

  local function unchanged(snap, what)
    local now = c:stats()
    for k, v in pairs(snap.stats) do
      if now[k] ~= v then fail(what .. " failed but changed stats." .. k .. " from " .. v .. " to " .. now[k]) end
    end
    for i, m in ipairs(model) do
      if not same_list(snap.pages[i], m.seq:pages()) or snap.lens[i] ~= m.seq:len() then
        fail(what .. " failed but changed sequence " .. m.seq.id)
      end
    end
    for i, v in pairs(snap.views) do
      local b = batches[i].b
      local now_v = { b.block_table:to_table(), b.cu_seqlens_q:to_table(), b.positions:to_table(), b.kv_indices:to_table() }
      for j = 1, #v do
        if not same_list(v[j], now_v[j]) then fail(what .. " failed but changed the staged views of batch " .. i) end
      end
    end
  end

  -- Calls fn(...) expecting a refusal: a raised message naming an argument
  -- (or, when oop is set, nil, "... out of pages ..."), and no change.
  local function expect_failure(op, what, oop, fn, ...)
    local snap = snapshot()
    local ok, r, err = pcall(fn, ...)
    if ok and r ~= nil then fail(what .. ": expected a refusal, it succeeded") end
    if ok then
      if not oop then fail(what .. ": expected an error, got nil, " .. tostring(err)) end
      if type(err) ~= "string" or not err:find("^pagedattn%.[%w_:]+: [%w_]+: out of pages") then
        fail(what .. ": expected 'pagedattn.<fn>: <arg>: out of pages...', got " .. tostring(err))
      end
      outcome(op, "out_of_pages")
    else
      local arg, why = parse_error(r)
      if not arg then fail(what .. ": " .. why .. ":\n    " .. tostring(r)) end
      if oop == "only" then fail(what .. ": expected out of pages, got " .. tostring(r)) end
      outcome(op, "refused")
    end
    unchanged(snap, what)
  end

  local function model_index(m)
    for i, x in ipairs(model) do if x == m then return i end end
  end

  -- Free pages no cache entry names (an allocation takes them first), and
  -- the evictions count now.
  local function uncached_free(rc)
    local n = 0
    for p = 0, N - 1 do if rc[p] == 0 and not (pc and pc.hash_of[p]) then n = n + 1 end end
    return n
  end
  local function evictions() return c:stats().prefix_evictions end

  -- After an allocation of `need` pages took the pages in `taken`: the cached
  -- ones among them were evicted (idle ones only: held pages are never
  -- taken), exactly as many as the uncached free pages fell short.
  local function note_evictions(taken, need, free_before, ev_before, what)
    local n = 0
    for p in pairs(taken) do
      if pc and pc.hash_of[p] then
        uncache(p)
        n = n + 1
      end
    end
    local want = math.max(0, need - free_before)
    if n ~= want then
      fail(string.format("%s took %d cached pages; %d pages needed, %d uncached free: %d should go", what, n, need,
        free_before, want))
    end
    if evictions() - ev_before ~= n then
      fail(string.format("%s: stats prefix_evictions grew by %d, %d cached pages were taken", what,
        evictions() - ev_before, n))
    end
    if n > 0 then count("prefix_evicted") end
  end

  local function write_op(m, n, reserve_only)
    local op = reserve_only and "reserve" or "append"
    local len = m.len
    if len + n > MAXSEQ then
      if m.seq:pages_needed(n) ~= -1 then fail("pages_needed(" .. n .. ") past 2^30 is " .. m.seq:pages_needed(n) .. ", not -1") end
      expect_failure(op, op .. "(" .. n .. ") past 2^30", false, reserve_only and m.seq.reserve or m.seq.append, m.seq, n)
      count("past_max_seqlen")
      return false
    end
    local rc = refcounts()
    local need, cow = plan(m, n, rc, {})
    if m.seq:pages_needed(n) ~= need then
      fail("pages_needed(" .. n .. ") = " .. m.seq:pages_needed(n) .. ", model " .. need)
    end
    local free = free_count(rc)
    if need > free then
      expect_failure(op, op .. "(" .. n .. ")", "only", reserve_only and m.seq.reserve or m.seq.append, m.seq, n)
      count("out_of_pages")
      return false
    end
    local was_free = free_set()
    local free_before, ev_before = uncached_free(rc), evictions()
    local r, err
    if reserve_only then r, err = m.seq:reserve(n) else r, err = m.seq:append(n) end
    if not r then fail("unexpected failure: " .. tostring(err) .. " (need " .. need .. ", free " .. free .. ")") end
    outcome(op, "ok")
    local taken = {}
    adopt(m, n, cow, was_free, taken)
    note_evictions(taken, need, free_before, ev_before, op)
    if not reserve_only then write_tokens(m, n) end
    if cow then count("copy_on_write") end
    return true
  end

  local insert_op, unstage_op -- (below)

  -- Stages a random subset of the live sequences in batch bb; now and then
  -- with a mistake in it (which must change nothing).
  local function stage_op(bb)
    local b = bb.b
    local order = {}
    for i = 1, #model do order[i] = i end
    rng:shuffle(order)
    local k = rng:int(0, #model)
    local rc, drops = refcounts(), {}
    local need, plans = 0, {}
    b:clear()
    local mistake = nil
    local r = rng:uniform()
    if r < 0.06 and k > 0 then mistake = "twice"
    elseif r < 0.1 and #ghosts > 0 then mistake = "dead"
    elseif r < 0.13 and k > 0 then mistake = "past_max"
    elseif r < 0.15 and #ghosts > 0 then mistake = "freed_object" end
    for j = 1, k do
      local m = model[order[j]]
      local n = rng:int(0, 2 * ps + 1)
      if o.big then n = rng:int(0, 3) end -- (staging writes a position per new token)
      local nd, cow, fresh = plan(m, n, rc, drops)
      need = need + nd
      plans[j] = { m = m, n = n, cow = cow, fresh = fresh, before_len = m.len, before_pages = #m.pages }
      b:add(m.seq, n)
    end
    if mistake == "twice" then
      local j = rng:int(1, k)
      b:add(plans[j].m.seq, rng:int(0, 2))
      log[#log + 1] = "stage(" .. k .. "+twice)"
      expect_failure("stage", "a stage listing a sequence twice", false, b.stage, b)
      count("stage_twice")
      return
    elseif mistake == "dead" then
      local g = pick(rng, ghosts)
      b:add({ id = g.id }, 1) -- what add() stores for a stale object
      log[#log + 1] = "stage(" .. k .. "+stale)"
      expect_failure("stage", "a stage with a stale sequence id", false, b.stage, b)
      count("stage_stale")
      return
    elseif mistake == "freed_object" then
      local g = pick(rng, ghosts)
      b:add(g.obj, 1)
      log[#log + 1] = "stage(" .. k .. "+freed)"
      expect_failure("stage", "a stage with a freed sequence", false, b.stage, b)
      return
    elseif mistake == "past_max" then
      local j = rng:int(1, k)
      local m = plans[j].m
      local n = math.min(I32_MAX, MAXSEQ - m.len + rng:int(1, 3))
      b.counts[j - 1] = n -- what add() stores
      log[#log + 1] = "stage(" .. k .. "+past2^30)"
      expect_failure("stage", "a stage past 2^30 tokens", false, b.stage, b)
      count("past_max_seqlen")
      return
    end
    for _, pl in ipairs(plans) do
      if pl.before_len + pl.n > MAXSEQ then
        log[#log + 1] = "stage(" .. k .. ", past 2^30)"
        expect_failure("stage", "a stage past 2^30 tokens", false, b.stage, b)
        count("past_max_seqlen")
        return
      end
    end
    local free = free_count(rc)
    local snap, was_free = snapshot(), free_set()
    local free_before, ev_before = uncached_free(rc), evictions()
    local ok, err = b:stage()
    log[#log + 1] = "stage(" .. k .. ")"
    if need > free then
      if ok then fail("stage: expected out of pages: need " .. need .. ", free " .. free) end
      if not tostring(err):find("^pagedattn%.batch:stage: seqs: out of pages") then fail("stage: unexpected error: " .. tostring(err)) end
      unchanged(snap, "stage")
      count("batch_out_of_pages")
      outcome("stage", "out_of_pages")
      return
    end
    if not ok then fail("stage: unexpected failure: " .. tostring(err) .. " (need " .. need .. ", free " .. free .. ")") end
    outcome("stage", "ok")
    if b.new_pages ~= need then fail("stage took " .. b.new_pages .. " pages, model " .. need) end
    count("batch")
    if b.cow_copies > 0 then count("batch_copy_on_write") end
    local taken = {}
    -- the staged tables, against the model
    local bt, cu, used, cs = b.block_table:to_table(), b.cu_seqlens_q:to_table(),
      b.seqused_k:to_table(), b.cache_seqlens:to_table()
    local pos, bidx = b.positions:to_table(), b.batch_indices:to_table()
    local ip, idx, last = b.kv_indptr:to_table(), b.kv_indices:to_table(), b.kv_last_page_len:to_table()
    local W, q_at, nnz = b.max_pages, 0, 0
    if b.size ~= k or b.total_q ~= #pos then fail("stage: size " .. b.size .. " / total_q " .. b.total_q) end
    local undo = {}
    for j, pl in ipairs(plans) do
      local m, n = pl.m, pl.n
      local before = m.len
      adopt(m, n, pl.cow, was_free, taken)
      write_tokens(m, n)
      local after = m.len
      local np = pages_for(after, ps)
      if cs[j] ~= before or used[j] ~= after or cu[j] ~= q_at or cu[j + 1] ~= q_at + n then
        fail("stage entry " .. j .. ": cache_seqlens/seqused_k/cu_seqlens_q wrong")
      end
      for t = 0, n - 1 do
        if pos[q_at + t + 1] ~= before + t then fail("stage entry " .. j .. ": position " .. t .. " wrong") end
        if bidx[q_at + t + 1] ~= j - 1 then fail("stage entry " .. j .. ": batch index wrong") end
      end
      for col = 1, W do
        local want = col <= np and m.pages[col] or 0
        if bt[(j - 1) * W + col] ~= want then fail("stage entry " .. j .. ": block_table column " .. col) end
      end
      if ip[j] ~= nnz or ip[j + 1] ~= nnz + np then fail("stage entry " .. j .. ": kv_indptr") end
      for col = 1, np do
        if idx[nnz + col] ~= m.pages[col] then fail("stage entry " .. j .. ": kv_indices") end
      end
      local want_last = np == 0 and 0 or after - (np - 1) * ps
      if last[j] ~= want_last then fail("stage entry " .. j .. ": kv_last_page_len " .. last[j] .. ", want " .. want_last) end
      q_at, nnz = q_at + n, nnz + np
      undo[j] = { m = m, before_len = pl.before_len, before_pages = pl.before_pages, num_new = n, fresh = pl.fresh }
    end
    note_evictions(taken, need, free_before, ev_before, "stage")
    bb.undo, bb.skip_unstage = undo, nil
    -- pages the stage filled go into the cache now and then (as a server
    -- registers a prefill): an unstage must take them out again
    if pc and k > 0 and rng:uniform() < 0.3 then
      -- mostly one that had reserved pages: an unstage keeps those
      local pl = plans[rng:int(1, k)]
      for _, x in ipairs(plans) do
        if x.before_pages > pages_for(x.before_len, ps) and rng:uniform() < 0.7 then pl = x end
      end
      insert_op(pl.m, floor(pl.before_len / ps))
      if rng:uniform() < 0.5 then unstage_op(bb) end
    end
  end

  -- Undoes batch bb's last good stage; the model predicts refusals.
  function unstage_op(bb)
    local b = bb.b
    if bb.skip_unstage then return end
    log[#log + 1] = "unstage"
    if not bb.undo then
      expect_failure("unstage", "unstage with nothing staged", false, b.unstage, b)
      return
    end
    for _, u in ipairs(bb.undo) do
      if not model_index(u.m) or u.m.len ~= u.before_len + u.num_new or #u.m.pages ~= u.before_pages + u.fresh then
        expect_failure("unstage", "unstage after a staged sequence changed", false, b.unstage, b)
        count("unstage_refused")
        return
      end
    end
    -- a page the stage filled, shared by a fork since, would be reserved
    -- again by the undo: the library refuses the undo then
    local rc = refcounts()
    local shared_reserved = false
    for _, u in ipairs(bb.undo) do
      for j = pages_for(u.before_len, ps) + 1, u.before_pages do
        if rc[u.m.pages[j]] > 1 then shared_reserved = true end
      end
    end
    if shared_reserved then
      expect_failure("unstage", "unstage after a fork shares pages it filled", false, b.unstage, b)
      count("unstage_refused")
      return
    end
    local snap = snapshot()
    local ok, err = pcall(b.unstage, b)
    if not ok then
      -- refusing is a fix of the bug above too; otherwise a refusal is wrong
      if not shared_reserved then fail("unstage refused: " .. tostring(err)) end
      local _, why = parse_error(err)
      if why then fail("unstage: " .. why .. ": " .. tostring(err)) end
      unchanged(snap, "unstage")
      outcome("unstage", "refused")
      return
    end
    outcome("unstage", "ok")
    for _, u in ipairs(bb.undo) do
      local m = u.m
      local np = pages_for(u.before_len, ps)
      local got = m.seq:pages()
      -- the token pages as before the stage; of the reserved ones, those a
      -- fix may drop (shared ones) may be gone
      for j = 1, np do
        if got[j] ~= m.pages[j] then fail("unstage: sequence " .. m.seq.id .. ": page " .. j .. " changed") end
      end
      for j = np + 1, #got do
        local ok_page = false
        for k = np + 1, u.before_pages do if got[j] == m.pages[k] then ok_page = true end end
        if not ok_page then fail("unstage: sequence " .. m.seq.id .. ": page " .. got[j] .. " is not one it held") end
      end
      if #got ~= u.before_pages and not shared_reserved then
        fail("unstage: sequence " .. m.seq.id .. " holds " .. #got .. " pages, " .. u.before_pages .. " before the stage")
      end
      m.pages = got
      cut(m, u.before_len)
      -- pages past the tokens are written without a copy: out of the cache
      for j = np + 1, #got do
        if pc and pc.hash_of[got[j]] then uncache(got[j]); count("prefix_uncached_by_unstage") end
      end
    end
    bb.undo = nil
    count("unstage")
  end

  local function free_op(i)
    local m = model[i]
    local id = m.seq.id
    m.seq:free()
    if m.seq.id ~= -1 then fail("a freed sequence object keeps its id") end
    table.remove(model, i)
    ghosts[#ghosts + 1] = { obj = m.seq, id = id }
    outcome("free", "ok")
  end

  -- A freed sequence: its Lua object is dead, and its C id too (a stale id
  -- must never answer for another sequence).
  local Sequence = cache_mod.Sequence
  local function stale_op()
    local g = pick(rng, ghosts)
    local ghost = setmetatable({ cache = c, id = g.id }, Sequence)
    log[#log + 1] = "stale(" .. g.id .. ")"
    if ghost:len() ~= -1 or ghost:num_pages() ~= -1 or #ghost:pages() ~= 0 or ghost:pages_needed(1) ~= -1
      or ghost:is_live() then
      fail("stale id " .. g.id .. " answers: len " .. ghost:len() .. ", pages " .. list_str(ghost:pages()))
    end
    local r = rng:int(1, 6)
    if r == 1 then expect_failure("stale", "append on a stale id", false, ghost.append, ghost, 1)
    elseif r == 2 then expect_failure("stale", "fork of a stale id", false, ghost.fork, ghost)
    elseif r == 3 then expect_failure("stale", "truncate of a stale id", false, ghost.truncate, ghost, 0)
    elseif r == 4 then expect_failure("stale", "free of a stale id", false, ghost.free, ghost)
    elseif r == 5 then expect_failure("stale", "reserve on a stale id", false, ghost.reserve, ghost, 1)
    else
      -- the freed Lua object itself: an error naming seq, or harmless free
      local obj = g.obj
      local m = pick(rng, { "append", "len", "fork", "pages", "truncate" })
      expect_failure("stale", m .. " on a freed sequence", false, obj[m], obj, 0)
      obj:free() -- twice is harmless
    end
    count("stale")
  end

  local function bad_args_op()
    local r = rng:int(1, 9)
    local m = #model > 0 and pick(rng, model) or nil
    local bad_n = pick(rng, { -1, 1.5, 2 ^ 31, "x", 0 / 0, 1 / 0, -2 ^ 31 })
    if m and r == 1 then expect_failure("bad_args", "append(" .. tostring(bad_n) .. ")", false, m.seq.append, m.seq, bad_n)
    elseif m and r == 2 then expect_failure("bad_args", "reserve(" .. tostring(bad_n) .. ")", false, m.seq.reserve, m.seq, bad_n)
    elseif m and r == 3 then
      local len = pick(rng, { -1, m.len + 1, m.len + ps, 0.5, I32_MAX, 2 ^ 40 })
      expect_failure("bad_args", "truncate(" .. len .. ")", false, m.seq.truncate, m.seq, len)
    elseif m and r == 4 then expect_failure("bad_args", "pages_needed(" .. tostring(bad_n) .. ")", false, m.seq.pages_needed, m.seq, bad_n)
    elseif r == 5 then
      local p = pick(rng, { N, -1, N + 100, I32_MAX })
      expect_failure("bad_args", "refcount(" .. p .. ")", false, c.refcount, c, p)
    elseif m and r == 6 then
      local bb = pick(rng, batches)
      expect_failure("bad_args", "batch:add(" .. tostring(bad_n) .. ")", false, bb.b.add, bb.b, m.seq, bad_n)
      bb.b:clear()
    elseif r == 7 then
      local bb = pick(rng, batches)
      local v = pick(rng, { "block_table", "positions", "cu_seqlens_q" })
      -- a view must not be freed by the user: it belongs to its batch
      expect_failure("bad_args", "free of a batch view", false, bb.b[v].free, bb.b[v])
    elseif m and r == 8 then
      -- appending past PA_MAX_SEQLEN from a (possibly) long sequence
      local n = math.min(I32_MAX, MAXSEQ - m.len + rng:int(1, 5))
      write_op(m, n, rng:uniform() < 0.5)
      return
    else
      -- a batch closed: its views die with it, using one is an error naming it
      local i = rng:int(1, #batches)
      local bb = batches[i]
      local view = bb.b[pick(rng, { "block_table", "seqused_k", "kv_indices" })]
      bb.b:close()
      local ok, err = pcall(view.to_table, view)
      if ok or not tostring(err):find("pagedattn.to_table: tensor: its batch was closed", 1, true) then
        fail("a closed batch's view: " .. (ok and "still readable" or tostring(err)))
      end
      expect_failure("bad_args", "stage on a closed batch", false, bb.b.stage, bb.b)
      batches[i] = { b = assert(c:batch{ capacity = rng:int(1, 8), csr = true }) }
      count("batch_closed")
      outcome("close_batch", "ok")
      return
    end
    count("bad_args")
  end

  ---------------------------------------------------------------------------
  -- the prefix cache

  -- a hash label: mostly from a small range, so that inserts meet hashes
  -- cached under other pages (the first page cached under a hash stays)
  local function label()
    if rng:uniform() < 0.7 then return rng:int(1, 3 * N) end
    return rng:int(1, 2 ^ 40)
  end

  -- hashes for m's first k pages: a cached page's own, else a fresh label
  local function chain_for(m, k)
    local hs = {}
    for j = 1, k do hs[j] = pc.hash_of[m.pages[j]] or label() end
    return hs
  end

  local function new_sequence()
    local s = assert(c:sequence())
    new_id(s.id)
    local m = { seq = s, pages = {}, len = 0, tags = {} }
    model[#model + 1] = m
    return m
  end

  -- inserts pages of m from `first` on (default: a random first page)
  function insert_op(m, from)
    local full = floor(m.len / ps)
    local first = from and math.min(from, full) or rng:int(0, full)
    local n = rng:int(math.min(1, full - first), full - first)
    local hs = chain_for(m, first + n)
    local r = rng:uniform()
    log[#log + 1] = "prefix_insert(" .. m.seq.id .. "," .. first .. "," .. n .. ")"
    if r < 0.06 then
      n = full - first + rng:int(1, 3)
      for j = #hs + 1, first + n do hs[j] = label() end
      expect_failure("prefix_insert", "an insert of pages that are not full", false, m.seq.prefix_insert, m.seq,
        first, n, hs)
      return
    elseif r < 0.14 then
      local cached = {}
      for j = first + 1, first + n do if pc.hash_of[m.pages[j]] then cached[#cached + 1] = j end end
      if #cached > 0 then
        local j = pick(rng, cached)
        hs[j] = pc.hash_of[m.pages[j]] + rng:int(1, 5)
        expect_failure("prefix_insert", "an insert naming a cached page by another hash", false, m.seq.prefix_insert,
          m.seq, first, n, hs)
        count("prefix_insert_other_hash")
        return
      end
    elseif r < 0.2 then
      local bad = rng:int(1, 5)
      if bad == 1 then first = -1
      elseif bad == 2 then n = -rng:int(1, 3)
      elseif bad == 3 then n = n + 0.5
      elseif bad == 4 and first + n > 0 then hs[rng:int(1, first + n)] = pick(rng, { -1, 0.5, "x", 2 ^ 53 })
      else hs[first + n] = nil; n = n + 1 end
      expect_failure("prefix_insert", "an insert with a bad argument (" .. bad .. ")", false, m.seq.prefix_insert,
        m.seq, first, n, hs)
      return
    end
    local added = 0
    for j = first + 1, first + n do
      local p, h = m.pages[j], hs[j]
      if not pc.hash_of[p] and not pc.page_of[h] then
        local held = {}
        if kc then for slot = 1, ps do held[slot] = m.tags[(j - 1) * ps + slot] end end
        pc.page_of[h], pc.hash_of[p], pc.held[p], pc.n = p, h, held, pc.n + 1
        added = added + 1
      end
    end
    local got = m.seq:prefix_insert(first, n, hs)
    if got ~= added then fail("prefix_insert cached " .. tostring(got) .. " pages, the model " .. added) end
    if first + n > 0 then chains[#chains + 1] = hs end
    outcome("prefix_insert", "ok")
    if added > 0 then count("prefix_inserted") end
  end

  local function attach_op()
    -- hashes: a chain an insert used, cut or extended, or two end to end
    local hs = {}
    if #chains > 0 then
      -- mostly one of the last inserts' chains (likelier still cached), from its start
      local ch = rng:uniform() < 0.7 and chains[#chains - rng:int(0, math.min(#chains, 4) - 1)] or pick(rng, chains)
      for j = 1, rng:int(rng:uniform() < 0.8 and 1 or 0, #ch) do hs[j] = ch[j] end
      local r = rng:uniform()
      if r < 0.3 then
        for _ = 1, rng:int(1, 3) do hs[#hs + 1] = label() end
      elseif r < 0.45 then
        for _, h in ipairs(pick(rng, chains)) do hs[#hs + 1] = h end
      end
    else
      for j = 1, rng:int(0, 4) do hs[j] = label() end
    end
    local n = #hs
    local pages = {}
    for j = 1, n do
      local p = pc.page_of[hs[j]]
      if not p then break end
      pages[j] = p
    end
    local matched = #pages
    -- a lookup changes nothing and agrees (idle: matched entries no sequence holds)
    local rc = refcounts()
    local idle = 0
    for _, p in ipairs(pages) do if rc[p] == 0 then idle = idle + 1 end end
    local lm, li = c:prefix_lookup(n, hs)
    if lm ~= matched or li ~= idle then
      fail(string.format("prefix_lookup: %d matched, %d idle; the model %d, %d", lm, li, matched, idle))
    end
    local r = rng:uniform()
    if r < 0.08 and #model > 0 then
      -- attach starts an empty sequence
      local m = pick(rng, model)
      if #m.pages > 0 then
        log[#log + 1] = "prefix_attach(nonempty " .. m.seq.id .. ")"
        expect_failure("prefix_attach", "an attach to a sequence holding pages", false, m.seq.prefix_attach, m.seq, n, hs)
        return
      end
    end
    local m = new_sequence()
    log[#log + 1] = "prefix_attach(" .. m.seq.id .. "," .. n .. ")"
    if r > 0.94 then
      local bad = rng:int(1, 3)
      local bn, bh = n, hs
      if bad == 1 then bn = -1 elseif bad == 2 then bn = n + 1 else bh = "hashes" end
      expect_failure("prefix_attach", "an attach with a bad argument (" .. bad .. ")", false, m.seq.prefix_attach,
        m.seq, bn, bh)
      return
    end
    if matched * ps > MAXSEQ then
      expect_failure("prefix_attach", "an attach past 2^30 tokens", false, m.seq.prefix_attach, m.seq, n, hs)
      count("prefix_attach_past_max")
      return
    end
    local before = c:stats()
    local got = m.seq:prefix_attach(n, hs)
    if got ~= matched then fail("prefix_attach matched " .. tostring(got) .. " pages, the model " .. matched) end
    local after = c:stats()
    if after.prefix_hits - before.prefix_hits ~= matched or after.prefix_misses - before.prefix_misses ~= n - matched then
      fail("prefix_attach: hits/misses grew by " .. (after.prefix_hits - before.prefix_hits) .. "/" ..
        (after.prefix_misses - before.prefix_misses) .. ", the model " .. matched .. "/" .. (n - matched))
    end
    m.pages, m.len = pages, matched * ps
    for j, p in ipairs(pages) do
      local held = pc.held[p]
      if kc then for slot = 1, ps do m.tags[(j - 1) * ps + slot] = held[slot] end end
    end
    outcome("prefix_attach", "ok")
    if matched > 0 then
      count("prefix_attached")
      check_data() -- the attached tokens are the cached ones
    end
  end

  -- on and off (off: every page leaves the cache; idle ones become free)
  local function toggle_op()
    local on = pc == nil
    if rng:uniform() < 0.2 then on = pc ~= nil end -- the same state again: nothing changes
    log[#log + 1] = "prefix_cache(" .. tostring(on) .. ")"
    if rng:uniform() < 0.1 then
      expect_failure("prefix_toggle", "enable_prefix_cache with a non-boolean", false, c.enable_prefix_cache, c,
        pick(rng, { 1, "on", {} }))
      return
    end
    assert(c:enable_prefix_cache(on))
    if not on then pc = nil
    elseif not pc then pc = { page_of = {}, hash_of = {}, held = {}, n = 0 } end
    chains = on and chains or {}
    outcome("prefix_toggle", "ok")
  end

  local function prefix_op()
    if rng:uniform() < (pc and 0.03 or 0.3) then return toggle_op() end
    if not pc then
      -- off: lookups find nothing, the other calls are refused
      local lm, li = c:prefix_lookup(2, { label(), label() })
      if lm ~= 0 or li ~= 0 then fail("prefix_lookup with the cache off: " .. lm .. ", " .. li) end
      local m = #model > 0 and pick(rng, model) or new_sequence()
      if rng:uniform() < 0.5 then
        expect_failure("prefix_off", "prefix_insert with the cache off", false, m.seq.prefix_insert, m.seq, 0, 0, {})
      else
        expect_failure("prefix_off", "prefix_attach with the cache off", false, m.seq.prefix_attach, m.seq, 1, { 1 })
      end
      return
    end
    if #model > 0 and rng:uniform() < 0.5 then insert_op(pick(rng, model)) else attach_op() end
  end

  -- Thousands of create/free cycles: ids must stay unique (issue 46: they
  -- came back after 2,048), and the stale ones dead.
  local function churn_op()
    local n = rng:int(1500, 2500)
    log[#log + 1] = "churn(" .. n .. ")"
    local first
    for _ = 1, n do
      local s = assert(c:sequence())
      new_id(s.id)
      first = first or s.id
      s:free()
    end
    ghosts[#ghosts + 1] = { obj = setmetatable({ cache = c, id = -1 }, Sequence), id = first }
    count("churn")
    outcome("churn", "ok")
  end

  for _ = 1, rng:int(1, 2) do batches[#batches + 1] = { b = assert(c:batch{ capacity = rng:int(1, 8), csr = true }) } end
  for step = 1, o.steps do
    local r = rng:uniform()
    if o.prefix and r < 0.15 then
      prefix_op()
      r = nil
    elseif o.prefix then
      r = (r - 0.15) / 0.85
    end
    -- a nearly full pool mostly fails: give pages back more often then
    if r and c:free_pages() < N / 5 and rng:uniform() < 0.6 then r = 0.55 + 0.2 * rng:uniform() end
    if not r then -- (a prefix cache operation ran)
    elseif #model == 0 or r < 0.08 then
      new_sequence()
      log[#log + 1] = "create"
      outcome("create", "ok")
    else
      local i = rng:int(1, #model)
      local m = model[i]
      if r < 0.28 then
        local n = rng:int(0, 3 * ps)
        if o.big then n = pick(rng, { rng:int(0, 40), rng:int(0, 3 * ps), math.max(0, MAXSEQ - m.len - rng:int(0, 2)) }) end
        if n > MAXSEQ - m.len and not o.big then n = 0 end
        if rng:uniform() < 0.05 then n = math.min(I32_MAX, (N + 1) * ps) end -- certainly too many
        log[#log + 1] = "append(" .. m.seq.id .. "," .. n .. ")"
        write_op(m, n, false)
      elseif r < 0.36 then
        local n = rng:int(0, 2 * ps)
        log[#log + 1] = "reserve(" .. m.seq.id .. "," .. n .. ")"
        write_op(m, n, true)
      elseif r < 0.46 then
        local kid = assert(m.seq:fork())
        new_id(kid.id)
        local np = pages_for(m.len, ps)
        local pages, tags = {}, {}
        for j = 1, np do pages[j] = m.pages[j] end
        for t, tag in pairs(m.tags) do tags[t] = tag end
        model[#model + 1] = { seq = kid, pages = pages, len = m.len, tags = tags }
        log[#log + 1] = "fork(" .. m.seq.id .. ")"
        outcome("fork", "ok")
      elseif r < 0.56 then
        local len = rng:int(0, m.len)
        if m.len > 100 and rng:uniform() < 0.5 then len = m.len - rng:int(0, 40) end
        m.seq:truncate(len)
        cut(m, len)
        for j = #m.pages, pages_for(len, ps) + 1, -1 do m.pages[j] = nil end
        log[#log + 1] = "truncate(" .. m.seq.id .. "," .. len .. ")"
        outcome("truncate", "ok")
      elseif r < 0.64 then
        log[#log + 1] = "free(" .. m.seq.id .. ")"
        free_op(i)
      elseif r < 0.78 then
        stage_op(pick(rng, batches))
      elseif r < 0.84 then
        unstage_op(pick(rng, batches))
      elseif r < 0.89 and #ghosts > 0 then
        stale_op()
      elseif r < 0.985 then
        log[#log + 1] = "bad_args"
        bad_args_op()
      elseif o.churn ~= false then
        churn_op()
      end
    end
    check_all()
    if step % 10 == 0 then check_data() end
  end
  check_data()
  -- everything goes back
  for i = #model, 1, -1 do free_op(i) end
  check_all()
  local s = c:stats()
  if s.free_pages ~= N or s.used_pages ~= 0 or s.shared_pages ~= 0 or s.page_refs ~= 0 or s.tokens ~= 0 then
    fail("after freeing every sequence the pool is not empty")
  end
  c:close()
end

---------------------------------------------------------------------------
-- the run: episodes of random configurations until `iters` operations

local CONFIGS = {
  { page_size = 1, num_pages = 24 },
  { page_size = 3, num_pages = 16 },
  { page_size = 4, num_pages = 40 },
  { page_size = 16, num_pages = 12 },
  { page_size = 5, num_pages = 30, layers = 2 },
  { page_size = 2, num_pages = 8, layers = 0 },
  -- pages of a million tokens, no tensors: lengths near 2^30 (PA_MAX_SEQLEN)
  { page_size = 2 ^ 20 + 7, num_pages = 1100, layers = 0, big = true },
}
M.CONFIGS = CONFIGS

-- run{ seed =, iters = operations, device =, log = function(line), steps =
-- operations per pool (default 100-400), case = i (only the i-th pool),
-- strict = true (also where M.KNOWN_BUGS would strike) } ->
-- summary: seed, iters, device,
-- episodes, ops[name] = {ok, refused, out_of_pages}, events, seconds.
function M.run(o)
  o = o or {}
  local seed = assert(tonumber(o.seed), "fuzz.pool.run: seed: a number expected")
  local iters = o.iters or 2000
  local dev = o.device
  if type(dev) ~= "table" then
    local d, err = pa.device(dev or "cpu")
    if not d then error("fuzz.pool.run: device " .. tostring(dev) .. ": " .. tostring(err), 2) end
    dev = d
  end
  local st = { seed = seed, iters = iters, device = dev.name, episodes = 0, ops = {}, events = {}, known = {} }
  local master = ref.rng(seed)
  local t0 = os.clock()
  local done, next_log = 0, o.log_every or 10000
  while done < iters do
    -- four draws a pool, whatever it does: pool i can be rerun alone (case = i)
    local cfg = CONFIGS[master:int(1, #CONFIGS)]
    local steps = math.min(iters - done, o.steps or master:int(100, 400))
    local ep_seed = floor(master:uniform() * 2 ^ 52)
    local prefix = master:uniform() < 0.5
    st.episodes = st.episodes + 1
    if not o.case or o.case == st.episodes then
      M.episode{ seed = ep_seed, page_size = cfg.page_size, num_pages = cfg.num_pages, layers = cfg.layers,
        big = cfg.big, prefix = prefix, steps = steps, device = dev, events = st.events, ops = st.ops, known = st.known, strict = o.strict,
        rerun = string.format("pool %d of the run; rerun: %s  (this pool alone: --case %d)", st.episodes,
          M.rerun(seed, iters, dev.name), st.episodes) }
    end
    done = done + steps
    if o.log and (done >= next_log or done >= iters) then
      next_log = next_log + (o.log_every or 10000)
      o.log(string.format("pool %s: %d/%d operations, %d pools (%.1f s)", dev.name, done, iters, st.episodes, os.clock() - t0))
    end
    collectgarbage()
  end
  st.seconds = os.clock() - t0
  return st
end

function M.report(s)
  local lines = { string.format("pool fuzzer on %s: seed %d, %d operations on %d pools in %.1f s",
    s.device, s.seed, s.iters, s.episodes, s.seconds) }
  local names, parts = {}, {}
  for k in pairs(s.ops) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do
    local m = s.ops[k]
    parts[#parts + 1] = string.format("%s %d/%d/%d", k, m.ok, m.refused, m.out_of_pages)
  end
  lines[#lines + 1] = "  operations (ok/refused/out of pages): " .. table.concat(parts, ", ")
  local ev = {}
  for k, n in pairs(s.events) do ev[#ev + 1] = k .. " " .. n end
  table.sort(ev)
  lines[#lines + 1] = "  events: " .. table.concat(ev, ", ")
  local known = {}
  for k, n in pairs(s.known or {}) do known[#known + 1] = k .. " " .. n end
  table.sort(known)
  if #known > 0 then lines[#lines + 1] = "  known library bugs stepped around (--strict runs them): " .. table.concat(known, ", ") end
  return table.concat(lines, "\n")
end

return M
