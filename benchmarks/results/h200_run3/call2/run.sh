#!/bin/bash
# Session 3, device call 2 (nvidia-h200), after call 1 chose the decode GEMV kernels (one-token
# GEMVs as Triton reductions, block sizes by inductor's coordinate descent):
#   1. 8B decode vs bandwidth, our variants side by side (incl. compiled with cuBLAS GEMVs) and
#      transformers (default, assisted, static cache + compiled) on the same weights
#   2. where the new compiled 8B step spends its time (kernel profile)
# (ran with the engine's first reduction version: COMPILE_OPTIONS = coordinate descent only, also
# applied to the cuBLAS variant; call 4 re-ran this with the final options)
# Run from the repository root:  bash benchmarks/results/h200_run3/call2/run.sh   (writes $OUT/results.tgz)
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 560 profile
{
    run 420 python3 benchmarks/h200_decode.py --out $R/h200_decode.json
    run 130 python3 -m benchmarks.decode_profile --out-dir $R/profile --steps 20
} > $R/run.log 2>&1
echo "total $(( $(date +%s) - START ))s" >> $R/run.log
tar czf $OUT/results.tgz -C $R .
grep -v "^\s*$" $R/run.log | grep -v -i "warn" | tail -n 70
