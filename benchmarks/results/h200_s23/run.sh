#!/usr/bin/env bash
# Session 23's H200 calls (issue 19), one stage per call on one warm machine; the tree is slimmed
# (benchmarks/device_tree.sh slim) and every call carries .whl. Calls 1-3 ran h200_s19's `part` and
# `assemble`, then `LIMIT_S=590 bash benchmarks/results/h200_s22/run.sh conc` (call3/, cut at 0 steps c=16).
#   bash benchmarks/results/h200_s23/run.sh profile   # carries shipped/smollm2/drafter/model.safetensors:
#       host_profile.py at concurrency 16 and 32 (CUDA graphs, captured prefills, not compiled); SDPA=1
#       first times one eager attention call per SDPA backend (sdpa_host.py); TESTS=1 first runs the GPU tests
#       that need no compile
#   bash benchmarks/results/h200_s23/run.sh conc      # carries the drafter: batch_sweep compiled at 16 and 32
#       requests (plain, chain 4, 0 steps, then the table it picks), as h200_s22's conc; resumable
set -uo pipefail
source benchmarks/results/device_call.sh
device_call "${LIMIT_S:-585}"
work_dir h200_s23
case "$1" in
profile)
    [ -n "${TESTS:-}" ] && run 150 python3 -m pytest -m gpu tests/test_gpu.py -k "not compiled" -p no:cacheprovider \
        2>&1 | tee "$OUT/gpu_tests.txt" | tail -3
    [ -n "${SDPA:-}" ] && run 60 python3 benchmarks/results/h200_s23/sdpa_host.py 2>&1 | tee "$OUT/sdpa_host.txt"
    for c in ${CONC:-16 32}; do
        run 280 python3 benchmarks/results/h200_s23/host_profile.py --model runs/smollm2/target \
            --draft shipped/smollm2/drafter --concurrency $c --prefill-graphs --device cuda --dtype bfloat16 \
            --out "$OUT/profile_c$c" 2>&1 | grep -v Warning | tee "$OUT/profile_c$c.log"
    done ;;
conc)
    run 585 python3 -m benchmarks.batch_sweep --model runs/smollm2/target --draft shipped/smollm2/drafter ${COMPILE---compile} \
        --device cuda --dtype bfloat16 --resume --out $W/conc.json --steps 4 --concurrency ${CONC:-16,32} \
        --num-prompts 16 --rounds 3 --max-tokens 256 --prefill-graphs 2>&1 | grep -v Warning | tee -a "$OUT/conc.log"
    cp $W/conc.* "$OUT/" 2>/dev/null ;;
*) echo "stage: profile | conc" >&2; exit 2 ;;
esac
echo "stage $1 done after $(( $(date +%s) - START ))s"
