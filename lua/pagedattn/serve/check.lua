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
--
-- An fp8 cache (cfg.kv_dtype) is read back: each step's appended rows must
-- match the reference's to one fp8 step, and the device's rows are what the
-- shadow keeps and the reference reads (a device that rounds one element
-- the other way, within the rule, is judged on what it holds).
local ffi = require "ffi"
local ref = require "pagedattn.reference"

local M = {}
local Checker = {}
Checker.__index = Checker

-- cfg: kv_heads, head_dim, dtype, page_size, kv_dtype, k_scale, v_scale;
-- cos, sin: reference tensors
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

-- The rows of layer 1's caches that hold tokens [before, before + n) of
-- each entry's sequence, as the device holds them: rows[b].k[i], .v[i].
function Checker:device_rows(entries)
  local Hk, D, ps = self.cfg.kv_heads, self.cfg.head_dim, self.cfg.page_size
  local kc, vc = self.cache.k_caches[1], self.cache.v_caches[1]
  local rows = {}
  for b, e in ipairs(entries) do
    local pages, r = e.seq:pages(), { k = {}, v = {} }
    for i = 1, e.n do
      local t = e.before + i - 1
      local off = (pages[math.floor(t / ps) + 1] * ps + t % ps) * Hk * D
      r.k[i], r.v[i] = kc:to_table(off, Hk * D), vc:to_table(off, Hk * D)
    end
    rows[b] = r
  end
  return rows
end

-- entries: { shadow = {k = rows, v = rows}, before = keys, n = new tokens, seq }
-- Returns ok, max |err|, tolerance.
function Checker:step(entries, q, k, v, out)
  local cfg = self.cfg
  local Hk, D, dt = cfg.kv_heads, cfg.head_dim, cfg.dtype
  local cdt = cfg.kv_dtype or dt
  local fp8 = cdt == "fp8_e4m3" or cdt == "fp8_e5m2"
  local tok = Hk * D
  local B, maxk = #entries, 1
  for _, e in ipairs(entries) do if e.before + e.n > maxk then maxk = e.before + e.n end end
  local qr = ref.tensor(q.shape, q:to_table())
  local kr = ref.tensor(k.shape, k:to_table())
  local vr = ref.tensor(v.shape, v:to_table())
  local cu, used = { 0 }, {}
  for b, e in ipairs(entries) do cu[b + 1] = cu[b] + e.n; used[b] = e.before + e.n end
  local k_scale = cfg.k_scale and ref.round(cfg.k_scale, "f32") -- (as the device has them)
  local v_scale = cfg.v_scale and ref.round(cfg.v_scale, "f32")
  -- the reference over each entry's shadow; `given` (device rows of the new
  -- tokens, in place already): not appended again
  local function run(precision, given)
    local kd, vd = {}, {}
    for x = 1, B * maxk * tok do kd[x], vd[x] = 0, 0 end
    for b, e in ipairs(entries) do
      for t = 1, e.before do
        local base, krow, vrow = ((b - 1) * maxk + t - 1) * tok, e.shadow.k[t], e.shadow.v[t]
        for x = 1, tok do kd[base + x], vd[base + x] = krow[x], vrow[x] end
      end
      for i = 1, given and e.n or 0 do
        local base, krow, vrow = ((b - 1) * maxk + e.before + i - 1) * tok, given[b].k[i], given[b].v[i]
        for x = 1, tok do kd[base + x], vd[base + x] = krow[x], vrow[x] end
      end
    end
    local kc, vc = ref.tensor({ B, maxk, Hk, D }, kd), ref.tensor({ B, maxk, Hk, D }, vd)
    local res = ref.attention_varlen(qr, kc, vc, {
      cu_seqlens_q = cu, seqused_k = used, k = kr, v = vr, causal = true,
      rotary_cos = self.cos, rotary_sin = self.sin, rotary_interleaved = false,
      precision = precision, cache_dtype = cdt, k_scale = k_scale, v_scale = v_scale, write_cache = not given })
    return res, kc, vc
  end
  local exact, kc, vc = run("f64")
  local rows = {} -- per entry, the new tokens' rows the shadow keeps
  for b, e in ipairs(entries) do
    local r = { k = {}, v = {} }
    for i = 1, e.n do
      local base, krow, vrow = ((b - 1) * maxk + e.before + i - 1) * tok, {}, {}
      for x = 1, tok do krow[x], vrow[x] = kc.data[base + x], vc.data[base + x] end
      r.k[i], r.v[i] = krow, vrow
    end
    rows[b] = r
  end
  local naive
  local cache_ok = true
  if fp8 then
    local dev_rows, differ = self:device_rows(entries), false
    local step = require("pagedattn.check").excess_over_step
    for b, e in ipairs(entries) do
      for i = 1, e.n do
        for _, kind in ipairs({ "k", "v" }) do
          local a, want = dev_rows[b][kind][i], rows[b][kind][i]
          if step(a, want, cdt) > 0 then cache_ok = false end
          if not differ and ref.max_abs_diff(a, want) > 0 then differ = true end
        end
      end
    end
    rows = dev_rows
    if differ then exact = run("f64", rows) end
    naive = run(dt, differ and rows or nil)
  else
    naive = run(dt)
  end
  for b, e in ipairs(entries) do
    for i = 1, e.n do e.shadow.k[e.before + i], e.shadow.v[e.before + i] = rows[b].k[i], rows[b].v[i] end
  end
  local err = ref.max_abs_diff(out:to_table(), exact.data)
  if not cache_ok then err = math.huge end -- an appended row off by more than one fp8 step
  local tol = ref.tolerance(dt, ref.max_abs_diff(naive.data, exact.data))
  self.steps = self.steps + 1
  if err > self.worst then self.worst = err end
  if err / tol > self.worst_ratio then self.worst_ratio = err / tol end
  return err <= tol, err, tol
end

return M
