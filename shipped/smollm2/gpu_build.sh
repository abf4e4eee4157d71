#!/usr/bin/env bash
# SmolLM2-135M-Instruct's EAGLE-3 drafter, built on one H200 in consecutive device calls on one
# warm machine (what a call writes under runs/ stays there while the machine is warm, ~30 s
# between calls; each call must end within the 10-minute limit):
#
#   bash shipped/smollm2/gpu_build.sh part     # calls 1..8: the carried GGUF piece stays in runs/gguf_parts
#   bash shipped/smollm2/gpu_build.sh data     # call 9: last piece -> GGUF (sha256 checked) -> HF folder;
#                                              #   [the target writes prompts;] it answers them; shards; vocab
#   bash shipped/smollm2/gpu_build.sh train    # calls 9..: train the drafter on all conversations (each call
#                                              #   ends at TRAIN_S with a checkpoint; call again until done),
#                                              #   then export it and return it at once
#   bash shipped/smollm2/gpu_build.sh evals    # next call: add it to the scaling table, held-out evals at 1..6
#
# Why pieces: a call carries at most 64 MiB with the tree (51.3 MiB since the drafter, the DeepSeek tiny
# pair and 6.6 MB of prompts ship), and the GGUF is 98 MB: `split -n 9 -d SmolLM2-135M-Instruct.Q4_1.gguf
# runs/gguf_parts/part.` makes nine 10.9 MB pieces, call k carries runs/gguf_parts/part.0k (the
# last one also .whl: `make device-wheels`). `data` may run again to add to the data.
# The machine stays warm only ~30 s after a call: start the next call at once, or the pieces and
# the data are gone. Returns (data) $OUT/data.tgz: stats, logs; (train) $OUT/drafter.tgz.NN,
# pieces of one tarball (cat them): the drafter and its training log; (evals) $OUT/evals.tgz.NN:
# scaling table/plot, eval JSON, logs. Training returns the drafter in the call it finishes in,
# so evals that do not fit that call's time cannot cost the drafter (session 10's last call).
#
# Prompts: the 43,661 the target wrote (shipped/smollm2/data/self_prompts.jsonl.gz) and 22,000
# function stubs people wrote (code_prompts.jsonl.gz, `drafter code-prompts`), answered
# interleaved; DROP_SYSTEM of the chats are answered without the system prompt they were written
# under, as users send them. PROMPTS_S > 0 lets the target write more first.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
W=${W:-runs/smollm2}; mkdir -p $W
GGUF=$W/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
N_PROMPTS=${N_PROMPTS:-70000}; PROMPTS_S=${PROMPTS_S:-0}; DATA_S=${DATA_S:-510}; LIMIT=${LIMIT:-0}
DROP_SYSTEM=${DROP_SYSTEM:-0.75}
MAX_TOKENS=${MAX_TOKENS:-512}; BATCH=${BATCH:-2048}; VOCAB=${VOCAB:-8192}
EPOCHS=${EPOCHS:-1.2}; TRAIN_S=${TRAIN_S:-520}; LR=${LR:-1e-3}; TRAIN_BATCH=${TRAIN_BATCH:-32}
EARLIER=${EARLIER:-1000,4000,16000,35230}   # sizes whose evals (session 7) the table keeps
DEVICE=${DEVICE:-cuda}; EVAL_PROMPTS=${EVAL_PROMPTS:-0}; EVAL_TOKENS=${EVAL_TOKENS:-256}; EVAL_STEPS=${EVAL_STEPS:-1,2,3,4,5,6}
RESULTS=benchmarks/results/smollm2_build
log() { echo "[$(date +%T)] $*" | tee -a $W/stages.log; }

