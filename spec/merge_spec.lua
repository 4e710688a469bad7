-- spec/merge_spec.lua -- pa.merge_states against the float64 reference:
-- random states of both layouts and every dtype (empty ones among them, whose
-- o must not be read), lists longer than one backend pass, in place, values
-- near the largest float; attention over keys split in two and merged against
-- the reference's attention over all of them; every mistake named, nothing
-- changed.
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local H = require "helpers"

local SPEC = "spec/merge_spec.lua"
local DEVICES = { "cpu", "cpu:staged" }

local function to_ref(t) return ref.tensor(t.shape, t:to_table()) end

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

describe("pa.merge_states", function()
  for _, name in ipairs(DEVICES) do
    it("matches the float64 reference on random states (both layouts, every dtype, empty states) on " .. name, function()
      local dev = assert(pa.device(name))
      for c = 1, H.scale(40) do
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
    end)

    it("merges in place (out = o_a, out_lse = lse_a) on " .. name, function()
      local dev = assert(pa.device(name))
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
        assert.equal(last[1], got)
        assert.equal(last[2], got_lse)
        judge(sd, sr, got, got_lse, "bf16", n .. " states in place")
        assert.same(want:to_table(), got:to_table())
        assert.same(want_lse:to_table(), got_lse:to_table())
      end
    end)

    it("gives an attention over split keys that matches the reference over all of them on " .. name, function()
      local dev = assert(pa.device(name))
      for c = 1, H.scale(12) do
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
    end)
  end

  it("keeps outputs near the largest float finite, as the exact merge is", function()
    local dev = assert(pa.device("cpu"))
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
        for i = 1, #same do assert.equal(big, same[i]) end
      end
    end
  end)

  it("merges all-empty rows into zeros and -inf, and one state into itself", function()
    local dev = assert(pa.device("cpu"))
    local o = pa.from_table({ 0 / 0, 0 / 0, 1, 2 }, { 2, 1, 2 }, "f32", dev)
    local l = pa.from_table({ -math.huge, 0.5 }, { 1, 2 }, "f32", dev)
    local out, lse = pa.merge_states({ { o, l }, { o, l } })
    local t, lt = out:to_table(), lse:to_table()
    assert.same({ 0, 0, 1, 2 }, t)
    assert.equal(-math.huge, lt[1])
    assert.near(0.5 + math.log(2), lt[2], 1e-6)
    local one, one_lse = pa.merge_states({ { o, l } })
    assert.same({ 0, 0, 1, 2 }, one:to_table())
    assert.same({ -math.huge, 0.5 }, one_lse:to_table())
  end)

  it("names what is wrong and changes nothing", function()
    local dev = assert(pa.device("cpu"))
    local o = pa.randn({ 4, 2, 8 }, "f32", dev, 1)
    local l = pa.randn({ 2, 4 }, "f32", dev, 2)
    local out = pa.tensor({ 4, 2, 8 }, "f32", dev):fill(7)
    local out_lse = pa.tensor({ 2, 4 }, "f32", dev):fill(7)
    local before, before_lse = out:to_table(), out_lse:to_table()
    local function e(...) return H.error_of(pa.merge_states, ...) end
    assert.matches("merge_states: lse_b: expected shape %[2, 4%] %[H, T%], got %[4, 2%]",
      e(o, l, o, pa.tensor({ 4, 2 }, "f32", dev), out, out_lse))
    assert.matches("merge_states: o_b: expected shape %[4, 2, 8%]", e(o, l, pa.tensor({ 4, 2, 4 }, "f32", dev), l, out, out_lse))
    assert.matches("merge_states: o_b: dtype bf16, but o_a is f32", e(o, l, pa.tensor({ 4, 2, 8 }, "bf16", dev), l, out, out_lse))
    assert.matches("merge_states: lse_a: dtype bf16, expected f32", e(o, pa.tensor({ 2, 4 }, "bf16", dev), o, l, out, out_lse))
    assert.matches("merge_states: out: expected shape %[4, 2, 8%]", e(o, l, o, l, pa.tensor({ 4, 2, 9 }, "f32", dev)))
    assert.matches("merge_states: out: dtype f16", e(o, l, o, l, pa.tensor({ 4, 2, 8 }, "f16", dev)))
    assert.matches("merge_states: out_lse: expected shape %[2, 4%]", e(o, l, o, l, out, pa.tensor({ 4, 2 }, "f32", dev)))
    assert.matches("merge_states: o_a: expected %[T, H, D%] or %[B, Sq, H, D%]", e(pa.tensor({ 4, 8 }, "f32", dev), l, o, l))
    assert.matches("merge_states: o_a: dtype i32", e(pa.tensor({ 4, 2, 8 }, "i32", dev), l, o, l))
    assert.matches("merge_states: lse_b: expected a tensor, got nil", e(o, l, o, nil))
    assert.matches("merge_states: states: expected a list", e({}))
    assert.matches("merge_states: states%[2%]%[2%]: expected shape %[2, 4%]", e({ { o, l }, { o, o } }))
    assert.matches("merge_states: states%[2%]: expected an {o, lse} pair", e({ { o, l }, 5 }))
    local many = {}
    for i = 1, 33 do many[i] = { o, l } end
    assert.matches("merge_states: num_states: 33, expected 1 to 32", e(many))
    local staged = assert(pa.device("cpu:staged"))
    assert.matches("merge_states: o_b: on device cpu:staged, but o_a is on cpu",
      e(o, l, pa.tensor({ 4, 2, 8 }, "f32", staged), l, out, out_lse))
    assert.same(before, out:to_table())
    assert.same(before_lse, out_lse:to_table())
    -- the 4-D layout's lse is [B, H, Sq]
    local o4, l4 = pa.randn({ 2, 3, 2, 8 }, "f32", dev, 3), pa.randn({ 2, 2, 3 }, "f32", dev, 4)
    assert.matches("merge_states: lse_a: expected shape %[2, 2, 3%] %[B, H, Sq%]", e(o4, pa.tensor({ 2, 3, 2 }, "f32", dev), o4, l4))
    assert.truthy(pa.merge_states(o4, l4, o4, l4))
  end)
end)
