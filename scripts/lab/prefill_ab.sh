#!/bin/bash
# scripts/lab/prefill_ab.sh "CONFIG|CONFIG|..." [ROUNDS] -- A/B of prefill
# kernels by ncu's kernel duration (docs/measuring.md):
# per config and workload the median of 5 launches of
# scripts/lab/prefill_once.lua under `ncu --clock-control base` (locked clocks:
# repeats agree within ~0.5 % in one visit, where the bench's points move
# 5-10 %), configs alternating, ROUNDS rounds (default 2). A CONFIG is
# space-separated settings: VAR=VALUE for the environment (e.g.
# PAGEDATTN_KERNEL_DIR=$PWD/tmp/k_new), field=value for the device's tuning
# (e.g. prefill_order=0; pagedattn.tuning), and page=N for the cache's page
# size (default 16; 0: contiguous).
# PREFILL_AB_CLOCK="--clock-control none": clocks as they come.
# Workloads: the bench's three (4 x 2048, 8192 causal, 4 x 1024 on 8192).
# Durations in ns. On the GPU machine, after `. .gpu-deps/env.sh && .
# scripts/env.sh` (and the kernel cache, README "GPU"):
#   scripts/lab/prefill_ab.sh "page=16|page=0" 2
IFS='|' read -ra CFGS <<< "$1"
R=${2:-2}
WLS=("--batch 4 --seqlen 2048" "--batch 1 --seqlen 8192" "--batch 4 --seqlen 1024 --cached 8192")
for r in $(seq "$R"); do
  for c in "${CFGS[@]}"; do
    envs=() page=16 tune=
    for kv in $c; do
      case $kv in page=*) page=${kv#page=} ;; [[:upper:]]*) envs+=("$kv") ;; *) tune=${tune:+$tune,}$kv ;; esac
    done
    for w in "${WLS[@]}"; do
      # shellcheck disable=SC2086
      d=$(env "${envs[@]}" ncu ${PREFILL_AB_CLOCK:---clock-control base} --metrics gpu__time_duration.sum --csv \
        -k regex:pa_prefill --launch-skip 2 --launch-count 5 \
        luajit scripts/lab/prefill_once.lua $w --page "$page" --calls 7 --tuning "${tune:--}" 2>/dev/null |
        grep gpu__time_duration | awk -F'","' '{gsub(/[",]/, "", $NF); print $NF}' | sort -n | sed -n 3p)
      echo "round $r [$c] $w: ${d:-failed}"
    done
  done
done