wheels() {  # gguf, datasketch: not in the GPU image
    [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH="$PWD:/tmp/site"
}

assemble() {
    ls -l runs/gguf_parts
    mkdir -p $W/gguf && cat runs/gguf_parts/part.0* > $GGUF
    echo "$SHA256  $GGUF" | sha256sum -c - || { log "GGUF sha256 mismatch"; exit 3; }
    [ -f $W/target/config.json ] || python3 -m drafter export-hf $GGUF $W/target || exit 3  # float32: Q4_1 is exact there
}

# Answers need at most ~700 positions (prompt <= 128 tokens for the written ones, system prompt and
# template, answer <= 512; stubs are longer, a few are cut): a 1,024-token context keeps every
# attention span short. What is answered by the time limit is sharded.
data() {
    wheels; assemble
    [ -f $W/prompts.jsonl ] || zcat shipped/smollm2/data/self_prompts.jsonl.gz > $W/prompts.jsonl
    [ -f $W/code_prompts.jsonl ] || zcat shipped/smollm2/data/code_prompts.jsonl.gz > $W/code_prompts.jsonl
    if [ "$PROMPTS_S" != 0 ]; then
        log "prompts: $N_PROMPTS, at most ${PROMPTS_S}s"
        python3 -m drafter prompts --target $W/target --out $W/prompts.jsonl --num "$N_PROMPTS" \
          --time-limit "$PROMPTS_S" --max-tokens 128 --max-batch "$BATCH" --max-context 512 \
          --concurrency $((4 * BATCH)) --device "$DEVICE" > $W/prompts.log 2>&1
        tail -1 $W/prompts.log | tee $W/prompts_stats.json
    fi
    log "answers: max $MAX_TOKENS tokens, at most ${DATA_S}s, system prompts dropped from $DROP_SYSTEM"
    python3 -m drafter data --prompts $W/prompts.jsonl --prompts $W/code_prompts.jsonl --out $W/data \
      --target $W/target --time-limit "$DATA_S" --limit "$LIMIT" --drop-system "$DROP_SYSTEM" \
      --max-tokens "$MAX_TOKENS" --max-batch "$BATCH" --max-context 1024 --concurrency $((4 * BATCH)) \
      --device "$DEVICE" > $W/data.log 2>&1
    tail -1 $W/data.log | tee $W/data_stats.json
    log "vocab $VOCAB"; python3 -m drafter vocab --data $W/data --size "$VOCAB" --target $W/target | tee $W/vocab.json
    log "packing"
    tar -C $W -czf "$OUT/data.tgz" data.log data_stats.json vocab.json stages.log $(cd $W && ls prompts.log \
      prompts_stats.json 2>/dev/null)
}

# The drafter on every conversation answered, with session 7's recipe (EPOCHS passes, batch, lr,
# schedule), so it extends that session's scaling table; each call trains until TRAIN_S and
# checkpoints. Once finished: export, and return the drafter.
records() {
    python3 -c "import json; print(json.load(open('$W/data/index.json'))['records'])" 2>/dev/null \
      || { log "no $W/data: run data first"; exit 3; }
}

train() {
    wheels
    n=$(records) || exit 3
    run=$W/scaling/run_$n; mkdir -p $W/scaling
    resume=(); [ -d $run ] && resume=(--resume)
    log "train: $n conversations, $EPOCHS epochs, at most ${TRAIN_S}s this call ${resume[*]}"
    python3 -m drafter train --target $W/target --data $W/data --out $run --epochs "$EPOCHS" \
      --batch-size "$TRAIN_BATCH" --max-length 1024 --ttt-length 7 --lr "$LR" --save-every 200 --log-every 50 \
      --time-limit "$TRAIN_S" --device "$DEVICE" "${resume[@]}" > $W/scaling/train_$n.log 2>&1
    tail -1 $W/scaling/train_$n.log | tee $W/train_state.json
    if ! grep -q '"finished": true' $W/train_state.json; then
        log "not finished: call train again"
        tar -C $W -czf "$OUT/train_partial.tgz" stages.log train_state.json scaling/train_$n.log
        return
    fi
    python3 -m drafter export $run $W/scaling/drafter_$n --dtype bfloat16 >> $W/scaling/train_$n.log 2>&1
    log "exported drafter_$n: returning it; call evals next"
    rm -rf $W/drafter && cp -r $W/scaling/drafter_$n $W/drafter
    tar -C $W -czf $W/drafter.tgz drafter stages.log scaling/train_$n.log scaling/run_$n/log.jsonl
    split -b 15M -d $W/drafter.tgz "$OUT/drafter.tgz."   # a returned file is at most 16 MiB
}

# The trained drafter in the scaling table (the earlier sizes' evals kept) and the three held-out
# sets at steps 1..6.
evals() {
    wheels
    n=$(records) || exit 3
    [ -d $W/scaling/drafter_$n ] || { log "no drafter_$n: run train until it finishes"; exit 3; }
    for size in ${EARLIER//,/ }; do   # earlier sizes: their evals, not trained again
        src=$RESULTS/scaling_runs/eval_$size.json; [ -f $src ] || src=$RESULTS/eval_chat.json
        cp $src $W/scaling/eval_$size.json
    done
    log "scaling table: $EARLIER + $n"
    python3 shipped/smollm2/data_scaling.py --target $W/target --data $W/data --sizes "$EARLIER,$n" \
      --prompts shipped/smollm2/heldout/chat.jsonl --eval-prompts "$EVAL_PROMPTS" --max-tokens "$EVAL_TOKENS" \
      --steps "$EVAL_STEPS" --device "$DEVICE" --work-dir $W/scaling --out-dir $W/scaling_out 2>&1 | tee $W/scaling.log
    cp $W/scaling/eval_$n.json $W/eval_chat.json; cp $W/scaling/eval_$n.log $W/eval_chat.txt
    log "evals of drafter_$n: humaneval, completion (side by side)"
    for set in humaneval completion; do
        python3 -m drafter eval --target $W/target --draft $W/scaling/drafter_$n \
          --prompts shipped/smollm2/heldout/$set.jsonl --steps "$EVAL_STEPS" --max-tokens "$EVAL_TOKENS" \
          --limit "$EVAL_PROMPTS" --max-batch 256 --device "$DEVICE" --out $W/eval_$set.json \
          > $W/eval_$set.txt 2>> $W/eval.log &
    done
    wait; cat $W/eval_chat.txt $W/eval_humaneval.txt $W/eval_completion.txt
    log "packing"
    tar -C $W -czf $W/evals.tgz scaling_out eval_chat.json eval_humaneval.json eval_completion.json \
      scaling.log eval.log stages.log scaling/eval_$n.json
    split -b 15M -d $W/evals.tgz "$OUT/evals.tgz."
}

case "${1:-}" in
    part) ls -l runs/gguf_parts ;;
    data) data ;;
    train) train ;;
    evals) evals ;;
    *) echo "usage: $0 part|data|train|evals" >&2; exit 2 ;;
esac
