# scripts/env.sh -- sourced by scripts/run and scripts/test: Lua paths for the
# source tree (the library itself is found from lua/pagedattn/core.lua).
PAGEDATTN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PAGEDATTN_ROOT
export LUA_PATH="$PAGEDATTN_ROOT/lua/?.lua;$PAGEDATTN_ROOT/lua/?/init.lua;$PAGEDATTN_ROOT/?.lua;${LUA_PATH:-;}"
