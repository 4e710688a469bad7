-- pagedattn.serve.check: compares every step's attention output of the
-- serving engine with pagedattn.reference (float64), which sees each
-- request's history as a plain contiguous cache rebuilt from what earlier
-- steps appended: a wrong page, a missed copy-on-write, a wrong position or
-- a prefix-cache hit on the wrong page shows as a mismatch.
--
-- Each request keeps a shadow of its layer-1 history: the rotated k and the
-- v rows the reference appended, one per token. A fork of the shared system
-- prompt starts from the prompt's shadow; a start that takes pages from the
-- prefix cache starts from the rows recorded under those pages' hashes when
-- they were first cached (by whichever request wrote them), so the check
-- does not trust the pool's choice of page.
local ffi = require "ffi"
local ref = require "pagedattn.reference"

local M = {}
local Checker = {}
Checker.__index = Checker

-- cfg: kv_heads, head_dim, dtype, page_size; cos, sin: reference tensors
function M.new(cfg, cos, sin, cache)
  return setmetatable({ cfg = cfg, cos = cos, sin = sin, cache = cache, by_hash = {},
    steps = 0, worst = 0, worst_ratio = 0 }, Checker)
end

function Checker:fresh(req) req.shadow = { k = {}, v = {} } end

function Checker:fork(req, prefix)
  local sh = { k = {}, v = {} }
  for t = 1, prefix.len do sh.k[t], sh.v[t] = prefix.shadow.k[t], prefix.shadow.v[t] end
  req.shadow = sh
end

function Checker:drop(req) req.shadow = nil end

local function hkey(h) return tostring(ffi.cast("uint64_t", h)) end

function Checker:attach(req, pages)
  local sh, ps = { k = {}, v = {} }, self.cfg.page_size
  for i = 0, pages - 1 do
    local rows = self.by_hash[hkey(req.hashes[i])]
    if not rows then error("serve: check: request " .. req.id .. " took page " .. i .. " from the prefix cache, " ..
      "but no request cached a page with its hash", 0) end
    for s = 1, ps do sh.k[i * ps + s], sh.v[i * ps + s] = rows.k[s], rows.v[s] end
  end
  req.shadow = sh
end

-- Before req's pages [from, to) are offered to the cache: the ones whose
-- hash is not cached yet will be cached with these rows.
function Checker:insert(req, from, to)
  local ps = self.cfg.page_size
  for i = from, to - 1 do
    if self.cache:prefix_lookup(1, req.hashes + i) == 0 then
      local rows = { k = {}, v = {} }
      for s = 1, ps do rows.k[s], rows.v[s] = req.shadow.k[i * ps + s], req.shadow.v[i * ps + s] end
      self.by_hash[hkey(req.hashes[i])] = rows
    end
  end
end

-- entries: { shadow = {k = rows, v = rows}, before = keys, n = new tokens }
-- Returns ok, max |err|, tolerance.
function Checker:step(entries, q, k, v, out)
  local cfg = self.cfg
  local Hk, D, dt = cfg.kv_heads, cfg.head_dim, cfg.dtype
  local tok = Hk * D
  local B, maxk = #entries, 1
  for _, e in ipairs(entries) do if e.before + e.n > maxk then maxk = e.before + e.n end end
  local qr = ref.tensor(q.shape, q:to_table())
  local kr = ref.tensor(k.shape, k:to_table())
  local vr = ref.tensor(v.shape, v:to_table())
  local cu, used = { 0 }, {}
  for b, e in ipairs(entries) do cu[b + 1] = cu[b] + e.n; used[b] = e.before + e.n end
  local function run(precision)
    local kd, vd = {}, {}
    for x = 1, B * maxk * tok do kd[x], vd[x] = 0, 0 end
    for b, e in ipairs(entries) do
      for t = 1, e.before do
        local base, krow, vrow = ((b - 1) * maxk + t - 1) * tok, e.shadow.k[t], e.shadow.v[t]
        for x = 1, tok do kd[base + x], vd[base + x] = krow[x], vrow[x] end
      end
    end
    local kc, vc = ref.tensor({ B, maxk, Hk, D }, kd), ref.tensor({ B, maxk, Hk, D }, vd)
    local res = ref.attention_varlen(qr, kc, vc, {
      cu_seqlens_q = cu, seqused_k = used, k = kr, v = vr, causal = true,
      rotary_cos = self.cos, rotary_sin = self.sin, rotary_interleaved = false,
      precision = precision, cache_dtype = dt })
    return res, kc, vc
  end
  local exact, kc, vc = run("f64")
  local naive = run(dt)
  for b, e in ipairs(entries) do
    for t = e.before, e.before + e.n - 1 do
      local base, krow, vrow = ((b - 1) * maxk + t) * tok, {}, {}
      for x = 1, tok do krow[x], vrow[x] = kc.data[base + x], vc.data[base + x] end
      e.shadow.k[t + 1], e.shadow.v[t + 1] = krow, vrow
    end
  end
  local err = ref.max_abs_diff(out:to_table(), exact.data)
  local tol = ref.tolerance(dt, ref.max_abs_diff(naive.data, exact.data))
  self.steps = self.steps + 1
  if err > self.worst then self.worst = err end
  if err / tol > self.worst_ratio then self.worst_ratio = err / tol end
  return err <= tol, err, tol
end

return M
