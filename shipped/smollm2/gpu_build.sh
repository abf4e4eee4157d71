#!/usr/bin/env bash
# SmolLM2-135M-Instruct's EAGLE-3 drafter, built on one H200 in consecutive device calls on one
# warm machine (what a call writes under runs/ stays there while the machine is warm, ~30 s
# between calls; each call must end within the 10-minute limit):
#
#   bash shipped/smollm2/gpu_build.sh part     # calls 1..P-1: the carried GGUF piece stays in runs/gguf_parts
#   bash shipped/smollm2/gpu_build.sh assemble # (optional) last piece -> GGUF -> HF folder, for other work
#   bash shipped/smollm2/gpu_build.sh data     # call P: last piece -> GGUF (sha256 checked) -> HF folder;
#                                              #   [the target writes prompts;] it answers them; shards; vocab
#   bash shipped/smollm2/gpu_build.sh train    # calls P+1..: TRAIN_BUDGET_S seconds of training in all, each
#                                              #   call until TRAIN_S with a checkpoint; once spent: export,
#                                              #   return the drafter at once, then held-out evals in what is left
#   bash shipped/smollm2/gpu_build.sh evals    # held-out evals at steps 1..6 (again, or if train ran out)
#   bash shipped/smollm2/gpu_build.sh scaling  # after data: drafters on the first 1K..64K conversations, one
#                                              #   recipe, side by side; accept length on held-out chat prompts
#   bash shipped/smollm2/gpu_build.sh capacity # after data: one drafter per MLP width and draft vocabulary (ARMS),
#                                              #   from scratch, side by side, evaluated beside each other
#
# Pieces: a call carries at most 64 MiB. The GGUF is 98 MB; the tree is larger than a call with the
# binaries that ship (fixture pairs, the shipped drafter) and the results. `bash benchmarks/device_tree.sh
# slim` leaves those out of the index for the device calls (`unslim` afterwards), which leaves ~9 MB of tree: `split -n 2 -d SmolLM2-135M-Instruct.Q4_1.gguf
# runs/gguf_parts/part.` then makes two 49.2 MB pieces, and the second call carries the last with .whl
# (`make device-wheels`, 3.6 MB). With the whole tree it takes nine pieces (`split -n 9`).
# A slimmed-out file inside a tracked folder (shipped/smollm2/drafter/model.safetensors) must be carried
# by the call that reads it: one carried by an earlier call can be gone two calls later.
# The machine stays warm only ~30 s after a call: start the next call at once, or the pieces and
# the data are gone. Returns (data) $OUT/data.tgz: stats, logs, and $OUT/generated.jsonl.gz.NN, the
# answered conversations (cat the pieces; RETURN_DATA=0 keeps them there); (train)
# $OUT/drafter.tgz.NN, pieces of one tarball (cat them): the drafter and its training log; then
# $OUT/evals.tgz.NN: eval JSON and tables, logs.
#
# The shipped drafter's first stage (shipped/smollm2/PROVENANCE.md):
#   EXTRA_PROMPTS=runs/sharegpt_prompts.jsonl.gz SELF_LIMIT=15000 MAX_TOKENS=384 DATA_S=400 ... data
#   TRAIN_BUDGET_S=980 TRAIN_S=550 ... train    (twice: the second call resumes, exports, evaluates)
# A second `data` call before `train` resumes the answering (ids already answered are skipped), and
# so does an earlier build's returned generated.jsonl.gz, carried in pieces to runs/prev_parts/.
# INIT=DRAFTER: train fine-tunes that drafter (its weights and draft vocabulary) instead of starting anew.
# SHARED_HEAD=1: the drafter borrows the target's lm_head (no head of its own, full vocabulary); its logits
# are 6x the 8,192-row head's: TRAIN_BATCH=8 GRAD_ACCUM=4 (32 sequences a step) took 17.5 GB at peak
# and 0.43 s a step, so on an H200 TRAIN_BATCH=32 alone should fit.
# INTERMEDIATE=N: the drafter's MLP width (default the target's, 1536); with SHARED_HEAD=1, 4096 keeps the
# export within 20 MB (19.0 MB).
# PROMPTS_FROM=A,B,C...: start the prompt files (written, stubs, then EXTRA_PROMPTS, in that order) at
# these lines, to answer only prompts an earlier build did not (the second stage started past the first's).
# The files are answered interleaved in proportion to their sizes, so within DATA_S a small file beside
# a large one is answered only in that proportion (649 of 2,156 instructions beside 45K ShareGPT
# prompts): answer a small file alone in its own call first, then add the large one.
#
# Prompts: the 43,661 the target wrote (shipped/smollm2/data/self_prompts.jsonl.gz), 22,000
# function stubs people wrote (code_prompts.jsonl.gz, `drafter code-prompts`) and any EXTRA_PROMPTS
# (comma-separated .jsonl.gz files, such as the 45,484 ShareGPT prompts people wrote that
# shipped/smollm2/data/sharegpt_prompts.py writes), answered interleaved (SELF_LIMIT: only the first N
# written ones). DROP_SYSTEM of the chats are answered without the system prompt they were written
# under, as users send them. PROMPTS_S > 0 lets the target write more first.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
W=${W:-runs/smollm2}; mkdir -p $W
GGUF=$W/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
N_PROMPTS=${N_PROMPTS:-70000}; PROMPTS_S=${PROMPTS_S:-0}; DATA_S=${DATA_S:-510}; LIMIT=${LIMIT:-0}
DROP_SYSTEM=${DROP_SYSTEM:-0.75}; EXTRA_PROMPTS=${EXTRA_PROMPTS:-}; SELF_LIMIT=${SELF_LIMIT:-0}
MAX_TOKENS=${MAX_TOKENS:-512}; BATCH=${BATCH:-2048}; VOCAB=${VOCAB:-8192}
TRAIN_BUDGET_S=${TRAIN_BUDGET_S:-900}; TRAIN_S=${TRAIN_S:-520}; LR=${LR:-1e-3}; TRAIN_BATCH=${TRAIN_BATCH:-32}
LENGTH_GROUP=${LENGTH_GROUP:-64}; ARMS=${ARMS:-1536/8192,6144/8192,1536/16384}
DEVICE=${DEVICE:-cuda}; EVAL_PROMPTS=${EVAL_PROMPTS:-0}; EVAL_TOKENS=${EVAL_TOKENS:-256}; EVAL_STEPS=${EVAL_STEPS:-1,2,3,4,5,6}
EVAL_DRAFTS=${EVAL_DRAFTS:-}   # more drafters to evaluate beside the new one (comma-separated folders)
EVAL_SETS=(chat mtbench humaneval completion)   # shipped/smollm2/heldout/*.jsonl
RETURN_DATA=${RETURN_DATA:-1}; PROMPTS_FROM=${PROMPTS_FROM:-}
INIT=${INIT:-}; SHARED_HEAD=${SHARED_HEAD:-0}; INTERMEDIATE=${INTERMEDIATE:-}; GRAD_ACCUM=${GRAD_ACCUM:-1}; SIZES=${SIZES:-1000,4000,16000,64000}; EPOCHS=${EPOCHS:-1.2}; SCALING_S=${SCALING_S:-480}
log() { echo "[$(date +%T)] $*" | tee -a $W/stages.log; }

