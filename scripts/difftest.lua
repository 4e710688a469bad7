-- scripts/difftest.lua [N] [SEED] [DEVICE]: runs N random differential cases of a
-- device against the float64 reference and prints one line per case.
--   scripts/run scripts/difftest.lua 200 1234 cpu
-- Exits non-zero if any case fails; each failing line says how to rerun it.
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local check = require "pagedattn.check"

local n = tonumber(arg[1]) or 50
local seed = tonumber(arg[2]) or os.time()
local device = assert(pa.device(arg[3]))
print(string.format("difftest: %d cases on %s, seed %d", n, tostring(device), seed))
local failed = 0
for i = 1, n do
  local case_seed = seed + i
  local rng = ref.rng(case_seed)
  local case = check.random_case(rng)
  local ok, r = pcall(check.run, case, device, rng)
  if not ok then r = { ok = false, report = "error: " .. tostring(r) } end
  if not r.ok then failed = failed + 1 end
  print(string.format("%s case %d (seed %d): %s\n    %s", r.ok and "ok  " or "FAIL", i, case_seed,
    check.describe(case), r.report))
  if not r.ok then
    print(string.format("    rerun: scripts/run scripts/difftest.lua 1 %d %s", case_seed - 1, device.name))
  end
end
print(string.format("difftest: %d of %d cases failed", failed, n))
os.exit(failed == 0 and 0 or 1)
