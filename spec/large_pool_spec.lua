-- 64-bit offsets on the CPU: a page pool of more than 2^31 elements, with the
-- sequences' pages at its far end, checked against the reference run on a
-- small contiguous copy of those pages. The pool's 8.6 GB are zero pages the
-- OS maps lazily (only the pages used are touched), but the allocation still
-- needs that much RAM on paper; pending on a smaller machine.
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local H = require "helpers"

local function mem_total_gb()
  local f = io.open("/proc/meminfo")
  if not f then return 0 end
  local text = f:read("*a")
  f:close()
  local kb = tonumber(text:match("MemTotal:%s+(%d+)")) or 0
  return kb / 1048576
end

describe("a pool beyond 2^31 elements", function()
  local PAGE, D, HK = 16, 128, 1
  local page_elems = PAGE * HK * D
  local num_pages = math.floor(2 ^ 31 / page_elems) + 64 -- 2^31 + 131072 elements
  local need_gb = 2 * num_pages * page_elems * 2 / 2 ^ 30 + 1

  if mem_total_gb() < need_gb + 2 then
    pending(string.format("needs a machine with %.1f GB of memory, this one has %.1f", need_gb + 2, mem_total_gb()))
    return
  end

  it("attends to pages past element 2^31 (bf16, decode and append)", function()
    local cpu = assert(pa.device("cpu"))
    local rng = H.rng("large_pool")
    local kc = assert(pa.tensor({ num_pages, PAGE, HK, D }, "bf16", cpu))
    local vc = assert(pa.tensor({ num_pages, PAGE, HK, D }, "bf16", cpu))
    -- 3 sequences of 40, 17 and 33 tokens on the last 12 pages (scattered)
    local lens = { 40, 17, 33 }
    local pages = {}
    for i = 1, 12 do pages[i] = num_pages - i end
    rng:shuffle(pages)
    local bt, small_k, small_v = {}, {}, {}
    for b = 1, 3 do for j = 1, 4 do bt[(b - 1) * 4 + j] = pages[(b - 1) * 4 + j] end end
    -- fill those pages with random values (written at 64-bit element offsets)
    local small_pages = {}
    for i, pg in ipairs(pages) do
      local kv = ref.randn({ page_elems }, rng, "bf16").data
      local vv = ref.randn({ page_elems }, rng, "bf16").data
      assert(kc:write(kv, pg * page_elems))
      assert(vc:write(vv, pg * page_elems))
      small_pages[pg] = i - 1
      for e = 1, page_elems do
        small_k[(i - 1) * page_elems + e] = kv[e]
        small_v[(i - 1) * page_elems + e] = vv[e]
      end
    end
    local small_bt = {}
    for i, pg in ipairs(bt) do small_bt[i] = small_pages[pg] end
    local q = ref.randn({ 3, 1, 4, D }, rng, "bf16")
    local k = ref.randn({ 3, 1, HK, D }, rng, "bf16")
    local v = ref.randn({ 3, 1, HK, D }, rng, "bf16")
    local out = assert(pa.attention_with_kvcache(
      pa.from_table(q.data, q.shape, "bf16", cpu), kc, vc, {
        k = pa.from_table(k.data, k.shape, "bf16", cpu), v = pa.from_table(v.data, v.shape, "bf16", cpu),
        cache_seqlens = lens, block_table = pa.from_table(bt, { 3, 4 }, "i32", cpu), causal = true,
      }))
    local function run_ref(precision)
      local sk = ref.copy(ref.tensor({ 12, PAGE, HK, D }, small_k))
      local sv = ref.copy(ref.tensor({ 12, PAGE, HK, D }, small_v))
      return ref.attention_with_kvcache(q, sk, sv, {
        k = k, v = v, cache_seqlens = lens, block_table = ref.tensor({ 3, 4 }, small_bt), causal = true,
        precision = precision, cache_dtype = "bf16",
      }), sk
    end
    local exact, exact_k = run_ref("f64")
    local naive = run_ref("bf16")
    local err = ref.max_abs_diff(out:to_table(), exact.data)
    local tol = ref.tolerance("bf16", ref.max_abs_diff(naive.data, exact.data))
    assert(err <= tol, string.format("error %.3g > tolerance %.3g", err, tol))
    -- the appended keys landed at their 64-bit offsets: sequence 1's token 40
    local pg = bt[1 * 4 - 4 + 3] -- page index 2 of sequence 1 holds tokens 32..47
    local got = kc:to_table(pg * page_elems + (40 % PAGE) * D, D)
    for d = 1, D do
      local want = exact_k.data[small_pages[pg] * page_elems + (40 % PAGE) * D + d]
      assert(got[d] == want, "appended key at a 64-bit offset differs")
    end
  end)
end)
