-- Prefill and chunked prefill on the CUDA device against the CPU backend (the
-- CPU is checked against the float64 reference by the CPU specs): seqlen_q x
-- seqlen_k from 1 to a few thousand, page sizes 1, 3, 16, 48, 256 and
-- contiguous caches, bf16 and f16, head dims 64/128/256, GQA groups 1 and 4,
-- causal and not, sliding window, softcap, ALiBi, the LSE always; a varlen
-- batch mixing prefills, chunked prefills, decodes and an empty sequence;
-- caches whose rows past the keys hold NaN (never to reach out); and
-- the issue's case for compute-sanitizer (appends of 170 tokens into an empty
-- paged cache with random block tables, repeated). Tagged #gpu.
--
-- Same inputs on both devices (randn is one stream everywhere; tables from
-- Lua), the tolerance of spec/gpu_large_spec.lua: docs/design.md's rule with the
-- naive-precision error measured by the Lua reference on one slice of the
-- problem (the last queries of one sequence, one kv head's query heads, all
-- its keys), plus one rounding step of the dtype at the CPU output's largest
-- value (the CPU's output is itself rounded). Appended k/v must match bit for
-- bit. Each case prints one line to stderr; a failure names the case, its
-- seed and how to rerun it.
--   PAGEDATTN_GPU_SPEC_DEVICE=cpu PAGEDATTN_GPU_SPEC_SMALL=1  a dry run on the CPU
--   PAGEDATTN_PREFILL_REPEAT=N  repetitions of the memcheck case (default 100)
--   scripts/test --tags=gpu spec/gpu_prefill_spec.lua
--   compute-sanitizer --tool memcheck luajit $(command -v busted) --lua=luajit \
--     --tags=memcheck spec/gpu_prefill_spec.lua   (the issue case alone: what
--     scripts/gpu-run.sh prefill-memcheck runs)
local ffi = require "ffi"
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local core = require "pagedattn.core"
local G = require "gpu_helpers"
local H = require "helpers"

local SPEC = "spec/gpu_prefill_spec.lua"
local dev, why = G.device()
local small = G.small
local SLICE_Q = 3 -- queries of the tolerance slice
-- locals, not globals, in the loops over whole tensors: busted's spec
-- environment makes every global lookup a call (and stops the JIT)
local abs, huge, floor = math.abs, math.huge, math.floor

---------------------------------------------------------------------------
-- cases (pure Lua: the same tables on both devices)
--   c: name, seed, form ("kvcache" | "varlen"), B, H, Hk, D, dtype, page (0:
--   contiguous), sq[b], sk[b] (keys attended, counting appended ones),
--   append (the last sq[b] keys of each sequence come as k/v), causal,
--   window, softcap, alibi (slopes [H]), dup (duplicate pages; only without
--   append), and, made here: cached[b], bt, width, num_pages, S_cache, cu.

local function fill_tables(c, rng)
  c.cached = {}
  for b = 1, c.B do
    assert(c.sk[b] >= c.sq[b] or not c.append, c.name .. ": appends need sk >= sq")
    c.cached[b] = c.append and c.sk[b] - c.sq[b] or c.sk[b]
  end
  if c.form == "varlen" then
    c.cu = { 0 }
    for b = 1, c.B do c.cu[b + 1] = c.cu[b] + c.sq[b] end
    c.total_q = c.cu[c.B + 1]
  else
    for b = 2, c.B do assert(c.sq[b] == c.sq[1], c.name .. ": kvcache cases have one seqlen_q") end
  end
  if c.page > 0 then
    -- duplicates over a smaller pool; distinct pages (and a few spare) otherwise
    c.bt, c.width, c.num_pages = G.paged_table(rng, c.B, c.sk, c.page, c.dup,
      c.dup and function(need) return math.max(1, math.floor(need / 2)) end)
  else
    local cap = 1
    for b = 1, c.B do cap = math.max(cap, c.sk[b]) end
    c.S_cache = cap + 5
  end
  if c.alibi == true then
    c.alibi = {}
    for h = 1, c.H do c.alibi[h] = ref.round(rng:uniform() * 0.05, "f32") end
  end
  return c
end

local function describe_case(c)
  local p = { c.name, c.form, c.dtype, string.format("B=%d H=%d/Hk=%d D=%d", c.B, c.H, c.Hk, c.D),
    c.page > 0 and ("page=" .. c.page .. (c.dup and " dup" or "")) or "contiguous",
    "sq={" .. table.concat(c.sq, ",") .. "}", "sk={" .. table.concat(c.sk, ",") .. "}" }
  if c.append then p[#p + 1] = "append" end
  if c.causal then p[#p + 1] = "causal" end
  if c.window then p[#p + 1] = "window={" .. c.window[1] .. "," .. c.window[2] .. "}" end
  if c.softcap then p[#p + 1] = "softcap=" .. c.softcap end
  if c.alibi then p[#p + 1] = "alibi" end
  p[#p + 1] = "seed=" .. c.seed
  return table.concat(p, " ")
end

-- A kvcache case: B sequences of Sq queries over sk keys (per sequence).
local function kv_case(name, i, fields)
  local seed = H.seed(name, i)
  local rng = ref.rng(seed)
  local c = { name = name, seed = seed, form = "kvcache", B = 1, Hk = 2, group = 4, D = 128, dtype = "bf16",
    page = 16 }
  for k, v in pairs(fields) do c[k] = v end
  c.H = c.Hk * c.group
  local Sq, Sk = c.Sq, c.Sk
  c.sq, c.sk = {}, {}
  for b = 1, c.B do
    c.sq[b] = Sq
    -- later sequences a little shorter (per-sequence lengths), never below Sq
    c.sk[b] = math.max(Sq, Sk - 13 * (b - 1))
  end
  return fill_tables(c, rng)
end

---------------------------------------------------------------------------
-- running and comparing

local function randn(shape, c, device, k) return assert(pa.randn(shape, c.dtype, device, c.seed + k)) end

local function build(c, device)
  local t = { opts = {} }
  local o = t.opts
  if c.form == "varlen" then
    t.q = randn({ c.total_q, c.H, c.D }, c, device, 1)
    o.cu_seqlens_q = assert(pa.from_table(c.cu, { c.B + 1 }, "i32", device))
    o.seqused_k = assert(pa.from_table(c.sk, { c.B }, "i32", device))
    if c.append then
      o.k = randn({ c.total_q, c.Hk, c.D }, c, device, 2)
      o.v = randn({ c.total_q, c.Hk, c.D }, c, device, 3)
    end
  else
    t.q = randn({ c.B, c.sq[1], c.H, c.D }, c, device, 1)
    o.cache_seqlens = assert(pa.from_table(c.cached, { c.B }, "i32", device))
    if c.append then
      o.k = randn({ c.B, c.sq[1], c.Hk, c.D }, c, device, 2)
      o.v = randn({ c.B, c.sq[1], c.Hk, c.D }, c, device, 3)
    end
  end
  local shape = c.page > 0 and { c.num_pages, c.page, c.Hk, c.D } or { c.B, c.S_cache, c.Hk, c.D }
  t.k_cache = randn(shape, c, device, 4)
  t.v_cache = randn(shape, c, device, 5)
  if c.page > 0 then o.block_table = assert(pa.from_table(c.bt, { c.B, c.width }, "i32", device)) end
  if c.nan_tail then
    -- every cache row no query may read holds NaN: the rest of each
    -- sequence's last page (or contiguous row) and the pages nobody uses
    -- (distinct pages only: c.dup must be off). A kernel that lets one in
    -- (0 x NaN is NaN) poisons out.
    local row, nan = c.Hk * c.D, 0 / 0
    local rows = {}
    for i = 1, row do rows[i] = nan end
    local function poison(r) G.write(t.k_cache, r * row, rows); G.write(t.v_cache, r * row, rows) end
    assert(not c.dup and not c.append, c.name .. ": NaN tails need distinct pages and no appends")
    if c.page > 0 then
      local used = {}
      for b = 0, c.B - 1 do
        local n = math.ceil(c.sk[b + 1] / c.page)
        for j = 0, n - 1 do used[c.bt[b * c.width + j + 1]] = true end
        for tok = c.sk[b + 1], n * c.page - 1 do
          poison(c.bt[b * c.width + floor(tok / c.page) + 1] * c.page + tok % c.page)
        end
      end
      for pg = 0, c.num_pages - 1 do
        if not used[pg] then for r = 0, c.page - 1 do poison(pg * c.page + r) end end
      end
    else
      for b = 0, c.B - 1 do
        for tok = c.sk[b + 1], c.S_cache - 1 do poison(b * c.S_cache + tok) end
      end
    end
  end
  if c.alibi then o.alibi_slopes = assert(pa.from_table(c.alibi, { c.H }, "f32", device)) end
  o.causal = c.causal or nil
  o.window_size = c.window
  o.softcap = c.softcap
  o.return_softmax_lse = true
  return t
end

local function run(c, device)
  local t = build(c, device)
  local fn = c.form == "varlen" and pa.attention_varlen or pa.attention_with_kvcache
  local out, lse = fn(t.q, t.k_cache, t.v_cache, t.opts)
  if not out then error(string.format("%s on %s: %s", c.name, device.name, tostring(lse)), 0) end
  return t, out, lse
end

-- A whole tensor as a double array (fast to compare from LuaJIT).
local function f64(t)
  local n = t.numel
  local buf = ffi.new("double[?]", math.max(1, n))
  if n > 0 then assert(core.C.pa_tensor_read_f64(core.ctx, t.handle, 0, buf, n) == 0, core.last_error()) end
  return buf, n
end

-- max |a - b| over [lo, hi) of two double arrays (NaN: infinite; equal
-- infinities: 0), and the largest finite |b|.
local function diff(a, b, lo, hi)
  local worst, biggest = 0, 0
  for i = lo, hi - 1 do
    local x, y = a[i], b[i]
    if x ~= x or y ~= y then return huge, biggest end
    if x ~= y then
      local d = abs(x - y)
      if d > worst then worst = d end
    end
    local m = abs(y)
    if m > biggest and m < huge then biggest = m end
  end
  return worst, biggest
end

-- Element offset of token `tok` of sequence b (0-based) in a cache.
local function token_offset(c, b, tok)
  if c.page > 0 then
    local page = c.bt[b * c.width + floor(tok / c.page) + 1]
    return ((page * c.page + tok % c.page) * c.Hk) * c.D
  end
  return ((b * c.S_cache + tok) * c.Hk) * c.D
end

-- The naive-precision tolerance on one slice of the CPU problem (after the
-- call): sequence b, kv head 0 and its query heads, the last SLICE_Q queries,
-- all keys (the causal / window / ALiBi diagonal stays where it was).
local function slice_tolerance(c, t, b)
  local sq, sk = c.sq[b + 1], c.sk[b + 1]
  local nq = math.min(sq, SLICE_Q)
  if nq == 0 or sk == 0 then return 1e-5, 0 end
  local q0 = (c.form == "varlen" and c.cu[b + 1] or b * sq) + sq - nq
  local q, k, v, opts = G.slice(t, c.H, c.Hk, c.D, q0, nq, sk, function(tok) return token_offset(c, b, tok) end, c)
  return G.naive_tolerance(c.dtype, q, k, v, opts)
end

local function fail(c, msg)
  error(string.format("%s\n  case: %s\n  %s", msg, describe_case(c), H.rerun(SPEC)), 0)
end

-- The appended rows of every sequence, bit for bit (only they were written).
local function check_appended(c, tg, tc, which)
  local row = c.Hk * c.D
  for _, name in ipairs({ "k_cache", "v_cache" }) do
    local a, c_ = f64(tg[name]), f64(tc[name])
    for b = 0, c.B - 1 do
      if not which or which[b] then
        for tok = c.cached[b + 1], c.sk[b + 1] - 1 do
          local off = token_offset(c, b, tok)
          for e = off, off + row - 1 do
            if a[e] ~= c_[e] then
              fail(c, string.format("%s: sequence %d token %d element %d: %.9g on %s, %.9g on the CPU", name, b,
                tok, e - off, a[e], dev.name, c_[e]))
            end
          end
        end
      end
    end
  end
end

-- Runs c on the device and the CPU and compares out, lse (and the appended
-- rows). slice_b: the sequence the tolerance is measured on (default: the one
-- with the most queries).
local function compare(c, slice_b)
  local cpu = assert(pa.device("cpu"))
  local ok, err = pcall(function()
    local tg, og, lg = run(c, dev)
    local tc, oc, lc = run(c, cpu)
    if not slice_b then
      slice_b = 0
      for b = 1, c.B - 1 do if c.sq[b + 1] > c.sq[slice_b + 1] then slice_b = b end end
    end
    local tol, naive = slice_tolerance(c, tc, slice_b)
    local a, n = f64(og)
    local b_ = f64(oc)
    local err_out, biggest = diff(a, b_, 0, n)
    tol = tol + biggest * G.STEP[c.dtype]
    local la, ln = f64(lg)
    local err_lse = diff(la, f64(lc), 0, ln)
    io.stderr:write(string.format("  %s: max |cuda - cpu| out %.3g, lse %.3g; tolerance %.3g (naive %s error %.3g)\n",
      describe_case(c), err_out, err_lse, tol, c.dtype, naive))
    if err_out > tol then
      fail(c, string.format("out differs from the CPU by %.4g > tolerance %.4g", err_out, tol))
    end
    if err_lse > tol then
      fail(c, string.format("lse differs from the CPU by %.4g > tolerance %.4g", err_lse, tol))
    end
    if c.append then check_appended(c, tg, tc) end
  end)
  if not ok then
    if tostring(err):find("\n  case: ", 1, true) then error(err, 0) end
    fail(c, tostring(err))
  end
end

---------------------------------------------------------------------------
-- the grid

local SQ = small and { 1, 7, 64, 170 } or { 1, 7, 64, 170, 500, 1031, 2048 }
local SK_MAX = small and 300 or 4100

-- (sq, sk) pairs: sk in {sq, sq + 37, SK_MAX}, sk >= sq
local function grid_pairs()
  local pairs_ = {}
  for _, sq in ipairs(SQ) do
    local seen = {}
    for _, sk in ipairs({ sq, sq + 37, SK_MAX }) do
      if sk >= sq and not seen[sk] then
        seen[sk] = true
        pairs_[#pairs_ + 1] = { sq, sk }
      end
    end
  end
  return pairs_
end

describe("#gpu prefill on CUDA against the CPU backend", function()
  if G.pending_without(pending, dev, why) then return end

  it("#gpu grid seqlen_q x seqlen_k (1 to 4100), causal, bf16, D 128, GQA 4, page 16", function()
    for i, p in ipairs(grid_pairs()) do
      compare(kv_case("prefill grid causal", i, { Sq = p[1], Sk = p[2], causal = true,
        B = p[1] * p[2] <= 300000 and 2 or 1 }))
    end
  end)

  it("#gpu grid seqlen_q x seqlen_k, not causal, pages 1, 256, 48 (duplicates) and contiguous", function()
    local pages = { 1, 256, 48, 0 }
    for i, p in ipairs(grid_pairs()) do
      local page = pages[(i - 1) % #pages + 1]
      compare(kv_case("prefill grid full", i, { Sq = p[1], Sk = p[2], page = page, dup = page == 48,
        B = p[1] * p[2] <= 300000 and 2 or 1 }))
    end
  end)

  it("#gpu grid seqlen_q x seqlen_k, causal, pages 3, 256, 1 and contiguous, f16", function()
    local pages = { 3, 256, 1, 0 }
    for i, p in ipairs(grid_pairs()) do
      compare(kv_case("prefill grid f16", i, { Sq = p[1], Sk = p[2], page = pages[(i - 1) % #pages + 1],
        causal = true, dtype = "f16" }))
    end
  end)

  it("#gpu dtypes x head dims x GQA groups: bf16/f16, D 64/128/256, groups 1/4", function()
    local shapes = small and { { 64, 101 }, { 170, 170 }, { 7, 300 } }
      or { { 170, 207 }, { 500, 4100 }, { 1031, 1031 }, { 64, 101 }, { 2048, 2085 }, { 7, 4100 } }
    local pages = { 16, 256, 3, 0, 1 }
    local i = 0
    for _, dt in ipairs({ "bf16", "f16" }) do
      for _, D in ipairs({ 64, 128, 256 }) do
        for _, group in ipairs({ 1, 4 }) do
          i = i + 1
          local s = shapes[(i - 1) % #shapes + 1]
          compare(kv_case("prefill dtypes", i, { Sq = s[1], Sk = s[2], dtype = dt, D = D, group = group,
            page = pages[(i - 1) % #pages + 1], causal = i % 2 == 1 }))
        end
      end
    end
  end)

  -- prefill_ws's TMA boxes (forced: small problems would go to the wgmma
  -- kernel): page boxes (tma=2: a page's rows, every column, in one box; 2
  -- to 16 8-row groups a box) at pages 16 to 256 and head dims 64 / 128 /
  -- 256, appended or cached keys, duplicate pages; the box per 64 columns
  -- (prefill_page_boxes 0) at pages 16 and 256; and the cp.async gather
  -- (pages of 48: no TMA). On Hopper the plan must show each.
  it("#gpu ws TMA boxes (forced ws): page boxes at pages 16-256, D 64/128/256; boxes of 64 columns; gather", function()
    local list = {
      { Sq = 170, Sk = 207, page = 16, dup = true, B = 3 },
      { Sq = 300, Sk = 1337, page = 32, D = 256, dtype = "f16", causal = true },
      { Sq = 64, Sk = 250, page = 64, D = 64, group = 1, dup = true, B = 2 },
      { Sq = 500, Sk = 500, page = 128, causal = true, append = true, B = 2 },
      { Sq = 7, Sk = 4100, page = 256, D = 256, causal = true },
      { Sq = 1031, Sk = 1031, page = 16, causal = true, append = true, Hk = 8, boxes = "0" },
      { Sq = 100, Sk = 2085, page = 256, D = 64, dup = true, boxes = "0" },
      { Sq = 170, Sk = 300, page = 48, causal = true, append = true, B = 2 },
      { Sq = 64, Sk = 700, page = 48, D = 256, dup = true },
    }
    for i, f in ipairs(list) do
      local boxes = f.boxes or "1"
      f.boxes = nil
      local tma = f.page == 48 and "tma=0" or boxes == "0" and "tma=1" or "tma=2"
      local prefill = f.Sq > 8 -- (7 queries a sequence: a decode kernel's)
      G.with_tuning(dev, { prefill_kernel = "ws", prefill_page_boxes = tonumber(boxes) }, function()
        compare(kv_case("prefill ws boxes=" .. boxes, i, f))
        if prefill and G.cc_major(dev) == 9 then
          G.expect_plan(dev, "prefill_ws, " .. tma, "prefill_ws [^\n]*" .. tma)
        end
      end)
    end
  end)

  -- Rows past a sequence's keys are never attended, but a K/V tile that
  -- holds them must not carry their bytes into P V: prefill_ws zeroes the
  -- last V tile's rows past k1 where they came with a box (a page's tail,
  -- pages of a tile or more, contiguous caches) and has TMA zero-fill the
  -- boxes of pages past k1 otherwise; the cp.async kernels
  -- zero-fill each row past k1. Here those rows hold NaN.
  it("#gpu rows past the keys hold NaN: never let into out (forced ws: tails, page boxes, zero fill; default kernels)",
    function()
    local list = {
      { Sq = 64, Sk = 250, page = 16, B = 2, ws = true },                  -- a page's tail: zeroed after the boxes
      { Sq = 96, Sk = 288, page = 16, causal = true, B = 2, ws = true },   -- k1 ends pages: TMA zero fill
      { Sq = 64, Sk = 352, page = 32, D = 256, causal = true, ws = true }, -- zero fill, BN 64
      { Sq = 64, Sk = 300, page = 256, ws = true },                       -- one box a tile: zeroed
      { Sq = 64, Sk = 250, page = 0, B = 2, ws = true },                  -- contiguous: zeroed
      { Sq = 100, Sk = 250, page = 16, causal = true, B = 3 },            -- default kernel
      { Sq = 1, Sk = 250, page = 16, B = 4 },                             -- decode
      { Sq = 4, Sk = 1000, page = 16, B = 2 },                            -- decode, several queries
    }
    for i, f in ipairs(list) do
      local ws = f.ws
      f.ws, f.nan_tail = nil, true
      G.with_tuning(dev, { prefill_kernel = ws and "ws" or "auto" }, function()
        compare(kv_case("prefill NaN past the keys" .. (ws and " (ws)" or ""), i, f))
        if ws and G.cc_major(dev) == 9 then G.expect_plan(dev, "prefill_ws", "prefill_ws ") end
      end)
    end
  end)

  it("#gpu new tokens appended (k/v) then attended: prefill from empty and chunked prefill", function()
    local list = small and {
      { Sq = 170, Sk = 170, page = 16 }, { Sq = 64, Sk = 250, page = 48, dtype = "f16" },
      { Sq = 7, Sk = 300, page = 1 }, { Sq = 100, Sk = 137, page = 0, B = 3 },
    } or {
      { Sq = 1031, Sk = 1031, page = 16, B = 2 }, { Sq = 500, Sk = 4100, page = 16, Hk = 8 },
      { Sq = 170, Sk = 207, page = 48, dtype = "f16", B = 3 }, { Sq = 64, Sk = 4100, page = 1, group = 1 },
      { Sq = 2048, Sk = 2048, page = 256 }, { Sq = 300, Sk = 1337, page = 0, B = 2, D = 256 },
      { Sq = 7, Sk = 44, page = 3, B = 4, D = 64 },
    }
    for i, f in ipairs(list) do
      f.append, f.causal = true, true
      compare(kv_case("prefill append", i, f))
    end
  end)

  it("#gpu sliding window, softcap, ALiBi (causal and not), LSE", function()
    local list = {
      { Sq = 500, Sk = 4100, causal = true, window = { 128, 0 }, page = 16 },
      { Sq = 1031, Sk = 1068, window = { 64, 64 }, page = 256 },
      { Sq = 2048, Sk = 2048, causal = true, softcap = 30, page = 16 },
      { Sq = 170, Sk = 170, softcap = 5, page = 3, dtype = "f16" },
      { Sq = 500, Sk = 537, causal = true, alibi = true, page = 16, B = 2 },
      { Sq = 64, Sk = 4100, alibi = true, page = 48, group = 1 },
      { Sq = 1031, Sk = 4100, causal = true, window = { 300, -1 }, softcap = 30, alibi = true, page = 16 },
      { Sq = 170, Sk = 1000, window = { -1, 20 }, page = 0, D = 64 },
      { Sq = 7, Sk = 7, causal = true, window = { 2, 0 }, alibi = true, page = 1, D = 256 },
    }
    for i, f in ipairs(list) do
      if small then
        f.Sq, f.Sk = math.min(f.Sq, 150), math.min(f.Sk, 300)
        f.Sk = math.max(f.Sk, f.Sq)
      end
      compare(kv_case("prefill options", i, f))
    end
  end)

  ---------------------------------------------------------------------------
  -- varlen: one call for a mixed batch

  -- {queries, keys before the call}: prefills (hundreds of queries, empty
  -- cache), chunked prefills onto existing keys, decodes, 0 queries
  local MIX = {
    { 300, 0 }, { 1, 777 }, { 256, 1500 }, { 1, 4095 }, { 0, 600 }, { 130, 0 }, { 1, 1 },
    { 64, 2000 }, { 17, 33 }, { 0, 0 },
  }
  local function mixed_case(name, append)
    local seed = H.seed(name)
    local rng = ref.rng(seed)
    local c = { name = name, seed = seed, form = "varlen", B = #MIX, H = 32, Hk = 8, D = 128, dtype = "bf16",
      page = 16, causal = true, append = append, sq = {}, sk = {} }
    for b, m in ipairs(MIX) do
      c.sq[b] = m[1]
      c.sk[b] = (small and math.min(m[2], 200) or m[2]) + m[1]
    end
    return fill_tables(c, rng)
  end

  it("#gpu varlen mixed batch (prefill, chunked prefill, decode, 0 queries), keys already cached", function()
    compare(mixed_case("prefill varlen mixed", false))
  end)

  it("#gpu varlen mixed batch, the new tokens appended (k/v) in the same call", function()
    compare(mixed_case("prefill varlen mixed append", true))
  end)

  -- prefill_ws's schedule (forced ws; docs/prefill.md): a causal diagonal whose
  -- upper 64 keys are masked for all of a consumer's rows runs half products
  -- (head dim 128, the last tile peeled), tile 0 unmasked where every row
  -- takes it whole, sequences ordered by their longest query tile. Causal
  -- offsets (Sk - Sq) at every residue of the 32-query tiles, a partial last
  -- tile of <= 64 keys without causality, a window (tile 0 masked), ALiBi
  -- (the natural variant: no peel), head dim 64, sequences of different
  -- lengths, and the mixed varlen batch under both orders.
  it("#gpu ws schedule (forced ws): half diagonal tiles, unmasked tile 0, sequence order", function()
    local list = {
      { Sq = 300, Sk = 300, causal = true, B = 3, dup = true },
      { Sq = 333, Sk = 1352, causal = true, Hk = 8, B = 2 },
      { Sq = 250, Sk = 1269, page = 32, causal = true, append = true },
      { Sq = 200, Sk = 2100, B = 2 },
      { Sq = 129, Sk = 1000, causal = true, window = { 200, 0 } },
      { Sq = 170, Sk = 700, page = 64, causal = true, alibi = true },
      { Sq = 300, Sk = 563, D = 64, causal = true, dup = true },
      { Sq = 96, Sk = 160, causal = true, B = 4 },
    }
    for i, f in ipairs(list) do
      G.with_tuning(dev, { prefill_kernel = "ws" }, function()
        compare(kv_case("prefill ws schedule", i, f))
        if G.cc_major(dev) == 9 then G.expect_plan(dev, "prefill_ws", "prefill_ws ") end
      end)
    end
    for _, order in ipairs({ 0, 1 }) do
      G.with_tuning(dev, { prefill_kernel = "ws", prefill_order = order }, function()
        compare(mixed_case("prefill ws schedule varlen order=" .. order, false))
      end)
    end
  end)
end)

---------------------------------------------------------------------------
-- the issue's case, alone (compute-sanitizer: busted --tags=memcheck)

-- Batch 4, 170 new tokens each appended to an EMPTY paged cache (page 16, 11
-- pages a sequence), 32 query heads and 8 kv heads (the issue says 32 heads;
-- GQA 4 as in docs/design.md's workload), head dim 128, bf16, causal; repeated
-- with a fresh random block table each time, every repetition compared with
-- the CPU.
--
-- Duplicates: appends into a slot that two sequences (or two positions of
-- one) share race on the GPU (blocks run in any order) while the CPU writes
-- in sequence order, so what lands there, and what is read back, is
-- order-dependent. Hence two kinds of repetition:
--   odd:  the written pages are distinct; the entries past each sequence's
--         last page repeat written pages, its own or another's (a stale
--         table: never read, never written through). Everything is compared: out, lse, and both
--         caches whole, bit for bit (nothing else may be written).
--   even: sequences 0 and 1 draw their pages with replacement from 8 shared
--         pages (duplicates within and across them); 2 and 3 have their own.
--         Compared: out and lse of 2 and 3, their pages bit for bit, every
--         page nobody references bit for bit (no stray write), and no NaN /
--         inf anywhere in out and lse (0 and 1 read a mix of finite values).
local ISSUE = { B = 4, new = 170, H = 32, Hk = 8, D = 128, page = 16, width = 16 }
ISSUE.used = math.ceil(ISSUE.new / ISSUE.page) -- 11
ISSUE.num_pages = ISSUE.B * ISSUE.used + 20      -- 64

-- A random table for repetition r: flat [B, width] (0-based sequence b at
-- b * width + j), which sequences are compared (checked[b]), and whether the
-- repetition shares pages.
local function issue_table(rng, r)
  local P, B, used, width = ISSUE.num_pages, ISSUE.B, ISSUE.used, ISSUE.width
  local pool = {}
  for i = 1, P do pool[i] = i - 1 end
  rng:shuffle(pool)
  local bt, checked = {}, {}
  local shared = r % 2 == 0
  local next_free = shared and 9 or 1 -- pool[1..8]: the shared pages of even repetitions
  for b = 0, B - 1 do
    checked[b] = not shared or b >= 2
    for j = 1, used do
      local v
      if shared and b < 2 then v = pool[rng:int(1, 8)]
      else v = pool[next_free]; next_free = next_free + 1 end
      bt[b * width + j] = v
    end
  end
  -- past the end: any page, often one another sequence writes
  for b = 0, B - 1 do
    for j = used + 1, width do bt[b * width + j] = bt[rng:int(0, B - 1) * width + rng:int(1, used)] end
  end
  return bt, checked, shared
end

describe("#gpu #memcheck prefill: the issue's case (4 x 170 tokens appended to an empty paged cache, random tables)",
  function()
  if G.pending_without(pending, dev, why) then return end

  it("#gpu issue: batch 4 x 170 new tokens, 32/8 heads, D 128, page 16, causal, random tables with duplicates",
    function()
    local cpu = assert(pa.device("cpu"))
    local reps = tonumber(os.getenv("PAGEDATTN_PREFILL_REPEAT") or "") or 100
    local I = ISSUE
    local row = I.Hk * I.D
    local page_elems = I.page * row
    for r = 1, reps do
      local seed = H.seed("prefill issue", r)
      local rng = ref.rng(seed)
      local bt, checked, shared = issue_table(rng, r)
      -- as a case, for the helpers (token offsets, slice, messages)
      local c = { name = string.format("issue repetition %d (%s)", r, shared and "shared pages" or "distinct pages"),
        seed = seed, form = "kvcache", B = I.B, H = I.H, Hk = I.Hk, D = I.D, dtype = "bf16", page = I.page,
        width = I.width, num_pages = I.num_pages, bt = bt, causal = true, append = true, sq = {}, sk = {},
        cached = {} }
      for b = 1, I.B do c.sq[b], c.sk[b], c.cached[b] = I.new, I.new, 0 end
      local ok, err = pcall(function()
        local tg, og, lg = run(c, dev)
        local tc, oc, lc = run(c, cpu)
        local tol, naive = slice_tolerance(c, tc, 3) -- sequence 3 is compared in every repetition
        local a, n = f64(og)
        local b_ = f64(oc)
        local la, ln = f64(lg)
        local lb = f64(lc)
        -- finite everywhere (a NaN or inf: a read of a slot nobody wrote, or garbage)
        for i = 0, n - 1 do
          if not (a[i] == a[i] and abs(a[i]) < huge) then
            fail(c, string.format("out element %d is %s on %s", i, tostring(a[i]), dev.name))
          end
        end
        for i = 0, ln - 1 do
          if not (la[i] == la[i] and abs(la[i]) < huge) then
            fail(c, string.format("lse element %d is %s on %s", i, tostring(la[i]), dev.name))
          end
        end
        -- out [B, Sq, H, D] and lse [B, H, Sq]: per sequence, contiguous
        local per_out, per_lse = I.new * I.H * I.D, I.H * I.new
        local worst, worst_lse, biggest = 0, 0, 0
        for b = 0, I.B - 1 do
          if checked[b] then
            local e, big = diff(a, b_, b * per_out, (b + 1) * per_out)
            worst, biggest = math.max(worst, e), math.max(biggest, big)
            worst_lse = math.max(worst_lse, (diff(la, lb, b * per_lse, (b + 1) * per_lse)))
          end
        end
        tol = tol + biggest * G.STEP.bf16
        if r == 1 or r == reps or worst > tol or worst_lse > tol then
          io.stderr:write(string.format("  %s: max |cuda - cpu| out %.3g, lse %.3g; tolerance %.3g (naive %.3g)\n",
            c.name, worst, worst_lse, tol, naive))
        end
        if worst > tol then fail(c, string.format("out differs from the CPU by %.4g > tolerance %.4g", worst, tol)) end
        if worst_lse > tol then
          fail(c, string.format("lse differs from the CPU by %.4g > tolerance %.4g", worst_lse, tol))
        end
        -- caches: every page except those of the racing sequences, bit for bit
        local racing = {}
        for b = 0, I.B - 1 do
          if not checked[b] then
            for j = 1, I.used do racing[bt[b * I.width + j]] = true end
          end
        end
        for _, name in ipairs({ "k_cache", "v_cache" }) do
          local ka, kc = f64(tg[name]), f64(tc[name])
          for p = 0, I.num_pages - 1 do
            local e = not racing[p] and G.first_diff(ka, kc, p * page_elems, (p + 1) * page_elems - 1)
            if e then
              fail(c, string.format("%s page %d element %d: %.9g on %s, %.9g on the CPU", name, p,
                e - p * page_elems, ka[e], dev.name, kc[e]))
            end
          end
        end
      end)
      if not ok then
        if tostring(err):find("\n  case: ", 1, true) then
          error(string.format("%s\n  block table: {%s}", tostring(err), table.concat(bt, ",")), 0)
        end
        fail(c, tostring(err) .. "\n  block table: {" .. table.concat(bt, ",") .. "}")
      end
    end
  end)
end)
