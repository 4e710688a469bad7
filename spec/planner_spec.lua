-- spec/planner_spec.lua -- the CUDA backend's planner, on the host: CI has
-- no GPU, and choosing kernels and cutting query tiles into work items is
-- host code. spec/planner_check.c links with this build's objects
-- (build/obj/release; build/obj/debug, with the sanitizers, under the
-- ASan/UBSan build) and plans random problems (the items cover each tile's
-- keys exactly; the splits, claims, counters and partial rows agree) and
-- whole calls against a table of kernel facts (the kernel each chooses, with
-- the tuning's defaults and with fields set; its header lists the checks).
local H = require "helpers"
local root, sh = H.root, H.sh

describe("the CUDA work planner (host)", function()
  it("chooses the kernels and cuts random query tiles into work items that cover their keys", function()
    local debug = (os.getenv("PAGEDATTN_LIB") or ""):find("/debug/", 1, true) ~= nil
    local objdir = root .. "/build/obj/" .. (debug and "debug" or "release")
    -- (the objects of this tree's sources: one left from a renamed file would clash)
    local rc, objs = sh("for o in '" .. objdir .. "'/*.o; do b=$(basename \"$o\" .o); " ..
      "if [ -n \"$(find '" .. root .. "/src' -name \"$b.c\")\" ]; then echo \"$o\"; fi; done")
    assert(rc == 0 and objs:find("%.o"), "no objects in " .. objdir .. " (scripts/build first): " .. objs)
    local dir = H.tmpdir()
    local exe = dir .. "/planner_check"
    local flags = "-std=gnu11 -O1 -g -Wall -Wextra -Werror -Wno-unused-parameter -pthread -I'" .. root .. "/src'"
    if debug then flags = flags .. " -fsanitize=address,undefined -fno-sanitize-recover=undefined" end
    -- (the sanitizer runtimes preloaded for busted are not the compiler's business)
    local out
    rc, out = sh(string.format("env -u LD_PRELOAD cc %s -o '%s' '%s/spec/planner_check.c' %s -lm -ldl -pthread",
      flags, exe, root, (objs:gsub("%s+", " "))))
    assert(rc == 0, "compiling spec/planner_check.c failed:\n" .. out)
    local n = H.scale(3000)
    rc, out = sh(string.format("env -u LD_PRELOAD '%s' %d %d", exe, H.seed("planner"), n))
    sh("rm -rf '" .. dir .. "'")
    assert(rc == 0, out)
    assert.truthy(out:find(n .. " problems", 1, true), out)
  end)
end)
