-- FP8 caches on the CUDA device: the same bytes as the CPU where both write
-- (fills, randn, the append: one definition of the stored value), and the
-- differential suite against the float64 reference on every kernel that
-- reads fp8 caches (decode on tensor cores, the CUDA-core decode, the
-- fallback, prefill on mma.sync), both formats, saturating and subnormal
-- ranges, scales per head. Tagged #gpu; pending where there is no CUDA
-- device (PAGEDATTN_GPU_SPEC_DEVICE=cpu: a dry run on the CPU).
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local check = require "pagedattn.check"
local G = require "gpu_helpers"
local H = require "helpers"

local SPEC = "spec/gpu_fp8_spec.lua"
local dev, why = G.device()
local cpu = assert(pa.device("cpu"))
local FORMATS = check.FP8_DTYPES

-- expect(case): after each case's call, what its plan must show (G.expect_plan), or nil
local function run_cases(name, n, want_fn, expect)
  for i = 1, n do
    local seed = H.seed(name, i)
    local rng = ref.rng(seed)
    local case = check.random_case(rng, want_fn(rng, i))
    local ok, r = pcall(check.run, case, dev, rng)
    if ok and expect then
      local eok, eerr = pcall(expect, case)
      if not eok then ok, r = false, eerr end
    end
    if not ok then
      error(string.format("%s\n  case: %s\n  seed: %d\n  %s", tostring(r), check.describe(case), seed, H.rerun(SPEC)), 0)
    end
    H.assert_check(r, seed, SPEC)
  end
end

