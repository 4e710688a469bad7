-- spec/docs_spec.lua -- the documentation's Lua programs run as printed: every
-- ```lua block of README.md and docs/*.md that is a whole program (it starts
-- by requiring the package and returns nothing) runs in a fresh LuaJIT, and where each of its
-- print calls carries a "--> a  b ..." comment, the printed values must read
-- so ("..." ends what is compared; text after a value in parentheses is a
-- remark). Fragments (a block that uses names it does not define) are left
-- to the reader.
local H = require "helpers"
local root, sh = H.root, H.sh

-- the ```lua blocks of a file: { line = first line, text = source }
local function blocks(path)
  local f = assert(io.open(root .. "/" .. path))
  local list, cur, n = {}, nil, 0
  for line in f:lines() do
    n = n + 1
    if cur then
      if line:match("^```") then
        list[#list + 1] = cur
        cur = nil
      else
        cur.text = cur.text .. line .. "\n"
      end
    elseif line:match("^```lua%s*$") then
      cur = { line = n + 1, text = "" }
    end
  end
  f:close()
  return list
end

-- A whole program requires the package first and returns nothing (a block
-- that returns a table is a file for a runner: a sweep, a policy, a model).
local function is_program(text)
  return text:match("^local %w+ = require%s*%(?%s*\"pagedattn[%w.]*\"") ~= nil and not text:match("\nreturn[%s{]")
end

-- the expected values of each print line, when every print has them
local function expectations(text)
  local want = {}
  for line in text:gmatch("[^\n]+") do
    local code = line:gsub("%-%-.*", "")
    if code:match("%f[%w_]print%(") then
      local e = line:match("%-%->%s*(.-)%s*$")
      if not e then return nil end
      local vals = {}
      for tok in e:gmatch("%S+") do
        if tok == "..." or tok:match("^%(") then break end
        vals[#vals + 1] = tok
      end
      want[#want + 1] = vals
    end
  end
  return #want > 0 and want or nil
end

local files = { "README.md" }
do
  local rc, out = sh("cd '" .. root .. "' && ls docs/*.md")
  assert.equal(0, rc, out)
  for f in out:gmatch("[^\n]+") do files[#files + 1] = f end
end

describe("the documentation's programs", function()
  local dir = H.tmpdir()
  -- programs name the repository's files (examples/traces/...) relative to the root
  assert(os.execute("ln -s '" .. root .. "/examples' '" .. dir .. "/examples'") == 0)

  for _, file in ipairs(files) do
    for _, b in ipairs(blocks(file)) do
      if is_program(b.text) then
        local want = expectations(b.text)
        it(string.format("%s:%d runs%s", file, b.line, want and " and prints what it says" or ""),
          function()
            local path = dir .. "/block.lua"
            local f = assert(io.open(path, "w"))
            f:write(b.text)
            f:close()
            local rc, out = sh("cd '" .. dir .. "' && luajit block.lua")
            assert(rc == 0, string.format("%s:%d exits %s:\n%s", file, b.line, tostring(rc), out))
            if not want then return end
            local got = {}
            for line in out:gmatch("[^\n]+") do got[#got + 1] = line end
            assert(#got == #want, string.format("%s:%d prints %d lines, its comments say %d:\n%s", file, b.line,
              #got, #want, out))
            for i, vals in ipairs(want) do
              local toks = {}
              for tok in got[i]:gmatch("%S+") do toks[#toks + 1] = tok end
              for j, v in ipairs(vals) do
                assert(toks[j] == v, string.format("%s:%d: print %d shows %q where its comment says %q (line: %s)",
                  file, b.line, i, tostring(toks[j]), v, got[i]))
              end
            end
          end)
      end
    end
  end

  it("examples/first.lua and the policy x load study (its seconds-long preset) run as the README says", function()
    local rc, out = sh("cd '" .. dir .. "' && luajit '" .. root .. "/examples/first.lua'")
    assert(rc == 0, "examples/first.lua exits " .. tostring(rc) .. ":\n" .. out)
    assert.matches("all outputs within tolerance", out)
    rc, out = sh("cd '" .. dir .. "' && luajit '" .. root .. "/examples/serve_study.lua' --preset estimate --device cpu")
    assert(rc == 0, "examples/serve_study.lua --preset estimate exits " .. tostring(rc) .. ":\n" .. out)
    assert.matches("28 points run %(28 ok, 0 failed%)", out)
    for _, f in ipairs({ "serve_study.csv", "serve_study-ttft_p99_ms.png", "serve_study-goodput_rps.png" }) do
      local fh = io.open(dir .. "/results/" .. f)
      assert(fh and fh:read(4), "no results/" .. f .. ":\n" .. out)
      fh:close()
    end
  end)

  it("found the programs (README's first example among them)", function()
    local n = 0
    for _, b in ipairs(blocks("README.md")) do
      if is_program(b.text) then n = n + 1 end
    end
    assert.is_true(n >= 4, "README.md has " .. n .. " whole programs")
  end)

  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)
end)
