-- examples/first.lua -- a first pagedattn program.
--
-- Prefills a few sequences of different lengths into a paged KV cache (one
-- varlen call, rotary embedding applied as the keys are appended), then decodes
-- a few steps (one new token per sequence per step), checks every output
-- against the pure-Lua float64 reference, and prints timings.
--
--   scripts/run examples/first.lua [--device cpu|cuda] [--dtype bf16|f16|f32]
local pa = require "pagedattn"
local ref = require "pagedattn.reference"

local function flag(name, default)
  for i = 1, #arg - 1 do if arg[i] == "--" .. name then return arg[i + 1] end end
  return default
end

local dev = assert(pa.device(flag("device")))
local dtype = flag("dtype", "bf16")
local H, Hk, D = 8, 2, 64               -- 8 query heads share 2 kv heads (GQA 4)
local PAGE, NUM_PAGES = 16, 64          -- 64 pages of 16 tokens
local prompt_lens = { 37, 5, 80 }       -- three sequences of different lengths
local STEPS = 8                         -- decode steps
local B = #prompt_lens
print(string.format("pagedattn %s on %s, %s, H=%d Hk=%d D=%d, page %d", pa.version,
  dev.name, dtype, H, Hk, D, PAGE))

local clock = pa.clock -- monotonic wall clock, seconds
local rng = ref.rng(2024)

-- 1. The paged cache and a block table: pages handed out from a shuffled list,
--    so each sequence's pages are scattered over the pool.
local k_cache = pa.tensor({ NUM_PAGES, PAGE, Hk, D }, dtype, dev)
local v_cache = pa.tensor({ NUM_PAGES, PAGE, Hk, D }, dtype, dev)
local free = {}
for i = 1, NUM_PAGES do free[i] = i - 1 end
rng:shuffle(free)
local max_pages = 8
local table_rows = {}
for b = 1, B do
  table_rows[b] = {}
  for j = 1, max_pages do table_rows[b][j] = table.remove(free) end
