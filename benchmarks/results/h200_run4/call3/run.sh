#!/bin/bash
# Session 4, device call 3 (nvidia-h200), the last ~10 device minutes:
#   1. kernel profile of the shipped pair's plain step and chain cycles 3 and 5, CUDA graphs
#      only (no compile): where a speculative cycle's GPU time goes beyond a decode step
#      (it ran as `--chain-steps 3,5`, when the plain step was always included)
#   2. gpu_selfcheck: graphs == eager everywhere; compiled == eager for plain decoding and the
#      3-step chain at batch 1, where one-token GEMVs are Triton reductions (call 2 ran out of
#      time before the compiled chain)
# Run from the repository root:  bash benchmarks/results/h200_run4/call3/run.sh   (writes $OUT/results.tgz)
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 500 profile
{
    run 90 python3 -m benchmarks.decode_profile --model shipped/target --draft shipped/drafter --chain-steps 0,3,5 \
        --modes graphs_only --out-dir $R/profile
    run 400 python3 benchmarks/gpu_selfcheck.py
} > $R/run.log 2>&1
echo "total $(( $(date +%s) - START ))s" >> $R/run.log
tar czf $OUT/results.tgz -C $R .
grep -h -E "^===|SKIPPED|==|kernels .* ms/step|^\s+[a-z].* ms$|total" $R/run.log | tail -n 60
