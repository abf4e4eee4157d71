#!/bin/bash
# Third device call on nvidia-h200-x2. Lesson of the first call: host-bound measurements of the
# small shipped pair must not share the host with torch.compile jobs (inductor's compile
# workers take every core), so here nothing compiles while a graphs-only number is taken.
#   1. tensor-parallel decode on both GPUs (stage log + watchdog: the first try hung silently)
#   2. GPU 0: HTTP overhead (graphs)   |  GPU 1: embedded-pair step sweep + step costs (graphs)
#   3. GPU 1 alone: compiled step sweep, HTTP overhead compiled, compiled step costs
# Run from the repository root:  bash benchmarks/results/h200_run2/call3/run.sh   (writes $OUT/results.tgz)
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 565 step_sweep costs http_overhead tp_decode
TP="-m benchmarks.tp_decode --shape 8b --tokens 128 --prompt-len 64 --out-dir $R/tp_decode --watchdog-s 70"

{
    run 80 torchrun --nproc-per-node 2 $TP --name tp2-8b-default
    if [ -f $R/tp_decode/tp2-8b-default.json ]; then
        run 80 env NCCL_PROTO=LL NCCL_ALGO=Ring NCCL_P2P_LEVEL=NVL NCCL_CUMEM_ENABLE=0 \
            torchrun --nproc-per-node 2 $TP --name tp2-8b-best
    else
        run 80 torchrun --nproc-per-node 2 $TP --name tp2-8b-eager --no-graphs
    fi
    CUDA_VISIBLE_DEVICES=0 run 40 python3 $TP --name tp1-8b
} > $R/tp.log 2>&1

(
    export CUDA_VISIBLE_DEVICES=0
    for s in 0 5; do
        run 70 python3 -m benchmarks.http_overhead --steps $s --num-prompts 8 --max-tokens 128 --name h200-steps$s \
            --out-dir $R/http_overhead
    done
) > $R/gpu0.log 2>&1 &
(
    export CUDA_VISIBLE_DEVICES=1
    run 80 python3 -m benchmarks.step_sweep --profile h200-native --max-steps 8 --trees 4:2:8 --num-prompts 8 \
        --max-tokens 128 --repeats 2 --out-dir $R/step_sweep
    run 60 python3 -m benchmarks.step_costs --model shipped/target --draft shipped/drafter --name embedded-h200 \
        --cycle-steps 1,2,3,4,5,6,8 --out-dir $R/costs
) > $R/gpu1.log 2>&1 &
wait

{
    export CUDA_VISIBLE_DEVICES=1
    run 150 python3 -m benchmarks.step_sweep --name h200-native-compiled --compile --max-steps 6 --trees '' \
        --num-prompts 8 --max-tokens 128 --repeats 2 --out-dir $R/step_sweep
    for s in 0 5; do
        run 70 python3 -m benchmarks.http_overhead --compile --steps $s --num-prompts 8 --max-tokens 128 \
            --name h200-compiled-steps$s --out-dir $R/http_overhead
    done
    run 120 python3 -m benchmarks.step_costs --compile --model shipped/target --draft shipped/drafter \
        --name embedded-h200-compiled --cycle-steps 1,2,3,4,5,6 --out-dir $R/costs
} > $R/gpu1-compiled.log 2>&1
echo "total $(( $(date +%s) - START ))s" >> $R/gpu1-compiled.log
tar czf $OUT/results.tgz -C $R .
grep -h -E "^===|SKIPPED|HTTP /|Best" $R/*.log | tail -n 40
