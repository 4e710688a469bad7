-- spec/csr_spec.lua -- the attention calls take a batch's pages in FlashInfer's
-- CSR form (kv_indptr, kv_indices, kv_last_page_len) as well as its block
-- table, with the same outputs; bad CSR input is an error naming it and
-- changes nothing.
local pa = require "pagedattn"
local H = require "helpers"

local function max_diff(a, b)
  local t1, t2, d = a:to_table(), b:to_table(), 0
  assert.equal(#t1, #t2)
  for i = 1, #t1 do d = math.max(d, math.abs(t1[i] - t2[i])) end
  return d
end

describe("the CSR form of a batch's pages", function()
  for _, name in ipairs { "cpu", "cpu:staged" } do
    it("gives the block table's outputs (varlen with append, with_kvcache) on " .. name, function()
      local dev = assert(pa.device(name))
      local rng = H.rng("csr-" .. name)
      local cache = assert(pa.kv_cache { num_pages = 64, page_size = 3, kv_heads = 2, head_dim = 8, device = dev })
      local seqs, b = {}, assert(cache:batch())
      for i = 1, 4 do seqs[i] = assert(cache:sequence()) end
      for i = 1, 4 do b:add(seqs[i], rng:int(0, 9)) end
      assert(b:stage())
      local T = b.total_q
      local q = pa.randn({ T, 4, 8 }, "f32", dev, 1)
      local k, v = pa.randn({ T, 2, 8 }, "f32", dev, 2), pa.randn({ T, 2, 8 }, "f32", dev, 3)
      local o1 = assert(b:attention(q, k, v, {}))
      -- the same keys again (already appended): block table vs CSR
      local common = { cu_seqlens_q = b.cu_seqlens_q, seqused_k = b.seqused_k, causal = true }
      local function opts(extra)
        local o = {}
        for key, val in pairs(common) do o[key] = val end
        for key, val in pairs(extra) do o[key] = val end
        return o
      end
      local o2 = assert(pa.attention_varlen(q, cache.k_cache, cache.v_cache, opts { block_table = b.block_table }))
      local o3 = assert(pa.attention_varlen(q, cache.k_cache, cache.v_cache, opts {
        kv_indptr = b.kv_indptr, kv_indices = b.kv_indices, kv_last_page_len = b.kv_last_page_len }))
      assert.equal(0, max_diff(o1, o2))
      assert.equal(0, max_diff(o2, o3))
      -- one new query per sequence against the keys staged: with_kvcache
      local q1 = pa.randn({ 4, 1, 4, 8 }, "f32", dev, 4)
      local a = assert(pa.attention_with_kvcache(q1, cache.k_cache, cache.v_cache,
        { block_table = b.block_table, cache_seqlens = b.seqused_k }))
      local c = assert(pa.attention_with_kvcache(q1, cache.k_cache, cache.v_cache,
        { kv_indptr = b.kv_indptr, kv_indices = b.kv_indices, cache_seqlens = b.seqused_k }))
      assert.equal(0, max_diff(a, c))
      cache:close()
    end)
  end

  it("names what is wrong and changes nothing", function()
    local dev = assert(pa.device("cpu"))
    local kc = pa.randn({ 8, 4, 1, 4 }, "f32", dev, 1)
    local vc = pa.randn({ 8, 4, 1, 4 }, "f32", dev, 2)
    local q = pa.randn({ 2, 1, 1, 4 }, "f32", dev, 3)
    local k = pa.randn({ 2, 1, 1, 4 }, "f32", dev, 4)
    local out = pa.tensor({ 2, 1, 1, 4 }, "f32", dev):fill(7)
    local before_k, before_out = kc:to_table(), out:to_table()
    local function e(o)
      o.out = out
      o.k, o.v = k, k
      o.cache_seqlens = o.cache_seqlens or { 2, 5 }
      return H.error_of(pa.attention_with_kvcache, q, kc, vc, o)
    end
    assert.matches("kv_indptr: give block_table or the CSR form", e { block_table = { { 0, 1 }, { 2, 3 } },
      kv_indptr = { 0, 1, 3 }, kv_indices = { 0, 1, 2 } })
    assert.matches("kv_indices: missing", e { kv_indptr = { 0, 1, 3 } })
    assert.matches("kv_indptr: missing", e { kv_indices = { 0, 1, 2 } })
    assert.matches("kv_indptr: decreases at entry 2", e { kv_indptr = { 0, 2, 1 }, kv_indices = { 0, 1, 2 } })
    assert.matches("kv_indptr: first entry is 1", e { kv_indptr = { 1, 2, 3 }, kv_indices = { 0, 1, 2 } })
    assert.matches("kv_indptr: last entry is 4, but kv_indices has 3", e { kv_indptr = { 0, 1, 4 }, kv_indices = { 0, 1, 2 } })
    assert.matches("kv_indptr: expected shape %[3%]", e { kv_indptr = { 0, 1 }, kv_indices = { 0, 1, 2 } })
    assert.matches("kv_last_page_len: entry 1 is 1, but sequence 1 attends 6 keys %(2 in its last page%)",
      e { kv_indptr = { 0, 1, 3 }, kv_indices = { 0, 1, 2 }, kv_last_page_len = { 3, 1 } })
    assert.matches("kv_last_page_len: belongs to the CSR form", e { block_table = { { 0 }, { 1, 2 } },
      kv_last_page_len = { 3, 2 } })
    assert.matches("cache_seqlens: sequence 1 holds 5 keys %+ 1 new > capacity 4",
      e { kv_indptr = { 0, 1, 2 }, kv_indices = { 0, 1, 2 } })
    assert.matches("kv_indices %(as the block table %[B, widest%]%): entry %[1, 1%] is 9, outside the pool",
      e { kv_indptr = { 0, 1, 3 }, kv_indices = { 0, 1, 9 } })
    assert.same(before_k, kc:to_table())
    assert.same(before_out, out:to_table())
    -- and the good call appends where the pages say
    assert(pa.attention_with_kvcache(q, kc, vc, { k = k, v = k, cache_seqlens = { 2, 5 },
      kv_indptr = { 0, 1, 3 }, kv_indices = { 0, 1, 2 }, kv_last_page_len = { 3, 2 } }))
    assert.same(k:to_table(0, 4), kc:to_table(2 * 4, 4))     -- sequence 0, position 2: page 0 slot 2
    assert.same(k:to_table(4, 4), kc:to_table(2 * 16 + 4, 4)) -- sequence 1, position 5: page 2 slot 1
  end)
end)
