-- scripts/lab/fp8_qs_rows.lua [SEED:FMT:I ...] -- reruns wide-row fp8 decode
-- cases of spec/gpu_fp8_spec.lua ("decode with query rows of any magnitude",
-- the same want table) and prints, for every output row that is not finite,
-- its query row: the largest |element|, its bf16 exponent, the power of two
-- c that the f16-MMA form scales it by (decode_mma_fp8.cuh, qs_scale_of), how
-- many elements are zero, and the exact output row's largest |value|. With
-- no arguments: the three decode cases that gave inf in the f16-MMA form
-- before its headroom was rounded up (docs/fp8.md). The want table is a copy
-- of the spec's, draw for draw: keep the two alike. On the GPU machine:
--   luajit scripts/lab/fp8_qs_rows.lua   (the f16-MMA form is the default)
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local check = require "pagedattn.check"

local dev = assert(pa.device(os.getenv("PAGEDATTN_QS_DEVICE")))
local cases = { "948999002:fp8_e5m2:2", "948289001:fp8_e4m3:1", "949249002:fp8_e5m2:2" }
if #arg > 0 then cases = arg end

local function pick(rng, list) return list[rng:int(1, #list)] end
local finite = function(x) return x == x and x > -math.huge and x < math.huge end

for _, spec in ipairs(cases) do
  local seed, fmt, i = spec:match("^(%d+):([%w_]+):(%d+)$")
  seed, i = tonumber(seed), tonumber(i)
  local rng = ref.rng(seed)
  local want = { cache_dtype = fmt, mode = pick(rng, { "decode", "decode", "read" }), q_range = "wide",
    dtype = i % 4 == 0 and "f16" or "bf16", D = pick(rng, { 64, 128 }), group = pick(rng, { 1, 4, 8 }),
    page_size = pick(rng, { 0, 3, 16 }), B = rng:int(1, 6), max_keys = rng:int(1, 4) * 200, sq = rng:int(1, 8),
    form = "kvcache" }
  local c = check.random_case(rng, want)
  c.keep = true
  local r = check.run(c, dev, rng)
  print(string.format("%s  %s\n  %s", spec, check.describe(c), r.report))
  local D = c.D
  local n, shown = math.floor(#r.got_out / D), 0
  for row = 0, n - 1 do
    local bad, big = false, 0
    for d = 1, D do
      if not finite(r.got_out[row * D + d]) then bad = true end
      big = math.max(big, math.abs(r.exact_out[row * D + d]))
    end
    if bad then
      local qmax, zeros = 0, 0
      for d = 1, D do
        local x = math.abs(r.q.data[row * D + d])
        if x == 0 then zeros = zeros + 1 end
        if x > qmax then qmax = x end
      end
      local _, ex = math.frexp(qmax) -- qmax = f 2^ex, f in [0.5, 1): bf16 exponent E = ex + 126
      local E = qmax > 0 and ex + 126 or 0
      local cc = E >= 255 and 0 or math.min(142 - E, 126)
      if shown < 12 then
        print(string.format("  row %d: q max %.3g (E %d, c %d), %d zeros; exact out max %.3g", row, qmax, E, cc,
          zeros, big))
      end
      shown = shown + 1
    end
  end
  print(string.format("  %d of %d rows not finite", shown, n))
end
