-- spec/install_spec.lua -- packaging: scripts/install into a temporary prefix,
-- then a C program compiled and linked with `pkg-config --cflags --libs
-- pagedattn`, and `require "pagedattn"` from the installed Lua tree (outside
-- the source tree). The rockspec is checked with `luarocks lint` where
-- LuaRocks is installed (pending otherwise).
local H = require "helpers"
local root, sh, have = H.root, H.sh, H.have

local HELLO = [[
#include <pagedattn.h>
#include <stdio.h>

int main(void) {
    pa_context *ctx = NULL;
    pa_device *dev = NULL;
    if (pa_context_create(&ctx) != PA_OK) return 1;
    if (pa_device_open(ctx, "cpu", &dev) != PA_OK) {
        fprintf(stderr, "%s\n", pa_context_error(ctx));
        return 1;
    }
    printf("pagedattn %s on %s\n", pa_version(), pa_device_name(dev));
    pa_device_release(dev);
    pa_context_destroy(ctx);
    return 0;
}
]]

describe("scripts/install", function()
  local prefix

  setup(function()
    local p = io.popen("mktemp -d")
    prefix = p:read("*l") .. "/prefix"
    p:close()
    -- the library is already built by scripts/test; --no-build keeps this quick
    local rc, out = sh(string.format("%s/scripts/install --no-build '%s'", root, prefix))
    assert(rc == 0, out)
  end)
  teardown(function()
    sh("rm -rf '" .. prefix:match("^(.*)/") .. "'")
  end)

  local it_pc = (have("pkg-config") and have("cc")) and it or pending

  it_pc("installs a pkg-config file that compiles and links a C program", function()
    local dir = prefix:match("^(.*)/")
    local f = assert(io.open(dir .. "/hello.c", "wb"))
    f:write(HELLO)
    f:close()
    local env = string.format("PKG_CONFIG_PATH='%s/lib/pkgconfig'", prefix)
    local rc, version = sh(env .. " pkg-config --modversion pagedattn")
    assert.are.equal(0, rc, version)
    local pa = require "pagedattn"
    assert.are.equal(pa.version, version:match("[^\n]+"))
    local cmd = string.format("cd '%s' && %s && cc -std=c11 -Wall -Werror -o hello hello.c " ..
      "$(pkg-config --cflags --libs pagedattn) && LD_LIBRARY_PATH=\"$(pkg-config --variable=libdir pagedattn)\" ./hello",
      dir, "export " .. env)
    local rc2, out = sh(cmd)
    assert.are.equal(0, rc2, out)
    assert.matches("pagedattn " .. version:match("[^\n]+") .. " on cpu", out, 1, true)
  end)

  it("installs Lua modules that load the installed library and header", function()
    local lua = prefix .. "/share/lua/5.1"
    local cmd = string.format("cd / && env -u PAGEDATTN_LIB -u PAGEDATTN_HEADER -u PAGEDATTN_ROOT " ..
      "LUA_PATH='%s/?.lua;%s/?/init.lua;;' LUA_CPATH='%s/lib/lua/5.1/?.so;;' " ..
      "luajit -e 'local pa = require \"pagedattn\"; print(pa.library_path); print(pa.device(\"cpu\").name)'",
      lua, lua, prefix)
    local rc, out = sh(cmd)
    assert.are.equal(0, rc, out)
    assert.matches(prefix .. "/lib/libpagedattn.so", out, 1, true)
    assert.matches("\ncpu\n", out, 1, true)
  end)

  it("installs Lua modules that find the library beside them with LUA_PATH alone", function()
    local lua = prefix .. "/share/lua/5.1"
    local cmd = string.format("cd / && env -u PAGEDATTN_LIB -u PAGEDATTN_HEADER -u PAGEDATTN_ROOT -u LUA_CPATH " ..
      "LUA_PATH='%s/?.lua;%s/?/init.lua;;' " ..
      "luajit -e 'local pa = require \"pagedattn\"; print(pa.library_path); print(pa.device(\"cpu\").name)'",
      lua, lua)
    local rc, out = sh(cmd)
    assert.are.equal(0, rc, out)
    assert.matches(prefix .. "/lib/libpagedattn.so", out, 1, true)
    assert.matches("\ncpu\n", out, 1, true)
  end)

  it("installs every module under lua/pagedattn/, subfolders included (pagedattn.sweep.*)", function()
    local lua = prefix .. "/share/lua/5.1"
    local p = io.popen("cd '" .. root .. "/lua' && find pagedattn -name '*.lua' | sort")
    local n = 0
    for rel in p:lines() do
      n = n + 1
      assert.is_true(H.read_file(lua .. "/" .. rel) ~= nil, "not installed: " .. rel)
    end
    p:close()
    assert.is_true(n > 10)
    local cmd = string.format("cd / && LUA_PATH='%s/?.lua;;' luajit -e 'local s = require \"pagedattn.sweep\"; " ..
      "print(type(s.plot), type(s.run), type(require(\"pagedattn.sweep.csv\").read_csv))'", lua)
    local rc, out = sh(cmd)
    assert.are.equal(0, rc, out)
    assert.matches("^function%s+function%s+function%s*$", out)
  end)

  it("installs the subpackages: pagedattn.serve and its built-in policies", function()
    local lua = prefix .. "/share/lua/5.1"
    local cmd = string.format("cd / && env -u PAGEDATTN_LIB -u PAGEDATTN_HEADER -u PAGEDATTN_ROOT " ..
      "LUA_PATH='%s/?.lua;%s/?/init.lua;;' LUA_CPATH='%s/lib/lua/5.1/?.so;;' " ..
      "luajit -e 'local s = require \"pagedattn.serve\"; print(s.policy(\"lpm\").path); " ..
      "print(#s.run{ layers = 0, device = \"cpu\", synthetic = { requests = 3 }, page_size = 4, pages = 40 }.records)'",
      lua, lua, prefix)
    local rc, out = sh(cmd)
    assert.are.equal(0, rc, out)
    assert.matches(lua .. "/pagedattn/serve/policies/lpm.lua", out, 1, true)
    assert.matches("\n3\n", out, 1, true)
  end)

  it("installs the sweep runner and the plotter as commands", function()
    local rc, out = sh(string.format("cd / && env -u LUA_PATH '%s/bin/pagedattn-sweep' --help", prefix))
    assert.are.equal(0, rc, out)
    assert.matches("--emit-jobs", out, 1, true)
    local rc2, out2 = sh(string.format("cd / && env -u LUA_PATH '%s/bin/pagedattn-plot' --help", prefix))
    assert.are.equal(0, rc2, out2)
  end)
end)

describe("the rockspec", function()
  local it_rocks = have("luarocks") and it or pending
  it_rocks("passes luarocks lint", function()
    local rc, out = sh(string.format("cd '%s' && luarocks --lua-version=5.1 lint pagedattn-scm-1.rockspec", root))
    assert.are.equal(0, rc, out)
  end)
end)
