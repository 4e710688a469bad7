-- CUDA against the CPU backend at serving sizes, where the float64 reference
-- cannot run whole: the same inputs on both devices (randn is one stream
-- everywhere), the CPU as the reference, and the tolerance of docs/design.md with
-- the naive-precision error measured by the Lua reference on one slice of the
-- problem (one sequence, one kv head's query heads). Tagged #gpu.
--   PAGEDATTN_GPU_SPEC_SMALL=1 shrinks the sizes (dry runs on the CPU).
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local G = require "gpu_helpers"
local H = require "helpers"

local dev, why = G.device()
local small = G.small

-- A problem on a device: the tensors made from seeds, the options.
--   spec: B, H, Hk, D, dtype, page (0: contiguous), keys {per sequence},
--   queries {per sequence} (varlen) or Sq, new (tokens appended), num_pages,
--   bt (flat block table, width), causal, alibi, rotary...
local function build(spec, device)
  local s = spec
  local t = { opts = {} }
  local o = t.opts
  if s.varlen then
    t.q = assert(pa.randn({ s.total_q, s.H, s.D }, s.dtype, device, s.seed + 1))
    o.cu_seqlens_q = assert(pa.from_table(s.cu, { s.B + 1 }, "i32", device))
    o.seqused_k = assert(pa.from_table(s.keys, { s.B }, "i32", device))
  else
    t.q = assert(pa.randn({ s.B, s.Sq, s.H, s.D }, s.dtype, device, s.seed + 1))
    o.cache_seqlens = assert(pa.from_table(s.cached, { s.B }, "i32", device))
  end
  if s.new then
    local shape = s.varlen and { s.total_q, s.Hk, s.D } or { s.B, s.new, s.Hk, s.D }
    o.k = assert(pa.randn(shape, s.dtype, device, s.seed + 2))
    o.v = assert(pa.randn(shape, s.dtype, device, s.seed + 3))
  end
  local cache_shape = s.page > 0 and { s.num_pages, s.page, s.Hk, s.D } or { s.B_cache, s.S_cache, s.Hk, s.D }
  t.k_cache = assert(pa.randn(cache_shape, s.dtype, device, s.seed + 4))
  t.v_cache = assert(pa.randn(cache_shape, s.dtype, device, s.seed + 5))
  if s.page > 0 then o.block_table = assert(pa.from_table(s.bt, { s.B, s.width }, "i32", device)) end
  if s.cache_batch_idx then o.cache_batch_idx = assert(pa.from_table(s.cache_batch_idx, { s.B }, "i32", device)) end
  if s.rotary then
    o.rotary_cos = assert(pa.from_table(s.rotary.cos.data, s.rotary.cos.shape, s.dtype, device))
    o.rotary_sin = assert(pa.from_table(s.rotary.sin.data, s.rotary.sin.shape, s.dtype, device))
    o.rotary_interleaved = s.rotary.interleaved
  end
  if s.alibi then o.alibi_slopes = assert(pa.from_table(s.alibi, { s.H }, "f32", device)) end
  o.causal = s.causal
  o.softcap = s.softcap
  o.window_size = s.window
  o.return_softmax_lse = true
  o.num_splits = s.num_splits
  return t
end

local function run(spec, device)
  local t = build(spec, device)
  local fn = spec.varlen and pa.attention_varlen or pa.attention_with_kvcache
  local out, lse = fn(t.q, t.k_cache, t.v_cache, t.opts)
  assert(out, lse)
  return t, out, lse
end

-- The slice (sequence b, kv head 0, queries [0, nq), keys [0, nk)) of the CPU
-- problem as reference tensors, from the caches after the call.
local function slice(spec, t, b, nq, nk)
  local s = spec
  local D, Hk = s.D, s.Hk
  local q0 = s.varlen and s.cu[b + 1] or b * s.Sq
  local q, k, v, opts = G.slice(t, s.H, Hk, D, q0, nq, nk, function(tok)
    if s.page > 0 then
      local page = s.bt[b * s.width + math.floor(tok / s.page) + 1]
      return ((page * s.page + tok % s.page) * Hk) * D
    end
    local row = s.cache_batch_idx and s.cache_batch_idx[b + 1] or b
    return ((row * s.S_cache + tok) * Hk) * D
  end, s)
  -- rotary: the slice's q is the raw q; rotate it as the kernels do
  if s.rotary then
    opts.rotary_cos, opts.rotary_sin = s.rotary.cos, s.rotary.sin
    opts.rotary_interleaved = s.rotary.interleaved
  end
  return q, k, v, opts
end

local function compare(name, spec, slice_args)
  local cpu = assert(pa.device("cpu"))
  local tg, og, lg = run(spec, dev)
  local tc, oc, lc = run(spec, cpu)
  local q, k, v, opts = slice(spec, tc, slice_args.b, slice_args.nq, slice_args.nk)
  if spec.rotary then
    -- the slice's keys were rotated when appended; rotate q (query i at
    -- position q_pos + i) as the call does
    local D, Gq = spec.D, spec.H / spec.Hk
    for i = 0, slice_args.nq - 1 do
      for g = 0, Gq - 1 do
        local base = (i * Gq + g) * D
        local x = {}
        for d = 1, D do x[d] = q.data[base + d] end
        local y = ref.apply_rotary(x, slice_args.q_pos + i, spec.rotary.cos, spec.rotary.sin, spec.rotary.interleaved)
        for d = 1, D do q.data[base + d] = y[d] end
      end
    end
    opts.rotary_cos, opts.rotary_sin, opts.rotary_interleaved = nil, nil, nil
  end
  local tol, naive = G.naive_tolerance(spec.dtype, q, k, v, opts)
  -- the CPU's output is itself rounded to the dtype: allow that one step more
  local out_c = oc:to_table()
  local biggest = 0
  for i = 1, #out_c do biggest = math.max(biggest, math.abs(out_c[i])) end
  tol = tol + biggest * G.STEP[spec.dtype]
  local err = G.max_diff(og:to_table(), out_c)
  local lse_err = G.max_diff(lg:to_table(), lc:to_table())
  io.stderr:write(string.format("  %s: max |cuda - cpu| out %.3g, lse %.3g; tolerance %.3g (naive %s error %.3g)\n",
    name, err, lse_err, tol, spec.dtype, naive))
  assert(err <= tol, string.format("%s: out differs from the CPU by %.4g > tolerance %.4g (seed %d)", name, err, tol, spec.seed))
  assert(lse_err <= tol, string.format("%s: lse differs from the CPU by %.4g > tolerance %.4g", name, lse_err, tol))
  return tg, tc
