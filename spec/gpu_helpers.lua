-- spec/gpu_helpers.lua -- what the #gpu specs share: the CUDA device (or the
-- reason there is none, for a visible pending), same inputs on two devices,
-- random block tables, reading single pages, the tolerance rule at sizes the
-- float64 reference cannot do whole.
--   PAGEDATTN_GPU_SPEC_DEVICE=cpu  runs the GPU specs' own logic on the CPU
--                                  (a dry run of the specs; default "cuda")
local ffi = require "ffi"
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local core = require "pagedattn.core"

local G = {}

G.device_name = os.getenv("PAGEDATTN_GPU_SPEC_DEVICE") or "cuda"
-- PAGEDATTN_GPU_SPEC_SMALL=1: smaller sizes (dry runs on the CPU)
G.small = os.getenv("PAGEDATTN_GPU_SPEC_SMALL") == "1"
-- One rounding step of each dtype, relative (2^-mantissa bits)
G.STEP = { f32 = 2 ^ -23, f16 = 2 ^ -10, bf16 = 2 ^ -7 }

-- The device under test, or nil and why not.
function G.device()
  return pa.device(G.device_name)
end

-- Inside a describe: true, after a visible pending that says why, where there
-- is no device (the describe returns then). `pending`: busted's, which only
-- the spec files' environment holds.
function G.pending_without(pending, dev, why)
  if dev then return false end
  pending("no CUDA device: " .. tostring(why))
  return true
end

