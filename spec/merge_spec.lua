-- spec/merge_spec.lua -- pa.merge_states against the float64 reference
-- (spec/cascade_cases.lua): random states of both layouts and every dtype
-- (empty ones among them, whose o must not be read), up to 32 states, in
-- place, values near the largest float; attention over keys split in two and
-- merged against the reference's attention over all of them; every mistake
-- named, nothing changed. spec/gpu_cascade_spec.lua runs the cases on the GPU.
local pa = require "pagedattn"
local H = require "helpers"
local cases = require "cascade_cases"

local SPEC = "spec/merge_spec.lua"

describe("pa.merge_states", function()
  for _, name in ipairs { "cpu", "cpu:staged" } do
    it("matches the float64 reference on random states (both layouts, every dtype, empty states) on " .. name, function()
      cases.merge_random(assert(pa.device(name)), name, H.scale(40), SPEC)
    end)
    it("merges in place (out = o_a, out_lse = lse_a) on " .. name, function()
      cases.merge_inplace(assert(pa.device(name)), name, SPEC)
    end)
    it("gives an attention over split keys that matches the reference over all of them on " .. name, function()
      cases.merge_split(assert(pa.device(name)), name, H.scale(12), SPEC)
    end)
  end

  it("keeps outputs near the largest float finite, as the exact merge is", function()
    cases.merge_near_max(assert(pa.device("cpu")))
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
