#!/bin/bash
# Session 3, device call 1 (nvidia-h200): which kernels close the gap to 75% of bandwidth?
#   1. GEMV variants per 8B weight matrix and decode-attention variants, 32 layers' tensors in a graph
#   2. whole 8B decodes, compiled + overlapped, GEMV via cuBLAS vs the reduction form, alternated
# (ran as `--e2e` when that meant these two variants; its JSON keys were gemv_cublas/gemv_reduce)
# Run from the repository root:  bash benchmarks/results/h200_run3/call1/run.sh   (writes $OUT/results.tgz)
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 540
{
    run 200 python3 -m benchmarks.decode_kernels --out $R/kernels.json
    run 330 python3 -m benchmarks.decode_kernels --e2e cublas,reduce --out $R/e2e.json
} > $R/run.log 2>&1
echo "total $(( $(date +%s) - START ))s" >> $R/run.log
tar czf $OUT/results.tgz -C $R .
grep -v "^\s*$" $R/run.log | grep -v Warning | tail -n 60