end

local function paged_spec(rng, s)
  s.cached = s.cached or {}
  local given = s.num_pages
  s.bt, s.width, s.num_pages = G.paged_table(rng, s.B, s.keys, s.page, s.dup, given and function() return given end)
  return s
end

describe("#gpu CUDA against the CPU backend at serving sizes", function()
  if G.pending_without(pending, dev, why) then return end

  -- One query per sequence over B full caches of S keys (32/8 heads, D 128);
  -- the tolerance slice is sequence 0's first nk keys.
  local function uniform_decode(seed_name, name, B, S, dtype, page, nk)
    local seed = H.seed(seed_name)
    local s = { seed = seed, B = B, Sq = 1, H = 32, Hk = 8, D = 128, dtype = dtype, page = page, keys = {}, cached = {} }
    for b = 1, B do s.keys[b] = S; s.cached[b] = S end
    paged_spec(ref.rng(seed), s)
    compare(name, s, { b = 0, nq = 1, nk = nk })
  end

  it("#gpu decode, batch 64 x 4096 keys, bf16, page 16, random page order", function()
    local S = small and 512 or 4096
    uniform_decode("gpu large decode", "decode 64x4096 bf16 page 16", small and 8 or 64, S, "bf16", 16, S)
  end)

  -- persistent blocks hold 768 page ids a unit (12224 keys at page 16): a
  -- sequence of 13000 keys becomes two pieces of equal length, combined
  it("#gpu decode, batch 40 x 13000 keys, bf16, page 16 (pieces at the page-id cap)", function()
    local S = small and 2048 or 13000
    uniform_decode("gpu large capped", "decode 40x13000 bf16 page 16", small and 4 or 40, S, "bf16", 16, S)
  end)

  it("#gpu decode, batch 8 x 32768 keys, f16, page 256 (many splits)", function()
    local S = small and 2048 or 32768
    uniform_decode("gpu large long", "decode 8x32768 f16 page 256", small and 2 or 8, S, "f16", 256,
      small and S or 4096 * 2)
  end)

  -- Short and long sequences in one decode call: two launches, the long
  -- sequences on persistent blocks (or split over a wave), the short ones a
  -- block per unit (the call's plan must show both). Lengths 1-255 and
  -- 256-4000 (or 8000: few long, the whole call's plan first the short
  -- units' kernel), random page order with duplicates.
  local function mixed_decode(name, nshort, nlong, long_max, dtype)
    local seed = H.seed(name)
    local rng = ref.rng(seed)
    if small then nshort, nlong, long_max = 6, 2, 600 end
    local B = nshort + nlong
    local s = { seed = seed, B = B, Sq = 1, H = 32, Hk = 8, D = 128, dtype = dtype, page = 16, keys = {}, cached = {},
      dup = true }
    for b = 1, B do s.keys[b] = b <= nlong and rng:int(256, long_max) or rng:int(1, 255) end
    rng:shuffle(s.keys)
    s.cached = { unpack(s.keys) }
    paged_spec(rng, s)
    local long_b = 0
    for b = 1, B do
      if s.keys[b] > s.keys[long_b + 1] then long_b = b - 1 end
    end
    compare(name, s, { b = long_b, nq = 1, nk = s.keys[long_b + 1] })
    if not small then
      G.expect_plan(dev, "the short sequences' launch", "keys=0%.%.256\n")
      G.expect_plan(dev, "the long sequences' launch", "keys=256%.%.0\n")
    end
  end
  it("#gpu decode of short and long sequences: 576 x 1-255 keys and 48 x 256-4000, bf16, page 16", function()
    mixed_decode("decode mixed lengths", 576, 48, 4000, "bf16")
  end)
  it("#gpu decode of short and long sequences: 640 x 1-255 keys and 6 x 256-8000, f16, page 16", function()
    mixed_decode("decode mixed lengths, few long", 640, 6, 8000, "f16")
  end)

  -- Units of 256-511 keys: a warp a head tile (decode_hw 2, and the plan must
  -- show it), and the persistent blocks where its blocks would fill under
  -- half a wave: 64 sequences, 128 blocks of four head tiles on 264 slots
  -- (docs/planner.md).
  local function mid_decode(name, B, dtype, hw)
    local seed = H.seed(name)
    local rng = ref.rng(seed)
    if small then B = 6 end
    local s = { seed = seed, B = B, Sq = 1, H = 32, Hk = 8, D = 128, dtype = dtype, page = 16, keys = {}, cached = {},
      dup = true }
    for b = 1, B do s.keys[b] = rng:int(256, 511) end
    s.cached = { unpack(s.keys) }
    paged_spec(rng, s)
    G.with_tuning(dev, { decode_hw = hw and not small and 2 or 1 }, function()
      compare(name, s, { b = 0, nq = 1, nk = s.keys[1] })
      if hw and not small then G.expect_plan(dev, "a warp a head tile", "decode_mma [^\n]* hw=1") end
    end)
  end
  it("#gpu decode of 240 x 256-511 keys, bf16, page 16: a warp a head tile (decode_hw)", function()
    mid_decode("decode 256-511 keys, hw", 240, "bf16", true)
  end)
  it("#gpu decode of 64 x 256-511 keys, f16, page 16: persistent blocks (warp-a-tile under 0.5 waves)", function()
    mid_decode("decode 256-511 keys, persistent", 64, "f16", false)
  end)

  it("#gpu varlen, batch 48 (> 32), 1 to 8 queries, page 16 with duplicates, causal + ALiBi, split-KV", function()
    local seed = H.seed("gpu large varlen")
    local rng = ref.rng(seed)
    local B = 48
    local s = { seed = seed, varlen = true, B = B, H = 16, Hk = 2, D = 128, dtype = "bf16", page = 16,
      keys = {}, cu = { 0 }, causal = true, dup = true, alibi = {} }
    for b = 1, B do
      local nq = rng:int(1, 8)
      s.keys[b] = math.max(nq, rng:int(1, small and 300 or 3000))
      s.cu[b + 1] = s.cu[b] + nq
    end
    s.keys[1] = small and 300 or 3000
    s.total_q = s.cu[B + 1]
    for h = 1, s.H do s.alibi[h] = ref.round(rng:uniform() * 0.05, "f32") end
    paged_spec(rng, s)
    s.num_pages = math.floor(s.num_pages / 2) -- duplicates over a smaller pool
    s.bt = G.block_table(rng, s.B, (function()
      local u = {}
      for b = 1, B do u[b] = math.ceil(s.keys[b] / s.page) end
      return u
    end)(), s.width, s.num_pages, true)
    compare("varlen batch 48 causal alibi", s, { b = 0, nq = s.cu[2], nk = s.keys[1] })
    s.num_splits = 7
    compare("varlen batch 48, 7 splits", s, { b = 0, nq = s.cu[2], nk = s.keys[1] })
  end)

  -- A causal prefill from empty caches with rotary append (k rotated into
  -- the pages, q rotated for the attention): outputs against the CPU, and
  -- the appended keys and values the same bytes on both devices.
  local function rotary_prefill(name, B, S, heads, Hk, half, interleaved)
    local seed = H.seed(name)
    local rng = ref.rng(seed)
    local s = { seed = seed, B = B, Sq = S, new = S, H = heads, Hk = Hk, D = 128, dtype = "bf16", page = 16,
      keys = {}, cached = {}, causal = true }
    for b = 1, B do s.keys[b] = S; s.cached[b] = 0 end
    paged_spec(rng, s)
    local n = S + 8
    local cs, sn = {}, {}
    for pos = 0, n - 1 do
      for j = 0, half - 1 do
        local theta = pos * 10000 ^ (-2 * j / (2 * half))
        cs[pos * half + j + 1] = ref.round(math.cos(theta), "bf16")
        sn[pos * half + j + 1] = ref.round(math.sin(theta), "bf16")
      end
    end
    s.rotary = { cos = ref.tensor({ n, half }, cs), sin = ref.tensor({ n, half }, sn), interleaved = interleaved }
    local nq = 128
    local tg, tc = compare(name, s, { b = 0, nq = nq, nk = nq, q_pos = 0 })
    for b = 0, B - 1 do
      for j = 0, S / s.page - 1 do
        local page = s.bt[b * s.width + j + 1]
        local off, count = page * s.page * s.Hk * s.D, s.page * s.Hk * s.D
        for _, cache in ipairs({ "k_cache", "v_cache" }) do
          local a, c = G.read(tg[cache], off, count), G.read(tc[cache], off, count)
          local i = G.first_diff(a, c)
          if i then
            error(string.format("%s: %s page %d element %d: %.9g on %s, %.9g on the CPU", name, cache, page,
              i - 1, a[i], dev.name, c[i]))
          end
        end
      end
    end
  end

  it("#gpu prefill 2 x 1024 causal from empty caches, rotary append (GPT-NeoX, partial), bf16, page 16", function()
    rotary_prefill("gpu large prefill", 2, small and 256 or 1024, 8, 2, 32, false) -- rotary_dim 64 of 128
  end)

  -- enough new tokens (4 x 1104) that the append kernel takes a token per
  -- warp (split 1): every kv head of a token in one warp. Rotary dim 64:
  -- the rows straight from memory, 8 elements a lane (rotate_rows8); 60 (not
  -- whole 8-element chunks of pairs): staged, 8 kv heads in two batches.
  it("#gpu prefill 4 x 1104 causal, rotary append (GPT-J, partial), 32 / 8 heads: a warp per token", function()
    rotary_prefill("gpu large prefill warp per token", 4, small and 256 or 1104, 32, 8, 32, true)
  end)
  it("#gpu prefill 4 x 1104 causal, rotary append (GPT-J, rotary dim 60), 8 / 8 heads: staged rows", function()
    rotary_prefill("gpu large prefill staged rows", 4, small and 256 or 1104, 8, 8, 30, true)
  end)

  it("#gpu contiguous caches with cache_batch_idx, batch 40, f32, one token appended", function()
    local seed = H.seed("gpu large contiguous")
    local rng = ref.rng(seed)
    local B, S = 40, small and 256 or 2048
    local s = { seed = seed, B = B, Sq = 1, new = 1, H = 8, Hk = 8, D = 64, dtype = "f32", page = 0,
      B_cache = B + 3, S_cache = S, keys = {}, cached = {}, cache_batch_idx = {}, softcap = 20 }
    local rows = {}
    for i = 1, B + 3 do rows[i] = i - 1 end
    rng:shuffle(rows)
    for b = 1, B do
      s.cached[b] = rng:int(0, S - 1)
      s.keys[b] = s.cached[b] + 1
      s.cache_batch_idx[b] = rows[b]
    end
    compare("contiguous batch 40 f32 softcap", s, { b = 0, nq = 1, nk = s.keys[1] })
  end)
end)
