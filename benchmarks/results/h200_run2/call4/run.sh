#!/bin/bash
# Fourth device call on nvidia-h200-x2, after the overlap change (the engine launches step
# n+1 before reading step n) and the tensor-parallel teardown fix:
#   1. tensor-parallel decode, 2 GPUs, default NCCL and the sweep's best setting; 1 GPU for reference
#   2. GPU 0: 8B decode vs bandwidth vs transformers  |  GPU 1: HTTP overhead (graphs, compiled)
#      (inductor limited to 8 compile threads so the host-bound HTTP runs keep their cores)
# Run from the repository root:  bash benchmarks/results/h200_run2/call4/run.sh   (writes $OUT/results.tgz)
set -u
START=$(date +%s)
DEADLINE=$((START + ${BUDGET_S:-470}))
R=/tmp/r; rm -rf $R; mkdir -p $R/http_overhead $R/tp_decode
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > $R/pip.log 2>&1 || echo "wheel install failed" >> $R/pip.log
export PYTHONPATH=/tmp/site:$PWD TORCHINDUCTOR_CACHE_DIR=/tmp/inductor NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_COMPILE_THREADS=8

run() {  # run CAP_S command...: timeout min(CAP_S, time left)
    local cap=$1; shift
    local left=$((DEADLINE - $(date +%s)))
    local t=$(( cap < left ? cap : left ))
    if [ "$t" -le 5 ]; then echo "SKIPPED (no time left): $*"; return; fi
    echo "=== [$(date +%T)] (limit ${t}s) $*"
    timeout "$t" "$@"
    echo "=== rc=$? after $(( $(date +%s) - START ))s"
}
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
