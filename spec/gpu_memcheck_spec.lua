-- Addressing at the edges, meant to run under compute-sanitizer (scripts/gpu-run.sh
-- runs it with --tool memcheck; it also runs as a plain spec): random block
-- tables with duplicate pages, batch > 32, and a page pool of more than 2^31
-- elements whose high pages are read and appended to, against the CPU on a
-- compact copy of the pages used. Tagged #gpu.
--   PAGEDATTN_GPU_SPEC_SMALL=1 uses a small pool (dry runs on the CPU).
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local check = require "pagedattn.check"
local G = require "gpu_helpers"
local H = require "helpers"

local SPEC = "spec/gpu_memcheck_spec.lua"
local dev, why = G.device()
local small = G.small

local PS, HK, D, GQ = 16, 8, 128, 4
local PAGE_ELEMS = PS * HK * D                                   -- 16384
local BIG_PAGES = small and 1200 or (math.floor(2 ^ 31 / PAGE_ELEMS) + 64) -- > 2^31 elements

-- pages: list of page ids of the big pool that hold data; returns the big
-- pool pair on dev, a compact pair on the CPU, and id -> compact index
local function pools(rng, pages)
  local cpu = assert(pa.device("cpu"))
  local big_k = assert(pa.tensor({ BIG_PAGES, PS, HK, D }, "bf16", dev))
  local big_v = assert(pa.tensor({ BIG_PAGES, PS, HK, D }, "bf16", dev))
  local cpu_k = assert(pa.tensor({ #pages, PS, HK, D }, "bf16", cpu))
  local cpu_v = assert(pa.tensor({ #pages, PS, HK, D }, "bf16", cpu))
  local index = {}
  for i, p in ipairs(pages) do
    index[p] = i - 1
    for _, pair in ipairs({ { big_k, cpu_k }, { big_v, cpu_v } }) do
      local vals = {}
      for e = 1, PAGE_ELEMS do vals[e] = ref.round(rng:normal(), "bf16") end
      G.write(pair[1], p * PAGE_ELEMS, vals)
      G.write(pair[2], (i - 1) * PAGE_ELEMS, vals)
    end
  end
  return big_k, big_v, cpu_k, cpu_v, index
end

local function remap(bt, index)
  local out = {}
  for i, v in ipairs(bt) do out[i] = index[v] or v end -- garbage past the end stays garbage
  return out
end

-- distinct page ids: half at the very top of the pool (offsets > 2^31), half anywhere
local function pick_pages(rng, n)
  assert(n <= BIG_PAGES / 2, "pick_pages: too many pages for the pool")
  local seen, pages = {}, {}
  while #pages < n do
    local p = #pages % 2 == 0 and rng:int(math.max(0, BIG_PAGES - 4 * n), BIG_PAGES - 1)
      or rng:int(0, BIG_PAGES - 1)
    if not seen[p] then seen[p] = true; pages[#pages + 1] = p end
  end
  return pages
end

-- b is the CPU's result: tol absolute, plus rel (default: one bf16 step, as
-- b is rounded to bf16) of the largest value
local function assert_close(name, a, b, tol, rel)
  local biggest = 0
  for i = 1, #b do
    if b[i] > -math.huge then biggest = math.max(biggest, math.abs(b[i])) end
  end
  tol = tol + biggest * (rel or 2 ^ -7)
  local err = G.max_diff(a, b)
  io.stderr:write(string.format("  %s: max |cuda - cpu| %.3g (tolerance %.3g)\n", name, err, tol))
  assert(err <= tol, string.format("%s: differs from the CPU by %.4g > %.4g", name, err, tol))
end

describe("#gpu #memcheck paged addressing: duplicates, batch > 32, pools beyond 2^31 elements", function()
  if G.pending_without(pending, dev, why) then return end
  local cpu = assert(pa.device("cpu"))

  -- A decode problem on the big pool: B sequences over at most `width`
  -- pages each, drawn with duplicates from npages distinct ones, the first
  -- sequence at least first_keys long (the rest are garbage ids), or
  -- lengths from keys_of(rng, b) when given; its call's arguments on the
  -- device (g) and on the CPU's compact copy (c).
  local function big_decode(seed, B, width, npages, first_keys, keys_of)
    local rng = ref.rng(seed)
    local pages = pick_pages(rng, npages)
    local big_k, big_v, cpu_k, cpu_v, index = pools(rng, pages)
    local keys, bt = {}, {}
    for b = 1, B do
      keys[b] = keys_of and keys_of(rng, b) or rng:int(b == 1 and first_keys or 0, width * PS)
      local used = math.ceil(keys[b] / PS)
      for j = 1, width do
        bt[(b - 1) * width + j] = j <= used and pages[rng:int(1, #pages)] or (j % 2 == 0 and -1 or 2000000000)
      end
    end
    local q_g, q_c = G.randn2({ B, 1, GQ * HK, D }, "bf16", dev, cpu, seed)
    local opts_g = { block_table = assert(pa.from_table(bt, { B, width }, "i32", dev)),
      cache_seqlens = assert(pa.from_table(keys, { B }, "i32", dev)), return_softmax_lse = true }
    local opts_c = { block_table = assert(pa.from_table(remap(bt, index), { B, width }, "i32", cpu)),
      cache_seqlens = assert(pa.from_table(keys, { B }, "i32", cpu)), return_softmax_lse = true }
    return { g = { q_g, big_k, big_v, opts_g }, c = { q_c, cpu_k, cpu_v, opts_c } }
  end
  -- bf16 outputs: both rounded once from f32 accumulations
  local function compare_decode(pr, label)
    local og, lg = assert(pa.attention_with_kvcache(unpack(pr.g)))
    local oc, lc = assert(pa.attention_with_kvcache(unpack(pr.c)))
    assert_close("decode out, " .. label, og:to_table(), oc:to_table(), 2 ^ -9)
    assert_close("decode lse, " .. label, lg:to_table(), lc:to_table(), 1e-4, 1e-5)
  end

  -- (persistent blocks, 320 units over 132 or 264 blocks: of four warps and
  -- of eight, decode_wide 2, which gives every persistent plan eight where
  -- they fit (sm_90); decode_hw 0: units averaging under 512 keys could go to
  -- the warp-a-tile blocks)
  it("#gpu decode, batch 40, random pages with duplicates, many above 2^31 elements", function()
    local pr = big_decode(H.seed("gpu memcheck decode"), 40, 64, 48, 1)
    for _, wide in ipairs({ 0, 2 }) do
      G.with_tuning(dev, { decode_wide = wide, decode_hw = 0 }, function()
        for _, splits in ipairs({ 0, 3 }) do
          pr.g[4].num_splits, pr.c[4].num_splits = splits, splits
          compare_decode(pr, "splits " .. splits .. ", wide " .. wide)
          if wide == 2 and G.cc_major(dev) >= 9 then
            G.expect_plan(dev, "eight warps", "persist=1 minb=%d+ hw=0 nw=4", true)
          end
        end
      end)
    end
  end)

  -- one block per unit, splits of 1024 keys claiming their tile's keys past
  -- their first 8 stages (the plan must show the claims); more blocks than a
  -- wave, so late blocks find their tile's keys taken
  it("#gpu decode, batch 36, splits claiming their keys, duplicate pages above 2^31 elements", function()
    local pr = big_decode(H.seed("gpu memcheck claims"), 36, 200, 64, 2000)
    G.with_tuning(dev, { decode_persist = 0, split_chunk = 1024, decode_claim_min = 0 }, function()
      -- (the second call finds the claim counters reset)
      for rep = 1, 2 do
        compare_decode(pr, "claims, call " .. rep)
        G.expect_plan(dev, "claims", "decode_mma [^\n]*claims=1")
      end
    end)
  end)

  -- short (< 256 keys) and long sequences in one call: two launches, the
  -- long ones on persistent blocks, the short ones a block per unit (the
  -- plan must show both)
  it("#gpu decode, batch 100 of short and long sequences in two launches, pages above 2^31 elements", function()
    local pr = big_decode(H.seed("gpu memcheck split"), 100, 64, 64, 0, function(rng, b)
      return b <= 40 and rng:int(256, 64 * PS) or rng:int(0, 255)
    end)
    local function two_launches(what)
      G.expect_plan(dev, what .. ": the short sequences' launch", "keys=0%.%.256\n")
      G.expect_plan(dev, what .. ": the long sequences' launch", "keys=256%.%.0\n")
    end
    compare_decode(pr, "short and long")
    two_launches("short and long")
    -- the short ones unsplit (split_chunk), each block's four warps on a
    -- head tile of their own (decode_hw 2: however few its blocks), one block
    -- a unit, and persistent blocks, five of them taking every unit (the long
    -- part's five too)
    for _, persist in ipairs({ 0, 2 }) do
      G.with_tuning(dev, { decode_hw = 2, split_chunk = 100000, decode_hw_persist = persist,
        decode_max_blocks = persist == 2 and 5 or 0 }, function()
        local what = "short and long, a warp a head tile, persistent " .. persist
        compare_decode(pr, what)
        two_launches(what)
        G.expect_plan(dev, what, "decode_mma [^\n]* hw=1")
      end)
    end
  end)

  it("#gpu rotary append of 3 tokens into pages above 2^31 elements, batch 36, then attention", function()
    local seed = H.seed("gpu memcheck append")
    local rng = ref.rng(seed)
    local B, width, new = 36, 8, 3
    local pages = pick_pages(rng, B * width)
    local big_k, big_v, cpu_k, cpu_v, index = pools(rng, pages)
    local cached, bt = {}, {}
    for b = 1, B do
      cached[b] = rng:int(0, width * PS - new)
      for j = 1, width do bt[(b - 1) * width + j] = pages[(b - 1) * width + j] end -- distinct
    end
    local half = 32
    local cs, sn = {}, {}
    for pos = 0, width * PS - 1 do
      for j = 0, half - 1 do
        local theta = pos * 10000 ^ (-j / half)
        cs[pos * half + j + 1] = ref.round(math.cos(theta), "bf16")
        sn[pos * half + j + 1] = ref.round(math.sin(theta), "bf16")
      end
    end
    local function opts(device, table_)
      return {
        block_table = assert(pa.from_table(table_, { B, width }, "i32", device)),
        cache_seqlens = assert(pa.from_table(cached, { B }, "i32", device)),
        k = assert(pa.randn({ B, new, HK, D }, "bf16", device, seed + 1)),
        v = assert(pa.randn({ B, new, HK, D }, "bf16", device, seed + 2)),
        rotary_cos = assert(pa.from_table(cs, { width * PS, half }, "bf16", device)),
        rotary_sin = assert(pa.from_table(sn, { width * PS, half }, "bf16", device)),
        rotary_interleaved = true, causal = true,
      }
    end
    local q_g, q_c = G.randn2({ B, new, GQ * HK, D }, "bf16", dev, cpu, seed + 3)
    local og = assert(pa.attention_with_kvcache(q_g, big_k, big_v, opts(dev, bt)))
    local oc = assert(pa.attention_with_kvcache(q_c, cpu_k, cpu_v, opts(cpu, remap(bt, index))))
    assert_close("append + attention out", og:to_table(), oc:to_table(), 2 ^ -9)
    -- the appended rows, bit for bit, where they landed
    for b = 1, B do
      for i = 0, new - 1 do
        local pos = cached[b] + i
        local page = bt[(b - 1) * width + math.floor(pos / PS) + 1]
        local row = (pos % PS) * HK * D
        for _, pair in ipairs({ { big_k, cpu_k }, { big_v, cpu_v } }) do
          local a = G.read(pair[1], page * PAGE_ELEMS + row, HK * D)
          local c = G.read(pair[2], index[page] * PAGE_ELEMS + row, HK * D)
          local e = G.first_diff(a, c)
          if e then
            error(string.format("sequence %d token %d: page %d element %d: %.9g on %s, %.9g on the CPU",
              b - 1, pos, page, e - 1, a[e], dev.name, c[e]))
          end
        end
      end
    end
  end)

  it("#gpu random small problems on every kernel path (duplicates, page sizes 1 to 256)", function()
    for i = 1, H.scale(24) do
      local seed = H.seed("gpu memcheck random", i)
      local rng = ref.rng(seed)
      local case = check.random_case(rng, { page_size = ({ 1, 3, 16, 256, 0, 8 })[i % 6 + 1] })
      H.assert_check(check.run(case, dev, rng), seed, SPEC)
    end
  end)
end)
