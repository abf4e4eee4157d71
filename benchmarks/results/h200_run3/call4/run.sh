#!/bin/bash
# Session 3, device call 4 (nvidia-h200), the engine as committed: one-token GEMVs as Triton
# reductions, inductor coordinate descent + benchmarked fusion (call 3's best). 8B decode vs
# bandwidth, our variants side by side (incl. the previous compiled engine: cuBLAS GEMVs,
# default inductor) and transformers (default, assisted, static cache + compiled), same weights.
# Run from the repository root:  bash benchmarks/results/h200_run3/call4/run.sh   (writes $OUT/results.tgz)
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 490
{
    run 480 python3 benchmarks/h200_decode.py --out $R/h200_decode.json
} > $R/run.log 2>&1
echo "total $(( $(date +%s) - START ))s" >> $R/run.log
tar czf $OUT/results.tgz -C $R .
grep -v "^\s*$" $R/run.log | grep -v -i "warn" | grep "tok/s\|total\|rc=\|verify\|drafter\|failed" | tail -n 30