-- Runs fn with tuning fields of the device set (dev:set_tuning's table), the
-- tuning before restored after, also on an error. The CPU of a dry run has no
-- tuning: fn runs as is there.
function G.with_tuning(dev, fields, fn)
  if dev.kind ~= "cuda" then return fn() end
  return dev:with_tuning(fields, fn)
end

-- Asserts that the last attention call on a CUDA device launched what the
-- test is about: its plan (dev:last_plan(), a line a launch) matches the Lua
-- pattern `want` (or, with `absent`, does not). `what` names the path. A dry
-- run on the CPU checks results only (the CPU plans no kernels).
function G.expect_plan(dev, what, want, absent)
  if dev.kind ~= "cuda" then return end
  local plan = assert(dev:last_plan())
  local found = plan:find(want) ~= nil
  if found == (absent == true) then
    error(string.format("%s: the last call's plan %s '%s':\n%s", what, absent and "has" or "lacks", want, plan), 2)
  end
end

-- The device's compute capability major (0: not a CUDA device).
function G.cc_major(dev)
  return tonumber((dev.description or ""):match("compute (%d+)%.")) or 0
end

-- The same standard normal tensor on two devices (randn is one stream everywhere).
function G.randn2(shape, dtype, dev_a, dev_b, seed)
  return assert(pa.randn(shape, dtype, dev_a, seed)), assert(pa.randn(shape, dtype, dev_b, seed))
end

-- A flat 1-based table of a random block table [B, width] over num_pages:
-- distinct pages, or any pages (duplicates) when dup is true; entries past a
-- sequence's used pages are garbage that must never be read.
function G.block_table(rng, B, used, width, num_pages, dup)
  local pool = {}
  for i = 1, num_pages do pool[i] = i - 1 end
  rng:shuffle(pool)
  local bt, next_free = {}, 1
  for b = 1, B do
    for j = 1, width do
      local v
      if j <= used[b] then
        if dup then v = rng:int(0, num_pages - 1)
        else v = pool[next_free]; next_free = next_free + 1 end
      else
        v = (j % 2 == 0) and -7 or 2000000000
      end
      bt[(b - 1) * width + j] = v
    end
  end
  return bt
end

-- The block table of B sequences holding keys[b] keys each in pages of
-- `page`: returns the flat table, its width (one spare column of garbage past
-- the widest sequence) and the pool size: num_pages(need) when given (need:
-- pages the sequences use), else need + 3 (distinct pages and a few spare).
function G.paged_table(rng, B, keys, page, dup, num_pages)
  local used, need, width = {}, 0, 0
  for b = 1, B do
    used[b] = math.ceil(keys[b] / page)
    need = need + used[b]
    if used[b] > width then width = used[b] end
  end
  width = width + 1
  local n = num_pages and num_pages(need) or need + 3
  return G.block_table(rng, B, used, width, n, dup), width, n
end

-- Elements [offset, offset + count) of a tensor as a 1-based Lua table.
function G.read(t, offset, count)
  local buf = ffi.new("double[?]", count)
  assert(core.C.pa_tensor_read_f64(core.ctx, t.handle, offset, buf, count) == 0, core.last_error())
  local out = {}
  for i = 1, count do out[i] = buf[i - 1] end
  return out
end

-- Writes a 1-based Lua table at element offset.
function G.write(t, offset, values)
  assert(t:write(values, offset, #values))
end

-- The first index in [i0, i1] (default: all of a) where two tables differ
-- bit for bit (~=), or nil.
function G.first_diff(a, b, i0, i1)
  for i = i0 or 1, i1 or #a do
    if a[i] ~= b[i] then return i end
  end
  return nil
end

-- max |a - b| over two flat tables (NaN: infinite).
G.max_diff = ref.max_abs_diff

-- The slice of a problem (its tensors t after the call) that the float64
-- reference can do whole: queries q0 .. q0 + nq - 1 of kv head 0's query
-- heads, keys 0 .. nk - 1 of kv head 0 (token tok at element offset
-- offset_of(tok) of the caches), and the options o (causal, softcap, window,
-- alibi: all heads' slopes) for those heads. Returns q [1, nq, G, D], k and
-- v [1, nk, 1, D] (reference tensors) and the reference's options.
function G.slice(t, H, Hk, D, q0, nq, nk, offset_of, o)
  local Gq = H / Hk
  local qd = {}
  for i = 0, nq - 1 do
    local row = G.read(t.q, (q0 + i) * H * D, Gq * D)
    for j = 1, #row do qd[#qd + 1] = row[j] end
  end
  local kd, vd = {}, {}
  for tok = 0, nk - 1 do
    local off = offset_of(tok)
    local kr, vr = G.read(t.k_cache, off, D), G.read(t.v_cache, off, D)
    for j = 1, D do kd[#kd + 1] = kr[j]; vd[#vd + 1] = vr[j] end
  end
  local opts = { causal = o.causal, softcap = o.softcap, window_size = o.window }
  if o.alibi then
    local a = {}
    for g = 1, Gq do a[g] = o.alibi[g] end
    opts.alibi_slopes = ref.tensor({ Gq }, a)
  end
  return ref.tensor({ 1, nq, Gq, D }, qd), ref.tensor({ 1, nk, 1, D }, kd), ref.tensor({ 1, nk, 1, D }, vd), opts
end

-- The rule of docs/design.md at sizes where the float64 reference cannot run
-- whole: the naive-precision error is measured on one slice of the problem
-- (one sequence, one kv head's query heads, from a paged cache) and the
-- tolerance is 3x that + 1e-5.
--   q: [1, Sq, G, D] table, k/v: [1, S, 1, D] tables (reference tensors)
function G.naive_tolerance(dtype, q, k, v, opts)
  local o = {}
  for key, val in pairs(opts or {}) do o[key] = val end
  o.cache_seqlens = ref.tensor({ 1 }, { k.shape[2] })
  local exact = ref.attention_with_kvcache(q, ref.copy(k), ref.copy(v), o)
  o.precision = dtype
  o.cache_dtype = dtype
  local naive = ref.attention_with_kvcache(q, ref.copy(k), ref.copy(v), o)
  local err = ref.max_abs_diff(naive.data, exact.data)
  return ref.tolerance(dtype, err), err
end

return G
