#!/usr/bin/env bash
# The shipped pair on one H200, in two device calls (each must end within the 10-minute limit).
#
#   bash shipped/gpu_build_target.sh target    # ~7 min: train the target; regenerate the drafter's
#                                              # training data with it (in-process native engine, greedy)
#   bash shipped/gpu_build_target.sh drafter   # ~7 min: draft vocabulary; train (TTT) and export the
#                                              # drafter; held-out accept lengths on the GPU
#
# Call 1 carries runs/shipped/{corpus.jsonl.gz,tokenizer,manifest.json,train_prompts.jsonl} and
# returns $OUT/build.tgz (target/ and data/ shards, logs): unpack it into runs/gpu_build/ and carry
# runs/gpu_build into call 2, which returns $OUT/drafter.tgz (drafter/, logs, eval JSON).
# The target's shape is train_target.py's defaults; override with TARGET_ARGS="--layers 8 ...".
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
B=runs/gpu_build; mkdir -p $B
TRAIN_S=${TRAIN_S:-120}; N_PROMPTS=${N_PROMPTS:-16000}; MAX_TOKENS=${MAX_TOKENS:-128}
DATA_S=${DATA_S:-240}; DRAFT_STEPS=${DRAFT_STEPS:-1100}; DRAFT_S=${DRAFT_S:-320}; EVAL_S=${EVAL_S:-150}
TARGET_ARGS=${TARGET_ARGS:-}
log() { echo "[$(date +%T)] $*" | tee -a $B/stages.log; }

build_target() {
    log "target training ${TRAIN_S}s $TARGET_ARGS"
    python3 shipped/train_target.py --corpus runs/shipped/corpus.jsonl.gz --out $B/target --work-dir /tmp/st_work \
      --time-budget-s "$TRAIN_S" --batch-size 64 --seq-len 1024 --lr 2e-3 --compile \
      --num-samples 4 --sample-tokens 200 $TARGET_ARGS 2>&1 | grep -v Warning > $B/target_train.log
    tail -3 $B/target_train.log
    generate_data
    log "packing"
    tar -C $B -czf "$OUT/build.tgz" --exclude=data/generated.jsonl target data generated.jsonl target_train.log \
      data.log stages.log
}

# Regenerate answers for the first N_PROMPTS training prompts, continuing $B/generated.jsonl
# (a rerun skips the conversations already answered). Out of time, shard what is there.
generate_data() {
    log "data: $N_PROMPTS prompts, max $MAX_TOKENS tokens, at most ${DATA_S}s"
    rm -rf /tmp/data; mkdir -p /tmp/data
    [ -f $B/generated.jsonl ] && cp $B/generated.jsonl /tmp/data/generated.jsonl
    timeout "$DATA_S" python3 -m drafter data --prompts runs/shipped/train_prompts.jsonl --out /tmp/data \
      --target $B/target --limit "$N_PROMPTS" --max-tokens "$MAX_TOKENS" --concurrency 512 --max-batch 256 \
      >> $B/data.log 2>&1
    rm -rf $B/data
    if [ -f /tmp/data/index.json ]; then
        mv /tmp/data $B/data
    else  # tokenize the conversations answered so far (exact ids of a killed run are lost: text is re-tokenized)
        log "data stopped at $(wc -l < /tmp/data/generated.jsonl) conversations; sharding those"
        head -n "$(wc -l < /tmp/data/generated.jsonl)" /tmp/data/generated.jsonl > /tmp/answered.jsonl  # whole lines
        python3 -m drafter data --keep-responses --prompts /tmp/answered.jsonl --tokenizer $B/target \
          --out $B/data >> $B/data.log 2>&1
    fi
    cp $B/data/generated.jsonl $B/generated.jsonl
    tail -1 $B/data.log
}

build_drafter() {
    [ "$DATA_S" -gt 0 ] && generate_data
    log "vocab"
    python3 -m drafter vocab --data $B/data --size 2048 --target $B/target 2>&1 | tail -2
    log "drafter training: $DRAFT_STEPS steps, at most ${DRAFT_S}s"
    timeout "$DRAFT_S" python3 -m drafter train --target $B/target --data $B/data --out /tmp/run --batch-size 32 \
      --max-length 512 --max-steps "$DRAFT_STEPS" --lr 2e-3 --save-every 100 --log-every 50 \
      > $B/drafter_train.log 2>&1
    tail -3 $B/drafter_train.log
    python3 -m drafter export /tmp/run $B/drafter --dtype bfloat16 && cp $B/drafter_train.log $B/drafter/
    log "held-out eval (GPU, bf16)"
    timeout "$EVAL_S" python3 -m drafter eval --target $B/target --draft $B/drafter --prompts shipped/data/heldout_prompts.jsonl \
      --steps 1,2,3,4,5,6 --max-tokens 128 --limit 40 --device cuda --out $B/eval_heldout_gpu.json 2>&1 | tail -12
    log "packing"
    tar -C $B -czf "$OUT/drafter.tgz" --exclude=data/generated.jsonl drafter data generated.jsonl drafter_train.log \
      eval_heldout_gpu.json data.log stages.log
}

case "${1:-}" in
    target) build_target ;;
    drafter) build_drafter ;;
    *) echo "usage: $0 target|drafter" >&2; exit 2 ;;
esac
