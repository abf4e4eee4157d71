#!/usr/bin/env bash
# SmolLM2-135M-Instruct's EAGLE-3 drafter, built on one H200 in consecutive device calls on one
# warm machine (what a call writes under runs/ stays there while the machine is warm, ~30 s
# between calls; each call must end within the 10-minute limit):
#
#   bash shipped/smollm2/gpu_build.sh part     # calls 1..4: the carried GGUF piece stays in runs/gguf_parts
#   bash shipped/smollm2/gpu_build.sh data     # call 5: last piece -> GGUF (sha256 checked) -> HF folder;
#                                              #   the target writes prompts, then answers them; shards; vocab
#   bash shipped/smollm2/gpu_build.sh train    # then: drafters on 1K..64K conversations (one recipe, trained
#                                              #   side by side), exports, held-out evals at steps 1..6
#
# Why pieces: a call carries at most 64 MiB with the tree (42 MB since the drafter and 2.7 MB of
# prompts ship), and the GGUF is 98 MB: `split -n 5 -d SmolLM2-135M-Instruct.Q4_1.gguf
# runs/gguf_parts/part.` makes five 19.7 MB pieces, call k carries runs/gguf_parts/part.0k (the
# last one also .whl: the gguf and datasketch wheels). `data` may run again to add to the data.
# The machine stays warm only ~30 s after a call: start the next call at once, or the pieces and
# the data are gone. Returns (data) $OUT/data.tgz: prompts, stats, logs; (train) $OUT/drafter.tgz.NN,
# pieces of one tarball (cat them): the largest drafter, scaling table/plot, eval JSON, logs.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
W=runs/smollm2; mkdir -p $W
GGUF=$W/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
N_PROMPTS=${N_PROMPTS:-70000}; PROMPTS_S=${PROMPTS_S:-170}; DATA_S=${DATA_S:-240}
MAX_TOKENS=${MAX_TOKENS:-512}; BATCH=${BATCH:-2048}; VOCAB=${VOCAB:-8192}
SIZES=${SIZES:-1000,4000,16000,64000}; EPOCHS=${EPOCHS:-auto}; TRAIN_S=${TRAIN_S:-400}; LR=${LR:-1e-3}
TRAIN_BATCH=${TRAIN_BATCH:-32}
DEVICE=${DEVICE:-cuda}; EVAL_PROMPTS=${EVAL_PROMPTS:-0}; EVAL_TOKENS=${EVAL_TOKENS:-256}; EVAL_STEPS=${EVAL_STEPS:-1,2,3,4,5,6}
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

# The target writes user prompts (a fifth become raw openings) until N_PROMPTS are written,
# counting the ones session 6 wrote (shipped/smollm2/data/self_prompts.jsonl.gz: the run resumes
# from them), then answers each (greedy); each step stops at its time limit, and what is
# answered then is sharded. Answers need at most ~700 positions (prompt <= 128 tokens, system
# prompt and template, answer <= 512): a 1,024-token context keeps every attention span short.
data() {
    wheels; assemble
    [ -f $W/prompts.jsonl ] || zcat shipped/smollm2/data/self_prompts.jsonl.gz > $W/prompts.jsonl
    log "prompts: $N_PROMPTS, at most ${PROMPTS_S}s"
    python3 -m drafter prompts --target $W/target --out $W/prompts.jsonl --num "$N_PROMPTS" --time-limit "$PROMPTS_S" \
      --max-tokens 128 --max-batch "$BATCH" --max-context 512 --concurrency $((4 * BATCH)) --device "$DEVICE" > $W/prompts.log 2>&1
    tail -1 $W/prompts.log | tee $W/prompts_stats.json
    log "answers: max $MAX_TOKENS tokens, at most ${DATA_S}s"
    python3 -m drafter data --prompts $W/prompts.jsonl --out $W/data --target $W/target --time-limit "$DATA_S" \
      --max-tokens "$MAX_TOKENS" --max-batch "$BATCH" --max-context 1024 --concurrency $((4 * BATCH)) \
      --device "$DEVICE" > $W/data.log 2>&1
    tail -1 $W/data.log | tee $W/data_stats.json
    log "vocab $VOCAB"; python3 -m drafter vocab --data $W/data --size "$VOCAB" --target $W/target | tee $W/vocab.json
    log "training probe: 30 steps"  # seconds per step, from which `train` sizes its epochs
    rm -rf $W/probe; python3 -m drafter train --target $W/target --data $W/data --out $W/probe --max-steps 30 \
      --batch-size "$TRAIN_BATCH" --max-length 1024 --lr "$LR" --log-every 10 --save-every 1000 --device "$DEVICE" \
      > $W/probe.log 2>&1
    python3 -c "import json; r = [json.loads(l) for l in open('$W/probe/log.jsonl')]; \
print(json.dumps({'s_per_step': round((r[-1]['elapsed_s'] - r[0]['elapsed_s']) / 20, 4)}))" | tee $W/probe.json
    log "packing"
    gzip -kf $W/prompts.jsonl
    tar -C $W -czf "$OUT/data.tgz" prompts.jsonl.gz prompts.rejected.jsonl prompts.log data.log prompts_stats.json \
      data_stats.json vocab.json probe.json probe.log stages.log
}

