#!/usr/bin/env bash
# Session 37's own device stage (issue 19), on a warm machine after `shipped/smollm2/gpu_build.sh part` and
# `assemble`:
#   bash benchmarks/results/h200_s37/run.sh plain   # carries .whl: plain_compiles.py in RUNS separate processes
#       (default "default default off"), each over an empty inductor and Triton cache, so each compiles anew
set -uo pipefail
source benchmarks/results/device_call.sh
device_call "${LIMIT_S:-585}"
work_dir h200_s37
case "$1" in
plain)
    i=0
    for tuning in ${RUNS:-default default off}; do
        i=$((i + 1))
        fresh=/tmp/plain_compile_$i; rm -rf $fresh
        TORCHINDUCTOR_CACHE_DIR=$fresh/inductor TRITON_CACHE_DIR=$fresh/triton \
            run 300 python3 benchmarks/results/h200_s37/plain_compiles.py --model runs/smollm2/target \
            --tuning $tuning --out "$OUT/plain_compiles/${i}_$tuning.json" 2>&1 | grep -v Warning \
            | tee -a "$OUT/plain_compiles.log" | grep -E "median|===|Error" ;
    done ;;
*) echo "stage: plain" >&2; exit 2 ;;
esac
echo "stage $1 done after $(( $(date +%s) - START ))s"
