-- The CUDA device itself: description, tensors and copies, fills, randn (the
-- same stream as the CPU's), errors, ceilings and device-side timing.
-- Tagged #gpu; pending, with the reason, where there is no CUDA device.
local ffi = require "ffi"
local pa = require "pagedattn"
local core = require "pagedattn.core"
local G = require "gpu_helpers"
local H = require "helpers"

local dev, why = G.device()
-- (the dry run on the CPU: what only a CUDA device has is pending, with the reason)
local function cuda_only()
  if G.device_name == "cpu" then
    pending("a CUDA device's own behaviour: the dry run on the CPU cannot check it")
    return true
  end
end

describe("#gpu CUDA device", function()
  if G.pending_without(pending, dev, why) then return end
  local cpu = assert(pa.device("cpu"))

  it("#gpu describes itself (model, SMs, memory)", function()
    if cuda_only() then return end
    assert.equal("cuda", dev.kind)
    assert.truthy(dev.description:find("SMs", 1, true), dev.description)
    assert.truthy(dev.description:find("GiB", 1, true), dev.description)
    assert.equal(dev, pa.device("cuda:0"))
  end)

  it("#gpu tensors: zero-filled, round-trip every dtype, fill and copy", function()
    for _, dt in ipairs({ "f32", "f16", "bf16", "i32" }) do
      local t = assert(pa.tensor({ 3, 5, 7 }, dt, dev))
      for _, v in ipairs(t:to_table()) do assert.equal(0, v) end
      local vals = {}
      for i = 1, 105 do vals[i] = (dt == "i32") and (i * 7919 % 2001 - 1000) or ((i % 17) - 8) * 0.25 end
      local u = assert(pa.from_table(vals, { 3, 5, 7 }, dt, dev))
      assert.same(vals, u:to_table())
      t:copy_from(u)
      assert.same(vals, t:to_table())
      u:fill(dt == "i32" and -3 or 1.5)
      for _, v in ipairs(u:to_table()) do assert.equal(dt == "i32" and -3 or 1.5, v) end
      assert.same(vals, t:to_table()) -- the copy is its own
      -- partial writes and reads at offsets
      G.write(t, 100, { 2, 3 })
      assert.same({ vals[100], 2, 3, vals[103] }, G.read(t, 99, 4))
    end
    -- rounding of a fill: once, to nearest even (as from_table; the CPU's
    -- fill still rounds through f32, hence not in the dry run)
    if G.device_name ~= "cpu" then
      local b = assert(pa.tensor({ 4 }, "bf16", dev)):fill(192.50000141882174)
      assert.equal(193, b:to_table()[1])
    end
    local n = assert(pa.tensor({ 3 }, "f16", dev)):fill(0 / 0)
    local x = n:to_table()[1]
    assert.is_true(x ~= x)
  end)

  it("#gpu randn: the same values as the CPU for a seed (up to one rounding step)", function()
    for _, dt in ipairs({ "f32", "f16", "bf16" }) do
      for _, n in ipairs({ 1, 3, 4, 1001, 65537 }) do
        local seed = H.seed("gpu randn " .. dt, n)
        local a = assert(pa.randn({ n }, dt, dev, seed)):to_table()
        local c = assert(pa.randn({ n }, dt, cpu, seed)):to_table()
        local differ, sum, sumsq = 0, 0, 0
        local ulp = G.STEP[dt]
        for i = 1, n do
          if a[i] ~= c[i] then
            differ = differ + 1
            assert(math.abs(a[i] - c[i]) <= ulp * math.abs(c[i]) * 1.0001,
              string.format("%s element %d: %.9g on %s, %.9g on the CPU", dt, i - 1, a[i], dev.name, c[i]))
          end
          sum = sum + a[i]
          sumsq = sumsq + a[i] * a[i]
        end
        assert(differ <= math.max(1, n / 10000), string.format("%s n=%d: %d values differ", dt, n, differ))
        if n > 10000 then
          assert(math.abs(sum / n) < 0.05 and math.abs(sumsq / n - 1) < 0.05, "not standard normal")
        end
      end
    end
  end)

  it("#gpu kernels are kept per source directory (the tuning's kernel_dir, read at each first use)", function()
    if cuda_only() then return end
    -- a copy of kernels/ whose randn kernels draw from seed + 1
    local dir = H.tmpdir()
    assert(H.sh("cp -r '" .. core.root .. "/kernels/.' '" .. dir .. "'") == 0)
    local util = assert(H.read_file(dir .. "/util.cu"))
    local changed, n = util:gsub("randn_fill<(PA_DT_%w+)>%(out, n, seed%)", "randn_fill<%1>(out, n, seed + 1)")
    assert.equal(3, n)
    H.write_file(dir .. "/util.cu", changed)
    local function draw(seed) return assert(pa.randn({ 257 }, "f32", dev, seed)):to_table() end
    local before = draw(11)
    local other
    dev:with_tuning({ kernel_dir = dir }, function() other = draw(11) end)
    local after = draw(11)
    os.execute("rm -rf '" .. dir .. "'")
    assert.same(before, after)    -- the embedded sources' module again
    assert.same(draw(12), other)  -- the copy's module, not the one already loaded
    assert.are_not.same(before, other)
  end)

  it("#gpu kernels are kept per NVRTC options too (the tuning's nvrtc_options, sweeps by define)", function()
    if cuda_only() then return end
    local function draw() return pa.randn({ 257 }, "f32", dev, 11) end
    local before = assert(draw()):to_table() -- the util module, loaded without options
    -- other options are another module: compiled (here: refused by NVRTC), not the one loaded
    dev:with_tuning({ nvrtc_options = "--no-such-option" }, function()
      local t, e = draw()
      assert.is_nil(t)
      assert.truthy(tostring(e):find("no-such-option", 1, true), e)
    end)
    assert.same(before, assert(draw()):to_table())
  end)

  it("#gpu a device that does not exist is a clear error, not a crash", function()
    if cuda_only() then return end
    local d, err = pa.device("cuda:63")
    assert.is_nil(d)
    assert.truthy(err:find("cuda:63 does not exist", 1, true), err)
  end)

  it("#gpu running out of device memory is a clear error", function()
    if cuda_only() then return end
    -- far more than the device has
    local t, err = pa.tensor({ 1024, 1024, 1024, 1024 }, "f32", dev)
    assert.is_nil(t)
    assert.truthy(err:find("cannot allocate", 1, true), err)
  end)

  it("#gpu measures its ceilings: streaming read and copy, the bf16 matmul (cuBLAS) or why not", function()
    local c = assert(dev:ceilings(0.05))
    assert.is_true(c.read_gbps > 0 and c.copy_gbps > 0)
    if G.device_name == "cpu" then return end
    io.stderr:write(string.format("  matmul: short %.1f TFLOP/s, sustained %.1f TFLOP/s: %s\n",
      c.matmul_gflops / 1e3, c.matmul_sustained_gflops / 1e3, tostring(c.matmul_note)))
    assert.is_string(c.matmul_note)
    if c.matmul_gflops > 0 then
      assert.truthy(c.matmul_note:find("^cuBLAS"), c.matmul_note)
      assert.is_true(c.matmul_sustained_gflops > 0 and c.matmul_sustained_gflops < 1.2 * c.matmul_gflops)
    else
      assert.truthy(c.matmul_note:find("^not measured"), c.matmul_note) -- and the ceilings call succeeded
    end
  end)

  it("#gpu times the kernels of an attention call on the device", function()
    if cuda_only() then return end
    local q = assert(pa.randn({ 2, 1, 8, 64 }, "bf16", dev, 1))
    local k = assert(pa.randn({ 2, 512, 2, 64 }, "bf16", dev, 2))
    local v = assert(pa.randn({ 2, 512, 2, 64 }, "bf16", dev, 3))
    local secs = ffi.new("double[1]")
    assert.equal(0, core.C.pa_device_timing(core.ctx, dev.handle, 1))
    for _ = 1, 3 do
      assert(pa.attention_with_kvcache(q, k, v, { cache_seqlens = 500 }))
      assert.equal(0, core.C.pa_device_timing_last(core.ctx, dev.handle, secs))
      assert.is_true(secs[0] > 0 and secs[0] < 1, tostring(secs[0]))
    end
    assert.equal(0, core.C.pa_device_timing(core.ctx, dev.handle, 0))
    assert.equal(4, core.C.pa_device_timing(core.ctx, cpu.handle, 1)) -- unsupported on the CPU
  end)

  it("#gpu its tuning: read, set (checked, named errors, a failed set changes nothing), reset; the last plan", function()
    if cuda_only() then return end
    local t0 = assert(dev:tuning())
    assert.equal(16, t0.decode_kpw)
    assert.equal(1, t0.decode_persist)
    assert.equal(0, t0.prefill_kernel)
    dev:set_tuning({ decode_kpw = 8, prefill_kernel = "wgmma" })
    local t1 = assert(dev:tuning())
    assert.equal(8, t1.decode_kpw)
    assert.equal(2, t1.prefill_kernel)
    assert.equal(t0.decode_stages, t1.decode_stages) -- the fields not named stay
    local err = H.error_of(dev.set_tuning, dev, { decode_kpw = 12 })
    assert.truthy(err:find("decode_kpw: 12 is not 8 or 16", 1, true), err)
    err = H.error_of(dev.set_tuning, dev, { decode_kpw = 16, no_such_field = 1 })
    assert.truthy(err:find("no tuning field 'no_such_field'", 1, true), err)
    err = H.error_of(dev.set_tuning, dev, { decode_stages = 1 })
    assert.truthy(err:find("decode_stages: 1", 1, true), err)
    assert.same(t1, assert(dev:tuning())) -- (the failed sets changed nothing)
    dev:reset_tuning()
    assert.same(t0, assert(dev:tuning()))
    -- the plan of a call: a decode of 2 x 500 keys at 8 heads over 2 of 64 (a GQA tile of 4)
    local q = assert(pa.randn({ 2, 1, 8, 64 }, "bf16", dev, 1))
    local k = assert(pa.randn({ 2, 512, 2, 64 }, "bf16", dev, 2))
    local v = assert(pa.randn({ 2, 512, 2, 64 }, "bf16", dev, 3))
    assert(pa.attention_with_kvcache(q, k, v, { cache_seqlens = 500 }))
    local plan = assert(dev:last_plan())
    assert.truthy(plan:find("^decode_mma dtype=bf16 D=64 nq=1 gt=4 page=contig [^\n]* | pa_decode_mma grid=%d+"), plan)
    dev:with_tuning({ decode_kernel = "simt" }, function()
      assert(pa.attention_with_kvcache(q, k, v, { cache_seqlens = 500 }))
      plan = assert(dev:last_plan())
      assert.truthy(plan:find("^decode dtype=bf16 D=64 nq=1 gt=4 page=contig stages=3 maxp=1024 | pa_decode "), plan)
    end)
    assert.same(t0, assert(dev:tuning()))
  end)
end)
