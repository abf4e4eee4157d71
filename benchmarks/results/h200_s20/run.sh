#!/usr/bin/env bash
# Session 20's H200 calls (issue 19), one stage per call on one warm machine. The tree is slimmed
# (benchmarks/device_tree.sh slim) and every call carries .whl:
#   bash benchmarks/results/h200_s20/run.sh rows   # random weights, nothing else carried: the compiled
#       cycle's kernels (cycle_profile.py, SmolLM2 shape), then few-row products alone (few_rows.py)
#   bash benchmarks/results/h200_s20/run.sh rows2  # the chain alone, then 8B products of one layer
#   (calls 1-2 ran `rows` and `rows2` at 6c4b7af, with few-row products as reductions in the engine;
#   call 3 ran cycle_profile.py --settings chain,plain at this commit's engine: README.md)
#   STEPS=3 bash benchmarks/results/h200_s20/run.sh 8b   # 8B shape, SYNTHETIC acceptance, plain vs STEPS
#   bash benchmarks/results/h200_s19/run.sh part       # carries runs/gguf_parts/part.00
#   bash benchmarks/results/h200_s19/run.sh assemble   # carries part.01: the real SmolLM2 target
#   bash benchmarks/results/h200_s20/run.sh pair       # carries shipped/smollm2/drafter/model.safetensors:
#       the real pair at batch 1, compiled, plain vs chain STEPS (default 4), --prefill-graphs
set -uo pipefail
source benchmarks/results/device_call.sh
device_call "${LIMIT_S:-585}"
work_dir h200_s20
S=benchmarks/results/h200_s20
case "$1" in
rows)
    run 300 python3 $S/cycle_profile.py --shape smollm2 --steps 4 --out "$OUT/cycle_profile_smollm2_shape" 2>&1 \
        | grep -v Warning | tee "$OUT/cycle_profile.log" | grep -E "wall|^  "
    run 280 python3 $S/few_rows.py --out "$OUT/few_rows.json" 2>&1 | grep -v Warning | tee "$OUT/few_rows.log" ;;
8b)
    run 585 python3 -m benchmarks.batch_sweep --shape 8b --compile --device cuda --dtype bfloat16 --resume \
        --out $W/synthetic_8b.json --steps ${STEPS:-3} --concurrency 1 --num-prompts 3 --rounds 1 \
        --max-tokens 256 --max-context 1024 --synthetic-accept 0.9,0.86,0.8,0.75,0.7,0.65,0.6 2>&1 \
        | grep -v Warning | tee -a "$OUT/synthetic_8b.log"
    cp $W/synthetic_8b.* "$OUT/" 2>/dev/null ;;
pair)
    run 585 python3 -m benchmarks.batch_sweep --model runs/smollm2/target --draft shipped/smollm2/drafter --compile \
        --device cuda --dtype bfloat16 --resume --out $W/pair.json --steps ${STEPS:-4} --concurrency 1 \
        --num-prompts 12 --rounds 1 --max-tokens 256 --prefill-graphs 2>&1 | grep -v Warning | tee -a "$OUT/pair.log"
    cp $W/pair.* "$OUT/" 2>/dev/null ;;
rows2)  # after `rows` ran out of time in the chain's compile: the chain alone, both ways; 8B products, one layer
    run 420 python3 $S/cycle_profile.py --shape smollm2 --steps 4 --settings chain \
        --out "$OUT/cycle_profile_chain4" 2>&1 | grep -v Warning | tee "$OUT/cycle_profile_chain4.log" | grep -E "wall|^  "
    run 585 python3 $S/few_rows.py --shapes 8b --layers 1 --out "$OUT/few_rows_8b.json" 2>&1 | grep -v Warning \
        | tee "$OUT/few_rows_8b.log" ;;
*) echo "stage: rows | rows2 | 8b | pair" >&2; exit 2 ;;
esac
echo "stage $1 done after $(( $(date +%s) - START ))s"
