#!/bin/bash
# Fourth device call on nvidia-h200-x2, after the overlap change (the engine launches step
# n+1 before reading step n) and the tensor-parallel teardown fix:
#   1. tensor-parallel decode, 2 GPUs, default NCCL and the sweep's best setting; 1 GPU for reference
#   2. GPU 0: 8B decode vs bandwidth vs transformers  |  GPU 1: HTTP overhead (graphs, compiled)
#      (inductor limited to 8 compile threads so the host-bound HTTP runs keep their cores)
# Run from the repository root:  bash benchmarks/results/h200_run2/call4/run.sh   (writes $OUT/results.tgz)
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 470 http_overhead tp_decode
export TORCHINDUCTOR_COMPILE_THREADS=8
TP="-m benchmarks.tp_decode --shape 8b --tokens 128 --prompt-len 64 --out-dir $R/tp_decode --watchdog-s 50"

{
    run 60 torchrun --nproc-per-node 2 $TP --name tp2-8b-default
    run 60 env NCCL_PROTO=LL NCCL_ALGO=Ring NCCL_P2P_LEVEL=NVL NCCL_CUMEM_ENABLE=0 \
        torchrun --nproc-per-node 2 $TP --name tp2-8b-best
    CUDA_VISIBLE_DEVICES=0 run 30 python3 $TP --name tp1-8b
} > $R/tp.log 2>&1

(
    export CUDA_VISIBLE_DEVICES=0
    run 260 python3 benchmarks/h200_decode.py --out $R/h200_decode.json
) > $R/gpu0.log 2>&1 &
(
    export CUDA_VISIBLE_DEVICES=1
    for s in 0 5; do
        run 60 python3 -m benchmarks.http_overhead --steps $s --num-prompts 8 --max-tokens 128 --name h200-steps$s \
            --out-dir $R/http_overhead
    done
    for s in 0 5; do
        run 75 python3 -m benchmarks.http_overhead --compile --steps $s --num-prompts 8 --max-tokens 128 \
            --name h200-compiled-steps$s --out-dir $R/http_overhead
    done
) > $R/gpu1.log 2>&1 &
wait
echo "total $(( $(date +%s) - START ))s" >> $R/gpu0.log
tar czf $OUT/results.tgz -C $R .
grep -h -E "^===|SKIPPED|HTTP /|rank .*measured|ours_tok_s|hf_static" $R/*.log | tail -n 40
