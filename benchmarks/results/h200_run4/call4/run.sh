#!/bin/bash
# Session 4, device call 4 (nvidia-h200), the last ~5 device minutes: where does the compiled
# 3-step chain cycle of the shipped pair go? (call 2: 0.55 ms against a 0.19 ms compiled decode
# step, no faster than before the tuned GEMVs; call 3 profiled the CUDA-graph steps only.)
# One compile (about two minutes), then the kernel profile.
# Run from the repository root:  bash benchmarks/results/h200_run4/call4/run.sh   (writes $OUT/results.tgz)
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 250 profile
{
    run 245 python3 -m benchmarks.decode_profile --model shipped/target --draft shipped/drafter --chain-steps 3 \
        --modes compiled --out-dir $R/profile
} > $R/run.log 2>&1
echo "total $(( $(date +%s) - START ))s" >> $R/run.log
tar czf $OUT/results.tgz -C $R .
grep -h -E "^===|SKIPPED|kernels .* ms/step|^\s+[a-z].* ms$|^\s+[0-9.]+ ms|total" $R/run.log | tail -n 40
