-- pagedattn.sweep.measures: ready-made workloads for sweeps (decode, prefill,
-- and either by the point's `kind`) and the builders they share with
-- scripts/bench*.lua: paged or contiguous K/V caches, a decode call over a
-- mixed batch, rotary tables.
--
-- Point fields (all optional): batch (1), heads (32), kv_heads (8), head_dim
-- (128), dtype ("bf16"), page (16; 0 or "none" = contiguous, unpaged),
-- context (decode: keys in the cache, 4096; prefill: keys before the new
-- tokens, 0), seqlen (prefill: new tokens, 2048; decode: 1), causal (prefill:
-- true), num_splits (0: the library chooses), page_order ("shuffled" like a
-- pool after some churn, or "sequential").
local M = {}

-- 0 .. n-1 in a fixed pseudo-random order (an LCG, so every run and host agrees).
function M.shuffled_pages(n, seed)
  local ids = {}
  for i = 1, n do ids[i] = i - 1 end
  local x = seed
  for i = n, 2, -1 do
    x = (x * 1103515245 + 12345) % 2147483648
    local j = x % i + 1
    ids[i], ids[j] = ids[j], ids[i]
  end
  return ids
end

local dtype_bytes = { f32 = 4, f16 = 2, bf16 = 2 }
local cache_bytes = { f32 = 4, f16 = 2, bf16 = 2, fp8_e4m3 = 1, fp8_e5m2 = 1 }

local function unpaged(page)
  return page == nil and false or page == 0 or page == "none" or page == "unpaged"
end

-- K/V caches holding B sequences of L keys: paged [B * ceil(L/page), page, Hk, D]
-- with a block table, or contiguous [B, L, Hk, D].
function M.make_cache(lib, dev, B, L, Hk, D, page, dtype, order)
  if unpaged(page) then
    return lib.randn({ B, L, Hk, D }, dtype, dev, 1), lib.randn({ B, L, Hk, D }, dtype, dev, 2), nil
  end
  assert(type(page) == "number" and page >= 1, "page: a size >= 1, or 0 / \"none\" for unpaged")
  local per = math.max(1, math.ceil(L / page))
  local ids
  if order == "sequential" then
    ids = {}
    for i = 1, B * per do ids[i] = i - 1 end
  else
    ids = M.shuffled_pages(B * per, 7)
  end
  local kc = lib.randn({ B * per, page, Hk, D }, dtype, dev, 1)
  local vc = lib.randn({ B * per, page, Hk, D }, dtype, dev, 2)
  local bt = lib.from_table(ids, { B, per }, "i32", dev)
  return kc, vc, bt
end

-- One decode call of the batch named `name`, "BxL" (B sequences of L keys)
-- or "BxL+BxL..." (one batch of them all, the lengths in a fixed shuffled
-- order): one query a sequence of o.H heads, a cache from make_cache of
-- o.Hk heads, o.D, o.dtype, o.page (0: contiguous) and o.order (o.kv_dtype:
-- the caches' dtype instead, e.g. "fp8_e4m3", with o.k_scale, o.v_scale). Returns the
-- call (its tensors live as long as it), its `out` tensor and the bytes of
-- K/V it reads; nil for a name that is not a batch.
function M.decode_batch(lib, dev, name, o)
  local lens, parts = {}, 0
  for b, l in name:gmatch("(%d+)x(%d+)") do
    parts = parts + 1
    for _ = 1, tonumber(b) do lens[#lens + 1] = tonumber(l) end
  end
  if parts == 0 then return nil end
  require("pagedattn.reference").rng(11):shuffle(lens)
  local B, L, keys = #lens, 0, 0
  for _, l in ipairs(lens) do L, keys = math.max(L, l), keys + l end
  local kc, vc, bt = M.make_cache(lib, dev, B, L, o.Hk, o.D, o.page, o.kv_dtype or o.dtype, o.order)
  local q = assert(lib.randn({ B, 1, o.H, o.D }, o.dtype, dev, 3))
  local out = assert(lib.tensor({ B, 1, o.H, o.D }, o.dtype, dev))
  local seqlens = parts == 1 and L or assert(lib.from_table(lens, { B }, "i32", dev))
  local opts = { block_table = bt, cache_seqlens = seqlens, out = out, k_scale = o.k_scale, v_scale = o.v_scale }
  return function() assert(lib.attention_with_kvcache(q, kc, vc, opts)) end, out,
    2 * keys * o.Hk * o.D * cache_bytes[o.kv_dtype or o.dtype]
end

-- One rotary append of B sequences x n new tokens (the bench's append
-- workload): k and v of o.dtype, o.Hk heads of o.D, into caches from
-- make_cache (o.page, o.order) of o.L keys a sequence (default 4096) at its
-- last n positions, GPT-NeoX rotary, no queries (q of 0 rows of o.H heads).
-- o.kv_dtype: the caches' dtype instead (fp8: scales 0.5 and 0.25). Returns
-- the call (its tensors live as long as it), the two caches, and the bytes
-- it moves (k and v read in o.dtype, written in the caches' dtype).
function M.append_batch(lib, dev, B, n, o)
  local L, kv = o.L or 4096, o.kv_dtype or o.dtype
  local fp8 = kv:find("fp8", 1, true) ~= nil
  local kc, vc, bt = M.make_cache(lib, dev, B, L, o.Hk, o.D, o.page, kv, o.order)
  local k = assert(lib.randn({ B, n, o.Hk, o.D }, o.dtype, dev, 4))
  local v = assert(lib.randn({ B, n, o.Hk, o.D }, o.dtype, dev, 5))
  local rc, rs = M.rope_tables(lib, dev, L, o.D / 2, o.dtype)
  local q = assert(lib.tensor({ B, 0, o.H, o.D }, o.dtype, dev))
  local opts = { block_table = bt, cache_seqlens = L - n, k = k, v = v, rotary_cos = rc, rotary_sin = rs,
    rotary_interleaved = false, k_scale = fp8 and 0.5 or nil, v_scale = fp8 and 0.25 or nil }
  return function() assert(lib.attention_with_kvcache(q, kc, vc, opts)) end, kc, vc,
    2 * B * n * o.Hk * o.D * (cache_bytes[o.dtype] + cache_bytes[kv])
end

-- Rotary tables for positions 0 .. L - 1 of rotary dim 2 half (base 10000,
-- GPT-NeoX's frequencies): cos and sin tensors [L, half] of `dtype`.
function M.rope_tables(lib, dev, L, half, dtype)
  local cs, sn = {}, {}
  for pos = 0, L - 1 do
    for j = 0, half - 1 do
      local th = pos * 10000 ^ (-j / half)
      cs[pos * half + j + 1], sn[pos * half + j + 1] = math.cos(th), math.sin(th)
    end
  end
  return assert(lib.from_table(cs, { L, half }, dtype, dev)), assert(lib.from_table(sn, { L, half }, dtype, dev))
end

local function shape_of(p)
  local s = {
    B = p.batch or 1, H = p.heads or 32, Hk = p.kv_heads or 8, D = p.head_dim or 128,
    dtype = p.dtype or "bf16", page = p.page == nil and 16 or p.page,
  }
  s.esize = dtype_bytes[s.dtype] or error("dtype: '" .. tostring(s.dtype) .. "' is not f32, f16 or bf16", 0)
  return s
end

-- A workload's tensors: caches of `keys` keys per sequence, q and out of Sq
-- queries per sequence.
local function tensors_of(p, env, s, keys, Sq)
  local lib, dev = env.pa, env.device
  local kc, vc, bt = M.make_cache(lib, dev, s.B, keys, s.Hk, s.D, s.page, s.dtype, p.page_order)
  local q = lib.randn({ s.B, Sq, s.H, s.D }, s.dtype, dev, 3)
  local out = lib.tensor({ s.B, Sq, s.H, s.D }, s.dtype, dev)
  return kc, vc, bt, q, out
end

-- Decode: one new query token per sequence over `context` cached keys.
-- Memory-bound: judged by the K/V bytes read.
function M.decode(p, env)
  local lib = env.pa
  local s = shape_of(p)
  local L = p.context or 4096
  local Sq = p.seqlen or 1
  local kc, vc, bt, q, out = tensors_of(p, env, s, L, Sq)
  local opts = { cache_seqlens = L, block_table = bt, out = out, num_splits = p.num_splits,
                 causal = Sq > 1 and p.causal ~= false or nil }
  return {
    run = function() assert(lib.attention_with_kvcache(q, kc, vc, opts)) end,
    bytes = 2.0 * s.B * L * s.Hk * s.D * s.esize,
    flops = 4.0 * s.B * Sq * L * s.H * s.D,
    bound = "memory",
  }
end

-- Prefill (context = 0) or chunked prefill (new tokens after `context` keys):
-- seqlen queries per sequence over context + seqlen keys, causal by default.
-- Compute-bound: judged by 4 * H * D flops per unmasked (query, key) pair.
function M.prefill(p, env)
  local lib = env.pa
  local s = shape_of(p)
  local Sq = p.seqlen or 2048
  local ctx = p.context or 0
  local Sk = ctx + Sq
  local causal = p.causal ~= false
  local kc, vc, bt, q, out = tensors_of(p, env, s, Sk, Sq)
  local opts = { cache_seqlens = Sk, block_table = bt, out = out, causal = causal,
                 num_splits = p.num_splits }
  -- bottom-right aligned causal mask: query i sees ctx + i + 1 keys
  local pairs_ = causal and (Sq * ctx + Sq * (Sq + 1) / 2) or Sq * Sk
  return {
    run = function() assert(lib.attention_with_kvcache(q, kc, vc, opts)) end,
    bytes = 2.0 * s.B * Sk * s.Hk * s.D * s.esize + 2.0 * s.B * Sq * s.H * s.D * s.esize,
    flops = 4.0 * s.B * s.H * s.D * pairs_,
    bound = "compute",
  }
end

-- Decode or prefill by the point's `kind` ("decode" | "prefill" | "chunked_prefill").
function M.attention(p, env)
  local kind = p.kind or "decode"
  if kind == "decode" then return M.decode(p, env) end
  if kind == "prefill" or kind == "chunked_prefill" then return M.prefill(p, env) end
  error("kind: '" .. tostring(kind) .. "' is not decode or prefill", 0)
end

return M
