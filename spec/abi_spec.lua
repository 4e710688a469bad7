-- The FFI's view of every public struct must match the C compiler's: sizes and
-- field offsets, read from the header itself so new structs are covered.
local ffi = require "ffi"
local core = require "pagedattn.core"

local function header_structs()
  local function block(file, tag)
    local f = assert(io.open(core.root .. "/src/" .. file))
    local text = f:read("*a")
    f:close()
    return assert(text:match("/%* " .. tag .. "_BEGIN %*/(.-)/%* " .. tag .. "_END %*/"), file)
  end
  local api = block("pagedattn.h", "PA_API") .. block("pagedattn_lab.h", "PA_LAB_API")
  api = api:gsub("/%*.-%*/", "")
  local structs = {}
  for name, body in api:gmatch("typedef%s+struct%s+([%w_]+)%s*(%b{})") do
    local fields = {}
    for decl in body:sub(2, -2):gmatch("([^;]+);") do
      -- "const pa_tensor *a, *b" -> a, b: a name is the word before a comma
      for field in (decl .. ","):gmatch("([%w_]+)%s*[%[%d%]]*%s*,") do fields[#fields + 1] = field end
    end
    structs[#structs + 1] = { name = name, fields = fields }
  end
  return structs
end

describe("ABI", function()
  local structs = header_structs()
  it("finds the public structs in the header", function()
    assert.is_true(#structs >= 2)
  end)
  for _, s in ipairs(structs) do
    it("struct " .. s.name .. ": size and offsets agree with the C compiler", function()
      local csize = tonumber(core.C.pa_abi_sizeof(s.name))
      assert(csize >= 0, s.name .. " is not listed in src/core/abi.c")
      assert.equal(csize, ffi.sizeof(s.name))
      assert.is_true(#s.fields > 0)
      for _, field in ipairs(s.fields) do
        local coff = tonumber(core.C.pa_abi_offsetof(s.name, field))
        assert(coff >= 0, s.name .. "." .. field .. " is not listed in src/core/abi.c")
        assert.equal(coff, ffi.offsetof(s.name, field), s.name .. "." .. field)
      end
    end)
  end
end)
