-- spec/cpu_isa_cases.lua SEED N -- differential cases of the CPU device against
-- the float64 reference, run in a process of its own by spec/cpu_isa_spec.lua
-- (PAGEDATTN_CPU_ISA picks the kernel variant when the device opens, once a
-- process). Named decode cases (the dot-product form: GQA 4 and 8, every
-- page size, the dtypes, several key blocks a tile, forced splits) and
-- prefills, fp8 caches (every byte through the decoders, then named cases),
-- then N random ones. Prints each failure with its seed, then
-- "cpu_isa_cases: <device>: K cases, F failed"; exits non-zero on a failure.
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local check = require "pagedattn.check"

local seed, n = tonumber(arg[1]) or 1, tonumber(arg[2]) or 20
local dev, err = pa.device("cpu")
if not dev then
  print("cpu_isa_cases: " .. tostring(err))
  os.exit(2)
end
local wants = {}
for _, ps in ipairs({ 1, 3, 16, 0 }) do
  for _, group in ipairs({ 4, 8 }) do
    wants[#wants + 1] = { mode = "decode", page_size = ps, group = group, D = 128, cached = 290 }
  end
end
for _, dt in ipairs({ "f32", "f16", "bf16" }) do
  wants[#wants + 1] = { mode = "decode", dtype = dt, group = 4, D = 64, cached = 280, lse = true }
  wants[#wants + 1] = { mode = "read", dtype = dt, group = 4, D = 256, sq = 2, duplicates = true, page_size = 5 }
end
for _, cdt in ipairs(check.FP8_DTYPES) do
  wants[#wants + 1] = { mode = "decode", dtype = "bf16", cache_dtype = cdt, group = 4, D = 64, cached = 280, lse = true }
  wants[#wants + 1] = { mode = "read", dtype = "f16", cache_dtype = cdt, group = 4, D = 256, sq = 2, duplicates = true,
                        page_size = 5, k_scale = "head", v_scale = 0.5 }
  wants[#wants + 1] = { mode = "prefill", dtype = "f32", cache_dtype = cdt, causal = true, group = 4 }
  wants[#wants + 1] = { mode = "decode", dtype = "bf16", cache_dtype = cdt, group = 8, D = 128, cached = 200,
                        fp8_range = "saturate" }
  wants[#wants + 1] = { mode = "chunked", dtype = "bf16", cache_dtype = cdt, D = 128, fp8_range = "subnormal" }
end
wants[#wants + 1] = { mode = "decode", group = 4, num_splits = 3, cached = 250 }
wants[#wants + 1] = { mode = "prefill", causal = true, group = 4 }
wants[#wants + 1] = { mode = "chunked", causal = true, group = 1, D = 37 }
for _ = 1, n do wants[#wants + 1] = {} end

local failed = 0

-- Every fp8 byte through the kernel's decoders: a cache of one key whose
-- value row holds the 256 codes (NaNs and e5m2's infinities included), read
-- by one query (the dot-product form) and by 16 (the matrix form); with one
-- key the output is the value row times v_scale, exactly. Then the row with
-- its NaN codes zeroed: a tile without them takes e4m3's loader without the
-- NaN fix-up (cpu_vec.inc: e4m3_rows_finite).
local ffi = require "ffi"
local core = require "pagedattn.core"
for _, cdt in ipairs(check.FP8_DTYPES) do
  for _, nans in ipairs({ true, false }) do
    local bytes, codes = ffi.new("uint8_t[256]"), {}
    for b = 0, 255 do
      codes[b] = (nans or ref.fp8_decode(b, cdt) == ref.fp8_decode(b, cdt)) and b or 0
      bytes[b] = codes[b]
    end
    local kc = pa.tensor({ 1, 1, 1, 256 }, cdt, dev)
    local vc = pa.tensor({ 1, 1, 1, 256 }, cdt, dev)
    assert(core.C.pa_tensor_write(core.ctx, vc.handle, 0, bytes, 256) == 0)
    for _, sq in ipairs({ 1, 16 }) do
      for _, vscale in ipairs({ 1, 0.125 }) do
        local q = pa.tensor({ 1, sq, 1, 256 }, "f32", dev)
        local out = pa.attention_with_kvcache(q, kc, vc, { cache_seqlens = 1, v_scale = vscale })
        local got, bad = out:to_table(), nil
        for i = 1, sq * 256 do
          local code = codes[(i - 1) % 256]
          local want = ref.fp8_decode(code, cdt) * vscale
          local ok = (want ~= want and got[i] ~= got[i]) or want == got[i]
          if not ok and not bad then bad = string.format("code 0x%02x: %s, expected %s", code, got[i], want) end
        end
        if bad then
          failed = failed + 1
          print(string.format("FAIL %s decode of every byte%s (%d queries, v_scale %g): %s", cdt,
            nans and "" or " but the NaNs", sq, vscale, bad))
        end
      end
    end
  end
end

-- A key row holding a NaN code makes its score NaN, and so every output of
-- the query that reads it (the tile takes the loader with the NaN fix-up).
for _, cdt in ipairs(check.FP8_DTYPES) do
  local bytes = ffi.new("uint8_t[256]")
  for b = 0, 255 do bytes[b] = ref.fp8_decode(b, cdt) ~= ref.fp8_decode(b, cdt) and b or 0x38 end
  local kc = pa.tensor({ 1, 1, 1, 256 }, cdt, dev)
  local vc = pa.tensor({ 1, 1, 1, 256 }, cdt, dev)
  assert(core.C.pa_tensor_write(core.ctx, kc.handle, 0, bytes, 256) == 0)
  for _, sq in ipairs({ 1, 16 }) do
    local q = pa.tensor({ 1, sq, 1, 256 }, "f32", dev)
    q:fill(0.5)
    local got = pa.attention_with_kvcache(q, kc, vc, { cache_seqlens = 1 }):to_table()
    for i = 1, #got do
      if got[i] == got[i] then
        failed = failed + 1
        print(string.format("FAIL %s: a key with NaN codes (%d queries): output %d is %s, expected NaN", cdt, sq, i, got[i]))
        break
      end
    end
  end
end

for i, want in ipairs(wants) do
  local case_seed = seed + i
  local rng = ref.rng(case_seed)
  local case = check.random_case(rng, want)
  local ok, r = pcall(check.run, case, dev, rng)
  if not ok then r = { ok = false, report = "error: " .. tostring(r) } end
  if not r.ok then
    failed = failed + 1
    print(string.format("FAIL case %d (seed %d): %s\n    %s", i, case_seed, check.describe(case), r.report))
  end
end
print(string.format("cpu_isa_cases: %s: %d cases, %d failed", dev.description, #wants, failed))
os.exit(failed == 0 and 0 or 1)
