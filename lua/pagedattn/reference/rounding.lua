-- pagedattn.reference.rounding: the reference's rounding to narrower
-- floating-point formats (f32, f16, bf16, and the fp8 caches' e4m3 / e5m2),
-- written from the formats' definitions, apart from the library's code.
-- Pure Lua, as pagedattn.reference (which re-exports what users call:
-- ref.round, ref.rounder, ref.fp8_decode, ref.fp8_encode).
local M = {}

local floor, abs, frexp, ldexp = math.floor, math.abs, math.frexp, math.ldexp
local huge = math.huge
local assert, error, tostring = assert, error, tostring
local format = string.format

local function is_int(x)
  return type(x) == "number" and x == x and x % 1 == 0 and x > -math.huge and x < math.huge
end

-- p: significand bits including the implicit one; emin: exponent of the
-- smallest normal; max: largest finite value.
local FORMATS = {
  f32  = { p = 24, emin = -126, max = (2 - 2 ^ -23) * 2 ^ 127 },
  f16  = { p = 11, emin = -14,  max = 65504 },
  bf16 = { p = 8,  emin = -126, max = (2 - 2 ^ -7) * 2 ^ 127 },
}

-- Round to nearest, ties to even; subnormals, overflow to +-inf, NaN and signed
-- zero handled. Scaling by powers of two is exact in binary64, so q below is the
-- exact value in units of the target's ulp and only the final rounding decides.
local function round_fmt(x, p, emin, maxv)
  if x ~= x or x == 0 or x == huge or x == -huge then return x end
  local a = x
  if a < 0 then a = -a end
  local _, e = frexp(a)          -- a = m * 2^e, 0.5 <= m < 1
  local E = e - 1                -- a = 1.f * 2^E
  if E < emin then E = emin end  -- subnormal range: fixed quantum 2^(emin-p+1)
  local sh = p - 1 - E
  local q = ldexp(a, sh)         -- 0 < q < 2^p, exact
  local f = floor(q)
  local r = q - f
  if r > 0.5 or (r == 0.5 and f % 2 == 1) then f = f + 1 end
  local res = ldexp(f, -sh)
  if res > maxv then res = huge end
  if x < 0 then return -res end  -- -0 when a negative value rounds to zero
  return res
end

local function identity(x) return x end

local ROUNDERS = { f64 = identity }
for name, f in pairs(FORMATS) do
  local p, emin, maxv = f.p, f.emin, f.max
  ROUNDERS[name] = function(x) return round_fmt(x, p, emin, maxv) end
end

-- f32 without frexp (which LuaJIT does not compile), for the hot loops of the
-- precision emulation: for 2^-100 <= |x| <= 2^100, Veltkamp's split with
-- x * (2^29 + 1) rounds x to nearest with 24 bits (ties went to even in every
-- case tried: reference_spec compares it with the hardware's f32 conversion on
-- random values and ties). Outside that range round_fmt.
do
  local slow = ROUNDERS.f32
  local SPLIT, LO, HI = 2 ^ 29 + 1, 2 ^ -100, 2 ^ 100
  ROUNDERS.f32 = function(x)
    local a = x < 0 and -x or x
    if a >= LO and a <= HI then
      local c = x * SPLIT
      return c - (c - x)
    end
    return slow(x)
  end
end

-- fp8 (e4m3fn: no infinities, NaN = S.1111.111; e5m2: IEEE-like): rounded
-- to nearest even and saturated at the largest finite value, infinities
-- too, as pagedattn writes them (NaN stays NaN).
local FP8 = {
  fp8_e4m3 = { p = 4, emin = -6, bias = 7, max = 448 },
  fp8_e5m2 = { p = 3, emin = -14, bias = 15, max = 57344 },
}
for name, f in pairs(FP8) do
  local p, emin, maxv = f.p, f.emin, f.max
  ROUNDERS[name] = function(x)
    if x ~= x then return x end
    if x >= maxv then return maxv end
    if x <= -maxv then return -maxv end
    return round_fmt(x, p, emin, maxv)
  end
end

local function rounder(dtype, what)
  local r = ROUNDERS[dtype or "f64"]
  if not r then
    error(format("reference: %s must be one of \"f64\", \"f32\", \"f16\", \"bf16\", " ..
      "\"fp8_e4m3\", \"fp8_e5m2\", got %s", what or "dtype", tostring(dtype)), 3)
  end
  return r
end

-- ref.fp8_decode(byte, dtype): the value of an fp8 byte (0..255), written
-- from the formats' definitions, apart from the library's decoders.
function M.fp8_decode(byte, dtype)
  local f = FP8[dtype]
  assert(f, "reference.fp8_decode: dtype must be \"fp8_e4m3\" or \"fp8_e5m2\"")
  assert(is_int(byte) and byte >= 0 and byte <= 255, "reference.fp8_decode: byte must be in [0, 255]")
  local m = f.p - 1
  local sign = byte >= 128 and -1 or 1
  local b = byte % 128
  local e, man = floor(b / 2 ^ m), b % 2 ^ m
  local emax_field = 2 ^ (7 - m) - 1
  if dtype == "fp8_e4m3" and b == 127 then return 0 / 0 end
  if dtype == "fp8_e5m2" and e == emax_field then
    if man == 0 then return sign * huge end
    return 0 / 0
  end
  if e == 0 then return sign * man * 2 ^ (f.emin - m) end
  return sign * (1 + man / 2 ^ m) * 2 ^ (e - f.bias)
end

-- ref.fp8_encode(x, dtype): the byte that x rounds to (saturating).
function M.fp8_encode(x, dtype)
  local f = FP8[dtype]
  assert(f, "reference.fp8_encode: dtype must be \"fp8_e4m3\" or \"fp8_e5m2\"")
  local m = f.p - 1
  local y = ROUNDERS[dtype](x)
  if y ~= y then return 127 end
  local sign = (y < 0 or (y == 0 and 1 / y < 0)) and 128 or 0
  local a = abs(y)
  if a == 0 then return sign end
  local _, e = frexp(a)
  local E = e - 1
  if E < f.emin then return sign + a / 2 ^ (f.emin - m) end
  return sign + (E + f.bias) * 2 ^ m + (a / 2 ^ E - 1) * 2 ^ m
end

M.ROUNDERS, M.FP8, M.rounder, M.identity = ROUNDERS, FP8, rounder, identity

return M
