#!/bin/bash
# One device call on nvidia-h200-x2 (two H200s): single-GPU measurements, one stream per GPU,
# side by side, under one deadline so everything measured comes back.
#   GPU 0: 8B-shaped decode vs bandwidth vs transformers (h200_decode.py), then 8B step costs.
#   GPU 1: the shipped (embedded) pair: step sweep, step costs, HTTP overhead, compiled sweep.
# Run from the repository root:  bash benchmarks/results/h200_run2/call1/run.sh   (writes $OUT/results.tgz)
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 560 step_sweep costs http_overhead

(
    export CUDA_VISIBLE_DEVICES=0
    run 420 python3 benchmarks/h200_decode.py --out $R/h200_decode.json
    run 200 python3 -m benchmarks.step_costs --shape 8b --name llama8b-h200 --iters 20 --cycle-steps 1,2,3,4,5,6 \
        --out-dir $R/costs
) > $R/gpu0.log 2>&1 &

(
    export CUDA_VISIBLE_DEVICES=1
    run 120 python3 -m benchmarks.step_sweep --profile h200-native --max-steps 8 --trees 3:2:6,4:2:8 \
        --num-prompts 8 --max-tokens 128 --out-dir $R/step_sweep
    run 90 python3 -m benchmarks.step_costs --model shipped/target --draft shipped/drafter --name embedded-h200 \
        --cycle-steps 1,2,3,4,5,6,8 --out-dir $R/costs
    run 90 python3 -m benchmarks.http_overhead --steps 0 --num-prompts 8 --max-tokens 128 --name h200-nospec \
        --out-dir $R/http_overhead
    run 90 python3 -m benchmarks.http_overhead --steps 4 --num-prompts 8 --max-tokens 128 --name h200-steps4 \
        --out-dir $R/http_overhead
    run 300 python3 -m benchmarks.step_sweep --name h200-native-compiled --compile --max-steps 6 --trees '' \
        --num-prompts 8 --max-tokens 128 --out-dir $R/step_sweep
) > $R/gpu1.log 2>&1 &

wait
echo "total $(( $(date +%s) - START ))s" >> $R/gpu0.log
tar czf $OUT/results.tgz -C $R .
tail -5 $R/gpu0.log $R/gpu1.log
