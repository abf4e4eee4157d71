#!/bin/bash
# Session 4, device call 2 (nvidia-h200). Call 1 ran out of time in every step: with the
# engine's inductor options (coordinate descent + benchmarked fusion) one compile of the small
# pair takes over a minute, so this call compiles little:
#   1. HTTP streaming vs the engine, now that the server runs the engine in its own process
#      (CUDA graphs, no speculation and 5 steps)
#   2. compiled step sweep of the shipped pair: no speculation, chains 3 and 5
#   3. gpu_selfcheck: graphs == eager in all cases; compiled == eager for plain batch 1 and
#      the 3-step chain at batch 3
# Run from the repository root (carry .whl):  bash benchmarks/results/h200_run4/call2/run.sh
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 530 http_overhead step_sweep
{
    for s in 0 5; do
        run 60 python3 -m benchmarks.http_overhead --steps $s --num-prompts 8 --max-tokens 128 --name h200-steps$s \
            --out-dir $R/http_overhead
    done
    run 250 python3 -m benchmarks.step_sweep --name h200-native-compiled --compile --steps 3,5 --trees '' \
        --num-prompts 8 --max-tokens 128 --repeats 2 --out-dir $R/step_sweep
    run 300 python3 benchmarks/gpu_selfcheck.py
} > $R/run.log 2>&1
echo "total $(( $(date +%s) - START ))s" >> $R/run.log
tar czf $OUT/results.tgz -C $R .
grep -h -E "^===|SKIPPED|Best|==|HTTP / engine|tok/s|total" $R/run.log | tail -n 40
