-- pagedattn.reference.rng: the reference's deterministic random numbers
-- (pagedattn.reference re-exports M.new as ref.rng).
--
-- MRG32k3a (L'Ecuyer 1999), designed for binary64 arithmetic: every product
-- stays below 2^53, so the stream is bit-identical under LuaJIT and PUC Lua.
-- normal() uses the polar method with a log computed here from + - * / only,
-- so it does not depend on the libm either.
local M = {}

local floor, frexp, sqrt = math.floor, math.frexp, math.sqrt
local assert, tostring, setmetatable = assert, tostring, setmetatable

local function is_int(x)
  return type(x) == "number" and x == x and x % 1 == 0 and x > -math.huge and x < math.huge
end

local M1, M2 = 4294967087, 4294944443
local A12, A13N, A21, A23N = 1403580, 810728, 527612, 1370589
local MRG_NORM = 2.328306549295727688e-10 -- 1 / (M1 + 1)
local TWO32 = 4294967296
local LN2 = 0.6931471805599453
local SQRT_HALF = 0.7071067811865476

local function det_log(x) -- x > 0, finite
  local m, e = frexp(x)
  if m < SQRT_HALF then m = m * 2; e = e - 1 end -- m in [sqrt(1/2), sqrt(2))
  local t = (m - 1) / (m + 1)                      -- |t| < 0.172
  local t2 = t * t
  local term, sum = t, t
  for k = 3, 31, 2 do
    term = term * t2
    sum = sum + term / k
  end
  return 2 * sum + e * LN2
end

local Rng = {}
Rng.__index = Rng

local function mrg_mod(p, m)
  p = p - floor(p / m) * m
  if p < 0 then p = p + m elseif p >= m then p = p - m end
  return p
end

-- uniform in (0, 1)
function Rng:uniform()
  local p1 = mrg_mod(A12 * self.s11 - A13N * self.s10, M1)
  self.s10, self.s11, self.s12 = self.s11, self.s12, p1
  local p2 = mrg_mod(A21 * self.s22 - A23N * self.s20, M2)
  self.s20, self.s21, self.s22 = self.s21, self.s22, p2
  if p1 > p2 then return (p1 - p2) * MRG_NORM end
  return (p1 - p2 + M1) * MRG_NORM
end

-- standard normal
function Rng:normal()
  local spare = self.spare
  if spare then
    self.spare = nil
    return spare
  end
  local u, v, s
  repeat
    u = 2 * self:uniform() - 1
    v = 2 * self:uniform() - 1
    s = u * u + v * v
  until s < 1 and s > 0
  local f = sqrt(-2 * det_log(s) / s)
  self.spare = v * f
  return u * f
end

-- integer uniform in [lo, hi]
function Rng:int(lo, hi)
  assert(is_int(lo) and is_int(hi) and lo <= hi,
    "rng:int(lo, hi): integers with lo <= hi expected")
  local n = hi - lo + 1
  local k = floor(self:uniform() * n)
  if k >= n then k = n - 1 end
  return lo + k
end

-- in-place Fisher-Yates shuffle of a 1-based array
function Rng:shuffle(arr)
  for i = #arr, 2, -1 do
    local j = self:int(1, i)
    arr[i], arr[j] = arr[j], arr[i]
  end
  return arr
end

-- ref.rng(seed): seed is an integer in [0, 2^53); nil takes os.time(). The seed
-- is kept in rng.seed so that specs can print it.
function M.new(seed)
  if seed == nil then seed = os.time() end
  assert(is_int(seed) and seed >= 0 and seed < 2 ^ 53,
    "reference.rng: seed must be an integer in [0, 2^53), got " .. tostring(seed))
  local x = seed % TWO32
  local y = floor(seed / TWO32) % TWO32
  local s = {}
  for i = 1, 6 do
    x = (69069 * x + 1) % TWO32
    y = (1664525 * y + 1013904223) % TWO32
    s[i] = (x + y) % (i <= 3 and M1 or M2)
  end
  if s[1] == 0 and s[2] == 0 and s[3] == 0 then s[1] = 1 end
  if s[4] == 0 and s[5] == 0 and s[6] == 0 then s[4] = 1 end
  local r = setmetatable({ seed = seed, s10 = s[1], s11 = s[2], s12 = s[3],
    s20 = s[4], s21 = s[5], s22 = s[6] }, Rng)
  for _ = 1, 16 do r:uniform() end
  return r
end

return M
