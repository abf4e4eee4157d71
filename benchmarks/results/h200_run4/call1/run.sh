#!/bin/bash
# Session 4, device call 1 (nvidia-h200): the shipped (embedded) pair with the session-3 engine
# (one-token GEMVs as tuned Triton reductions under torch.compile), none of it measured yet:
#   1. gpu_selfcheck: graph / compiled steps == eager on this GPU
#   2. kernel profile of the compiled (and graphs-only) plain step and chain cycles 3, 4, 5:
#      where a speculative cycle's time goes beyond a decode step
#   3. compiled step sweep (no speculation, chains 1..6) and compiled step costs
# Run from the repository root:  bash benchmarks/results/h200_run4/call1/run.sh   (writes $OUT/results.tgz)
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 540 profile step_sweep costs
{
    run 90 python3 benchmarks/gpu_selfcheck.py
    run 200 python3 -m benchmarks.decode_profile --model shipped/target --draft shipped/drafter --chain-steps 3,4,5 \
        --out-dir $R/profile
    run 160 python3 -m benchmarks.step_sweep --name h200-native-compiled --compile --max-steps 6 --trees '' \
        --num-prompts 8 --max-tokens 128 --repeats 2 --out-dir $R/step_sweep
    run 80 python3 -m benchmarks.step_costs --compile --model shipped/target --draft shipped/drafter \
        --name embedded-h200-compiled --cycle-steps 1,2,3,4,5,6 --out-dir $R/costs
} > $R/run.log 2>&1
echo "total $(( $(date +%s) - START ))s" >> $R/run.log
tar czf $OUT/results.tgz -C $R .
grep -h -E "^===|SKIPPED|Best|==|kernels .* ms/step|^\s+[a-z].* ms$" $R/run.log | tail -n 60
