#!/usr/bin/env bash
# The drafter ablation on CPU: each arm fine-tunes the shipped SmolLM2 drafter for the same number
# of optimizer steps on the same data and seed, then every drafter is evaluated on the same held-out
# prompts at 3 and 4 steps. Resumable: an arm whose export exists is not trained again.
# Usage: ARMS="base noise lk eagle31" STEPS=40 bash run.sh   (W: work folder, default /tmp/abl)
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
W=${W:-/tmp/abl}
REC=benchmarks/results/2026-12-cpu-epyc-drafter-ablation
STEPS=${STEPS:-40}
LR=${LR:-3e-4}
LIMIT=${LIMIT:-0}
# every 8th prompt of chat, mtbench and completion (10 each), every 16th of humaneval (11): spread
# over the sets' categories, not their first ones
HELDOUT=${HELDOUT:-$W/heldout}
if [ ! -d "$HELDOUT" ]; then
  mkdir -p "$HELDOUT"
  for s in chat mtbench completion; do awk 'NR%8==1' "shipped/smollm2/heldout/$s.jsonl" > "$HELDOUT/$s.jsonl"; done
  awk 'NR%16==1' shipped/smollm2/heldout/humaneval.jsonl > "$HELDOUT/humaneval.jsonl"
fi
TOKENS=${TOKENS:-96}
declare -A OPTS=(
  [base]=""
  [noise]="--feature-noise 0.05"
  [lk]="--loss lk-lambda"
  [eagle31]="--fc-norm --norm-output"
  [opd]="--on-policy 0.5"
  [combo]="${COMBO:-}"
)
for arm in ${ARMS:-base noise lk eagle31}; do
  [ -f "$W/export/$arm/config.json" ] && continue
  echo "== train $arm: ${OPTS[$arm]}"
  rm -rf "$W/runs/$arm"
  start=$(date +%s)
  nice -n 19 $PY -m drafter train --target "$W/target" --data "$W/data" --out "$W/runs/$arm" \
    --init shipped/smollm2/drafter --dtype bfloat16 --seed 0 --max-steps "$STEPS" --batch-size 4 \
    --max-length 512 --ttt-length 4 --lr "$LR" --log-every 5 --save-every 1000 ${OPTS[$arm]} 2>&1 | tail -1
  echo "{\"arm\": \"$arm\", \"train_wall_s\": $(( $(date +%s) - start ))}" > "$W/runs/$arm/wall.json"
  $PY -m drafter export "$W/runs/$arm" "$W/export/$arm" --dtype bfloat16 >/dev/null
  mkdir -p "$REC/raw/$arm"
  cp "$W/runs/$arm/log.jsonl" "$W/runs/$arm/train_config.json" "$W/runs/$arm/wall.json" "$REC/raw/$arm/"
done
[ "${EVAL:-1}" = 1 ] || exit 0
drafts="--draft shipped/smollm2/drafter"
for arm in ${ARMS:-base noise lk eagle31}; do drafts="$drafts --draft $W/export/$arm"; done
for set in ${SETS:-chat humaneval mtbench completion}; do
  [ -f "$REC/raw/eval_${set}${TAG:-}.json" ] && continue
  echo "== eval $set"
  nice -n 19 $PY ${EVAL_ENTRY:--m drafter} eval --target "$W/target" $drafts --prompts "$HELDOUT/$set.jsonl" \
    --steps 3,4 --max-tokens "$TOKENS" --limit "$LIMIT" --dtype bfloat16 --max-batch 16 --max-context 1024 \
    --out "$REC/raw/eval_${set}${TAG:-}.json" | tee "$REC/raw/eval_${set}${TAG:-}.txt"
done
