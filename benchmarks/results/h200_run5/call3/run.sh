#!/bin/bash
# Session 5, third device call (one H200): the new shipped pair (32-layer target, built by calls 1
# and 2 with shipped/gpu_build_target.sh) with CUDA graphs, no compile:
#   1. step sweep, baseline and chains of 1..6 steps (filed under the h200-native profile for --steps auto)
#   2. step costs (decode, verify, draft, whole cycles) for the cost model
#   3. kernel profile of a plain step and 3- and 5-step cycles (for depth_prediction's check)
# Run from the repository root:  bash benchmarks/results/h200_run5/call3/run.sh   (writes $OUT/results.tgz)
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 530 step_sweep costs profile
{
    run 330 python3 -m benchmarks.step_sweep --profile h200-native --max-steps 6 --trees '' --num-prompts 8 \
        --max-tokens 128 --repeats 2 --out-dir $R/step_sweep
    run 100 python3 -m benchmarks.step_costs --model shipped/target --draft shipped/drafter --name embedded-h200 \
        --cycle-steps 1,2,3,4,5,6 --out-dir $R/costs
    run 90 python3 -m benchmarks.decode_profile --model shipped/target --draft shipped/drafter --chain-steps 0,3,5 \
        --modes graphs_only --out-dir $R/profile
} > $R/run.log 2>&1
echo "total $(( $(date +%s) - START ))s" >> $R/run.log
tar czf $OUT/results.tgz -C $R .
grep -h -E "^===|SKIPPED|Best|speedup|total" $R/run.log | tail -n 40
