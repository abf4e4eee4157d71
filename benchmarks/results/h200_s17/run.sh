#!/usr/bin/env bash
# Session 17's H200 call for issue 19, after shipped/smollm2/gpu_build.sh built a new drafter on the
# same warm machine (runs/smollm2/target and runs/smollm2/drafter are there):
#   STEPS=4 bash benchmarks/results/h200_s17/run.sh pair
# pair   the embedded pair (SmolLM2-135M-Instruct from the GGUF, DRAFT), bf16, compiled on both sides,
#        batch 1, the held-out chat prompts, replies to EOS or 256 tokens: plain decoding against a
#        chain of STEPS steps (real acceptance, not synthetic)
set -uo pipefail
source benchmarks/results/device_call.sh
device_call "${LIMIT_S:-570}"
work_dir h200_s17
DRAFT=${DRAFT:-runs/smollm2/drafter}; STEPS=${STEPS:-4}
case "$1" in
pair)
    run 60 bash shipped/smollm2/gpu_build.sh assemble
    run 540 python3 -m benchmarks.batch_sweep --model runs/smollm2/target --draft "$DRAFT" \
        --compile --device cuda --dtype bfloat16 --steps "$STEPS" --concurrency 1 --num-prompts 12 --rounds 1 \
        --max-tokens 256 --resume --out $W/pair.json 2>&1 | grep -v Warning | tee "$OUT/pair.log"
    cp $W/pair.* "$OUT/" 2>/dev/null ;;
*) echo "stage: pair" >&2; exit 2 ;;
esac
echo "stage $1 done after $(( $(date +%s) - START ))s"