wheels() {  # gguf, datasketch, pydantic: not in the GPU image
    [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH="$PWD:/tmp/site"
}

assemble() {
    ls -l runs/gguf_parts
    mkdir -p $W/gguf && cat runs/gguf_parts/part.0* > $GGUF
    echo "$SHA256  $GGUF" | sha256sum -c - || { log "GGUF sha256 mismatch"; exit 3; }
    [ -f $W/target/config.json ] || python3 -m drafter export-hf $GGUF $W/target || exit 3  # float32: Q4_1 is exact there
}

# A returned file is at most 16 MiB: big results come back in pieces (cat them).
give_back() { split -b 15M -d "$1" "$OUT/$(basename "$1")."; }

# Answers need at most ~700 positions (prompt <= 128 tokens for the written ones, system prompt and
# template, answer <= 512; stubs are longer, a few are cut): a 1,024-token context keeps every
# attention span short. What is answered by the time limit is sharded.
data() {
    wheels; assemble
    if ls runs/prev_parts/generated.jsonl.gz.* > /dev/null 2>&1 && [ ! -f $W/data/generated.jsonl ]; then
        mkdir -p $W/data && cat runs/prev_parts/generated.jsonl.gz.* | zcat > $W/data/generated.jsonl || exit 3
        log "resuming from an earlier build's $(wc -l < $W/data/generated.jsonl) conversations"
    fi
    from=(${PROMPTS_FROM//,/ }); k=2
    skip() { tail -n +$(( ${from[$1]:-0} + 1 )); }  # prompt file $1 from its line from[$1] on
    [ -f $W/prompts.jsonl ] || zcat shipped/smollm2/data/self_prompts.jsonl.gz | \
        { [ "$SELF_LIMIT" = 0 ] && cat || head -n "$SELF_LIMIT"; } | skip 0 > $W/prompts.jsonl
    [ -f $W/code_prompts.jsonl ] || zcat shipped/smollm2/data/code_prompts.jsonl.gz | skip 1 > $W/code_prompts.jsonl
    paths=($W/prompts.jsonl $W/code_prompts.jsonl)
    for f in ${EXTRA_PROMPTS//,/ }; do
        x=$W/$(basename "$f" .gz); [ -f "$x" ] || zcat "$f" | skip $((k++)) > "$x"; paths+=("$x")
    done
    wc -l "${paths[@]}" | tee -a $W/stages.log
    files=(); for p in "${paths[@]}"; do files+=(--prompts "$p"); done
    if [ "$PROMPTS_S" != 0 ]; then
        log "prompts: $N_PROMPTS, at most ${PROMPTS_S}s"
        python3 -m drafter prompts --target $W/target --out $W/prompts.jsonl --num "$N_PROMPTS" \
          --time-limit "$PROMPTS_S" --max-tokens 128 --max-batch "$BATCH" --max-context 512 \
          --concurrency $((4 * BATCH)) --device "$DEVICE" > $W/prompts.log 2>&1
        tail -1 $W/prompts.log | tee $W/prompts_stats.json
    fi
    log "answers: max $MAX_TOKENS tokens, at most ${DATA_S}s, system prompts dropped from $DROP_SYSTEM: ${files[*]}"
    python3 -m drafter data "${files[@]}" --out $W/data \
      --target $W/target --time-limit "$DATA_S" --limit "$LIMIT" --drop-system "$DROP_SYSTEM" \
      --max-tokens "$MAX_TOKENS" --max-batch "$BATCH" --max-context 1024 --concurrency $((4 * BATCH)) \
      --device "$DEVICE" > $W/data.log 2>&1
    tail -1 $W/data.log | tee $W/data_stats.json
    log "vocab $VOCAB"; python3 -m drafter vocab --data $W/data --size "$VOCAB" --target $W/target | tee $W/vocab.json
    log "packing"
    tar -C $W -czf "$OUT/data.tgz" data.log data_stats.json vocab.json stages.log $(cd $W && ls prompts.log \
      prompts_stats.json 2>/dev/null)
    [ "$RETURN_DATA" = 0 ] && return  # another data call follows, or the conversations are not wanted back
    gzip -1 -c $W/data/generated.jsonl > $W/generated.jsonl.gz && give_back $W/generated.jsonl.gz
}

records() {
    python3 -c "import json; print(json.load(open('$W/data/index.json'))['records'])" 2>/dev/null \
      || { log "no $W/data: run data first"; exit 3; }
}

# `drafter train` with the build's recipe on every conversation answered, into folder $1 (more arguments
# after it), for TRAIN_BUDGET_S seconds of training, at most TRAIN_S of them in this call.
drafter_train() {
    local out=$1; shift
    python3 -m drafter train --target $W/target --data $W/data --out "$out" --batch-size "$TRAIN_BATCH" \
      --grad-accum "$GRAD_ACCUM" --length-group "$LENGTH_GROUP" --max-length 1024 --ttt-length 7 --lr "$LR" \
      --log-every 20 --device "$DEVICE" --time-budget "$TRAIN_BUDGET_S" --time-limit "$TRAIN_S" "$@"
}

# The drafter on every conversation answered, for TRAIN_BUDGET_S seconds of training (its cosine
# schedule spread over them: `drafter train --time-budget`), each call until TRAIN_S with a checkpoint.
# Once the budget is spent: export, return the drafter, then evaluate it.
train() {
    wheels
    n=$(records) || exit 3
    run=$W/run; resume=(); [ -d $run ] && resume=(--resume)
    [ -n "$INIT" ] && resume+=(--init "$INIT")
    [ "$SHARED_HEAD" = 1 ] && resume+=(--shared-head)   # the target's head
    [ -n "$INTERMEDIATE" ] && resume+=(--intermediate-size "$INTERMEDIATE")   # the drafter's MLP width
    # Segments that grow in place, for batches of ever-changing lengths: with them (and batches
    # padded to multiples of 64) a step takes 0.092 s, without them 0.4-1.1 s. Only for
    # the native in-loop trainer: vLLM's hidden-states connector refuses it in a capture process.
    export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
    log "train: $n conversations, ${TRAIN_BUDGET_S}s of training, at most ${TRAIN_S}s this call ${resume[*]}"
    drafter_train $run --save-every 200 "${resume[@]}" > $W/train.log 2>&1
    tail -1 $W/train.log | tee $W/train_state.json
    if ! grep -q '"finished": true' $W/train_state.json; then
        log "not finished: call train again"
        tar -C $W -czf "$OUT/train_partial.tgz" stages.log train_state.json train.log run/log.jsonl
        return
    fi
    rm -rf $W/drafter
    python3 -m drafter export $run $W/drafter --dtype bfloat16 >> $W/train.log 2>&1
    log "exported the drafter: returning it, then evals"
    tar -C $W -czf $W/drafter.tgz drafter stages.log train.log run/log.jsonl run/train_config.json \
      data_stats.json vocab.json
    give_back $W/drafter.tgz
    evals
}

# The new drafter (or the drafters named as arguments), and EVAL_DRAFTS beside it, on the four
# held-out sets at EVAL_STEPS.
evals() {
    wheels
    drafts=(); for d in "${@:-$W/drafter}" ${EVAL_DRAFTS//,/ }; do
        [ -f "$d/config.json" ] || { log "no drafter in $d: run train until it finishes"; exit 3; }
        drafts+=(--draft "$d")
    done
    log "evals: ${EVAL_SETS[*]} at steps $EVAL_STEPS: ${drafts[*]}"
    for set in "${EVAL_SETS[@]}"; do
        python3 -m drafter eval --target $W/target "${drafts[@]}" \
          --prompts shipped/smollm2/heldout/$set.jsonl --steps "$EVAL_STEPS" --max-tokens "$EVAL_TOKENS" \
          --limit "$EVAL_PROMPTS" --max-batch 256 --device "$DEVICE" --out $W/eval_$set.json \
          > $W/eval_$set.txt 2>> $W/eval.log &
    done
    wait; for set in "${EVAL_SETS[@]}"; do cat $W/eval_$set.txt; done
    log "packing"
    tar -C $W -czf $W/evals.tgz $(for set in "${EVAL_SETS[@]}"; do echo eval_$set.json eval_$set.txt; done) \
      eval.log stages.log
    give_back $W/evals.tgz
}

# Drafters on the first SIZES conversations, EPOCHS passes each, trained side by side, each then
# evaluated on the held-out chat prompts at steps 1..6 (shipped/smollm2/data_scaling.py). Whatever
# has finished by SCALING_S seconds comes back: a size cut short resumes in another call.
scaling() {
    wheels
    records > /dev/null || exit 3
    export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
    log "scaling: $SIZES conversations, $EPOCHS epochs each"
    timeout "$SCALING_S" python3 shipped/smollm2/data_scaling.py --target $W/target --data $W/data --sizes "$SIZES" \
      --epochs "$EPOCHS" --batch-size "$TRAIN_BATCH" --max-length 1024 --ttt-length 7 --lr "$LR" --save-every 200 \
      --export-dtype bfloat16 --jobs 4 --prompts shipped/smollm2/heldout/chat.jsonl --eval-prompts 0 \
      --max-tokens "$EVAL_TOKENS" --steps "$EVAL_STEPS" --device "$DEVICE" --work-dir $W/scaling \
      --out-dir $W/scaling_out > $W/scaling.log 2>&1
    log "scaling ended ($?)"; tail -8 $W/scaling.log
    tar -C $W -czf "$OUT/scaling.tgz" scaling.log stages.log $(cd $W && ls -d scaling_out scaling/*.json \
      scaling/*.log scaling/run_*/log.jsonl scaling/run_*/train_config.json 2>/dev/null)
}

# The capacity probe: one drafter per arm of ARMS, each WIDTH/VOCAB (the MLP's width,
# the draft vocabulary's size), from scratch on every conversation answered, with one recipe and one seed
# (so the same batches in the same order), trained side by side for TRAIN_BUDGET_S seconds each; then
# exported and evaluated beside each other. One call: TRAIN_S must cover the budget. Returns
# $OUT/capacity.tgz (logs) and evals.tgz.
capacity() {
    wheels
    n=$(records) || exit 3
    export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
    arms=(${ARMS//,/ }); names=()
    log "capacity: ${arms[*]} (MLP width/draft vocabulary) side by side, $n conversations, ${TRAIN_BUDGET_S}s each"
    for arm in "${arms[@]}"; do
        width=${arm%/*}; vocab=${arm#*/}; name=mlp${width}_vocab$vocab; names+=($name)
        vocab_file=$W/data/draft_vocab_$vocab.safetensors
        [ -f $vocab_file ] || python3 -m drafter vocab --data $W/data --size "$vocab" --target $W/target \
            --out $vocab_file > $W/vocab_$vocab.json
        drafter_train $W/$name --vocab $vocab_file --intermediate-size "$width" --save-every 100000 \
          > $W/train_$name.log 2>&1 &
    done
    wait
    for name in "${names[@]}"; do
        tail -1 $W/train_$name.log
        python3 -m drafter export $W/$name $W/drafter_$name --dtype bfloat16 >> $W/train_$name.log 2>&1
    done
    tar -C $W -czf "$OUT/capacity.tgz" stages.log data_stats.json $(cd $W && ls vocab*.json) \
      $(for name in "${names[@]}"; do echo train_$name.log $name/log.jsonl $name/train_config.json; done)
    evals $(for name in "${names[@]}"; do echo $W/drafter_$name; done)
}

case "${1:-}" in
    part) ls -l runs/gguf_parts ;;
    assemble) wheels; assemble ;;
    data) data ;;
    train) train ;;
    evals) evals ;;
    scaling) scaling ;;
    capacity) capacity ;;
    *) echo "usage: $0 part|assemble|data|train|evals|scaling|capacity" >&2; exit 2 ;;
esac
