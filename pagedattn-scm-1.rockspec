-- LuaRocks: builds libpagedattn (premake + make, through scripts/build) and
-- installs it with the Lua modules and pagedattn.h (which pagedattn.core reads
-- for its cdef). Needs LuaJIT (FFI), so use the Lua 5.1 flavour of LuaRocks
-- configured with LuaJIT:
--   luarocks --lua-version=5.1 make                       # from a checkout
--   luarocks --lua-version=5.1 make --tree /tmp/rocks     # a local tree
--   eval "$(luarocks --lua-version=5.1 --tree /tmp/rocks path)"; luajit -e 'require "pagedattn"'
-- Build tools: a C compiler, make, premake4 or premake5 (scripts/setup installs them).
rockspec_format = "3.0"
package = "pagedattn"
version = "scm-1"
source = {
  -- `luarocks make` builds the checkout it runs in and never reads this; set it
  -- to the published repository before `luarocks upload` / `luarocks install`
  url = "git+https://example.invalid/pagedattn.git",
}
description = {
  summary = "A LuaJIT-scriptable paged-attention runtime (C11 core, CPU and CUDA backends)",
  detailed = [[
Paged attention (prefill, chunked prefill, decode; GQA/MQA; any page size from
1 token up), rotary append and page allocation in a C11 library with a CPU
backend and a CUDA backend opened at run time (no link-time CUDA dependency),
driven from LuaJIT through FFI; with a pure-Lua reference, busted specs and an
experiment-sweep runner (pagedattn-sweep, pagedattn-plot).
]],
  license = "Apache-2.0", -- LICENSE
  labels = { "luajit", "ffi", "attention", "cuda", "llm" },
}
dependencies = {
  "lua >= 5.1, < 5.2", -- LuaJIT
  "dkjson >= 2.5",      -- pagedattn.serve: Mooncake traces, summaries (Debian: lua-dkjson)
}
build = {
  type = "command",
  build_command = "scripts/build release",
  install_command = "scripts/install --lua-modules $(LUADIR) $(LIBDIR)",
  install = {
    bin = {
      ["pagedattn-sweep"] = "scripts/sweep.lua",
      ["pagedattn-plot"] = "scripts/plot",
    },
  },
}
