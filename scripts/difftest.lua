-- scripts/difftest.lua [N] [SEED] [DEVICE] [CACHE]: runs N random differential cases
-- of a device against the float64 reference and prints one line per case.
-- CACHE: fp8_e4m3 or fp8_e5m2 (fp8 caches), fp8 (the two in turn); default: q's dtype.
--   scripts/run scripts/difftest.lua 200 1234 cpu
--   scripts/run scripts/difftest.lua 200 1234 cpu fp8
-- Exits non-zero if any case fails; each failing line says how to rerun it.
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local check = require "pagedattn.check"

local n = tonumber(arg[1]) or 50
local seed = tonumber(arg[2]) or os.time()
local device = assert(pa.device(arg[3]))
local cache = arg[4]
if cache and cache ~= "fp8" and cache ~= "fp8_e4m3" and cache ~= "fp8_e5m2" then
  error("difftest: CACHE must be fp8, fp8_e4m3 or fp8_e5m2, got " .. cache, 0)
end
print(string.format("difftest: %d cases on %s, seed %d", n, tostring(device), seed))
local failed = 0
for i = 1, n do
  local case_seed = seed + i
  local rng = ref.rng(case_seed)
  local want
  if cache then want = { cache_dtype = cache == "fp8" and check.FP8_DTYPES[case_seed % 2 + 1] or cache } end
  local case = check.random_case(rng, want)
  local ok, r = pcall(check.run, case, device, rng)
  if not ok then r = { ok = false, report = "error: " .. tostring(r) } end
  if not r.ok then failed = failed + 1 end
  print(string.format("%s case %d (seed %d): %s\n    %s", r.ok and "ok  " or "FAIL", i, case_seed,
    check.describe(case), r.report))
  if not r.ok then
    print(string.format("    rerun: scripts/run scripts/difftest.lua 1 %d %s%s", case_seed - 1, device.name,
      cache and (" " .. cache) or ""))
  end
end
print(string.format("difftest: %d of %d cases failed", failed, n))
os.exit(failed == 0 and 0 or 1)
