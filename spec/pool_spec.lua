-- Specs of the page pool and sequences (lua/pagedattn/cache.lua over
-- src/core/pool.c): unit cases, then random sequences of operations compared
-- with a plain Lua model (the pool fuzzer's, spec/fuzz/pool.lua). The model
-- knows every sequence's pages and, for each token, a tag value written into
-- the cache tensors (as an attention append would), so copy-on-write, sharing,
-- truncation and unstaging are checked on the data too, not only on the
-- bookkeeping.
-- Rerun a failure with the printed seed: PAGEDATTN_SEED=N scripts/test spec/pool_spec.lua
local pa = require "pagedattn"
local G = require "gpu_helpers"
local H = require "helpers"

local SPEC = "spec/pool_spec.lua"
local cpu = assert(pa.device("cpu"))

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
  -- random operations against a Lua model: one pool of the pool fuzzer
  -- (spec/fuzz/pool.lua: create, append, reserve, fork, truncate, free, batch
  -- stages and unstage, stale ids, bad arguments; after each, refcounts,
  -- pages, lengths, stats and the tokens' data against the model)

  local pool_fuzz = require "fuzz.pool"
  local function run_model(seed, opts)
    pool_fuzz.episode{ seed = seed, page_size = opts.page_size, num_pages = opts.num_pages, steps = opts.steps,
      events = opts.events, device = opts.device or cpu, rerun = H.rerun(SPEC) }
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
