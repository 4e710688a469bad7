#!/bin/bash
# scripts/lab/wgmma_windows.sh [--all] [VARIANT...] -- compiles kernel
# variants through NVRTC, as the library does (from $PAGEDATTN_KERNEL_DIR,
# default kernels/), and prints each one's wgmma windows
# (`scripts/lab/sass-scan.lua --windows`): its instruction count, the
# instructions from each wgmma fence to the next wait, and "(serialised)"
# where ptxas issued the wgmmas one at a time. Check a prefill change here
# before spending GPU time on it: nvcc's ptxas and NVRTC's disagree (once,
# an epilogue nvcc compiled with the loop's windows intact, NVRTC
# serialised, and the kernel ran 33-50 % slower), and NVRTC prints no C7511
# remark. No GPU needed.
# Default: the bench's prefill_ws variants (bf16, head dim 128, 4 heads a kv
# head: page 16 and 256 with page boxes, contiguous); --all: every prefill_ws
# variant of scripts/precompile.lua's list (its --names: 176, ~1.5 s each),
# serialised ones only.
#   scripts/lab/wgmma_windows.sh
#   PAGEDATTN_KERNEL_DIR=/tmp/k_new scripts/lab/wgmma_windows.sh
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
. scripts/env.sh
export PAGEDATTN_KERNEL_DIR=${PAGEDATTN_KERNEL_DIR:-$root/kernels}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
only_serialised=0
variants=()
if [ "${1:-}" = "--all" ]; then
  only_serialised=1
  shift
  mapfile -t variants < <(luajit scripts/precompile.lua --names | grep '^prefill_ws ')
fi
variants+=("$@")
if [ ${#variants[@]} -eq 0 ]; then
  for v in "page=16 stages=3 natural=0 tma=2" "page=256 stages=3 natural=0 tma=2" "page=contig stages=3 natural=0 tma=1"; do
    variants+=("prefill_ws dtype=bf16 D=128 gt=4 $v")
  done
fi
for v in "${variants[@]}"; do
  rm -rf "$tmp/cache"
  if ! PAGEDATTN_KERNEL_CACHE=$tmp/cache luajit scripts/precompile.lua --arch sm_90a "$v" >"$tmp/log" 2>&1; then
    echo "$v: compile failed"
    cat "$tmp/log"
    continue
  fi
  line=$(luajit scripts/lab/sass-scan.lua --windows "$tmp"/cache/*)
  if [ $only_serialised = 0 ] || [[ $line == *"(serialised)"* ]]; then echo "$v: ${line#*: }"; fi
done
