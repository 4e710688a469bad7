-- spec/tuning_spec.lua -- the CUDA backend's tuning seen from Lua without a
-- GPU: its fields (the header's struct, the library's table, the README's),
-- the defaults, configs as the bench and sweeps write them, the planner's
-- variants for a shape, and the clear errors where there is no tuning. The
-- GPU side (set, read back, reset, the last plan): spec/gpu_backend_spec.lua.
local ffi = require "ffi"
local pa = require "pagedattn"
local core = require "pagedattn.core"
local tuning = require "pagedattn.tuning"
local H = require "helpers"

local C = core.C

-- the field names of pa_cuda_tuning in the header, in order
local function header_fields()
  local text = assert(H.read_file(core.root .. "/src/pagedattn_lab.h"))
  local body = assert(text:match("typedef struct pa_cuda_tuning%s*(%b{})"))
  body = body:gsub("/%*.-%*/", "")
  local names = {}
  for decl in body:sub(2, -2):gmatch("([^;]+);") do names[#names + 1] = decl:match("([%w_]+)%s*[%[%d%]]*%s*$") end
  return names
end

describe("CUDA tuning", function()
  it("lists every field of the header's struct, in its order, with a range and what it does", function()
    local fields, names = tuning.fields(), header_fields()
    assert.is_true(#names >= 30)
    assert.equal(#names, #fields)
    for i, f in ipairs(fields) do
      assert.equal(names[i], f.name)
      assert.is_true(#f.doc > 10, f.name)
      if not f.text then assert.is_true(f.min <= f.max, f.name) end
    end
  end)

  it("has the defaults the README's table gives, and the README lists every field", function()
    local readme = assert(H.read_file(core.root .. "/README.md"))
    local d = ffi.new("pa_cuda_tuning")
    C.pa_cuda_tuning_defaults(d)
    for _, f in ipairs(tuning.fields()) do
      local row = readme:match("\n| `" .. f.name .. "` | ([^|]+) |")
      assert(row, "README: no row for " .. f.name)
      row = row:gsub("`", ""):match("^%s*(.-)%s*$")
      if f.text then
        assert.equal("", ffi.string(d[f.name]))
        assert.equal("$PAGEDATTN_" .. f.name:upper(), row)
      else
        local v = tonumber(d[f.name])
        assert.equal(f.names and f.names[v + 1] or tostring(v), row, f.name)
      end
    end
    assert.equal(16, d.decode_kpw)
    assert.equal(256, d.decode_persist_min_keys)
  end)

  it("reads configs as the bench writes them, and names a field that does not exist", function()
    local list = tuning.parse_configs("decode_kpw=8,decode_wide=0|-|prefill_kernel=wgmma|kernel_dir=/tmp/k 2")
    assert.equal(4, #list)
    assert.same({ decode_kpw = 8, decode_wide = 0 }, list[1].fields)
    assert.same({}, list[2].fields)
    assert.same({ prefill_kernel = "wgmma" }, list[3].fields)
    assert.same({ kernel_dir = "/tmp/k 2" }, list[4].fields)
    assert.equal("decode_kpw=8,decode_wide=0", list[1].name)
    local err = H.error_of(tuning.parse_configs, "decode_kpw=8|decode_kpx=8")
    assert.truthy(err:find("no tuning field 'decode_kpx'", 1, true), err)
    err = H.error_of(tuning.parse_configs, "decode_kpw")
    assert.truthy(err:find("field=value", 1, true), err)
  end)

  it("lists the variants the planner may choose for a shape, as precompile asks", function()
    local decode = { dtype = "bf16", head_dim = 128, heads = 32, kv_heads = 8, page_size = 16, seqlen_q = 1 }
    local v = assert(tuning.variants_for(decode, nil, "sm_90a"))
    local set = {}
    for _, name in ipairs(v) do set[name] = true end
    -- the bench's 64 x 4096 (persistent, eight warps) and 8 x 32768 (one block a unit)
    assert.is_true(set["decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=768 kpw=16 persist=1 minb=1 hw=0 nw=8"])
    assert.is_true(set["decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=1024 kpw=16 persist=0 minb=1 hw=0 nw=4"])
    for name in pairs(set) do assert.truthy(name:find("^decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 "), name) end
    -- a tuning changes the list; prefill on Hopper and elsewhere
    local simt = assert(tuning.variants_for(decode, { decode_kernel = "simt" }, "sm_90a"))
    assert.same({ "decode dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=1024" }, simt)
    local prefill = { dtype = "bf16", head_dim = 128, heads = 32, kv_heads = 8, page_size = 16, seqlen_q = 4096 }
    assert.same({ "prefill_wgmma dtype=bf16 D=128 gt=4 page=16 stages=3 natural=0",
      "prefill_ws dtype=bf16 D=128 gt=4 page=16 stages=3 natural=0 tma=2" }, assert(tuning.variants_for(prefill, nil, "sm_90a")))
    assert.same({ "prefill dtype=bf16 D=128 gt=4 page=16 stages=2 natural=0 minb=2" },
      assert(tuning.variants_for(prefill, nil, "sm_80")))
    local f32 = { dtype = "f32", head_dim = 64, heads = 2, kv_heads = 2, page_size = 0, seqlen_q = 100 }
    assert.same({ "fallback dtype=f32" }, assert(tuning.variants_for(f32, nil, "sm_80")))
    -- errors: a field out of range, a shape that is not one
    local err = H.error_of(tuning.variants_for, decode, { decode_kpw = 12 }, "sm_90a")
    assert.truthy(err:find("decode_kpw: 12 is not 8 or 16", 1, true), err)
    err = H.error_of(tuning.variants_for, { dtype = "bf16", head_dim = 128, heads = 3, kv_heads = 2, seqlen_q = 1 },
      nil, "sm_90a")
    assert.truthy(err:find("not a shape of attention", 1, true), err)
  end)

  it("is a CUDA device's: the CPU has none, and says so", function()
    local cpu = assert(pa.device("cpu"))
    local t, err = cpu:tuning()
    assert.is_nil(t)
    assert.truthy(err:find("cpu has no kernel tuning", 1, true), err)
    err = H.error_of(cpu.set_tuning, cpu, { decode_kpw = 8 })
    assert.truthy(err:find("cpu has no kernel tuning", 1, true), err)
    local plan, perr = cpu:last_plan()
    assert.is_nil(plan)
    assert.truthy(perr:find("plans no kernels", 1, true), perr)
  end)
end)
