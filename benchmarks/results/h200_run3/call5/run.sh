#!/bin/bash
# Session 3, device call 5 (nvidia-h200): transformers' static cache + compiled generate alone in
# a fresh process. Call 4 measured it at 100 tok/s after our compiled runs in the same process;
# earlier runs measured 128-130. Is the peer slower, or was it slowed by what ran before it?
# Run from the repository root:  bash benchmarks/results/h200_run3/call5/run.sh   (writes $OUT/results.tgz)
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 170
{
    run 165 python3 benchmarks/h200_decode.py --hf-only --out $R/h200_decode_hf_only.json
} > $R/run.log 2>&1
echo "total $(( $(date +%s) - START ))s" >> $R/run.log
tar czf $OUT/results.tgz -C $R .
grep -v "^\s*$" $R/run.log | grep -v -i "warn" | grep "tok/s\|total\|rc=\|failed\|static" | tail -n 20
