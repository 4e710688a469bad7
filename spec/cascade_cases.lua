-- spec/cascade_cases.lua -- the cases of merge_spec and cascade_spec, as
-- functions of the device, so that gpu_cascade_spec runs them on the GPU:
-- merges against the float64 reference (random states, in place, attention
-- over split keys, values near the largest float), and cascade batches
-- against the plain call and the reference (random sharing structures,
-- rotary positions). Each function raises with the seed and the rerun
-- command of `spec` (the spec file that called it).
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local H = require "helpers"
local luassert = require "luassert"

local M = {}
local SPEC = "spec/merge_spec.lua" -- (set by each entry point)

local function to_ref(t) return ref.tensor(t.shape, t:to_table()) end
M.to_ref = to_ref

-- A random state: o rounded to dtype, lse in [-6, 6] with some rows empty
-- (-inf, their o poisoned with NaN) and some far below the others.
local function random_state(rng, dev, dtype, oshape, lshape, empty_frac)
  local on, ln = ref.numel(oshape), ref.numel(lshape)
  local D = oshape[#oshape]
  local lv, ov = {}, {}
  for i = 1, ln do
    local u = rng:uniform()
    if u < empty_frac then lv[i] = -math.huge
    elseif u < empty_frac + 0.05 then lv[i] = -80 + rng:normal()
    else lv[i] = 12 * rng:uniform() - 6 end
  end
  for i = 1, on do ov[i] = ref.round(3 * rng:normal(), dtype) end
  local o = pa.from_table(ov, oshape, dtype, dev)
  local l = pa.from_table(lv, lshape, "f32", dev)
  -- an empty (row, head): its o is NaN, which must not reach the result
  local rank, Hh = #oshape, oshape[#oshape - 1]
  local seq = rank == 3 and oshape[1] or oshape[2]
  for li = 1, ln do
    if lv[li] == -math.huge then
      local i0 = li - 1
      local bi, rest = math.floor(i0 / (Hh * seq)), i0 % (Hh * seq)
      local h, i = math.floor(rest / seq), rest % seq
      local row = bi * seq + i
      local nan = {}
      for d = 1, D do nan[d] = 0 / 0 end
      o:write(nan, (row * Hh + h) * D)
    end
  end
  return o, l
end

local function shapes(rng, rank)
  local Hh, D = rng:int(1, 5), ({ 1, 3, 8, 64, 128, 256 })[rng:int(1, 6)]
  if rank == 3 then
    local T = rng:int(0, 9)
    return { T, Hh, D }, { Hh, T }
  end
  local B, Sq = rng:int(1, 3), rng:int(1, 4)
  return { B, Sq, Hh, D }, { B, Hh, Sq }
end

-- The device's merge against the f64 reference, judged by the rule.
local function judge(states_dev, states_ref, out, out_lse, dtype, what)
  local exact_o, exact_l = ref.merge_states(states_ref)
  local naive_o, naive_l = ref.merge_states(states_ref, { precision = dtype })
  local err_o = ref.max_abs_diff(out:to_table(), exact_o.data)
  local tol_o = ref.tolerance(dtype, ref.max_abs_diff(naive_o.data, exact_o.data))
  assert(err_o <= tol_o, string.format("%s: out err %g > tolerance %g (%s)", what, err_o, tol_o, H.rerun(SPEC)))
  local lt = out_lse:to_table()
  for i = 1, #lt do -- -inf where the reference has -inf, else within the rule
    if exact_l.data[i] == -math.huge then
      assert(lt[i] == -math.huge, string.format("%s: lse[%d] = %g, expected -inf", what, i, lt[i]))
    end
  end
  local err_l = ref.max_abs_diff(lt, exact_l.data)
  local tol_l = ref.tolerance("f32", ref.max_abs_diff(naive_l.data, exact_l.data))
  assert(err_l <= tol_l, string.format("%s: lse err %g > tolerance %g (%s)", what, err_l, tol_l, H.rerun(SPEC)))
  -- a (row, head) that every state leaves empty is exactly zero
  local ot, rank = out:to_table(), #out.shape
  local Hh, D = out.shape[rank - 1], out.shape[rank]
  local seq = rank == 3 and out.shape[1] or out.shape[2]
  for li = 1, #lt do
    if exact_l.data[li] == -math.huge then
      local i0 = li - 1
      local bi, rest = math.floor(i0 / (Hh * seq)), i0 % (Hh * seq)
      local h, i = math.floor(rest / seq), rest % seq
      local off = ((bi * seq + i) * Hh + h) * D
      for d = 1, D do assert(ot[off + d] == 0, what .. ": an empty row is not zero") end
    end
  end
end


-- Random states of both layouts and every dtype, 1 to 32 of them.
function M.merge_random(dev, name, cases, spec)
  SPEC = spec
  for c = 1, cases do
    local rng = H.rng("merge-random-" .. name, c)
    local dtype = ({ "f32", "f16", "bf16" })[rng:int(1, 3)]
    local rank = rng:int(3, 4)
    local os, ls = shapes(rng, rank)
    local n = ({ 1, 2, 2, 3, 5, 9, 32 })[rng:int(1, 7)]
    local sd, sr = {}, {}
    for s = 1, n do
      local o, l = random_state(rng, dev, dtype, os, ls, 0.2)
      sd[s] = { o, l }
      sr[s] = { to_ref(o), to_ref(l) }
    end
    local out, out_lse
    if n == 2 and rng:uniform() < 0.5 then
      out, out_lse = pa.merge_states(sd[1][1], sd[1][2], sd[2][1], sd[2][2])
    else
      out, out_lse = pa.merge_states(sd)
    end
    judge(sd, sr, out, out_lse, dtype, string.format("case %d (%s %s, %d states)", c, dtype, ref.shape_str(os), n))
  end
end

-- In place: out = the last state's o, out_lse its lse.
function M.merge_inplace(dev, name, spec)
  SPEC = spec
  local rng = H.rng("merge-inplace-" .. name)
  for _, n in ipairs { 2, 12, 32 } do
    local os, ls = { 7, 3, 16 }, { 3, 7 }
    local sd, sr = {}, {}
    for s = 1, n do
      sd[s] = { random_state(rng, dev, "bf16", os, ls, 0.1) }
      sr[s] = { to_ref(sd[s][1]), to_ref(sd[s][2]) }
    end
    local want, want_lse = pa.merge_states(sd)
    -- out aliases the last state: it must be read before anything is written
    local last = sd[n]
    local got, got_lse = pa.merge_states(sd, last[1], last[2])
    luassert.equal(last[1], got)
    luassert.equal(last[2], got_lse)
    judge(sd, sr, got, got_lse, "bf16", n .. " states in place")
    luassert.same(want:to_table(), got:to_table())
    luassert.same(want_lse:to_table(), got_lse:to_table())
  end
end

-- Attention over keys split in two (device calls), merged, against the
-- reference over all of them.
function M.merge_split(dev, name, cases, spec)
  SPEC = spec
  for c = 1, cases do
    local rng = H.rng("merge-split-" .. name, c)
    local dtype = ({ "f32", "f16", "bf16" })[rng:int(1, 3)]
    local B, Hk, G, D = rng:int(1, 3), rng:int(1, 2), rng:int(1, 4), ({ 8, 32, 64 })[rng:int(1, 3)]
    local Hq, page = Hk * G, ({ 1, 3, 16 })[rng:int(1, 3)]
    local Sq = rng:int(1, 3)
    local softcap = rng:uniform() < 0.3 and 5 or nil
    -- keys [0, a) in the first part, [a, n) in the second, a on a page boundary
    local pa_pages, pb_pages = rng:int(0, 4), rng:int(0, 4)
    local na, nb = pa_pages * page, math.max(0, pb_pages * page - rng:int(0, page - 1))
    local num_pages = B * (pa_pages + pb_pages) + 2
    local kc = pa.from_table((function()
      local t = {}
      for i = 1, num_pages * page * Hk * D do t[i] = ref.round(rng:normal(), dtype) end
      return t
    end)(), { num_pages, page, Hk, D }, dtype, dev)
    local vc = pa.from_table((function()
      local t = {}
      for i = 1, num_pages * page * Hk * D do t[i] = ref.round(rng:normal(), dtype) end
      return t
    end)(), { num_pages, page, Hk, D }, dtype, dev)
    local ids = {}
    for i = 1, num_pages do ids[i] = i - 1 end
    rng:shuffle(ids)
    local bt_a, bt_b, bt_all, wa, wb = {}, {}, {}, math.max(1, pa_pages), math.max(1, pb_pages)
    local at = 1
    for b = 1, B do
      local ra, rb, rall = {}, {}, {}
      for j = 1, pa_pages do ra[j] = ids[at]; rall[#rall + 1] = ids[at]; at = at + 1 end
      for j = 1, pb_pages do rb[j] = ids[at]; rall[#rall + 1] = ids[at]; at = at + 1 end
      for j = #ra + 1, wa do ra[j] = 0 end
      for j = #rb + 1, wb do rb[j] = 0 end
      if #rall == 0 then rall[1] = 0 end
      bt_a[b], bt_b[b], bt_all[b] = ra, rb, rall
    end
    local q = pa.randn({ B, Sq, Hq, D }, dtype, dev, H.seed("merge-split-q", c))
    local o = { softcap = softcap, return_softmax_lse = true }
    local function call(bt, keys)
      local oo = {}
      for k, v in pairs(o) do oo[k] = v end
      oo.block_table, oo.cache_seqlens = bt, keys
      return assert(pa.attention_with_kvcache(q, kc, vc, oo))
    end
    local oa, la = call(bt_a, na)
    local ob, lb = call(bt_b, nb)
    local out, lse = pa.merge_states(oa, la, ob, lb)
    -- the reference over all keys, and a naive one in the dtype
    local rq, rk, rv = to_ref(q), to_ref(kc), to_ref(vc)
    local ro = { block_table = ref.tensor({ B, wa + wb }, (function()
      local t = {}
      for b = 1, B do for j = 1, wa + wb do t[#t + 1] = bt_all[b][j] or 0 end end
      return t
    end)()), cache_seqlens = na + nb, softcap = softcap }
    local exact, exact_lse = ref.attention_with_kvcache(rq, ref.copy(rk), ref.copy(rv), ro)
    ro.precision = dtype
    local naive = ref.attention_with_kvcache(rq, ref.copy(rk), ref.copy(rv), ro)
    local tol = ref.tolerance(dtype, ref.max_abs_diff(naive.data, exact.data))
    local err = ref.max_abs_diff(out:to_table(), exact.data)
    assert(err <= tol, string.format("case %d (%s, %d + %d keys, page %d): err %g > tol %g (%s)", c, dtype, na, nb,
      page, err, tol, H.rerun(SPEC)))
    local lerr = ref.max_abs_diff(lse:to_table(), exact_lse.data)
    assert(lerr <= 1e-4, string.format("case %d: lse err %g (%s)", c, lerr, H.rerun(SPEC)))
  end
end

-- Values near the largest float stay finite, as the exact merge is.
function M.merge_near_max(dev)
  for _, dtype in ipairs { "f32", "bf16", "f16" } do
    local big = ({ f32 = 3.4028234663852886e38, bf16 = 3.3895313892515355e38, f16 = 65504 })[dtype]
    local T, Hh, D = 5, 2, 16
    local oa, ob, la, lb = {}, {}, {}, {}
    for i = 1, T * Hh * D do oa[i] = big; ob[i] = (i % 2 == 0) and big or -big end
    for i = 1, Hh * T do la[i] = (i % 3) - 1; lb[i] = ((i + 1) % 3) - 1 end
    local A = pa.from_table(oa, { T, Hh, D }, dtype, dev)
    local Bt = pa.from_table(ob, { T, Hh, D }, dtype, dev)
    local LA, LB = pa.from_table(la, { Hh, T }, "f32", dev), pa.from_table(lb, { Hh, T }, "f32", dev)
    local out = pa.merge_states(A, LA, Bt, LB)
    local exact = ref.merge_states({ { to_ref(A), to_ref(LA) }, { to_ref(Bt), to_ref(LB) } })
    local got = out:to_table()
    for i = 1, #got do
      assert(got[i] == got[i] and math.abs(got[i]) < math.huge, dtype .. ": element " .. i .. " is " .. got[i])
      assert(math.abs(got[i] - exact.data[i]) <= 2 ^ -6 * big, dtype .. ": element " .. i)
    end
    -- states that agree merge into their value, whatever the weights: in
    -- f32 these lse (0 and one of offs) give weights that round to a sum
    -- past 1, which took an unguarded sum of FLT_MAX to inf
    local offs = { -0.0234375, -0.0703125, -0.078125, -0.09375, -0.125 }
    local l0, l1 = {}, {}
    for i = 1, Hh * T do l0[i] = 0; l1[i] = offs[(i - 1) % #offs + 1] end
    local L0, L1 = pa.from_table(l0, { Hh, T }, "f32", dev), pa.from_table(l1, { Hh, T }, "f32", dev)
    for _, pair in ipairs { { L0, L1 }, { L1, L0 }, { LA, LA } } do
      local same = pa.merge_states(A, pair[1], A, pair[2]):to_table()
      for i = 1, #same do luassert.equal(big, same[i]) end
    end
  end
end

local function pick(rng, list) return list[rng:int(1, #list)] end
local function chance(rng, p) return rng:uniform() < p end

local function ints(t)
  local v = t:to_table()
  return v
end

-- Rotary tables [n, dim / 2] (f32), as a model would have them.
local function rotary_tables(n, dim, dev)
  local cs, sn = {}, {}
  for pos = 0, n - 1 do
    for j = 0, dim / 2 - 1 do
      local theta = pos * 10000 ^ (-2 * j / dim)
      cs[#cs + 1], sn[#sn + 1] = math.cos(theta), math.sin(theta)
    end
  end
  return pa.from_table(cs, { n, dim / 2 }, "f32", dev), pa.from_table(sn, { n, dim / 2 }, "f32", dev)
end

-- A random sharing structure on a pool: roots, forks, forks of forks (some
-- grown before forking again), truncations into shared pages, lone
-- sequences. Returns the live sequences (bookkeeping only: the caches are
-- filled afterwards).
local function random_structure(rng, cache, ps)
  local live = {}
  for r = 1, rng:int(1, 3) do
    local s = cache:sequence()
    -- (the first root holds two whole pages or more, and two forks of it
    -- come first: most structures then share a page or more)
    assert(s:append(rng:int(r == 1 and 2 * ps or 0, 6 * ps + 2)))
    live[#live + 1] = s
  end
  live[#live + 1] = assert(live[1]:fork())
  live[#live + 1] = assert(live[1]:fork())
  for _ = 1, rng:int(2, 10) do
    local s = pick(rng, live)
    local u = rng:uniform()
    if u < 0.55 then
      local c = assert(s:fork())
      if chance(rng, 0.5) then assert(c:append(rng:int(1, 3 * ps))) end
      live[#live + 1] = c
    elseif u < 0.7 and s:len() > 0 then
      s:truncate(rng:int(0, s:len()))
    elseif u < 0.85 then
      assert(s:append(rng:int(1, 2 * ps)))
    else
      local n = cache:sequence()
      assert(n:append(rng:int(0, 4 * ps)))
      live[#live + 1] = n
    end
  end
  return live
end


-- Random sharing structures and options against the plain call (caches bit
-- for bit) and the reference (the tolerance rule).
-- shape (maybe): the lists to draw dtypes, pages and head dims from (the
-- kernels' own shapes, where a spec forces each kernel in turn)
function M.cascade_random(dev, name, cases, spec, shape)
  SPEC = spec
  shape = shape or {}
  local used, reasons = 0, {}
  for case = 1, cases do
    local seed = H.seed("cascade-" .. name, case)
    local rng = ref.rng(seed)
    local dtype = pick(rng, shape.dtypes or { "f32", "f32", "bf16", "f16" })
    local ps = pick(rng, shape.pages or { 1, 3, 4, 16 })
    local Hk, G, D = pick(rng, { 1, 2 }), pick(rng, { 1, 2, 4 }), pick(rng, shape.dims or { 8, 16, 32 })
    local Hq = Hk * G
    -- an fp8 cache (its scales, per tensor or per kv head, go into every level's calls)
    local kvd, ks, vs = dtype, nil, nil
    if chance(rng, 0.25) then
      kvd = pick(rng, { "fp8_e4m3", "fp8_e5m2" })
      local function f32(x) return ref.round(x, "f32") end
      ks = chance(rng, 0.5) and f32(0.25 + rng:uniform()) or (function()
        local t = {}
        for h = 1, Hk do t[h] = f32(0.25 + rng:uniform()) end
        return t
      end)()
      vs = f32(0.25 + 2 * rng:uniform())
    end
    local cache = assert(pa.kv_cache { num_pages = 600, page_size = ps, kv_heads = Hk, head_dim = D,
      dtype = kvd, device = dev, k_scale = ks, v_scale = vs })
    local live = random_structure(rng, cache, ps)
    -- the keys: random, in the cache's dtype (shared pages hold one copy)
    cache.k_cache:copy_from(pa.randn(cache.k_cache.shape, kvd, dev, seed))
    cache.v_cache:copy_from(pa.randn(cache.v_cache.shape, kvd, dev, seed + 1))
    local form4 = chance(rng, 0.2)
    local b = cache:batch { cascade = true }
    local labels = chance(rng, 0.25)
    local entries = {}
    rng:shuffle(live)
    local s_new = rng:int(1, 3)
    for i = 1, #live do
      if chance(rng, 0.85) then
        local n = form4 and s_new or pick(rng, { 1, 1, 1, 0, 2, 5 })
        local grp = labels and chance(rng, 0.8) and rng:int(0, 2) or nil
        b:add(live[i], n, grp)
        entries[#entries + 1] = live[i]
      end
    end
    if #entries == 0 then b:add(live[1], form4 and s_new or 1); entries[1] = live[1] end
    assert(b:stage())
    local T, B = b.total_q, b.size
    -- options
    local o = {}
    if chance(rng, 0.2) then
      o.causal = false
      if chance(rng, 0.5) then o.window_size = { -1, rng:int(0, 3) } end
    end
    if chance(rng, 0.3) then o.softcap = pick(rng, { 2, 10 }) end
    if chance(rng, 0.2) then o.softmax_scale = 0.05 + rng:uniform() end
    if chance(rng, 0.2) then o.num_splits = rng:int(1, 3) end
    if chance(rng, 0.6) then o.return_softmax_lse = true end
    local info0 = b:cascade_info()
    local wl = -1
    if chance(rng, 0.15) then
      wl = chance(rng, 0.5) and rng:int(0, 3) or info0.max_grouped_pos + rng:int(0, 4)
      o.window_size = { wl, o.window_size and o.window_size[2] or -1 }
    end
    if chance(rng, 0.1) then
      local sl = {}
      for h = 1, Hq do sl[h] = 0.25 * h end
      o.alibi_slopes = pa.from_table(sl, { Hq }, "f32", dev)
    end
    -- the plain call where the levels would not give its results
    local want = info0.groups == 0 and "no groups" or o.alibi_slopes and "alibi"
      or (wl >= 0 and wl < info0.max_grouped_pos) and "window" or "used"
    local appended = not form4 and chance(rng, 0.15) -- k/v appended first (append_kv), then attention
    local rot = T > 0 and chance(rng, 0.4)
    local rotdim = rot and 2 * rng:int(1, D / 2) or nil
    local cos, sin
    if rot then
      cos, sin = rotary_tables(b.max_seqlen_k + 2, rotdim, dev)
      o.rotary_cos, o.rotary_sin = cos, sin
      if chance(rng, 0.5) then o.rotary_interleaved = false end
    end
    local qshape = form4 and { B, s_new, Hq, D } or { T, Hq, D }
    local kshape = form4 and { B, s_new, Hk, D } or { T, Hk, D }
    local q = pa.randn(qshape, dtype, dev, seed + 2)
    local k, v = pa.randn(kshape, dtype, dev, seed + 3), pa.randn(kshape, dtype, dev, seed + 4)
    local k0, v0 = cache.k_cache:clone(), cache.v_cache:clone()
    local function run(fn)
      if appended then
        local ao = { rotary_cos = o.rotary_cos, rotary_sin = o.rotary_sin, rotary_interleaved = o.rotary_interleaved }
        assert(b:append_kv(k, v, ao))
        local oo = {}
        for key, val in pairs(o) do oo[key] = val end
        oo.rotary_cos, oo.rotary_sin, oo.rotary_interleaved = nil, nil, nil
        return fn(nil, nil, oo)
      end
      return fn(k, v, o)
    end
    -- the cascade
    local out1, lse1 = run(function(kk, vv, oo) return b:attention(q, kk, vv, oo) end)
    assert(out1, lse1)
    local info = b:cascade_info()
    local what = string.format("case %d (seed %d, %s cache %s page %d H %d/%d D %d, %d entries, %s, info %d groups %d grouped)",
      case, seed, dtype, kvd, ps, Hq, Hk, D, B, form4 and "with_kvcache" or "varlen", info.groups, info.grouped)
    assert(info.last == want, what .. ": the call ran '" .. info.last .. "', expected '" .. want .. "'")
    if info.last == "used" then used = used + 1 else reasons[info.last] = (reasons[info.last] or 0) + 1 end
    local k1, v1 = cache.k_cache:to_table(), cache.v_cache:to_table()
    -- the plain call on the same tables, from the same caches
    cache.k_cache:copy_from(k0)
    cache.v_cache:copy_from(v0)
    local out2 = run(function(kk, vv, oo)
      local po = { k = kk, v = vv, block_table = b.block_table, causal = oo.causal ~= false, k_scale = ks,
        v_scale = vs }
      for key, val in pairs(oo) do if key ~= "causal" then po[key] = val end end
      if form4 then
        po.cache_seqlens = kk and b.cache_seqlens or b.seqused_k
        return assert(pa.attention_with_kvcache(q, cache.k_cache, cache.v_cache, po))
      end
      po.cu_seqlens_q, po.seqused_k = b.cu_seqlens_q, b.seqused_k
      return assert(pa.attention_varlen(q, cache.k_cache, cache.v_cache, po))
    end)
    assert(ref.max_abs_diff(k1, cache.k_cache:to_table()) == 0, what .. ": the caches differ from the plain call's")
    assert(ref.max_abs_diff(v1, cache.v_cache:to_table()) == 0, what .. ": the caches differ from the plain call's")
    -- the reference, from the caches before the step (after append_kv's append when it ran first)
    local rk, rv
    if appended then
      rk, rv = to_ref(cache.k_cache), to_ref(cache.v_cache)
    else
      rk, rv = to_ref(k0), to_ref(v0)
    end
    local ro = { block_table = to_ref(b.block_table), causal = o.causal ~= false, softcap = o.softcap,
      softmax_scale = o.softmax_scale, window_size = o.window_size,
      alibi_slopes = o.alibi_slopes and to_ref(o.alibi_slopes), k_scale = ks, v_scale = vs,
      cache_dtype = kvd ~= dtype and kvd or nil }
    if not appended then
      ro.k, ro.v = to_ref(k), to_ref(v)
      if rot then
        ro.rotary_cos, ro.rotary_sin, ro.rotary_interleaved = to_ref(cos), to_ref(sin), o.rotary_interleaved
      end
    end
    local f = ref.attention_varlen
    if form4 then
      f = ref.attention_with_kvcache
      ro.cache_seqlens = to_ref(appended and b.seqused_k or b.cache_seqlens)
    else
      ro.cu_seqlens_q, ro.seqused_k = to_ref(b.cu_seqlens_q), to_ref(b.seqused_k)
    end
    local rq = to_ref(q)
    local exact, exact_lse = f(rq, ref.copy(rk), ref.copy(rv), ro)
    ro.precision, ro.cache_dtype = dtype, kvd
    local naive, naive_lse = f(rq, ref.copy(rk), ref.copy(rv), ro)
    local tol = ref.tolerance(dtype, ref.max_abs_diff(naive.data, exact.data))
    local err1 = ref.max_abs_diff(out1:to_table(), exact.data)
    local err2 = ref.max_abs_diff(out2:to_table(), exact.data)
    assert(err1 <= tol, string.format("%s: cascade err %g > tolerance %g (plain call: %g)\n  %s", what, err1, tol,
      err2, H.rerun(SPEC)))
    if lse1 then
      local ltol = ref.tolerance("f32", ref.max_abs_diff(naive_lse.data, exact_lse.data))
      local lerr = ref.max_abs_diff(lse1:to_table(), exact_lse.data)
      assert(lerr <= ltol, string.format("%s: lse err %g > tolerance %g\n  %s", what, lerr, ltol, H.rerun(SPEC)))
    end
    cache:validate()
    cache:close()
  end
  -- most cases must have run the two levels, or this spec proves little
  -- (about 70% do; under a quarter would be a broken generator or planner;
  -- a run of 2 or 3 cases, at a small PAGEDATTN_SPEC_SCALE, may have none)
  assert(used >= math.floor(cases * 0.25), string.format("only %d of %d cases ran the two levels (%s)", used, cases,
    (function()
      local parts = {}
      for r, n in pairs(reasons) do parts[#parts + 1] = r .. " " .. n end
      return table.concat(parts, ", ")
    end)()))
end

-- q rotated at the plain call's positions before both levels.
function M.cascade_rotary(dev, spec)
  SPEC = spec
  for case, mode in ipairs { "causal", "none", "right", "causal", "none", "right" } do
    local seed = H.seed("cascade-rotary", case)
    local rng = ref.rng(seed)
    local cache = assert(pa.kv_cache { num_pages = 128, page_size = 4, kv_heads = 2, head_dim = 16, device = dev })
    local root = cache:sequence()
    assert(root:append(13))
    cache.k_cache:copy_from(pa.randn(cache.k_cache.shape, "f32", dev, seed))
    cache.v_cache:copy_from(pa.randn(cache.v_cache.shape, "f32", dev, seed + 1))
    local kids = { root:fork(), root:fork(), root:fork() }
    local b = cache:batch { cascade = true }
    b:clear():add(kids[1], 3):add(root, 1):add(kids[2], 4):add(kids[3], 2)
    assert(b:stage())
    local T = b.total_q
    local cos, sin = rotary_tables(b.max_seqlen_k + 1, case > 3 and 8 or 16, dev)
    local o = { rotary_cos = cos, rotary_sin = sin, rotary_interleaved = case % 2 == 0, return_softmax_lse = true,
      causal = mode == "causal", window_size = mode == "right" and { -1, 1 } or nil }
    local q = pa.randn({ T, 4, 16 }, "f32", dev, seed + 2)
    local k, v = pa.randn({ T, 2, 16 }, "f32", dev, seed + 3), pa.randn({ T, 2, 16 }, "f32", dev, seed + 4)
    local rk, rv = to_ref(cache.k_cache), to_ref(cache.v_cache)
    local out, lse = assert(b:attention(q, k, v, o))
    luassert.equal("used", b:cascade_info().last)
    luassert.equal(3, b:cascade_info().calls) -- the append, the two levels
    local exact, exact_lse = ref.attention_varlen(to_ref(q), rk, rv, { block_table = to_ref(b.block_table),
      cu_seqlens_q = to_ref(b.cu_seqlens_q), seqused_k = to_ref(b.seqused_k), k = to_ref(k), v = to_ref(v),
      rotary_cos = to_ref(cos), rotary_sin = to_ref(sin), rotary_interleaved = o.rotary_interleaved,
      causal = o.causal, window_size = o.window_size })
    local err, lerr = ref.max_abs_diff(out:to_table(), exact.data), ref.max_abs_diff(lse:to_table(), exact_lse.data)
    assert(err <= 2e-5 and lerr <= 2e-5, string.format("%s (seed %d): err %g, lse err %g (%s)", mode, seed, err, lerr,
      H.rerun(SPEC)))
    cache:close()
  end
end

M.rotary_tables = rotary_tables

return M
