-- Tensors: creation, host round trips with rounding, randn, errors.
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local H = require "helpers"

local cpu = assert(pa.device("cpu"))

describe("tensors", function()
  it("pa.tensor is zero-filled and knows its shape, dtype and device", function()
    local t = pa.tensor({ 2, 3, 4 }, "bf16", cpu)
    assert.same({ 2, 3, 4 }, t.shape)
    assert.equal("bf16", t.dtype)
    assert.equal(cpu, t.device)
    assert.equal(24, t.numel)
    local v = t:to_table()
    assert.equal(24, #v)
    for i = 1, 24 do assert.equal(0, v[i]) end
  end)

  for _, dt in ipairs({ "f32", "f16", "bf16" }) do
    it("from_table rounds to nearest even in " .. dt .. ", like the reference", function()
      local rng = H.rng("round" .. dt)
      local vals = {}
      for i = 1, 2000 do vals[i] = rng:normal() * 2 ^ rng:int(-30, 20) end
      -- just above ties: a conversion through float would round these twice
      -- (192.50000141882174 once came out as 192 in bf16)
      vals[#vals + 1] = 192.50000141882174
      vals[#vals + 1] = 1 + 2 ^ -11 + 2 ^ -40
      vals[#vals + 1] = 1 + 2 ^ -8 + 2 ^ -40
      vals[#vals + 1] = -(1 + 2 ^ -24 + 2 ^ -50)
      vals[#vals + 1] = 1e10
      vals[#vals + 1] = -0.0
      vals[#vals + 1] = 1 / 0
      local t = pa.from_table(vals, { #vals }, dt, cpu)
      local got = t:to_table()
      for i = 1, #vals do
        local want = ref.round(vals[i], dt)
        if got[i] ~= want then
          error(string.format("element %d: %.17g rounds to %.17g, reference says %.17g", i, vals[i], got[i], want))
        end
      end
    end)
  end

  it("i32 tensors keep integers and refuse non-integers", function()
    local t = pa.from_table({ -2147483648, 0, 7, 2147483647 }, { 4 }, "i32", cpu)
    assert.same({ -2147483648, 0, 7, 2147483647 }, t:to_table())
    local err = H.error_of(pa.from_table, { 1.5 }, { 1 }, "i32", cpu)
    assert.truthy(err:find("not a 32%-bit integer"), err)
  end)

  it("randn is seeded, the same for every dtype up to rounding, and standard normal", function()
    local a = pa.randn({ 100000 }, "f32", cpu, 42):to_table()
    local b = pa.randn({ 100000 }, "f32", cpu, 42):to_table()
    local c = pa.randn({ 100000 }, "f32", cpu, 43):to_table()
    local h = pa.randn({ 100000 }, "bf16", cpu, 42):to_table()
    assert.same(a, b)
    local same, sum, sq = 0, 0, 0
    for i = 1, #a do
      if a[i] == c[i] then same = same + 1 end
      sum, sq = sum + a[i], sq + a[i] * a[i]
      -- bf16 values are the same normals rounded once from double: within half a
      -- bf16 ulp of the f32 ones (a near-tie may round either way)
      local _, e = math.frexp(a[i])
      assert(math.abs(h[i] - a[i]) <= 2 ^ (e - 9) * (1 + 2 ^ -14), "bf16 randn is not the f32 stream rounded")
    end
    assert.is_true(same < 10)
    local mean, var = sum / #a, sq / #a - (sum / #a) ^ 2
    assert.is_true(math.abs(mean) < 0.02, "mean " .. mean)
    assert.is_true(math.abs(var - 1) < 0.03, "variance " .. var)
  end)

  it("fill rounds once, like from_table", function()
    for _, dt in ipairs({ "bf16", "f16", "f32" }) do
      local x = 192.50000141882174
      assert.equal(ref.round(x, dt), pa.tensor({ 3 }, dt, cpu):fill(x):to_table()[2])
    end
  end)

  it("fill, clone and copy_from", function()
    local t = pa.tensor({ 5 }, "f16", cpu):fill(1.5)
    assert.same({ 1.5, 1.5, 1.5, 1.5, 1.5 }, t:to_table())
    local u = t:clone()
    t:fill(2)
    assert.same({ 1.5, 1.5, 1.5, 1.5, 1.5 }, u:to_table())
    u:copy_from(t)
    assert.same(t:to_table(), u:to_table())
    local err = H.error_of(u.copy_from, u, pa.tensor({ 5 }, "f32", cpu))
    assert.truthy(err:find("dtype"), err)
  end)

  it("bad shapes and dtypes name the argument", function()
    local err = H.error_of(function() local t = pa.tensor({ 2, -1 }, "f32", cpu); return t end)
    assert.truthy(err:find("shape: dimension 2"), err)
    assert.truthy(err:find("tensor_spec.lua:", 1, true), "error does not point at the caller: " .. err)
    assert.truthy(H.error_of(pa.tensor, { 2 }, "f64", cpu):find("dtype: 'f64'"))
    assert.truthy(H.error_of(pa.from_table, { 1, 2, 3 }, { 2 }, "f32", cpu):find("values: 3 numbers"))
    assert.truthy(H.error_of(pa.tensor, { 2 }, "f32", 7):find("device: expected a device"))
  end)

  it("devices: cpu by name, cached, described; an unknown name raises", function()
    assert.equal(cpu, pa.device("cpu"))
    assert.equal("cpu", cpu.kind)
    assert.truthy(cpu.num_threads >= 1)
    assert.truthy(cpu.description:find("threads"))
    local err = H.error_of(pa.device, "tpu")
    assert.truthy(err:find("unknown device name 'tpu'"), err)
  end)

  it("ceilings of the CPU are measured and positive", function()
    local c = assert(cpu:ceilings(0.05))
    assert.is_true(c.read_gbps > 0.1 and c.copy_gbps > 0.1 and c.fma_gflops > 0.1)
    -- the matmul ceiling is a GPU's (cuBLAS)
    assert.equal(0, c.matmul_gflops)
    assert.equal(0, c.matmul_sustained_gflops)
    assert.is_nil(c.matmul_note)
  end)
end)
