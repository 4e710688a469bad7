#!/usr/bin/env bash
# scripts/lab/plan_equiv.sh [REV] [CALLS] [SEED] -- the CUDA planner's
# equivalence harness: spec/plan_equiv.c built against this tree and against
# REV's src/cuda/cuda_attention.c (default: the tree before the planner was
# split out of it), both planning and "launching" the same CALLS random
# attention calls (default 5000) on a stubbed driver with fake kernel facts
# (spec/fake_kernels.h), the default tuning and fourteen others (the old
# environment variables there); their traces (kernel variants, launch
# shapes, parameter structs, the uploaded plan byte for byte) must be
# identical. Both builds run under ASan and UBSan. Exit 0: identical.
#   scripts/lab/plan_equiv.sh                 # 5000 calls, seed 1
#   scripts/lab/plan_equiv.sh "" 20000 7
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
rev=${1:-}
calls=${2:-5000}
seed=${3:-1}
if [ -z "$rev" ]; then
  # the last commit whose cuda_attention.c still planned (plan_kernel in it)
  c=$(git log -1 --format=%H -S'static pa_status plan_kernel(' -- src/cuda/cuda_attention.c)
  if git show "$c:src/cuda/cuda_attention.c" | grep -q 'static pa_status plan_kernel('; then rev=$c; else rev=$c^; fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/old"
git archive "$rev" src kernels | tar -x -C "$tmp/old"
flags=(-std=gnu11 -O1 -g -Wall -Wno-unused-parameter -Wno-unused-function -pthread
  -fsanitize=address,undefined -fno-sanitize-recover=undefined)
cc "${flags[@]}" -DEQUIV_OLD -I"$tmp/old/src" -I"$root/spec" -o "$tmp/plan_old" spec/plan_equiv.c \
  "$tmp/old/src/cuda/cuda_attention.c" -lm
cc "${flags[@]}" -I"$root/src" -I"$root/spec" -o "$tmp/plan_new" spec/plan_equiv.c \
  src/cuda/cuda_attention.c src/cuda/cuda_choice.c src/cuda/cuda_planner.c src/cuda/cuda_worklist.c src/cuda/cuda_launch.c \
  src/cuda/cuda_variants.c src/cuda/cuda_tuning.c -lm
export ASAN_OPTIONS=detect_leaks=0
echo "plan_equiv: $(git rev-parse --short "$rev") against this tree, $calls calls, seed $seed"
# the traces go through cmp as they are written (gigabytes at thousands of calls)
set +e
cmp <("$tmp/plan_old" "$seed" "$calls" 2>"$tmp/old.log") <("$tmp/plan_new" "$seed" "$calls" 2>"$tmp/new.log") \
  >"$tmp/cmp.txt" 2>&1
same=$?
set -e
if [ "$same" = 0 ]; then
  cat "$tmp/new.log"
  grep -q '^plan_equiv: [0-9]* calls' "$tmp/old.log" || { echo "plan_equiv: the old build failed:"; cat "$tmp/old.log"; exit 2; }
  grep -q '^plan_equiv: [0-9]* calls' "$tmp/new.log" || { echo "plan_equiv: the new build failed:"; cat "$tmp/new.log"; exit 2; }
  echo "plan_equiv: identical traces (old: $(tail -1 "$tmp/old.log" | cut -d';' -f1 | cut -d: -f2))"
  exit 0
fi
cat "$tmp/cmp.txt"
grep -q 'differ' "$tmp/cmp.txt" || { echo "plan_equiv: a build failed:"; cat "$tmp/old.log" "$tmp/new.log"; exit 2; }
at=$(sed -E 's/.*byte ([0-9]+).*/\1/' "$tmp/cmp.txt")
keep=${PLAN_EQUIV_KEEP:-/tmp/plan_equiv}
mkdir -p "$keep"
"$tmp/plan_old" "$seed" "$calls" 2>/dev/null | head -c $((at + 100000)) >"$keep/old.trace" || true
"$tmp/plan_new" "$seed" "$calls" 2>/dev/null | head -c $((at + 100000)) >"$keep/new.trace" || true
call=$(head -c "$at" "$keep/new.trace" | grep -a '^call ' | tail -1)
echo "plan_equiv: DIFFERENT at byte $at, in $call (traces up to there: $keep/old.trace, $keep/new.trace)"
exit 1
