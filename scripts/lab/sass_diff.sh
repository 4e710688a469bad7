#!/usr/bin/env bash
# scripts/lab/sass_diff.sh OLD_TREE NEW_TREE [--arch ARCH] [--jobs N] [--list FILE] [--keep DIR]
# -- whether two checkouts compile every kernel variant to the same machine
# code. Each tree's own library is built (its scripts/build release) and
# compiles every variant of the list through NVRTC (scripts/lab/kernel_images.lua:
# each variant into an empty disk cache, the cache file's cubin kept);
# then, per variant, the two cubins are compared: with cuobjdump -sass where
# it is on the PATH or in /usr/local/cuda/bin (its listings, the line-info
# comments stripped), else section by section (scripts/lab/cubin_cmp.lua: the
# .text encodings, .nv.info, shared memory, constants and symbols; the debug
# sections left out, since -lineinfo's line table moves with any comment).
# The list: every variant of the catalog and the benchmark's
# (NEW_TREE/scripts/precompile.lua --names, else OLD_TREE's), or --list FILE
# (one a line). ARCH: sm_90a by default (sm_80 too is worth a run). --jobs:
# compilers side by side per tree (default: the cores). Takes minutes: ~400
# variants took 8-22 min a tree on 2 shared cores. Prints one line per variant that
# differs, fails to compile or exists in one tree only, then a summary;
# exit 0 only when every variant matches.
#   mkdir -p /tmp/main-tree && git archive main | tar -x -C /tmp/main-tree
#   scripts/lab/sass_diff.sh /tmp/main-tree . --arch sm_90a
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ $# -lt 2 ]; then sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; fi
old=$(cd "$1" && pwd); new=$(cd "$2" && pwd); shift 2
arch=sm_90a; jobs=$(nproc 2>/dev/null || echo 2); list=""; keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --list) list=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    *) echo "sass_diff: unknown argument $1" >&2; exit 2 ;;
  esac
done
work=${keep:-$(mktemp -d /tmp/sass_diff.XXXXXX)}
mkdir -p "$work"
lua_path() { echo "$1/lua/?.lua;$1/lua/?/init.lua;$1/?.lua;;"; }

for t in "$old" "$new"; do
  echo "sass_diff: building $t" >&2
  "$t/scripts/build" release >&2
done
if [ -z "$list" ]; then
  list=$work/variants.txt
  for t in "$new" "$old"; do
    if [ -f "$t/scripts/precompile.lua" ] &&
      LUA_PATH=$(lua_path "$t") PAGEDATTN_LIB= PAGEDATTN_HEADER= luajit "$t/scripts/precompile.lua" --names > "$list.$$" 2>/dev/null; then
      mv "$list.$$" "$list"; break
    fi
  done
  [ -s "$list" ] || { echo "sass_diff: no variant list (give --list FILE)" >&2; exit 2; }
fi
n=$(grep -c . "$list")
echo "sass_diff: $n variants for $arch, $jobs compilers a tree, in $work" >&2

for side in old new; do
  t=$old; [ $side = new ] && t=$new
  rm -rf "${work:?}/$side"; mkdir -p "$work/$side"
  pids=()
  for k in $(seq 1 "$jobs"); do
    LUA_PATH=$(lua_path "$t") PAGEDATTN_LIB= PAGEDATTN_HEADER= PAGEDATTN_KERNEL_DIR= PAGEDATTN_NVRTC_OPTIONS= \
      luajit "$here/kernel_images.lua" "$work/$side" "$list" --arch "$arch" --shard "$k/$jobs" >&2 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
done

objdump=""
if command -v cuobjdump >/dev/null 2>&1; then objdump=cuobjdump
elif [ -x /usr/local/cuda/bin/cuobjdump ]; then objdump=/usr/local/cuda/bin/cuobjdump; fi
sass() { "$objdump" -sass "$1" | grep -v '^[[:space:]]*//##' | sed 's/[[:space:]]*$//'; }
how="sections (cubin_cmp.lua)"; [ -n "$objdump" ] && how="cuobjdump -sass"

same=0; differ=0; failed=0; missing=0
while IFS= read -r v; do
  v=$(echo "$v" | sed 's/#.*//; s/^[[:space:]]*//; s/[[:space:]]*$//')
  [ -z "$v" ] && continue
  f=$(echo "$v" | sed 's/[^A-Za-z0-9=._-]/_/g').cubin
  a=$work/old/$f; b=$work/new/$f
  if [ ! -f "$a" ] || [ ! -f "$b" ]; then
    if grep -qsF "$v	" "$work"/old/failed-*.txt "$work"/new/failed-*.txt; then
      echo "FAILED   $v"; failed=$((failed + 1))
    else
      echo "MISSING  $v"; missing=$((missing + 1))
    fi
    continue
  fi
  if [ -n "$objdump" ]; then
    if diff -q <(sass "$a") <(sass "$b") >/dev/null; then same=$((same + 1))
    else echo "DIFFERS  $v"; differ=$((differ + 1)); fi
  else
    if out=$(luajit "$here/cubin_cmp.lua" "$a" "$b"); then same=$((same + 1))
    else echo "DIFFERS  $v: $(echo "$out" | tr '\n' ';')"; differ=$((differ + 1)); fi
  fi
done < "$list"
echo "sass_diff: $arch, compared by $how: $same identical, $differ differ, $failed failed to compile, $missing missing"
[ -z "$keep" ] && rm -rf "$work"
[ $differ -eq 0 ] && [ $failed -eq 0 ] && [ $missing -eq 0 ]
