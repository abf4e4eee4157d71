#!/usr/bin/env bash
# Session 21's H200 calls (issue 19): greedy trees as one device-side step, against plain decoding
# and the chain, on the real SmolLM2 pair. One stage per call on one warm machine; the tree is
# slimmed (benchmarks/device_tree.sh slim) and every call carries .whl:
#   bash benchmarks/results/h200_s19/run.sh part     # carries runs/gguf_parts/part.00
#   bash benchmarks/results/h200_s21/run.sh profile  # carries runs/gguf_parts/part.01: assembles the target
#       (sha256 checked), the GPU tree tests, then the kernels of a compiled tree cycle and a plain step
#       (random weights of the SmolLM2 shape; its compiles warm the inductor cache the next stage reads)
#   bash benchmarks/results/h200_s21/run.sh pair     # carries shipped/smollm2/drafter/model.safetensors:
#       the real pair at batch 1, compiled, plain vs TREES (default 6x8x32,5x4x16) vs chain STEPS
#       (default 4), --prefill-graphs; resumable (run it again if a call's limit cut it)
#   bash benchmarks/results/h200_s21/run.sh treecompile  # nothing but .whl: the tree step's compile with
#       default inductor options (engine/decoder.py TUNED_KINDS), random SmolLM2-shaped weights
set -uo pipefail
source benchmarks/results/device_call.sh
device_call "${LIMIT_S:-585}"
work_dir h200_s21
S=benchmarks/results/h200_s20
case "$1" in
profile)
    bash shipped/smollm2/gpu_build.sh assemble 2>&1 | tail -3
    run 150 python3 -m pytest -m gpu tests/test_gpu.py -k "tree and graphs" -p no:cacheprovider 2>&1 \
        | tee "$OUT/gpu_tests_tree.txt" | tail -3
    run 400 python3 $S/cycle_profile.py --shape smollm2 --settings tree,plain --tree ${TREE:-6x8x32} \
        --out "$OUT/cycle_profile_tree" 2>&1 | grep -v Warning | tee "$OUT/cycle_profile_tree.log" | grep -E "wall|^  "
    run 200 python3 -m pytest -m gpu tests/test_gpu.py -k "tree and compiled" -p no:cacheprovider 2>&1 \
        | tee -a "$OUT/gpu_tests_tree.txt" | tail -3 ;;
treecompile)  # after engine.decoder stopped tuning tree steps (TUNED_KINDS): does the tree step compile now?
    run 585 python3 $S/cycle_profile.py --shape smollm2 --settings tree --tree ${TREE:-6x8x32} --iters 20 \
        --out "$OUT/cycle_profile_tree_untuned" 2>&1 | grep -v Warning | tee "$OUT/cycle_profile_tree_untuned.log" \
        | grep -E "wall|^  " ;;
pair)
    run 585 python3 -m benchmarks.batch_sweep --model runs/smollm2/target --draft shipped/smollm2/drafter --compile \
        --device cuda --dtype bfloat16 --resume --out $W/pair.json --steps ${STEPS-4} --trees ${TREES:-6x8x32,5x4x16} \
        --concurrency 1 --num-prompts 12 --rounds 1 --max-tokens 256 --prefill-graphs 2>&1 | grep -v Warning \
        | tee -a "$OUT/pair.log"
    cp $W/pair.* "$OUT/" 2>/dev/null ;;
*) echo "stage: profile | treecompile | pair" >&2; exit 2 ;;
esac
echo "stage $1 done after $(( $(date +%s) - START ))s"