# One recipe for every size (EPOCHS passes, same batch, lr and schedule), trained side by side;
# then the held-out evals of each size on chat prompts, and of the largest on all three sets.
train() {
    wheels
    if [ "$EPOCHS" = auto ]; then  # the most epochs (<= 3) whose steps fit TRAIN_S at the probe's pace
        EPOCHS=$(python3 -c "import json; s = json.load(open('$W/probe.json'))['s_per_step']; \
steps = sum(int(n) // $TRAIN_BATCH for n in '$SIZES'.split(',')); print(min(3.0, int(10 * $TRAIN_S / (s * steps)) / 10))")
    fi
    log "scaling: sizes $SIZES, $EPOCHS epochs"
    python3 shipped/smollm2/data_scaling.py --target $W/target --data $W/data --sizes "$SIZES" --epochs "$EPOCHS" \
      --batch-size "$TRAIN_BATCH" --max-length 1024 --lr "$LR" --save-every 200 --jobs 4 --export-dtype bfloat16 \
      --prompts shipped/smollm2/heldout/chat.jsonl --eval-prompts "$EVAL_PROMPTS" --max-tokens "$EVAL_TOKENS" \
      --steps "$EVAL_STEPS" \
      --device "$DEVICE" --work-dir $W/scaling --out-dir $W/scaling_out 2>&1 | tee $W/scaling.log
    largest=${SIZES##*,}
    log "evals of drafter_$largest: chat, humaneval, completion (side by side)"
    for set in chat humaneval completion; do
        python3 -m drafter eval --target $W/target --draft $W/scaling/drafter_$largest \
          --prompts shipped/smollm2/heldout/$set.jsonl --steps "$EVAL_STEPS" --max-tokens "$EVAL_TOKENS" \
          --limit "$EVAL_PROMPTS" --max-batch 256 --device "$DEVICE" --out $W/eval_$set.json \
          > $W/eval_$set.txt 2>> $W/eval.log &
    done
    wait; cat $W/eval_chat.txt $W/eval_humaneval.txt $W/eval_completion.txt
    log "packing"
    rm -rf $W/drafter && cp -r $W/scaling/drafter_$largest $W/drafter
    tar -C $W -czf $W/drafter.tgz drafter scaling_out eval_chat.json eval_humaneval.json eval_completion.json \
      scaling.log eval.log stages.log $(cd $W && ls scaling/*.log scaling/eval_*.json scaling/run_*/log.jsonl)
    split -b 15M -d $W/drafter.tgz "$OUT/drafter.tgz."   # a returned file is at most 16 MiB
}

case "${1:-}" in
    part) ls -l runs/gguf_parts ;;
    data) data ;;
    train) train ;;
    *) echo "usage: $0 part|data|train" >&2; exit 2 ;;
esac
