#!/bin/bash
# Second device call on nvidia-h200-x2: where the 8B decode step's time goes (GPU 0), then the
# NCCL sweep and tensor-parallel decode across both GPUs (default NCCL vs the sweep's best).
# Run from the repository root:  bash benchmarks/results/h200_run2/call2/run.sh   (writes $OUT/results.tgz)
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 560

{
    CUDA_VISIBLE_DEVICES=0 run 150 python3 -m benchmarks.decode_profile --out-dir $R/profile
    run 200 python3 -m benchmarks.nccl_sweep --nproc 2 --out-dir $R/nccl
    run 80 python3 -m benchmarks.tp_decode --shape 8b --name tp1-8b --out-dir $R/tp_decode
    run 80 torchrun --nproc-per-node 2 -m benchmarks.tp_decode --shape 8b --name tp2-8b-default --out-dir $R/tp_decode
    best=$(ls $R/nccl/*-best.toml 2>/dev/null | head -1)
    if [ -n "$best" ]; then
        run 80 env $(sed -n 's/^\(NCCL_[A-Z_0-9]*\) = "\(.*\)"$/\1=\2/p' "$best") \
            torchrun --nproc-per-node 2 -m benchmarks.tp_decode --shape 8b --name tp2-8b-best --out-dir $R/tp_decode
    fi
} > $R/run.log 2>&1
echo "total $(( $(date +%s) - START ))s" >> $R/run.log
tar czf $OUT/results.tgz -C $R .
tail -n 30 $R/run.log
