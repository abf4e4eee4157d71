#!/bin/bash
# Session 3, device call 3 (nvidia-h200). Call 2 found the compiled 8B step's reduction GEMVs
# slower than alone (inductor fuses the RMSNorm / SiLU producing their input into them): whole
# 8B decodes, compiled + overlapped, per GEMV choice and inductor options, alternated twice.
# Run from the repository root:  bash benchmarks/results/h200_run3/call3/run.sh   (writes $OUT/results.tgz)
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 530
{
    run 520 python3 -m benchmarks.decode_kernels --out $R/e2e.json \
        --e2e cublas,reduce_cdt,reduce_cdt_benchfusion,autotune_cdt,cublas_cdt
} > $R/run.log 2>&1
echo "total $(( $(date +%s) - START ))s" >> $R/run.log
tar czf $OUT/results.tgz -C $R .
grep -v "^\s*$" $R/run.log | grep -v -i "warn" | tail -n 40
