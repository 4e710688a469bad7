-- Every CPU kernel variant this machine can run (PAGEDATTN_CPU_ISA: avx512,
-- avx2, generic) against the float64 reference. The other CPU specs run the
-- widest one only; a device picks its kernel once a process, so each variant
-- runs spec/cpu_isa_cases.lua in a process of its own. A variant this machine
-- cannot run is reported pending, not passed.
local H = require "helpers"

local function run_cases(isa, seed, n)
  local cmd = string.format("cd '%s' && PAGEDATTN_CPU_ISA=%s luajit spec/cpu_isa_cases.lua %d %d 2>&1; echo \"exit=$?\"",
    H.root, isa, seed, n)
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  p:close()
  return out, tonumber(out:match("exit=(%d+)%s*$"))
end

describe("CPU kernel variants against the reference", function()
  for _, isa in ipairs({ "avx512", "avx2", "generic" }) do
    it(isa, function()
      local seed = H.seed("isa-" .. isa)
      local out, code = run_cases(isa, seed, H.scale(20))
      if out:find("is not available here", 1, true) then
        pending(isa .. ": not available on this machine")
        return
      end
      assert(code == 0, string.format("%s: cases failed (exit %s):\n%s\n  seed %d; %s", isa, tostring(code), out,
        seed, H.rerun("spec/cpu_isa_spec.lua")))
      assert.truthy(out:find(", 0 failed", 1, true), out)
    end)
  end
end)