end
local flat = {}
for b = 1, B do for j = 1, max_pages do flat[#flat + 1] = table_rows[b][j] end end
local block_table = pa.from_table(flat, { B, max_pages }, "i32", dev)

-- 2. Rotary tables (GPT-NeoX style here), rounded to the dtype like the data.
local MAX_POS = max_pages * PAGE
local cos, sin = {}, {}
for pos = 0, MAX_POS - 1 do
  for j = 0, D / 2 - 1 do
    local theta = pos * 10000 ^ (-2 * j / D)
    cos[#cos + 1] = ref.round(math.cos(theta), dtype)
    sin[#sin + 1] = ref.round(math.sin(theta), dtype)
  end
end
local rotary_cos = pa.from_table(cos, { MAX_POS, D / 2 }, dtype, dev)
local rotary_sin = pa.from_table(sin, { MAX_POS, D / 2 }, dtype, dev)

-- The reference keeps its own copy of the caches and sees the same inputs.
local function to_ref(t) return ref.tensor(t.shape, t:to_table()) end
local ref_k, ref_v = to_ref(k_cache), to_ref(v_cache)
local ref_common = {
  block_table = to_ref(block_table), rotary_cos = to_ref(rotary_cos),
  rotary_sin = to_ref(rotary_sin), rotary_interleaved = false, causal = true,
}
local worst = 0
local function compare(what, out, ref_fn, q, ref_opts)
  -- tolerance rule: 3x the error of the naive computation in the dtype, + 1e-5
  local naive_k, naive_v = ref.copy(ref_k), ref.copy(ref_v)
  local opts = {}
  for k, v in pairs(ref_common) do opts[k] = v end
  for k, v in pairs(ref_opts) do opts[k] = v end
  opts.cache_dtype = dtype
  opts.precision = dtype
  local naive = ref_fn(to_ref(q), naive_k, naive_v, opts)
  opts.precision = "f64"
  local exact = ref_fn(to_ref(q), ref_k, ref_v, opts) -- appends into ref_k, ref_v
  local err = ref.max_abs_diff(out:to_table(), exact.data)
  local tol = ref.tolerance(dtype, ref.max_abs_diff(naive.data, exact.data))
  worst = math.max(worst, err / tol)
  if err > tol then error(string.format("%s: error %.3g exceeds tolerance %.3g", what, err, tol)) end
  return err, tol
end

-- 3. Prefill: all prompts in one varlen call; their k/v are rotated and
--    appended into the pages, then attended causally.
local total = 0
local cu = { 0 }
for b = 1, B do total = total + prompt_lens[b]; cu[b + 1] = total end
local q = pa.randn({ total, H, D }, dtype, dev, 1)
local k = pa.randn({ total, Hk, D }, dtype, dev, 2)
local v = pa.randn({ total, Hk, D }, dtype, dev, 3)
local cu_seqlens_q = pa.from_table(cu, { B + 1 }, "i32", dev)
local seqused_k = pa.from_table(prompt_lens, { B }, "i32", dev)
local t0 = clock()
local out = assert(pa.attention_varlen(q, k_cache, v_cache, {
  cu_seqlens_q = cu_seqlens_q, seqused_k = seqused_k, block_table = block_table,
  k = k, v = v, rotary_cos = rotary_cos, rotary_sin = rotary_sin,
  rotary_interleaved = false, causal = true,
}))
dev:synchronize()
local prefill_ms = (clock() - t0) * 1e3
local err, tol = compare("prefill", out, ref.attention_varlen, q, {
  cu_seqlens_q = to_ref(cu_seqlens_q), seqused_k = to_ref(seqused_k), k = to_ref(k), v = to_ref(v),
})
print(string.format("prefill  %3d tokens in %d sequences: %7.2f ms  (max error %.2g, tolerance %.2g)",
  total, B, prefill_ms, err, tol))

-- 4. Decode: one token per sequence per step, appended at its current length.
local lens = { unpack(prompt_lens) }
local decode_ms = 0
for step = 1, STEPS do
  local qd = pa.randn({ B, 1, H, D }, dtype, dev, 100 + step)
  local kd = pa.randn({ B, 1, Hk, D }, dtype, dev, 200 + step)
  local vd = pa.randn({ B, 1, Hk, D }, dtype, dev, 300 + step)
  local cache_seqlens = pa.from_table(lens, { B }, "i32", dev)
  t0 = clock()
  local o = assert(pa.attention_with_kvcache(qd, k_cache, v_cache, {
    k = kd, v = vd, cache_seqlens = cache_seqlens, block_table = block_table,
    rotary_cos = rotary_cos, rotary_sin = rotary_sin, rotary_interleaved = false, causal = true,
  }))
  dev:synchronize()
  local ms = (clock() - t0) * 1e3
  decode_ms = decode_ms + ms
  err, tol = compare("decode step " .. step, o, ref.attention_with_kvcache, qd, {
    k = to_ref(kd), v = to_ref(vd), cache_seqlens = to_ref(cache_seqlens),
  })
  for b = 1, B do lens[b] = lens[b] + 1 end
  print(string.format("decode step %d: lengths {%s}: %6.3f ms  (max error %.2g, tolerance %.2g)",
    step, table.concat(lens, ", "), ms, err, tol))
end

-- 5. The caches hold what the reference appended (to one rounding step).
local function cache_ok(dev_t, ref_t)
  local a, b = dev_t:to_table(), ref_t.data
  local rel = ({ f32 = 2 ^ -23, f16 = 2 ^ -10, bf16 = 2 ^ -7 })[dtype]
  for i = 1, #a do
    if math.abs(a[i] - b[i]) > rel * math.abs(b[i]) * 1.0001 then return false end
  end
  return true
end
assert(cache_ok(k_cache, ref_k) and cache_ok(v_cache, ref_v), "caches differ from the reference")
print(string.format("all outputs within tolerance (worst %.0f%% of it); caches match the reference",
  worst * 100))
print(string.format("time: prefill %.2f ms, decode %.3f ms per step (wall clock)", prefill_ms,
  decode_ms / STEPS))
