-- Differential specs: the CPU backend against the float64 Lua reference, on
-- named cases (each shape class the design calls out) and on random ones.
-- Every case prints its seed on failure, with the command that reruns it.
local pa = require "pagedattn"
local check = require "pagedattn.check"
local H = require "helpers"

local SPEC = "spec/attention_cpu_spec.lua"
local cpu = assert(pa.device("cpu"))

local function run(name, i, want)
  local seed = H.seed(name, i)
  local rng = require("pagedattn.reference").rng(seed)
  local case = check.random_case(rng, want)
  local r = check.run(case, cpu, rng)
  H.assert_check(r, seed, SPEC)
  return r
end

describe("attention on the CPU against the reference", function()
  describe("page sizes", function()
    for _, ps in ipairs({ 1, 3, 16, 256, 0 }) do
      for _, mode in ipairs({ "decode", "prefill", "chunked", "read" }) do
        it(string.format("page %s, %s", ps == 0 and "none (contiguous)" or ps, mode), function()
          for i = 1, 3 do run("ps" .. ps .. mode, i, { page_size = ps, mode = mode }) end
        end)
      end
    end
  end)

  it("random block tables with duplicate pages (read only)", function()
    for i = 1, 4 do
      run("dup", i, { mode = "read", page_size = ({ 1, 3, 16, 5 })[i], duplicates = true, B = 4 })
    end
  end)

  it("unique random block tables while appending", function()
    for i = 1, 4 do run("unique", i, { mode = "chunked", page_size = ({ 1, 3, 16, 7 })[i], B = 4 }) end
  end)

  it("empty caches: no keys at all gives zero rows and lse -inf", function()
    for i = 1, 3 do
      local r = run("empty", i, { mode = "read", cached = 0, lse = true, form = "kvcache" })
      assert.is_true(r.ok)
    end
  end)

  it("a partial last page", function()
    run("partial", 1, { page_size = 16, mode = "read", cached = { 37, 17, 1, 31 }, B = 4 })
    run("partial", 2, { page_size = 3, mode = "decode", cached = { 7, 2, 5, 10 }, B = 4 })
  end)

  it("decode: one query token", function()
    for i = 1, 4 do run("decode1", i, { mode = "decode", new = 1 }) end
  end)

  it("prefill into an empty cache, causal", function()
    for i = 1, 3 do run("prefill", i, { mode = "prefill", causal = true }) end
  end)

  it("chunked prefill onto an existing cache", function()
    for i = 1, 3 do run("chunked", i, { mode = "chunked", cached = 100 + 37 * i, causal = true }) end
  end)

  for _, group in ipairs({ 1, 4, 8 }) do
    it("GQA ratio " .. group, function()
      for i = 1, 2 do run("gqa" .. group, i, { group = group, Hk = 2 }) end
    end)
  end

  for _, d in ipairs({ 64, 128, 256, 37 }) do
    it("head dim " .. d, function()
      for i = 1, 2 do run("hd" .. d, i, { D = d }) end
    end)
  end

  for _, dt in ipairs({ "f32", "f16", "bf16" }) do
    it("dtype " .. dt .. " within the tolerance rule", function()
      for i = 1, 3 do run("dt" .. dt, i, { dtype = dt, lse = true }) end
    end)
  end

  it("varlen: sequences of different lengths in one call", function()
    for i = 1, 4 do run("varlen", i, { form = "varlen", B = 4, mode = ({ "chunked", "decode", "read", "prefill" })[i] }) end
  end)

  it("every masking option: causal, window, softcap, alibi, with lse", function()
    run("mask", 1, { causal = true, window = { 5, -1 }, lse = true })
    run("mask", 2, { causal = false, window = { 3, 2 }, lse = true })
    run("mask", 3, { softcap = 5, alibi = "BH", lse = true })
    run("mask", 4, { causal = true, alibi = "H", softcap = 30, lse = true })
  end)

  it("rotary append: interleaved and GPT-NeoX, full and partial", function()
    run("rope", 1, { mode = "chunked", rotary = { dim = 64, interleaved = true }, D = 64 })
    run("rope", 2, { mode = "chunked", rotary = { dim = 64, interleaved = false }, D = 64 })
    run("rope", 3, { mode = "decode", rotary = { dim = 32, interleaved = true }, D = 128, causal = true })
    run("rope", 4, { mode = "prefill", rotary = { dim = 16, interleaved = false }, D = 37, causal = false })
  end)

  it("split-KV: forced splits give the same result", function()
    for i = 1, 3 do run("splits", i, { num_splits = i + 1, mode = "decode", cached = 250 }) end
  end)

  it("random cases", function()
    for i = 1, H.scale(40) do run("random", i) end
  end)
end)
