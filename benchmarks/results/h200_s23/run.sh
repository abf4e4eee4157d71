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
#       (COMPILE= CONC=1,2,4,8,16,32 for calls 13 and 16: not compiled)
#   bash benchmarks/results/h200_s23/run.sh costs     # carries the drafter; not run yet (issue 19's cost-model
#       re-validation): step_costs of the real pair compiled, a compiled batch-1 sweep of chains 2-5, the cost
#       model on both; resumable over calls on a warm machine (the sweep and the inductor cache live in runs/)
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
costs)
    [ -f $W/costs.json ] || run 280 python3 -m benchmarks.step_costs --model runs/smollm2/target \
        --draft shipped/smollm2/drafter --compile --cycle-steps 2,3,4,5 --ref-steps 3 --device cuda --dtype bfloat16 \
        --name costs --out-dir $W 2>&1 | grep -v Warning | tee -a "$OUT/costs.log"
    run 585 python3 -m benchmarks.batch_sweep --model runs/smollm2/target --draft shipped/smollm2/drafter --compile \
        --device cuda --dtype bfloat16 --resume --out $W/batch1.json --steps 2,3,4,5 --concurrency 1 \
        --num-prompts 12 --rounds 1 --max-tokens 256 --prefill-graphs 2>&1 | grep -v Warning | tee -a "$OUT/batch1.log"
    [ -f $W/batch1.json ] && run 60 python3 -m benchmarks.cost_model --sweep $W/batch1.json --validate $W/costs.json \
        --name smollm2_compiled --out-dir "$OUT" 2>&1 | tail -20
    cp $W/costs.* $W/batch1.* "$OUT/" 2>/dev/null ;;
*) echo "stage: profile | conc | costs" >&2; exit 2 ;;
esac
echo "stage $1 done after $(( $(date +%s) - START ))s"