local function pick(rng, list) return list[rng:int(1, #list)] end

-- pending (true) unless dev is a CUDA device of sm_90, where `kernel` runs
local function pending_without_sm90(kernel)
  if dev.kind == "cuda" and G.cc_major(dev) >= 9 then return false end
  pending(kernel .. " runs on sm_90 only (this device: " .. tostring(dev.kind) .. ")")
  return true
end

-- The first index where two tables differ (NaN equals NaN), or nil.
local function first_diff(a, b)
  for i = 1, math.max(#a, #b) do
    local x, y = a[i], b[i]
    if not ((x ~= x and y ~= y) or x == y) then return i end
  end
  return nil
end

describe("#gpu fp8 caches on CUDA", function()
  if G.pending_without(pending, dev, why) then return end

  for _, fmt in ipairs(FORMATS) do
    it("#gpu " .. fmt .. " tensors: from_table, fill and randn write the CPU's bytes", function()
      local vals = {}
      local rng = H.rng("gpu fp8 values " .. fmt)
      for i = 1, 999 do vals[i] = rng:normal() * 2 ^ rng:int(-20, 18) end
      vals[#vals + 1] = 0 / 0
      vals[#vals + 1] = -math.huge
      local a, b = assert(pa.from_table(vals, nil, fmt, dev)), assert(pa.from_table(vals, nil, fmt, cpu))
      assert.is_nil(first_diff(a:to_table(), b:to_table()))
      a:fill(-1000)
      b:fill(-1000)
      assert.is_nil(first_diff(a:to_table(), b:to_table()))
      local ra, rb = G.randn2({ 4099 }, fmt, dev, cpu, 17)
      assert.is_nil(first_diff(ra:to_table(), rb:to_table()))
    end)

    -- entry: the kernel entry the plan must name. pa_append_new8 (8 elements
    -- a lane) takes new rows without rotary always, with rotary when a warp
    -- has 32 chunks or more (many tokens, so a warp a token: 2 x 2200 new
    -- rows and as many q rows); else pa_append, a lane an element.
    it("#gpu " .. fmt .. " append (rotated, scaled, rounded) writes the CPU's bytes", function()
      local small = { B = 3, S = 5, Hk = 2, D = 64, seqlens = { 0, 7, 11 } }
      local long = { B = 2, S = 2200, seqlens = { 0, 13 } }
      local function cfg(base, t)
        for key, val in pairs(base) do if t[key] == nil then t[key] = val end end
        return t
      end
      for i, c in ipairs({ cfg(small, { rot = true, il = true, per_head = false, entry = "pa_append " }),
                           cfg(small, { rot = true, il = false, per_head = true, entry = "pa_append " }),
                           cfg(small, { rot = false, per_head = true, entry = "pa_append_new8" }),
                           cfg(small, { rot = true, il = true, per_head = true, big = true, entry = "pa_append " }),
                           cfg(long, { rot = true, il = true, per_head = false, Hk = 4, D = 64, entry = "pa_append_new8" }),
                           cfg(long, { rot = true, il = false, per_head = true, big = true, Hk = 8, D = 64, rd = 32,
                             entry = "pa_append_new8" }),
                           cfg(long, { rot = false, per_head = true, Hk = 2, D = 128, entry = "pa_append_new8" }),
                           -- (1 / scale exactly an f32: the products in f32, past the range and below it)
                           cfg(long, { rot = false, per_head = false, big = true, Hk = 2, D = 128,
                             entry = "pa_append_new8" }),
                           cfg(long, { rot = false, per_head = false, tiny = true, Hk = 2, D = 128,
                             entry = "pa_append_new8" }),
                           -- (NaN, infinities, values past the range, at scales that are not powers of two)
                           cfg(long, { rot = true, il = false, per_head = true, specials = true, Hk = 8, D = 64,
                             entry = "pa_append_new8" }),
                           cfg(small, { rot = true, il = true, per_head = true, specials = true, entry = "pa_append " }) }) do
        local rng = H.rng("gpu fp8 append " .. fmt, i)
        local B, S, Hk, D, page = c.B, c.S, c.Hk, c.D, 16
        -- each sequence's pages, in a shuffled order of the pool's
        local per_seq = math.ceil((S + c.seqlens[B]) / page)
        local order = {}
        for j = 1, B * per_seq do order[j] = j - 1 end
        for j = #order, 2, -1 do
          local r = rng:int(1, j)
          order[j], order[r] = order[r], order[j]
        end
        local bt = {}
        for b = 1, B do
          bt[b] = {}
          for j = 1, per_seq do bt[b][j] = order[(b - 1) * per_seq + j] end
        end
        local k_scale, v_scale = 0.25, 1
        if c.per_head then
          k_scale, v_scale = {}, {}
          for h = 1, Hk do k_scale[h], v_scale[h] = 2 ^ rng:int(-3, 2), 2 ^ rng:int(-3, 1) * 1.5 end
          if c.specials then
            for h = 1, Hk do k_scale[h], v_scale[h] = 0.3 * 2 ^ rng:int(-3, 2), 0.7 * 2 ^ rng:int(-3, 1) end
          end
        end
        -- (the same elements on both devices)
        local special_at = {}
        if c.specials then
          for j = 1, 40 do special_at[j] = { rng:int(1, B * S * Hk * D), ({ 0 / 0, math.huge, -math.huge, 1e30, -0.0 })[1 + j % 5] } end
        end
        local function with_specials(t, d)
          if not c.specials then return t end
          local vals = t:to_table()
          for _, sp in ipairs(special_at) do vals[sp[1]] = sp[2] end
          return assert(pa.from_table(vals, t.shape, "bf16", d))
        end
        local caches = {}
        for _, d in ipairs({ dev, cpu }) do
          local kc = assert(pa.tensor({ B * per_seq, page, Hk, D }, fmt, d))
          local vc = assert(pa.tensor({ B * per_seq, page, Hk, D }, fmt, d))
          local mult = c.big and (fmt == "fp8_e4m3" and 300 or 40000) or 1
          local k = assert(pa.randn({ B, S, Hk, D }, "bf16", d, 1))
          local v = assert(pa.randn({ B, S, Hk, D }, "bf16", d, 2))
          local function times(t, m) for j = 1, #t do t[j] = t[j] * m end return t end
          if mult ~= 1 then k = assert(pa.from_table(times(k:to_table(), mult), k.shape, "bf16", d)) end
          k, v = with_specials(k, d), with_specials(v, d)
          if c.tiny then -- fp8 subnormals and zeros
            local m = fmt == "fp8_e4m3" and 2 ^ -8 or 2 ^ -15
            k = assert(pa.from_table(times(k:to_table(), m), k.shape, "bf16", d))
            v = assert(pa.from_table(times(v:to_table(), m), v.shape, "bf16", d))
          end
          local q = assert(pa.randn({ B, S, 2 * Hk, D }, "bf16", d, 3))
          local opts = { k = k, v = v, cache_seqlens = c.seqlens, block_table = bt, causal = true,
            k_scale = k_scale, v_scale = v_scale }
          if c.rot then
            local n, half, cs, sn = S + c.seqlens[B], (c.rd or D) / 2, {}, {}
            for pos = 0, n - 1 do
              for j = 0, half - 1 do
                local th = pos * 10000 ^ (-2 * j / (c.rd or D))
                cs[pos * half + j + 1], sn[pos * half + j + 1] = math.cos(th), math.sin(th)
              end
            end
            opts.rotary_cos = assert(pa.from_table(cs, { n, half }, "bf16", d))
            opts.rotary_sin = assert(pa.from_table(sn, { n, half }, "bf16", d))
            opts.rotary_interleaved = c.il
          end
          assert(pa.attention_with_kvcache(q, kc, vc, opts))
          if d == dev then G.expect_plan(dev, "the fp8 append", "append dtype=bf16 kv=" .. fmt .. " | " .. c.entry) end
          caches[#caches + 1] = { kc:to_table(), vc:to_table() }
        end
        local at = first_diff(caches[1][1], caches[2][1])
        assert(not at, string.format("case %d: k_cache element %s: %s on %s, %s on the CPU", i, tostring(at),
          tostring(at and caches[1][1][at]), dev.name, tostring(at and caches[2][1][at])))
        assert.is_nil(first_diff(caches[1][2], caches[2][2]), "case " .. i .. ": v_cache")
      end
    end)

    it("#gpu " .. fmt .. ": decode on tensor cores (head dims 64, 128; f16, bf16; GQA 1-8; 1-8 queries)", function()
      run_cases("gpu fp8 decode mma " .. fmt, H.scale(24), function(rng)
        return { cache_dtype = fmt, mode = "decode", dtype = pick(rng, { "f16", "bf16" }), D = pick(rng, { 64, 128 }),
          group = pick(rng, { 1, 4, 8 }), page_size = pick(rng, { 0, 1, 3, 16, 256 }), B = rng:int(1, 6),
          max_keys = rng:int(1, 4) * 200, new = rng:int(1, 2) == 1 and 1 or rng:int(2, 8) }
      end, function() G.expect_plan(dev, "decode_mma over fp8", "decode_mma [^\n]* kv=" .. fmt) end)
    end)

    -- decode_mma's block modes over fp8 caches (the tuning forces each, as
    -- gpu_difftest_spec does for 16-bit caches): persistent blocks of four
    -- and of eight warps, one block a unit, a warp a head tile (8 and 16 keys
    -- a warp, one block a unit or persistent), claiming splits
    local modes = {
      { "persistent, four warps", { decode_max_blocks = 5, decode_persist_min_keys = 0, decode_wide = 0 },
        "persist=1 minb=%d+ hw=0 nw=4" },
      { "persistent, eight warps", { decode_max_blocks = 5, decode_persist_min_keys = 0, decode_wide = 2 }, "persist=1" },
      { "one block a unit", { decode_persist = 0 }, "persist=0" },
      { "a warp a head tile, 8 keys", { decode_persist_min_keys = 100000, split_chunk = 100000, decode_hw = 2,
        decode_short_kpw = 8, decode_hw_persist = 0 }, "kpw=8 persist=0 minb=%d+ hw=1" },
      { "a warp a head tile, 16 keys, persistent", { decode_persist_min_keys = 100000, split_chunk = 100000,
        decode_hw = 2, decode_short_kpw = 16, decode_hw_persist = 2, decode_max_blocks = 3 },
        "kpw=16 persist=1 minb=%d+ hw=1" },
      { "claiming splits", { decode_persist = 0, split_chunk = 1024, decode_claim_min = 0, decode_claim = 2 },
        " | [^\n]*claims=1" },
    }
    for _, m in ipairs(modes) do
      it("#gpu " .. fmt .. ": decode_mma, " .. m[1], function()
        -- Every case is checked against the reference; the cases that plan
        -- decode_mma over the fp8 cache (a read of 9 queries is a prefill,
        -- and a small one may not go persistent) must take the forced mode
        -- often enough that this test exercises it.
        local want = m[3]
        if m[1] == "persistent, eight warps" and G.cc_major(dev) < 9 then want = "" end -- (an A100 takes four)
        local pattern = "decode_mma [^\n]*" .. (want ~= "" and (want:sub(1, 3) == " | " and "kv=" .. fmt .. want
          or want .. "[^\n]* kv=" .. fmt) or "kv=" .. fmt)
        -- (six cases at least: at a quarter of the cases, three, a memcheck
        -- run once planned the forced mode for none of them)
        local n, decodes, hits = math.max(6, H.scale(12)), 0, 0
        G.with_tuning(dev, m[2], function()
          run_cases("gpu fp8 mode " .. m[1] .. fmt, n, function(rng)
            local hw = m[1]:find("head tile") ~= nil
            local group = pick(rng, hw and { 1, 2, 4 } or { 1, 4, 8 })
            local w = { cache_dtype = fmt, form = "kvcache", mode = pick(rng, { "decode", "decode", "read" }),
              dtype = pick(rng, { "f16", "bf16" }), D = pick(rng, { 64, 128 }), group = group,
              page_size = pick(rng, { 0, 1, 3, 16, 32, 256 }), B = rng:int(1, 9), max_keys = rng:int(2, 8) * 150,
              k_scale = pick(rng, { 0.5, "head" }), num_splits = 0 }
            if hw then
              w.Hk, w.sq, w.new, w.rotary = pick(rng, { 4, 8 }), 1, 1, group > 4 and false or nil
            end
            if m[1] == "claiming splits" then
              w.page_size, w.cached, w.window = pick(rng, { 1, 3, 16, 32, 256 }), { rng:int(1100, 3000) }, { -1, -1 }
              w.B = 1
            end
            return w
          end, function()
            if dev.kind ~= "cuda" then return end
            local plan = assert(dev:last_plan())
            if m[1] == "one block a unit" then G.expect_plan(dev, m[1], "persistent=1", true) end
            if want == "persist=1" then G.expect_plan(dev, m[1], "persist=1 minb=%d+ hw=0 nw=4", true) end
            if plan:find("decode_mma [^\n]* kv=" .. fmt) then
              decodes = decodes + 1
              if plan:find(pattern) then hits = hits + 1 end
            end
          end)
        end)
        if dev.kind == "cuda" then
          assert(hits >= math.max(1, math.floor(n / 4)), string.format(
            "%s: %d of %d cases planned '%s' (%d decode_mma over %s): the forced mode barely ran",
            m[1], hits, n, pattern, decodes, fmt))
        end
      end)
    end

    it("#gpu " .. fmt .. ": decode on CUDA cores and the fallback (f32 q, head dims 256, 96, 40, 37)", function()
      run_cases("gpu fp8 decode other " .. fmt, H.scale(16), function(rng)
        return { cache_dtype = fmt, mode = "decode", dtype = pick(rng, { "f32", "bf16", "f16" }),
          D = pick(rng, { 256, 96, 40, 37 }), group = pick(rng, { 1, 4 }), page_size = pick(rng, { 0, 5, 16 }) }
      end)
    end)

    -- prefill_fp8 = 1 (the default): where the Hopper kernels would run the
    -- call over 16-bit caches (sm_90, paged), they run it over a 16-bit copy
    -- of the keys it reads (pa_dequant first); elsewhere mma.sync over the
    -- fp8 bytes. prefill_fp8 = 0: mma.sync always.
    for _, dequant in ipairs({ 1, 0 }) do
      it("#gpu " .. fmt .. ": prefill and chunked prefill (tensor cores at head dims 64-256; the fallback), prefill_fp8 "
        .. dequant, function()
        local hits = 0
        G.with_tuning(dev, { prefill_fp8 = dequant }, function()
          run_cases("gpu fp8 prefill " .. fmt .. (dequant == 1 and "" or " mma"), H.scale(16), function(rng, i)
            local w = { cache_dtype = fmt, mode = pick(rng, { "prefill", "chunked" }), dtype = pick(rng, { "f16", "bf16" }),
              D = pick(rng, { 64, 128, 256, 80, 40 }), B = rng:int(1, 3), causal = rng:int(1, 3) > 1 }
            if i <= 2 then w.D, w.page_size, w.k_scale, w.mode = 128, 16, "head", "prefill" end -- (the common shape)
            return w
          end, function(case)
            if dev.kind ~= "cuda" then return end
            local plan = assert(dev:last_plan())
            for line in plan:gmatch("[^\n]+") do
              if line:find("^prefill_w") then
                assert(not line:find("kv="), "a Hopper prefill kernel over fp8 bytes:\n" .. plan)
                assert(dequant == 1 and plan:find("| pa_dequant ", 1, true), "a Hopper prefill kernel without the copy:\n" .. plan)
                hits = hits + 1
              end
            end
            if dequant == 0 then
              G.expect_plan(dev, "prefill_fp8 = 0: no copy", "pa_dequant", true)
              if case.D % 16 == 0 and case.new[1] > 8 then G.expect_plan(dev, "prefill over fp8", "prefill [^\n]* kv=" .. fmt) end
            end
          end)
        end)
        if dev.kind == "cuda" and dequant == 1 and G.cc_major(dev) >= 9 then
          assert(hits >= 1, "prefill_fp8 = 1: no call ran on the Hopper kernels over a 16-bit copy")
        end
      end)
    end

    -- prefill_fp8 = 3: prefill_ws reads the fp8 pages and widens each tile in
    -- the block (kv=) where it applies (sm_90, head dim 128, pages of 16 or
    -- more, no softcap or ALiBi), else as 1; within the tolerance rule (the
    -- widening is exact, the scales apply in f32). Pages of 5 and 1 here
    -- take the copy: both paths in one test.
    it("#gpu " .. fmt .. ": prefill widening the fp8 pages in the block (prefill_fp8 = 3), within the tolerance rule",
      function()
      if pending_without_sm90("prefill_ws") then return end
      local hits = 0
      G.with_tuning(dev, { prefill_fp8 = 3 }, function()
        run_cases("gpu fp8 prefill ws8 " .. fmt, H.scale(16), function(rng, i)
          local w = { cache_dtype = fmt, form = "kvcache", mode = pick(rng, { "prefill", "chunked" }),
            dtype = pick(rng, { "f16", "bf16" }), D = 128, page_size = pick(rng, { 16, 32, 256, 64, 5 }),
            B = rng:int(1, 3), group = pick(rng, { 1, 4, 8 }), causal = rng:int(1, 3) > 1, new = rng:int(9, 300),
            max_keys = 600, softcap = false, alibi = false }
          if i <= 2 then w.page_size, w.k_scale, w.mode, w.new = 16, "head", "prefill", 300 end -- (several tiles)
          return w
        end, function(case)
          if case.page_size >= 16 then
            G.expect_plan(dev, "prefill_fp8 = 3: prefill_ws over the fp8 pages", "prefill_ws [^\n]*kv=" .. fmt)
            G.expect_plan(dev, "prefill_fp8 = 3: no copy", "pa_dequant", true)
            hits = hits + 1
          end
        end)
      end)
      assert(hits >= 2, "prefill_fp8 = 3: fewer than two calls ran prefill_ws over the fp8 pages")
    end)

    -- prefill_fp8 = 2: the e4m3 tensor cores (prefill_f8: Q and P in e4m3)
    -- where they apply (sm_90, head dim 128, paged, no softcap or ALiBi, more
    -- than 8 queries a sequence: every case here), judged by
    -- check.run_e4m3's bound (not the tolerance rule: q and P lose bits).
    it("#gpu " .. fmt .. ": prefill on the e4m3 tensor cores (prefill_fp8 = 2), within the bound of q and P in e4m3",
      function()
      if pending_without_sm90("prefill_f8") then return end
      G.with_tuning(dev, { prefill_fp8 = 2 }, function()
        run_cases("gpu fp8 prefill e4m3 " .. fmt, H.scale(8), function(rng, i)
          local w = { cache_dtype = fmt, form = "kvcache", mode = pick(rng, { "prefill", "chunked" }),
            dtype = pick(rng, { "f16", "bf16" }), D = 128, page_size = pick(rng, { 16, 1, 5, 256, 32 }),
            B = rng:int(1, 3), group = pick(rng, { 1, 4 }), causal = rng:int(1, 3) > 1, new = rng:int(9, 140),
            max_keys = 400, softcap = false, alibi = false, rotary = false, q_e4m3 = true }
          if i <= 2 then w.page_size, w.k_scale, w.mode, w.new = 16, "head", "prefill", 260 end -- (several tiles)
          return w
        end, function(case)
          G.expect_plan(dev, "prefill_fp8 = 2: the e4m3 tensor cores", "| pa_prefill_f8 ")
          G.expect_plan(dev, "prefill_fp8 = 2: the tiles", "| pa_f8_tiles ")
        end)
      end)
    end)

    it("#gpu " .. fmt .. ": reading with duplicate pages, varlen mixes, every masking option, splits", function()
      run_cases("gpu fp8 mixed " .. fmt, H.scale(24), function(rng, i)
        local w = { cache_dtype = fmt, dtype = pick(rng, { "f16", "bf16" }) }
        if i % 3 == 0 then
          w.mode, w.duplicates, w.page_size = "read", true, pick(rng, { 1, 3, 16 })
        elseif i % 3 == 1 then
          w.form, w.B = "varlen", 4
        else
          w.num_splits = rng:int(2, 5)
        end
        return w
      end)
    end)

    -- (rows from 2^-60 to 2^60, rows of zeros, elements far below their
    -- row's largest: the decode kernels scale each score before its max, so
    -- any size that f32 holds; and a bf16 q's MMAs run in f16, each row
    -- scaled into f16 and P kept below 2^15: docs/fp8.md; no rotary, as in
    -- gpu_difftest_spec.lua's rows of 2^-16 to 2^16: the rotated q's one
    -- rounding to the dtype decides near ties there, at random)
    it("#gpu " .. fmt .. ": decode with query rows of any magnitude", function()
      run_cases("gpu fp8 q range " .. fmt, H.scale(16), function(rng, i)
        -- (reads of at most 8 queries: decode_mma's; more plan a prefill, below)
        return { cache_dtype = fmt, mode = pick(rng, { "decode", "decode", "read" }), q_range = "wide", rotary = false,
          dtype = i % 4 == 0 and "f16" or "bf16", D = pick(rng, { 64, 128 }), group = pick(rng, { 1, 4, 8 }),
          page_size = pick(rng, { 0, 3, 16 }), B = rng:int(1, 6), max_keys = rng:int(1, 4) * 200, sq = rng:int(1, 8),
          form = "kvcache" }
      end)
    end)
    -- (prefill reads: rows from 2^-16 to 2^16, inside the prefill kernels'
    -- range of scores; past it, docs/prefill.md "Scores past 2^31", and the
    -- pending test of gpu_difftest_spec.lua; no ALiBi, softcap or rotary, as there)
    it("#gpu " .. fmt .. ": prefill with query rows from 2^-16 to 2^16", function()
      run_cases("gpu fp8 q range prefill " .. fmt, H.scale(12), function(rng, i)
        local mode = pick(rng, { "prefill", "chunked", "read" })
        return { cache_dtype = fmt, mode = mode, q_range = 16, alibi = false, softcap = 0, rotary = false,
          dtype = i % 4 == 0 and "f16" or "bf16",
          D = pick(rng, { 64, 128 }), group = pick(rng, { 1, 4 }), page_size = pick(rng, { 0, 3, 16 }),
          B = rng:int(1, 3), max_keys = rng:int(1, 3) * 200, sq = mode == "read" and rng:int(9, 40) or nil, lse = true }
      end)
    end)

    it("#gpu " .. fmt .. ": values past the largest finite one, subnormals, a scale per kv head", function()
      run_cases("gpu fp8 ranges " .. fmt, H.scale(18), function(rng, i)
        return { cache_dtype = fmt, dtype = pick(rng, { "f16", "bf16" }), Hk = 2,
          fp8_range = ({ "saturate", "subnormal", "normal" })[i % 3 + 1], k_scale = "head",
          v_scale = rng:int(1, 2) == 1 and "head" or 0.5, mode = pick(rng, { "decode", "chunked", "read" }) }
      end)
    end)
  end
end)
