-- spec/cascade_spec.lua -- shared prefixes read once (batch{cascade = true}):
-- the groups the stage plans from the pool's pages (forks of forks, partial
-- shared pages, groups of one, the caller's groups), and b:attention's two
-- levels against the plain call and the float64 reference on random sharing
-- structures with every option that makes sense with them (and the plain
-- call, named, for those that do not), on cpu and cpu:staged
-- (spec/cascade_cases.lua; spec/gpu_cascade_spec.lua runs them on the GPU).
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local H = require "helpers"

local SPEC = "spec/cascade_spec.lua"

local cases = require "cascade_cases"
local rotary_tables = cases.rotary_tables

local function ints(t) return t:to_table() end

describe("shared prefixes (batch{cascade = true})", function()
  it("groups forks of forks by the page reads they save, one level each", function()
    local c = assert(pa.kv_cache { num_pages = 512, page_size = 4, layers = 0 })
    local b = c:batch { cascade = true, device = "cpu" }
    local sys = c:sequence()
    assert(sys:append(32)) -- 8 whole pages
    local others, conv = {}, sys:fork()
    assert(conv:append(80)) -- 20 more pages
    for i = 1, 4 do others[i] = sys:fork() end
    local x, y = conv:fork(), conv:fork()
    b:clear()
    for i = 1, 4 do b:add(others[i], 1) end
    b:add(x, 1):add(y, 1)
    assert(b:stage())
    local ci = b:cascade_info()
    -- the four share the system prompt (saving 3 x 8 reads); x and y share
    -- it and the conversation, 28 pages (saving 28, more than 2 x 8 joining)
    assert.equal(2, ci.groups)
    assert.equal(6, ci.grouped)
    assert.equal(8 + 28, ci.prefix_pages)
    assert.equal(3 * 8 + 28, ci.saved_pages)
    assert.equal(28, ci.prefix_width)
    assert.same({ 32, 112 }, ints(b.prefix_seqused_k))
    assert.same({ 0, 4, 6 }, ints(b.prefix_cu_seqlens_q))
    assert.same({ 0, 1, 2, 3, 4, 5 }, ints(b.prefix_rows))
    assert.same({ 0, 1, 2, 3, 4, 5 }, ints(b.prefix_row_of))
    local sys_pages, conv_pages = sys:pages(), conv:pages()
    local pbt = ints(b.prefix_block_table)
    for j = 1, 8 do assert.equal(sys_pages[j], pbt[j]) end
    for j = 9, 28 do assert.equal(0, pbt[j]) end -- padding
    for j = 1, 28 do assert.equal(conv_pages[j], pbt[28 + j]) end
    -- the suffixes: each entry's own page (its new token), past the prefix
    assert.same({ 1, 1, 1, 1, 1, 1 }, ints(b.suffix_seqused_k))
    assert.same({ 0, 0, 0, 0, 0, 0 }, ints(b.suffix_cache_seqlens))
    -- with one other entry only, the system prompt's group would be one entry: none
    b:clear():add(others[1], 1):add(x, 1):add(y, 1)
    assert(b:stage())
    ci = b:cascade_info()
    assert.equal(1, ci.groups)
    assert.equal(2, ci.grouped)
    assert.same({ -1, 0, 1 }, ints(b.prefix_row_of))
    c:close()
  end)

  it("keeps only the groups that save cascade_min_saved page reads or more (cascade_min_saved)", function()
    local c = assert(pa.kv_cache { num_pages = 512, page_size = 4, layers = 0 })
    local sys, conv = c:sequence(), c:sequence()
    assert(sys:append(32))  -- 8 whole pages, forked 4 times: saves 3 x 8 = 24 reads
    assert(conv:append(80)) -- 20 whole pages, forked twice: saves 20
    local a, d = {}, {}
    for i = 1, 4 do a[i] = sys:fork() end
    for i = 1, 2 do d[i] = conv:fork() end
    local function stage(min)
      local b = c:batch { cascade = true, device = "cpu", cascade_min_saved = min }
      for i = 1, 4 do b:add(a[i], 1) end
      b:add(d[1], 1):add(d[2], 1)
      assert(b:stage())
      local ci = b:cascade_info()
      local row_of = ints(b.prefix_row_of)
      b:close()
      return ci.groups, ci.saved_pages, row_of
    end
    local function groups_saved(min)
      local g, saved = stage(min)
      return { g, saved }
    end
    assert.same({ 2, 44 }, groups_saved(nil))
    assert.same({ 2, 44 }, groups_saved(20))
    local g, saved, row_of = stage(21) -- only the system prompt's group
    assert.same({ 1, 24, { 0, 1, 2, 3, -1, -1 } }, { g, saved, row_of })
    assert.same({ 0, 0 }, groups_saved(25))
    -- named errors, before anything is made
    local F = "pagedattn.batch: cascade_min_saved: "
    assert.matches(F .. "applies to cascade = true batches", H.error_of(function() c:batch { cascade_min_saved = 1 } end),
      1, true)
    for _, bad in ipairs({ -1, 1.5, "2", 2 ^ 60 }) do
      assert.matches(F .. "expected a whole number", H.error_of(function()
        c:batch { cascade = true, cascade_min_saved = bad }
      end), 1, true)
    end
    c:close()
  end)

  it("shares only whole pages from before the step, and needs two entries with new tokens", function()
    local c = assert(pa.kv_cache { num_pages = 256, page_size = 4, layers = 0 })
    local b = c:batch { cascade = true, device = "cpu" }
    local root = c:sequence()
    assert(root:append(10)) -- pages 0, 1 whole, page 2 holds 2 tokens
    local a, d, e = root:fork(), root:fork(), root:fork()
    b:clear():add(a, 1):add(d, 3):add(e, 0) -- e attends without new tokens: not in a group
    assert(b:stage())
    local ci = b:cascade_info()
    assert.equal(1, ci.groups)
    assert.equal(2, ci.grouped)
    assert.equal(2, ci.prefix_width) -- the partial page was copied for a and d: their own
    assert.same({ 8 }, ints(b.prefix_seqused_k))
    assert.same({ 3, 5, 10 }, ints(b.suffix_seqused_k))
    assert.same({ 2, 2, 10 }, ints(b.suffix_cache_seqlens))
    assert.equal(12, ci.max_grouped_pos) -- d's last new token
    -- a chunk of more than 8 new tokens stays out of automatic groups (its
    -- attention is not bound by the keys it reads); given groups take it
    local a2, d2 = root:fork(), root:fork()
    b:clear():add(a2, 9):add(d2, 1):add(a, 1)
    assert(b:stage())
    assert.equal(2, b:cascade_info().grouped)
    local row_of = ints(b.prefix_row_of) -- a2's rows 0-8, d2's 9, a's 10
    assert.same({ -1, 0, 1 }, { row_of[1], row_of[10], row_of[11] })
    b:unstage()
    b:clear():add(a2, 9, 0):add(d2, 1, 0):add(a, 1, 0)
    assert(b:stage())
    assert.equal(3, b:cascade_info().grouped)
    b:unstage()
    -- a sequence that shares nothing, and a lone one: no groups
    local f = c:sequence()
    assert(f:append(9))
    b:clear():add(f, 1):add(a, 1)
    assert(b:stage())
    assert.equal(0, b:cascade_info().groups)
    assert.equal(0, b.prefix_block_table.shape[1])
    assert.equal(0, b.suffix_block_table.shape[1])
    -- truncated into a shared page: only the pages whole for every member
    local g = root:fork()
    g:truncate(6) -- page 1 is now partial for g (it is still root's page)
    local h = root:fork()
    b:clear():add(g, 1):add(h, 1)
    assert(b:stage())
    ci = b:cascade_info()
    assert.equal(1, ci.groups)
    assert.same({ 4 }, ints(b.prefix_seqused_k))
    c:validate()
    c:close()
  end)

  it("takes the caller's groups (the pages common to each), and refuses them on a plain batch", function()
    local c = assert(pa.kv_cache { num_pages = 256, page_size = 2, layers = 0 })
    local b = c:batch { cascade = true, device = "cpu" }
    local r1, r2 = c:sequence(), c:sequence()
    assert(r1:append(8))
    assert(r2:append(6))
    local a1, a2, a3 = r1:fork(), r1:fork(), r1:fork()
    local b1, b2 = r2:fork(), r2:fork()
    assert(a3:append(2))
    local a4 = a3:fork()
    -- group 7 holds a1, a2, a3, a4 (4 pages common), group 3 holds b1 and a
    -- stranger (nothing common: no group), b2 alone
    b:clear():add(a1, 1, 7):add(b1, 1, 3):add(a2, 1, 7):add(a3, 2, 7):add(r1, 1, 3):add(b2, 1):add(a4, 1, 7)
    assert(b:stage())
    local ci = b:cascade_info()
    assert.equal(1, ci.groups)
    assert.equal(4, ci.grouped)
    assert.same({ 8 }, ints(b.prefix_seqused_k))
    assert.same({ 0, 5 }, ints(b.prefix_cu_seqlens_q))
    assert.same({ 0, 2, 3, 4, 7 }, ints(b.prefix_rows))
    -- the next step without groups: found from the pages again (r1 with the a's, r2's forks)
    b:clear():add(a1, 1):add(b1, 1):add(a2, 1):add(b2, 1):add(r1, 1)
    assert(b:stage())
    ci = b:cascade_info()
    assert.equal(2, ci.groups)
    local plain = c:batch { device = "cpu" }
    assert.matches("group: the batch was made without cascade = true", H.error_of(function() plain:add(a1, 1, 0) end))
    assert.matches("group: expected a whole number >= 0", H.error_of(function() b:add(a1, 1, -1) end))
    assert.matches("cascade: expected a boolean", H.error_of(function() c:batch { cascade = 1 } end))
    c:close()
  end)

  for _, name in ipairs { "cpu", "cpu:staged" } do
    it("gives the plain call's results (float64 reference, tolerance rule) on random sharing structures on " .. name,
      function()
      cases.cascade_random(assert(pa.device(name)), name, H.scale(36), SPEC)
    end)
  end

  it("rotates q where the plain call does (each token's position when causal or windowed, else its entry's first)",
    function()
    cases.cascade_rotary(assert(pa.device("cpu:staged")), SPEC)
  end)

  it("changes nothing on a caller's mistake, and makes one plain call where the levels do not apply", function()
    local dev = assert(pa.device("cpu"))
    local cache = assert(pa.kv_cache { num_pages = 64, page_size = 4, kv_heads = 2, head_dim = 8, device = dev })
    local root = cache:sequence()
    assert(root:append(12))
    cache.k_cache:copy_from(pa.randn(cache.k_cache.shape, "f32", dev, 1))
    cache.v_cache:copy_from(pa.randn(cache.v_cache.shape, "f32", dev, 2))
    local a, c = root:fork(), root:fork()
    local b = cache:batch { cascade = true }
    b:clear():add(a, 1):add(c, 1)
    assert(b:stage())
    local q = pa.randn({ 2, 4, 8 }, "f32", dev, 3)
    local k, v = pa.randn({ 2, 2, 8 }, "f32", dev, 4), pa.randn({ 2, 2, 8 }, "f32", dev, 5)
    local cos, sin = rotary_tables(12, 8, dev) -- one position short of the new tokens' 12
    local before = cache.k_cache:to_table()
    local function e(...) return H.error_of(b.attention, b, ...) end
    assert.matches("rotary_cos: has 12 positions, sequence 0 needs position 12",
      e(q, k, v, { rotary_cos = cos, rotary_sin = sin }))
    assert.matches("out: dtype bf16", e(q, k, v, { out = pa.tensor({ 2, 4, 8 }, "bf16", dev) }))
    assert.matches("q: 3 heads is not a multiple", e(pa.randn({ 2, 3, 8 }, "f32", dev, 6), k, v))
    assert.matches("block_table: set by the batch", e(q, k, v, { block_table = b.block_table }))
    assert.matches("k: expected shape %[2, 2, 8%]", e(q, pa.randn({ 3, 2, 8 }, "f32", dev, 7), v))
    assert.same(before, cache.k_cache:to_table())
    assert.same({ 12, 12 }, ints(b.cache_seqlens))
    local out = assert(b:attention(q, k, v, { alibi_slopes = { 0.5, 1, 1.5, 2 } }))
    assert.equal("alibi", b:cascade_info().last)
    assert.equal(1, b:cascade_info().calls)
    assert.equal(2, out.shape[1])
    assert(b:attention(q, nil, nil))
    assert.equal("used", b:cascade_info().last)
    assert.equal(2, b:cascade_info().calls)
    cache:close()
  end)

  it("runs its two levels from the C API without a context (pa_batch_attention(NULL, ...))", function()
    -- the levels' f32 rows are asked of the attention calls through the
    -- context; a NULL one (the C API allows it) must work as with one
    local ffi = require "ffi"
    local C = require("pagedattn.core").C
    local cache = assert(pa.kv_cache { num_pages = 64, page_size = 4, kv_heads = 2, head_dim = 16, dtype = "bf16" })
    cache.k_cache:copy_from(pa.randn(cache.k_cache.shape, "bf16", "cpu", 1))
    cache.v_cache:copy_from(pa.randn(cache.v_cache.shape, "bf16", "cpu", 2))
    local sys = cache:sequence()
    assert(sys:append(24))
    local b = cache:batch { cascade = true }
    for i = 1, 3 do
      local s = assert(sys:fork())
      assert(s:append(i))
      b:add(s, 1)
    end
    assert(b:stage())
    local q = pa.randn({ 3, 4, 16 }, "bf16", "cpu", 3)
    local want = assert(b:attention(q, nil, nil, {}))
    assert.equal("used", b:cascade_info().last)
    local out = pa.tensor({ 3, 4, 16 }, "bf16", "cpu")
    local p = ffi.new("pa_attention_params")
    C.pa_attention_params_init(p)
    p.q, p.out, p.k_cache, p.v_cache, p.causal = q.handle, out.handle, cache.k_cache.handle, cache.v_cache.handle, 1
    assert.equal(0, C.pa_batch_attention(nil, b.handle, p))
    assert.equal("used", b:cascade_info().last)
    assert.same(want:to_table(), out:to_table())
    cache:close()
  end)
end)
