#!/bin/bash
# Session 5, fifth device call (one H200, CUDA graphs): HTTP streaming vs the engine in-process on
# the 32-layer shipped pair, each reply ending at its EOS (both sides), no speculation and 7 steps
# (the sweep's best). Carry .whl (the server's wheels).
# Run from the repository root:  bash benchmarks/results/h200_run5/call5/run.sh   (writes $OUT/results.tgz)
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 160 http_overhead
{
    for s in 0 7; do
        run 80 python3 -m benchmarks.http_overhead --steps $s --num-prompts 8 --max-tokens 128 --name h200-steps$s \
            --out-dir $R/http_overhead
    done
} > $R/run.log 2>&1
echo "total $(( $(date +%s) - START ))s" >> $R/run.log
tar czf $OUT/results.tgz -C $R .
grep -h -E "^===|SKIPPED|ratio|total" $R/run.log | tail -n 20
