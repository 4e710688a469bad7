-- spec/layout_spec.lua -- the shape of the tree that issue 48 asked for and
-- that a change could quietly undo: no product file (src/, lua/) over 900
-- lines, the library's C files calling each other in one direction only
-- (read from the built objects' symbols) and its Lua modules requiring each
-- other in one direction, and the environment read for
-- deployment only (the PAGEDATTN_ variables that src/ and lua/ name).
local H = require "helpers"
local root, sh = H.root, H.sh

-- The objects of this tree's sources in build/obj/release (one left from a
-- renamed file would be a stranger).
local function objects()
  local rc, out = sh("for o in '" .. root .. "'/build/obj/release/*.o; do b=$(basename \"$o\" .o); " ..
    "if [ -n \"$(find '" .. root .. "/src' -name \"$b.c\")\" ]; then echo \"$o\"; fi; done")
  assert(rc == 0 and out:find("%.o"), "no objects (scripts/build first): " .. out)
  local list = {}
  for o in out:gmatch("[^\n]+") do list[#list + 1] = o end
  return list
end

describe("the layout of the library", function()
  it("has no product file over 900 lines (src/, lua/, kernels/)", function()
    local rc, out = sh("cd '" .. root .. "' && find src lua kernels -name '*.c' -o -name '*.h' -o -name '*.inc' " ..
      "-o -name '*.lua' -o -name '*.cu' -o -name '*.cuh' | xargs wc -l")
    assert.equal(0, rc)
    local over = {}
    for n, f in out:gmatch("(%d+) ([^\n]+)") do
      if f ~= "total" and tonumber(n) > 900 then over[#over + 1] = f .. ": " .. n end
    end
    assert(#over == 0, "over 900 lines:\n" .. table.concat(over, "\n"))
  end)

  -- A depth-first walk over edges[from][to] = why: a file met again on its
  -- own path closes a circle. (Lists, not nested pairs() loops: Debian 12's
  -- LuaJIT drops keys from a pairs() loop around another, LuaJIT issue 827.)
  local function sorted_keys(t)
    local keys = {}
    for k in pairs(t) do keys[#keys + 1] = k end
    table.sort(keys)
    return keys
  end
  local function no_circle(edges)
    local state, path = {}, {}
    local function walk(f)
      state[f] = "open"
      path[#path + 1] = f
      local out = edges[f] or {}
      for _, to in ipairs(sorted_keys(out)) do
        if state[to] == "open" then
          error("a circle: " .. table.concat(path, " -> ") .. " -> " .. to .. " (" .. out[to] .. ")", 0)
        end
        if not state[to] then walk(to) end
      end
      path[#path] = nil
      state[f] = "done"
    end
    for _, f in ipairs(sorted_keys(edges)) do
      if not state[f] then walk(f) end
    end
  end

  it("the library's files call each other in one direction (no circle; the planner needs no driver)", function()
    local defs, uses = {}, {}
    for _, o in ipairs(objects()) do
      local name = o:match("([^/]+)%.o$")
      local rc, out = sh("nm '" .. o .. "'")
      assert.equal(0, rc, out)
      uses[name] = {}
      for kind, sym in out:gmatch("%s(%u)%s+([%w_]+)\n") do
        if kind == "U" then uses[name][sym] = true
        elseif kind:match("[TDBR]") then defs[sym] = name end
      end
    end
    local edges = {}
    for _, from in ipairs(sorted_keys(uses)) do
      edges[from] = {}
      for _, sym in ipairs(sorted_keys(uses[from])) do
        local to = defs[sym]
        if to and to ~= from then edges[from][to] = sym end
      end
    end
    -- (the symbols were read)
    assert.is_true(next(edges.cuda_attention) ~= nil and next(edges.pool) ~= nil)
    no_circle(edges)
    -- and the planner needs no driver: cuda_choice, cuda_planner, cuda_worklist,
    -- cuda_variants and cuda_tuning call nothing of the loader, modules or device
    for _, f in ipairs({ "cuda_choice", "cuda_planner", "cuda_worklist", "cuda_variants", "cuda_tuning" }) do
      for to, sym in pairs(edges[f] or {}) do
        assert(not to:match("^cuda_") or to == "cuda_choice" or to == "cuda_planner" or to == "cuda_worklist" or
          to == "cuda_variants" or to == "cuda_tuning", f .. " calls " .. to .. " (" .. sym .. ")")
      end
    end
  end)

  it("the Lua modules require each other in one direction (no circle, lazy requires included)", function()
    local rc, out = sh("cd '" .. root .. "/lua' && find pagedattn -name '*.lua'")
    assert.equal(0, rc, out)
    local files = {}
    for f in out:gmatch("[^\n]+") do
      files[(f:gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", "."))] = f
    end
    assert.is_truthy(files["pagedattn.serve.cli"])
    local edges = {}
    for m, f in pairs(files) do
      local fh = assert(io.open(root .. "/lua/" .. f))
      local src = fh:read("*a")
      fh:close()
      edges[m] = {}
      for to in src:gmatch("require%s*%(?%s*[\"']([%w_.]+)[\"']") do
        if files[to] and to ~= m then edges[m][to] = "require" end
      end
    end
    assert.is_true(next(edges["pagedattn.serve.cli"]) ~= nil) -- (the requires were read)
    no_circle(edges)
  end)

  it("nests no pairs() loop in another (Debian 12's LuaJIT drops keys from the outer one: LuaJIT issue 827)", function()
    -- (lexical nesting, told by indentation; the package, specs, scripts, examples)
    local rc, out = sh("cd '" .. root .. "' && find lua spec scripts examples -name '*.lua'")
    assert.equal(0, rc, out)
    local found, files = {}, 0
    for f in out:gmatch("[^\n]+") do
      files = files + 1
      local open_loops, n = {}, 0
      for line in io.lines(root .. "/" .. f) do
        n = n + 1
        local indent, code = line:match("^(%s*)(.-)%s*$")
        if code ~= "" and not code:match("^%-%-") then
          while #open_loops > 0 and open_loops[#open_loops] >= #indent do open_loops[#open_loops] = nil end
          if code:match("%f[%w_]in%s+pairs%s*%(") then
            if #open_loops > 0 then found[#found + 1] = f .. ":" .. n .. ": " .. code end
            open_loops[#open_loops + 1] = #indent
          end
        end
      end
    end
    assert.is_true(files > 50)
    assert(#found == 0, "a pairs() loop inside another (iterate a list of the keys instead):\n" .. table.concat(found, "\n"))
  end)

  it("reads the environment for deployment only: the PAGEDATTN_ variables of src/ and lua/", function()
    local rc, out = sh("cd '" .. root .. "' && grep -rhoE 'PAGEDATTN_[A-Z0-9_]+' src lua | sort -u")
    assert.equal(0, rc)
    local allowed = {
      PAGEDATTN_H = "include guard", PAGEDATTN_LAB_H = "include guard",
      PAGEDATTN_DEVICE = "the default device", PAGEDATTN_LIB = "the library", PAGEDATTN_HEADER = "the header",
      PAGEDATTN_NUM_THREADS = "CPU threads", PAGEDATTN_CPU_ISA = "CPU kernels",
      PAGEDATTN_NVRTC = "NVRTC's library", PAGEDATTN_CUBLAS = "cuBLAS's library",
      PAGEDATTN_KERNEL_CACHE = "the kernel cache", PAGEDATTN_KERNEL_DIR = "kernel sources",
      PAGEDATTN_NVRTC_OPTIONS = "NVRTC options",
    }
    local names, extra = {}, {}
    for name in out:gmatch("[%w_]+") do
      names[#names + 1] = name
      if not allowed[name] then extra[#extra + 1] = name end
    end
    assert(#extra == 0, "not deployment (a tuning choice is a field of pa_cuda_tuning): " .. table.concat(extra, ", "))
    assert.is_true(#names <= 15)
  end)
end)
