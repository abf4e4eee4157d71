#!/usr/bin/env bash
# Session 22's H200 calls (issue 19), one stage per call on one warm machine; the tree is slimmed
# (benchmarks/device_tree.sh slim) and every call carries .whl. Calls 1-4 ran h200_s19's `part`
# with h200_s21's `treecompile`, then h200_s19's `assemble`, `TREES=6x8x32 h200_s21/run.sh pair`
# and `STEPS=4 PREFILL_GRAPHS=1 h200_s19/run.sh conc` (README.md). After the warm-up started
# capturing every span bucket (engine/decoder.py warm_up), on a fresh machine:
#   bash benchmarks/results/h200_s19/run.sh part      # carries runs/gguf_parts/part.00
#   bash benchmarks/results/h200_s19/run.sh assemble; bash benchmarks/results/h200_s22/run.sh topk
#       # carries runs/gguf_parts/part.01; topk_bench.py: torch.topk against a two-stage top-k
#   bash benchmarks/results/h200_s22/run.sh conc      # carries shipped/smollm2/drafter/model.safetensors:
#       plain and chain STEPS (default 4) at concurrency 1..32, three rounds of 256-token replies (each
#       measurement about 3x as long as session 19's, where one stall moved a ratio by a third), the GPU warm-up
#       test first; resumable
set -uo pipefail
source benchmarks/results/device_call.sh
device_call "${LIMIT_S:-585}"
work_dir h200_s22
case "$1" in
topk) run 90 python3 benchmarks/results/h200_s22/topk_bench.py 2>&1 | tee "$OUT/topk_bench.txt" ;;
conc)
    run 60 python3 -m pytest -m gpu tests/test_gpu.py -k warm_up -p no:cacheprovider 2>&1 \
        | tee "$OUT/gpu_tests_warm_up.txt" | tail -2
    run 585 python3 -m benchmarks.batch_sweep --model runs/smollm2/target --draft shipped/smollm2/drafter --compile \
        --device cuda --dtype bfloat16 --resume --out $W/conc.json --steps ${STEPS:-4} --concurrency 1,2,4,8,16,32 \
        --num-prompts 16 --rounds 3 --max-tokens 256 --prefill-graphs 2>&1 | grep -v Warning | tee -a "$OUT/conc.log"
    cp $W/conc.* "$OUT/" 2>/dev/null ;;
*) echo "stage: topk | conc" >&2; exit 2 ;;
esac
echo "stage $1 done after $(( $(date +%s) - START ))s"
