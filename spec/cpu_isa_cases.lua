-- spec/cpu_isa_cases.lua SEED N -- differential cases of the CPU device against
-- the float64 reference, run in a process of its own by spec/cpu_isa_spec.lua
-- (PAGEDATTN_CPU_ISA picks the kernel variant when the device opens, once a
-- process). Named decode cases (the dot-product form: GQA 4 and 8, every
-- page size, the dtypes, several key blocks a tile, forced splits) and
-- prefills, then N random ones. Prints each failure with its seed, then
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
wants[#wants + 1] = { mode = "decode", group = 4, num_splits = 3, cached = 250 }
wants[#wants + 1] = { mode = "prefill", causal = true, group = 4 }
wants[#wants + 1] = { mode = "chunked", causal = true, group = 1, D = 37 }
for _ = 1, n do wants[#wants + 1] = {} end

local failed = 0
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
