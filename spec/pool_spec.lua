-- Specs of the page pool and sequences (lua/pagedattn/cache.lua over
-- src/core/pool.c): unit cases, then random sequences of operations compared
-- with a plain Lua model. The model knows every sequence's pages and, for each
-- token, a tag value that the spec writes into the cache tensors (as an
-- attention append would), so copy-on-write, sharing and truncation are
-- checked on the data too, not only on the bookkeeping.
-- Rerun a failure with the printed seed: PAGEDATTN_SEED=N scripts/test spec/pool_spec.lua
local pa = require "pagedattn"
local G = require "gpu_helpers"
local H = require "helpers"

local SPEC = "spec/pool_spec.lua"
local cpu = assert(pa.device("cpu"))

local function pages_for(n, ps) return math.floor((n + ps - 1) / ps) end

local function same_list(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local function list_str(t) return "{" .. table.concat(t, ",") .. "}" end

describe("page pool", function()
  describe("creation", function()
    it("makes its tensors, or takes given ones", function()
      local c = assert(pa.kv_cache{ num_pages = 10, page_size = 4, kv_heads = 2, head_dim = 8,
        dtype = "f16", device = cpu, layers = 2 })
      assert.same({ 10, 4, 2, 8 }, c.k_cache.shape)
      assert.equal(2, #c.k_caches)
      assert.equal("f16", c.v_caches[2].dtype)
      local s = c:stats()
      assert.same({ 10, 4, 10, 0, 0 }, { s.num_pages, s.page_size, s.free_pages, s.used_pages, s.shared_pages })
      local k, v = pa.tensor({ 6, 3, 1, 4 }, "f32", cpu), pa.tensor({ 6, 3, 1, 4 }, "f32", cpu)
      local c2 = assert(pa.kv_cache{ k_cache = k, v_cache = v })
      assert.equal(6, c2.num_pages)
      assert.equal(3, c2.page_size)
      local c3 = assert(pa.kv_cache{ num_pages = 5, page_size = 7, layers = 0 })
      assert.equal(5, c3:free_pages())
      c:close(); c2:close(); c3:close()
      c:close() -- twice is harmless
    end)

    it("names the argument that is wrong", function()
      local k = pa.tensor({ 6, 3, 1, 4 }, "f32", cpu)
      local function err(opts) return H.error_of(pa.kv_cache, opts) end
      assert.matches("num_pages: expected a whole number >= 1", err{ num_pages = 0, page_size = 4, layers = 0 })
      assert.matches("page_size: expected a whole number >= 1", err{ num_pages = 4, page_size = 1.5, layers = 0 })
      assert.matches("kv_heads: expected", err{ num_pages = 4, page_size = 4, head_dim = 8 })
      assert.matches("bogus: unknown option", err{ num_pages = 4, page_size = 4, layers = 0, bogus = 1 })
      assert.matches("v_cache: expected a tensor", err{ k_cache = k })
      assert.matches("v_caches%[0%]: shape %[6, 3, 1, 5%] differs",
        err{ k_cache = k, v_cache = pa.tensor({ 6, 3, 1, 5 }, "f32", cpu) })
      assert.matches("v_caches%[0%]: dtype f16 differs",
        err{ k_cache = k, v_cache = pa.tensor({ 6, 3, 1, 4 }, "f16", cpu) })
      assert.matches("v_caches%[0%]: is the same tensor as k_caches%[0%]", err{ k_cache = k, v_cache = k })
      assert.matches("k_caches%[0%]: expected 4 dimensions",
        err{ k_cache = pa.tensor({ 6, 3, 4 }, "f32", cpu), v_cache = pa.tensor({ 6, 3, 4 }, "f32", cpu) })
      local v = pa.tensor({ 6, 3, 1, 4 }, "f32", cpu)
      assert.matches("k_caches%[1%]: shape %[7, 3, 1, 4%], expected %[6, 3, Hk, D%]",
        err{ k_caches = { k, pa.tensor({ 7, 3, 1, 4 }, "f32", cpu) },
             v_caches = { v, pa.tensor({ 7, 3, 1, 4 }, "f32", cpu) } })
      assert.matches("the same tensor serves layer 0 too",
        err{ k_caches = { k, k }, v_caches = { v, pa.tensor({ 6, 3, 1, 4 }, "f32", cpu) } })
      assert.matches("k_cache: give k_cache/v_cache or k_caches/v_caches",
        err{ k_cache = k, v_cache = v, k_caches = { k }, v_caches = { v } })
    end)
  end)

  describe("sequences", function()
    local c
    before_each(function()
      c = assert(pa.kv_cache{ num_pages = 8, page_size = 4, layers = 0 })
    end)
    after_each(function() c:validate(); c:close() end)

    it("append takes pages in order; reserve makes room without growing", function()
      local s = c:sequence()
      assert.equal(0, s:len())
      assert.equal(s, s:append(5))
      assert.equal(5, s:len())
      assert.same({ 0, 1 }, s:pages())
      assert.equal(0, s:pages_needed(3))
      assert.equal(1, s:pages_needed(4))
      assert(s:reserve(7))
      assert.equal(5, s:len())
      assert.equal(3, s:num_pages())
      assert.equal(12, s:capacity())
      assert.equal(0, s:pages_needed(7))
      local before = c:stats()
      assert(s:append(7))
      assert.equal(before.free_pages, c:stats().free_pages) -- reserved: nothing more taken
      assert.equal(12, s:len())
      assert(s:append(0))
      local st = c:stats()
      assert.same({ 5, 3, 0, 3, 1, 12 },
        { st.free_pages, st.used_pages, st.shared_pages, st.page_refs, st.sequences, st.tokens })
    end)

    it("fork shares the pages that hold tokens; appending copies a shared partial page", function()
      local p = assert(c:sequence():append(6))
      assert(p:reserve(4)) -- a reserved page is not shared
      assert.equal(3, p:num_pages())
      local ch = assert(p:fork())
      assert.same({ 0, 1 }, ch:pages())
      assert.equal(6, ch:len())
      assert.same({ 2, 2, 1 }, { c:refcount(0), c:refcount(1), c:refcount(2) })
      assert.equal(2, c:stats().shared_pages)
      assert.equal(1, ch:pages_needed(1)) -- the copy of page 1
      assert(ch:append(1))
      local cp = ch:pages()
      assert.equal(0, cp[1])
      assert.is_not.equal(1, cp[2])
      assert.same({ 2, 1 }, { c:refcount(0), c:refcount(1) })
      assert.equal(1, c:stats().cow_copies)
      assert.equal(0, p:pages_needed(1)) -- page 1 is the parent's alone again
      -- a full shared page is not copied: the next token opens a new page
      local q = assert(c:sequence():append(4))
      local qc = assert(q:fork())
      assert.equal(1, qc:pages_needed(1))
      assert(qc:append(1))
      assert.equal(c:refcount(q:pages()[1]), 2)
      assert.equal(1, c:stats().cow_copies)
    end)

    it("truncate and free give pages back; a freed id stays dead", function()
      local s = assert(c:sequence():append(9))
      assert.equal(3, s:num_pages())
      s:truncate(4)
      assert.equal(1, s:num_pages())
      assert.equal(7, c:free_pages())
      assert.matches("len: 5 is not in %[0, 4%]", H.error_of(s.truncate, s, 5))
      local id = s.id
      s:free()
      s:free() -- harmless
      assert.equal(8, c:free_pages())
      assert.matches("seq:append: seq: freed", H.error_of(s.append, s, 1))
      -- the C id is not reused by the next sequence
      local t = c:sequence()
      assert.is_not.equal(id, t.id)
      local ghost = setmetatable({ cache = c, id = id }, getmetatable(t))
      assert.matches("seq: " .. id .. " is not a live sequence", H.error_of(ghost.append, ghost, 1))
    end)

    it("running out of pages is nil, err and changes nothing", function()
      local a = assert(c:sequence():append(10))
      local b = assert(a:fork())
      local before, pa_, pb = c:stats(), a:pages(), b:pages()
      local r, err = b:append(100)
      assert.is_nil(r)
      assert.matches("out of pages: 100 more tokens need 26 more pages %(one a copy of a shared page%)", err)
      assert.same(before, c:stats())
      assert.same(pa_, a:pages())
      assert.same(pb, b:pages())
      assert.equal(10, b:len())
      assert.is_nil((b:reserve(19)))
      assert.same(before, c:stats())
      assert(b:reserve(18)) -- exactly what is left: 5 free = 1 copy + 4 new
      assert.equal(0, c:free_pages())
    end)

    it("rejects bad arguments with their names", function()
      local s = c:sequence()
      assert.matches("seq:append: n: expected a whole number >= 0, got %-1", H.error_of(s.append, s, -1))
      assert.matches("seq:reserve: n: expected a whole number >= 0, got 1.5", H.error_of(s.reserve, s, 1.5))
      assert.matches("seq:truncate: len: expected", H.error_of(s.truncate, s, "x"))
      assert.matches("refcount: page: 8 is not in %[0, 8%)", H.error_of(c.refcount, c, 8))
      c:close()
      assert.matches("cache: closed", H.error_of(s.len, s))
      c = assert(pa.kv_cache{ num_pages = 8, page_size = 4, layers = 0 })
    end)

    it("grows its table of sequences past the first slots", function()
      local seqs = {}
      for i = 1, 300 do seqs[i] = assert(c:sequence()) end
      assert(seqs[1]:append(3))
      for i = 2, 300 do seqs[i] = nil end
      assert.equal(300, c:stats().sequences)
      local kid = assert(seqs[1]:fork())
      assert.same(seqs[1]:pages(), kid:pages())
      assert.equal(2, c:refcount(0))
    end)
  end)

  local function cow_copies_data(dev)
    local D, Hk, ps = 3, 2, 4
    local c = assert(pa.kv_cache{ num_pages = 6, page_size = ps, kv_heads = Hk, head_dim = D, layers = 2, device = dev })
    local tok = Hk * D
    local s = assert(c:sequence():append(6))
    -- fill the two used pages of every tensor with distinct values
    for l = 1, 2 do
      for which, t in ipairs({ c.k_caches[l], c.v_caches[l] }) do
        local vals = {}
        for i = 1, 2 * ps * tok do vals[i] = l * 1000 + which * 100 + i end
        assert(t:write(vals, 0))
      end
    end
    local ch = assert(s:fork())
    assert(ch:append(1))
    local src, dst = s:pages()[2], ch:pages()[2]
    assert.is_not.equal(src, dst)
    for l = 1, 2 do
      for _, t in ipairs({ c.k_caches[l], c.v_caches[l] }) do
        local all = t:to_table()
        for slot = 0, 1 do -- the two tokens (4, 5) in the partial page
          for e = 1, tok do
            local a = all[(src * ps + slot) * tok + e]
            local b = all[(dst * ps + slot) * tok + e]
            assert.equal(a, b)
          end
        end
      end
    end
    c:validate()
    c:close()
  end

  it("copy-on-write copies every layer's k and v", function() cow_copies_data(cpu) end)


  ---------------------------------------------------------------------------
  -- random operations against a Lua model

  local function run_model(seed, opts)
    local rng = require("pagedattn.reference").rng(seed)
    local ps, N = opts.page_size, opts.num_pages
    local Hk, D = 1, 2
    local c = assert(pa.kv_cache{ num_pages = N, page_size = ps, kv_heads = Hk, head_dim = D,
      device = opts.device or cpu })
    local kc = c.k_cache
    local tok = Hk * D
    local model = {}  -- list of { seq = , pages = {...}, tags = {...} } (tags: one per token)
    local next_tag = 1
    local batch = c:batch()
    local log = {}
    local events = opts.events or {}
    local function count(what) events[what] = (events[what] or 0) + 1 end

    local function fail(msg)
      error(string.format("%s\n  after: %s\n  seed %d, page_size %d, %d pages\n  %s", msg,
        table.concat(log, " ", math.max(1, #log - 12)), seed, ps, N, H.rerun(SPEC)), 0)
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
        if m.seq:len() ~= #m.tags then fail("sequence " .. m.seq.id .. ": length " .. m.seq:len() .. ", model " .. #m.tags) end
        -- pages past the tokens (reserved) are held by this sequence alone
        for j = pages_for(#m.tags, ps) + 1, #m.pages do
          if rc[m.pages[j]] ~= 1 then fail("reserved page " .. m.pages[j] .. " is shared") end
        end
        tokens = tokens + #m.tags
      end
      local s = c:stats()
      if s.used_pages ~= used or s.free_pages ~= N - used or s.shared_pages ~= shared or
         s.page_refs ~= refs or s.sequences ~= #model or s.tokens ~= tokens then
        fail(string.format("stats used %d free %d shared %d refs %d seqs %d tokens %d; model %d %d %d %d %d %d",
          s.used_pages, s.free_pages, s.shared_pages, s.page_refs, s.sequences, s.tokens,
          used, N - used, shared, refs, #model, tokens))
      end
      c:validate()
    end

    -- every token's tag must be in its slot: sharing and copies kept the data
    local function check_data()
      local all = kc:to_table()
      for _, m in ipairs(model) do
        for t = 0, #m.tags - 1 do
          local p = m.pages[math.floor(t / ps) + 1]
          local got = all[(p * ps + t % ps) * tok + 1]
          if got ~= m.tags[t + 1] then
            fail(string.format("sequence %d token %d (page %d slot %d) holds %s, expected %d",
              m.seq.id, t, p, t % ps, tostring(got), m.tags[t + 1]))
          end
        end
      end
    end

    -- what the model expects a write of n tokens into m to take, given the
    -- references already dropped (drops[p]) by earlier writers in a batch
    local function plan(m, n, rc, drops)
      if n == 0 then return 0, false end
      local len = #m.tags
      local fresh = math.max(0, pages_for(len + n, ps) - #m.pages)
      local cow = false
      if len % ps ~= 0 then
        local p = m.pages[math.floor(len / ps) + 1]
        if rc[p] - (drops[p] or 0) > 1 then
          cow = true
          drops[p] = (drops[p] or 0) + 1
        end
      end
      return fresh + (cow and 1 or 0), cow
    end

    -- after a successful write: C's new page list must be the old one with the
    -- shared partial page replaced (if cow) and fresh pages added, all of
    -- them free before
    local function adopt(m, n, cow, was_free, taken)
      local len = #m.tags
      local got = m.seq:pages()
      local want_len = math.max(#m.pages, pages_for(len + n, ps))
      if n == 0 then want_len = #m.pages end
      if #got ~= want_len then fail("sequence " .. m.seq.id .. ": " .. #got .. " pages, expected " .. want_len) end
      local cow_idx = cow and math.floor(len / ps) + 1 or -1
      for j = 1, want_len do
        if j <= #m.pages and j ~= cow_idx then
          if got[j] ~= m.pages[j] then fail("sequence " .. m.seq.id .. ": page " .. j .. " changed") end
        else
          if not was_free[got[j]] or taken[got[j]] then
            fail("sequence " .. m.seq.id .. ": new page " .. got[j] .. " was not free, or taken twice")
          end
          taken[got[j]] = true
        end
      end
      m.pages = got
    end

    local function write_tokens(m, n)
      local len = #m.tags
      for t = len, len + n - 1 do
        local p = m.pages[math.floor(t / ps) + 1]
        local vals = {}
        for e = 1, tok do vals[e] = next_tag end
        assert(kc:write(vals, (p * ps + t % ps) * tok))
        m.tags[t + 1] = next_tag
        next_tag = next_tag + 1
      end
    end

    local function free_set()
      local s = {}
      for p = 0, N - 1 do if c:refcount(p) == 0 then s[p] = true end end
      return s
    end

    local function snapshot()
      local snap = { stats = c:stats(), pages = {}, lens = {} }
      for i, m in ipairs(model) do snap.pages[i], snap.lens[i] = m.seq:pages(), m.seq:len() end
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
    end

    local function write_op(m, n, reserve_only)
      local rc = refcounts()
      local need, cow = plan(m, n, rc, {})
      if m.seq:pages_needed(n) ~= need then
        fail("pages_needed(" .. n .. ") = " .. m.seq:pages_needed(n) .. ", model " .. need)
      end
      local free = N - (function() local u = 0 for p = 0, N - 1 do if rc[p] > 0 then u = u + 1 end end return u end)()
      local snap, was_free = snapshot(), free_set()
      local r, err
      if reserve_only then r, err = m.seq:reserve(n) else r, err = m.seq:append(n) end
      if need > free then
        if r then fail("expected out of pages: need " .. need .. ", free " .. free) end
        if not err:find("out of pages", 1, true) then fail("unexpected error: " .. err) end
        unchanged(snap, reserve_only and "reserve" or "append")
        count("out_of_pages")
        return false
      end
      if not r then fail("unexpected failure: " .. tostring(err) .. " (need " .. need .. ", free " .. free .. ")") end
      adopt(m, n, cow, was_free, {})
      if not reserve_only then write_tokens(m, n) end
      if cow then count("copy_on_write") end
      return true
    end

    local function batch_op()
      -- a random subset of distinct sequences, in random order
      local order = {}
      for i = 1, #model do order[i] = i end
      rng:shuffle(order)
      local k = rng:int(0, #model)
      local rc, drops = refcounts(), {}
      local need, plans = 0, {}
      batch:clear()
      for j = 1, k do
        local m = model[order[j]]
        local n = rng:int(0, 2 * ps + 1)
        local nd, cow = plan(m, n, rc, drops)
        need = need + nd
        plans[j] = { m = m, n = n, cow = cow }
        batch:add(m.seq, n)
      end
      local free = 0
      for p = 0, N - 1 do if rc[p] == 0 then free = free + 1 end end
      local snap, was_free = snapshot(), free_set()
      local r, err = batch:stage()
      log[#log + 1] = "batch(" .. k .. ")"
      if need > free then
        if r then fail("batch: expected out of pages: need " .. need .. ", free " .. free) end
        if not err:find("out of pages", 1, true) then fail("batch: unexpected error: " .. err) end
        unchanged(snap, "batch stage")
        count("batch_out_of_pages")
        return
      end
      if not r then fail("batch: unexpected failure: " .. tostring(err) .. " (need " .. need .. ", free " .. free .. ")") end
      if batch.new_pages ~= need then fail("batch took " .. batch.new_pages .. " pages, model " .. need) end
      count("batch")
      if batch.cow_copies > 0 then count("batch_copy_on_write") end
      local taken = {}
      -- the staged tables, against the model
      local bt, cu, used, cs = batch.block_table:to_table(), batch.cu_seqlens_q:to_table(),
        batch.seqused_k:to_table(), batch.cache_seqlens:to_table()
      local pos, ip, idx, last = batch.positions:to_table(), batch.kv_indptr:to_table(),
        batch.kv_indices:to_table(), batch.kv_last_page_len:to_table()
      local W, q_at, nnz = batch.max_pages, 0, 0
      for j, pl in ipairs(plans) do
        local m, n = pl.m, pl.n
        local before = #m.tags
        adopt(m, n, pl.cow, was_free, taken)
        write_tokens(m, n)
        local after = #m.tags
        local np = pages_for(after, ps)
        if cs[j] ~= before or used[j] ~= after or cu[j] ~= q_at or cu[j + 1] ~= q_at + n then
          fail("batch entry " .. j .. ": cache_seqlens/seqused_k/cu_seqlens_q wrong")
        end
        for t = 0, n - 1 do
          if pos[q_at + t + 1] ~= before + t then fail("batch entry " .. j .. ": position " .. t .. " wrong") end
        end
        for col = 1, W do
          local want = col <= np and m.pages[col] or 0
          if bt[(j - 1) * W + col] ~= want then fail("batch entry " .. j .. ": block_table column " .. col) end
        end
        if ip[j] ~= nnz or ip[j + 1] ~= nnz + np then fail("batch entry " .. j .. ": kv_indptr") end
        for col = 1, np do
          if idx[nnz + col] ~= m.pages[col] then fail("batch entry " .. j .. ": kv_indices") end
        end
        local want_last = np == 0 and 0 or after - (np - 1) * ps
        if last[j] ~= want_last then fail("batch entry " .. j .. ": kv_last_page_len " .. last[j] .. ", want " .. want_last) end
        q_at, nnz = q_at + n, nnz + np
      end
    end

    for step = 1, opts.steps do
      local r = rng:uniform()
      -- a nearly full pool mostly fails: give pages back more often then
      if c:free_pages() < N / 5 and rng:uniform() < 0.6 then r = 0.6 + 0.22 * rng:uniform() end
      if #model == 0 or r < 0.1 then
        local s = assert(c:sequence())
        model[#model + 1] = { seq = s, pages = {}, tags = {} }
        log[#log + 1] = "create"
      else
        local i = rng:int(1, #model)
        local m = model[i]
        if r < 0.35 then
          local n = rng:int(0, 3 * ps)
          if rng:uniform() < 0.05 then n = (N + 1) * ps end -- certainly too many
          log[#log + 1] = "append(" .. m.seq.id .. "," .. n .. ")"
          write_op(m, n, false)
        elseif r < 0.45 then
          local n = rng:int(0, 2 * ps)
          log[#log + 1] = "reserve(" .. m.seq.id .. "," .. n .. ")"
          write_op(m, n, true)
        elseif r < 0.6 then
          local kid = assert(m.seq:fork())
          local np = pages_for(#m.tags, ps)
          local pages, tags = {}, {}
          for j = 1, np do pages[j] = m.pages[j] end
          for t = 1, #m.tags do tags[t] = m.tags[t] end
          model[#model + 1] = { seq = kid, pages = pages, tags = tags }
          log[#log + 1] = "fork(" .. m.seq.id .. ")"
        elseif r < 0.72 then
          local len = rng:int(0, #m.tags)
          m.seq:truncate(len)
          for t = #m.tags, len + 1, -1 do m.tags[t] = nil end
          for j = #m.pages, pages_for(len, ps) + 1, -1 do m.pages[j] = nil end
          log[#log + 1] = "truncate(" .. m.seq.id .. "," .. len .. ")"
        elseif r < 0.82 then
          m.seq:free()
          table.remove(model, i)
          log[#log + 1] = "free"
        else
          batch_op()
        end
      end
      check_all()
      if step % 10 == 0 then check_data() end
    end
    check_data()
    -- everything goes back
    for _, m in ipairs(model) do m.seq:free() end
    model = {}
    check_all()
    local s = c:stats()
    assert.equal(N, s.free_pages)
    assert.same({ 0, 0, 0, 0 }, { s.used_pages, s.shared_pages, s.page_refs, s.tokens })
    c:close()
  end

  describe("random operations against a Lua model", function()
    local configs = {
      { page_size = 1, num_pages = 24 },
      { page_size = 3, num_pages = 16 },
      { page_size = 4, num_pages = 40 },
      { page_size = 16, num_pages = 12 },
    }
    local events = {}
    for ci, cfg in ipairs(configs) do
      it(string.format("page size %d, %d pages", cfg.page_size, cfg.num_pages), function()
        for i = 1, H.scale(3) do
          run_model(H.seed("pool-model-" .. ci, i), { page_size = cfg.page_size, num_pages = cfg.num_pages,
            steps = 300, events = events })
        end
      end)
    end
    -- the random runs are only worth something if they hit the hard cases
    it("exercised running out, copy-on-write and batches", function()
      for _, what in ipairs({ "out_of_pages", "copy_on_write", "batch", "batch_out_of_pages", "batch_copy_on_write" }) do
        assert((events[what] or 0) > 0, "no " .. what .. " event in the random runs (" .. H.rerun(SPEC) .. ")")
      end
    end)
  end)

  describe("on CUDA #gpu", function()
    local cuda, why = pa.device("cuda")
    if G.pending_without(pending, cuda, why) then return end
    it("copy-on-write copies every layer's k and v", function() cow_copies_data(cuda) end)
    it("random operations against a Lua model, cache on the device", function()
      for i = 1, H.scale(2) do
        run_model(H.seed("pool-model-gpu", i), { page_size = 3, num_pages = 24, steps = 200, device = cuda })
      end
    end)
  end)
end)
