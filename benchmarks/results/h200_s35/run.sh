#!/usr/bin/env bash
# Session 35's own device stage (issue 19), on the warm machine after `shipped/smollm2/gpu_build.sh part` and
# `assemble` and the batch1 sweep (`WORK=h200_s35 ... benchmarks/results/h200_s24/run.sh batch1`), whose saved
# steps and inductor cache (runs/h200_s35) it loads:
#   bash benchmarks/results/h200_s35/run.sh     # carries .whl and the drafter: plain_loop.py
set -uo pipefail
source benchmarks/results/device_call.sh
device_call "${LIMIT_S:-585}"
work_dir h200_s35
run 585 python3 benchmarks/results/h200_s35/plain_loop.py --model runs/smollm2/target --draft shipped/smollm2/drafter \
    --compile-cache $W/compiled_steps --out "$OUT/plain_loop" 2>&1 | grep -v Warning | tee "$OUT/plain_loop.log"
