#!/usr/bin/env bash
# Session 11's H200 calls (issue 19), one stage per call on one warm machine, carrying .whl:
#   bash benchmarks/results/h200_s11/run.sh tests|smollm2|8b
# tests    the GPU tests: deferral at 0 draft steps on CUDA graphs and compiled, the steps table on
#          graphs, the bf16 graph cases (the fp32 compiled equality cases are left to their session)
# smollm2  the SmolLM2-135M shape (random bf16 weights; its GGUF does not travel), compiled, batch 1,
#          SYNTHETIC acceptance at the shipped drafter's measured per-position curve (CPU fp32, 3 steps,
#          smollm2_build/build_54k): chat 0.491 / 0.508 / 0.574, then HumanEval 0.651 / 0.679 / 0.667
#          (conditional rates: accepted at j given 1..j-1 were); plain vs chains 1, 2, 3
# 8b       the Llama-3-8B shape, compiled, batch 1, SYNTHETIC 0.9 .. 0.6 (accept length 3.29 at 3 steps,
#          4.42 at 7): plain vs chains 3 and 7; then step_costs' parts for the cost model
# Calls made: `tests`; `smollm2` (at f5b5c82: chains 3 and 2 before the steps-table bug stopped it,
# attention over the whole cache); `STEPS=2,3 TAG=_spans smollm2` (spans bucketed to the context).
# Sweeps resume (--resume) from runs/h200_s11 and share the inductor cache there: ignored files stay
# on a warm machine between calls, so a stage cut by the call's limit goes on in the next call.
set -uo pipefail
source benchmarks/results/device_call.sh
device_call "${LIMIT_S:-560}"
work_dir h200_s11
sweep() {  # name, cap, args...
    local name=$1 cap=$2; shift 2
    run "$cap" python3 -m benchmarks.batch_sweep --concurrency 1 --rounds 1 --compile --device cuda \
        --dtype bfloat16 --resume --out $W/$name.json "$@" 2>&1 | grep -v Warning | tee -a "$OUT/$name.log"
    cp $W/$name.* "$OUT/" 2>/dev/null
}
case "$1" in
tests)
    run 520 python3 -m pytest -m gpu tests/test_gpu.py -k "deferred or steps_table and graphs or bf16" \
        -p no:cacheprovider --durations=20 2>&1 | tee "$OUT/gpu_tests.txt" ;;
smollm2)  # STEPS (default 1,2,3) and TAG (appended to the output names) for the second run
    P="--shape smollm2 --steps ${STEPS:-1,2,3} --num-prompts 4 --max-tokens 256 --max-context 1024"
    sweep smollm2_chat${TAG:-} 400 $P --synthetic-accept 0.491,0.508,0.574
    sweep smollm2_humaneval${TAG:-} 400 $P --synthetic-accept 0.651,0.679,0.667 ;;
8b)
    sweep synthetic_8b${TAG:-} 520 --shape 8b --steps ${STEPS:-3,7} --num-prompts 3 --max-tokens 256 --max-context 1024 \
        --synthetic-accept 0.9,0.86,0.8,0.75,0.7,0.65,0.6
    [ -n "${NO_COSTS:-}" ] || run 300 python3 -m benchmarks.step_costs --shape 8b --compile --cycle-steps 3,7 --max-verify 8 \
        --iters 30 --device cuda --dtype bfloat16 --name llama8b_compiled --out-dir "$OUT" 2>&1 | grep -v Warning ;;
*) echo "stage: tests | smollm2 | 8b" >&2; exit 2 ;;
esac
echo "stage $1 done after $(( $(date +%s) - START ))s"
