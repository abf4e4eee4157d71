#!/usr/bin/env bash
# The shipped pair on one H200 (one call, ~9.5 min): train the target; regenerate drafter
# training data with it (in-process native engine, greedy); draft vocabulary; train the
# drafter (TTT) and export it; a data-scaling series of short drafter trainings.
# Carry runs/shipped/{corpus.jsonl.gz,tokenizer,manifest.json,train_prompts.jsonl}.
# Everything comes back in $OUT: target.tar, drafter.tar, scaling.tar, data.tar.gz.*, logs.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
W=/tmp/st; mkdir -p $W
TRAIN_S=${TRAIN_S:-180}; N_PROMPTS=${N_PROMPTS:-8000}; MAX_TOKENS=${MAX_TOKENS:-128}
# Another target shape, e.g. TARGET_ARGS="--layers 32 --hidden 128 --heads 2 --kv-heads 1 --intermediate 384"
TARGET_ARGS=${TARGET_ARGS:-}
log() { echo "[$(date +%T)] $*" | tee -a $W/stages.log; }
log "target training ${TRAIN_S}s"
python3 shipped/train_target.py --corpus runs/shipped/corpus.jsonl.gz --out $W/target --work-dir $W/work \
  --time-budget-s "$TRAIN_S" --batch-size 64 --seq-len 1024 --lr 2e-3 --compile \
  --num-samples 4 --sample-tokens 200 $TARGET_ARGS 2>&1 | grep -v Warning > $W/train.log
tail -20 $W/train.log
tar -C $W -cf "$OUT/target.tar" target train.log
log "data: $N_PROMPTS prompts, max $MAX_TOKENS tokens"
timeout 150 python3 -m drafter data --prompts runs/shipped/train_prompts.jsonl --out $W/data --target $W/target \
  --limit "$N_PROMPTS" --max-tokens "$MAX_TOKENS" --concurrency 192 --max-batch 64 > $W/data.log 2>&1
tail -3 $W/data.log
python3 -m drafter vocab --data $W/data --size 2048 --target $W/target 2>&1 | tail -2
log "drafter training"
timeout 150 python3 -m drafter train --target $W/target --data $W/data --out $W/run --batch-size 32 \
  --max-length 512 --epochs 3 --lr 2e-3 --save-every 200 --log-every 50 > $W/drafter_train.log 2>&1
tail -4 $W/drafter_train.log
python3 -m drafter export $W/run $W/drafter --dtype bfloat16 && cp $W/drafter_train.log $W/drafter/
tar -C $W -cf "$OUT/drafter.tar" drafter
log "scaling series"
for n in 500 1000 2000 4000; do
  timeout 40 python3 -m drafter train --target $W/target --data $W/data --out $W/scale_$n --batch-size 32 \
    --max-length 512 --limit-samples $n --max-steps 250 --lr 2e-3 --save-every 50 --log-every 250 \
    > $W/scale_$n.log 2>&1
  python3 -m drafter export $W/scale_$n $W/scaling/drafter_$n --dtype bfloat16 >/dev/null 2>&1
  cp $W/scale_$n.log $W/scaling/ 2>/dev/null
done
tar -C $W -cf "$OUT/scaling.tar" scaling
log "packing data"
tar -C $W -czf - data | split -b 15M - "$OUT/data.tar.gz."
cp $W/stages.log $W/data.log "$OUT/"
ls -la "$OUT"
