#!/usr/bin/env bash
# GPU stage 1 of the shipped pair (one H200, ~9 min): train the target, then regenerate drafter
# training data with it (in-process native engine, greedy) and build the draft vocabulary.
# Carry runs/shipped/{corpus.jsonl.gz,tokenizer,manifest.json,train_prompts.jsonl}.
# Results come back in $OUT: target.tar, data.tar.gz.* and logs.
set -euo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
W=/tmp/st; mkdir -p $W
TRAIN_S=${TRAIN_S:-240}; N_PROMPTS=${N_PROMPTS:-12000}; MAX_TOKENS=${MAX_TOKENS:-160}
python3 shipped/train_target.py --corpus runs/shipped/corpus.jsonl.gz --out $W/target --work-dir $W/work \
  --time-budget-s "$TRAIN_S" --batch-size 64 --seq-len 1024 --lr 2e-3 --compile \
  --num-samples 4 --sample-tokens 200 2>&1 | tee $W/train.log | grep -v Warning
tar -C $W -cf "$OUT/target.tar" target train.log
python3 -m drafter data --prompts runs/shipped/train_prompts.jsonl --out $W/data --target $W/target \
  --limit "$N_PROMPTS" --max-tokens "$MAX_TOKENS" --concurrency 192 --max-batch 64 2>&1 | tail -5 | tee $W/data.log
python3 -m drafter vocab --data $W/data --size 2048 --target $W/target 2>&1 | tail -3 | tee -a $W/data.log
cp $W/data.log "$OUT/"
tar -C $W -czf - data | split -b 15M - "$OUT/data.tar.gz."
ls -la "$OUT"
