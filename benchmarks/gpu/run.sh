#!/usr/bin/env bash
# vLLM 0.33 beside the native engine on one GPU: SmolLM2-135M-Instruct and its EAGLE-3 drafter, bfloat16,
# in consecutive device calls on one warm machine (the tree slimmed: benchmarks/device_tree.sh slim).
# Every stage first moves what its call carried (.carry/gguf/part.NN, .carry/drafter/model.safetensors,
# .carry/vllm/vllm-bundle.tar.xz.NN and SHA256SUMS, .whl) to /root/stash, which outlives the call.
#
#   bash benchmarks/gpu/run.sh recv      # a call that only carries pieces
#   bash benchmarks/gpu/run.sh setup     # GGUF + drafter + .whl there: the HF folder (drafter export-hf), then
#                                        #   the native servers start compiling in the background
#   bash benchmarks/gpu/run.sh vllm      # every vLLM piece there: install (vllm_bundle.sh), then the pipeline
#                                        #   runs in the background (below)
#   bash benchmarks/gpu/run.sh wait [S]  # wait up to S seconds (default 560) for the pipeline; pack results into $OUT
#   bash benchmarks/gpu/run.sh extra     # after it: the native servers stop; eager native servers (--no-compile) and
#                                        #   vLLM EAGLE-3 with 3 and 5 tokens start; their greedy texts at 1 and 8
#                                        #   requests, and the sweep at 1 8 32 (eager: chat only) into $W/sweep2
#
# Servers (ports): native plain 8101 and chain 4 8102 as gpu-native serves them (compiled, --max-batch 32,
# --compile-max-batch 32, --max-context 2048, --no-deterministic: the setting the side-by-side record measured);
# our server on vLLM (profile gpu-vllm): plain 8201, EAGLE-3 8202.
# Pipeline: (a) vLLM's offline API, greedy, 40 held-out chat prompts one at a time, plain and EAGLE-3;
# (b) the same through our server on vLLM with the openai client; then, once the native servers are ready,
# greedy texts of every server at 1 and 8 requests; (c) benchmarks.serving on every server, one at a time
# (the others idle), concurrency 1 8 32 2 4 16, held-out chat and HumanEval; the table and plot.
# REPO: the carried working tree on the device, where .carry and .whl arrive (default: here). The stages run
# from a snapshot of one commit (`git archive`, carried once as .carry/src.tgz and unpacked to /root/src), so
# the code that runs is the commit's whatever else the working tree holds:
#   R=$PWD; mkdir -p /root/src; [ -f .carry/src.tgz ] && tar -xzf .carry/src.tgz -C /root/src
#   cd /root/src && REPO=$R SOURCE_COMMIT=<commit> bash benchmarks/gpu/run.sh <stage>
set -uo pipefail
export PYTHONUNBUFFERED=1
REPO=${REPO:-$PWD}
W=${W:-/root/w}
STASH=${STASH:-/root/stash}
SITE=${SITE:-/root/vllm-site}
BASE=/root/site-base   # the native server's wheels (.whl)
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
TARGET=$W/target
DRAFT=$W/drafter
CHAT=shipped/smollm2/heldout/chat.jsonl
HUMANEVAL=shipped/smollm2/heldout/humaneval.jsonl
CONC=${CONC:-1 8 32 2 4 16}
mkdir -p "$W/logs" "$W/res" "$W/sweep" "$STASH"
log() { echo "[$(date +%T)] $*" | tee -a "$W/logs/stages.log"; }

recv() {
    local c=$REPO/.carry
    if compgen -G "$c/gguf/part.*" > /dev/null; then mkdir -p $STASH/gguf && mv -f $c/gguf/part.* $STASH/gguf/; fi
    if [ -f $c/drafter/model.safetensors ]; then
        mkdir -p $STASH/drafter && mv -f $c/drafter/model.safetensors $STASH/drafter/
    fi
    OUTDIR=$c/vllm STASH=$STASH/vllm bash benchmarks/gpu/vllm_bundle.sh stash > /dev/null
    if [ -d $REPO/.whl ] && [ ! -f $BASE/.done ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $BASE \
            $REPO/.whl/*.whl && touch $BASE/.done
    fi
    log "stash: $(cd $STASH && find . -type f | sort | tr '\n' ' ')"
}

health() {  # port, seconds: wait until /health answers 200
    local t=0
    until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$1/health', timeout=5)" 2> /dev/null; do
        sleep 2; t=$((t + 2)); [ $t -ge "$2" ] && return 1
    done
}

native_server() {  # name port [flags...]
    local name=$1 port=$2; shift 2
    (export PYTHONPATH="$PWD:$BASE" SPECSERVE_CACHE_DIR=$W/cache_$name
     setsid nohup python3 -m launch.cli --profile gpu-native --model $TARGET --draft $DRAFT --port "$port" \
        --max-batch 32 --compile-max-batch 32 --max-context 2048 --no-deterministic "$@" \
        > "$W/logs/server_$name.log" 2>&1 &)
    log "native $name: port $port $*"
}

setup() {
    [ -f $STASH/gguf/part.00 ] && [ -f $STASH/gguf/part.01 ] && [ -f $STASH/drafter/model.safetensors ] \
        || { log "setup: GGUF pieces or the drafter not carried yet"; exit 3; }
    cat $STASH/gguf/part.0* > $W/model.gguf
    echo "$GGUF_SHA  $W/model.gguf" | sha256sum -c --quiet - || { log "GGUF sha256 mismatch"; exit 3; }
    mkdir -p $DRAFT && cp shipped/smollm2/drafter/config.json $DRAFT/ && cp $STASH/drafter/model.safetensors $DRAFT/
    [ -f $TARGET/config.json ] || PYTHONPATH="$PWD:$BASE" python3 -m drafter export-hf $W/model.gguf $TARGET \
        > $W/logs/export_hf.log 2>&1 || { log "export-hf failed"; tail -5 $W/logs/export_hf.log; exit 3; }
    log "target: $(ls $TARGET | tr '\n' ' ')"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $W/res/gpu.txt
    python3 -c "import torch; print('torch', torch.__version__)" | tee -a $W/res/gpu.txt
    native_server plain 8101 --no-spec
    native_server chain 8102
}

vllm_server() {  # name port [flags...]
    local name=$1 port=$2; shift 2
    (source $SITE/env.sh; export SPECSERVE_SMOLLM2_HF=$TARGET
     setsid nohup python3 -m launch.cli --profile gpu-vllm --draft $DRAFT --port "$port" "$@" \
        > "$W/logs/server_$name.log" 2>&1 &)
    log "vllm $name: port $port $*"
    health "$port" 300 || { log "vllm $name did not start"; tail -20 "$W/logs/server_$name.log"; return 1; }
    log "vllm $name ready"
}

texts() {  # out port concurrency [prompts]
    python3 -m benchmarks.gpu.texts client --base-url "http://127.0.0.1:$2" --concurrency "$3" --side "$1" \
        --prompts "${4:-$CHAT}" --out "$W/res/texts_$1.json" 2>&1 | tail -1 | tee -a "$W/logs/stages.log"
}

compare() {  # a b
    python3 -m benchmarks.gpu.texts compare "$W/res/$1.json" "$W/res/$2.json" --out "$W/res/same_$1__$2.json" \
        | tee -a "$W/logs/stages.log"
}

pipeline() {
    # shellcheck disable=SC1091
    source $SITE/env.sh
    log "pipeline: (a) vLLM offline"
    python3 -m benchmarks.gpu.texts offline --model $TARGET --draft $DRAFT --no-spec --out $W/res/offline_plain.json \
        > $W/logs/offline_plain.log 2>&1; tail -1 $W/logs/offline_plain.log | tee -a $W/logs/stages.log
    python3 -m benchmarks.gpu.texts offline --model $TARGET --draft $DRAFT --out $W/res/offline_eagle.json \
        > $W/logs/offline_eagle.log 2>&1; tail -1 $W/logs/offline_eagle.log | tee -a $W/logs/stages.log
    compare offline_plain offline_eagle
    log "pipeline: (b) our server on vLLM"
    vllm_server vllm_eagle 8202
    vllm_server vllm_plain 8201 --no-spec
    texts vllm_eagle_c1 8202 1; texts vllm_plain_c1 8201 1
    compare offline_eagle texts_vllm_eagle_c1
    compare offline_plain texts_vllm_plain_c1
    log "pipeline: waiting for the native servers"
    for p in 8101 8102; do health $p 900 || log "native server on $p not ready"; done
    nvidia-smi > $W/res/nvidia_smi_servers.txt 2>&1
    top -bn1 | head -25 > $W/res/top_idle.txt 2>&1
    log "pipeline: greedy texts at 1 and 8 requests"
    for c in 1 8; do
        texts native_plain_c$c 8101 $c; texts native_chain_c$c 8102 $c
        [ $c = 8 ] && { texts vllm_eagle_c8 8202 8; texts vllm_plain_c8 8201 8; }
        compare texts_native_plain_c$c texts_native_chain_c$c
    done
    compare texts_vllm_plain_c8 texts_vllm_eagle_c8
    compare texts_vllm_plain_c1 texts_native_plain_c1
    log "pipeline: (c) side by side"
    for c in $CONC; do   # one concurrency at a time, every side, so that a cut run keeps whole rows
        sweep $W/sweep $c "chat humaneval" native_plain:8101 native_chain:8102 vllm_plain:8201 vllm_eagle:8202
    done
    python3 -m benchmarks ab side-by-side $W/sweep --out $W/res/side_by_side 2>&1 | tee -a $W/logs/stages.log
    nvidia-smi > $W/res/nvidia_smi_end.txt 2>&1
    manifests
    log "pipeline done"
    touch $W/done
}

stop_ports() {  # the process groups (setsid) of the servers listening on these ports
    python3 - "$@" <<'EOF'
import os, signal, sys
import psutil
ports = {int(p) for p in sys.argv[1:]}
mine = {os.getpgid(p.pid) for p in [psutil.Process(), *psutil.Process().parents()]}
pids = {c.pid for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port in ports and c.pid}
for g in {os.getpgid(p) for p in pids} - mine:
    os.killpg(g, signal.SIGTERM)
EOF
}

sweep() {  # folder concurrencies sets sides(name:port ...)
    local out=$1 concs=$2 sets=$3; shift 3
    for c in $concs; do
        n=$(( c * 2 > 40 ? c * 2 : 40 ))
        for set in $sets; do
            for side in "$@"; do
                name=${side%%:*}; port=${side##*:}
                python3 -m benchmarks.serving --base-url http://127.0.0.1:$port --max-concurrency $c --num-prompts $n \
                    --prompts shipped/smollm2/heldout/$set.jsonl --max-tokens 256 --out-dir $out --name ${name}__${set}__c$c \
                    > $W/logs/$(basename $out)_${name}__${set}__c$c.log 2>&1 || log "sweep $name $set c$c failed"
            done
        done
    done
}

extra() {
    # shellcheck disable=SC1091
    source $SITE/env.sh
    stop_ports 8101 8102 8201
    sleep 8
    native_server eager_plain 8111 --no-compile --no-spec
    native_server eager_chain 8112 --no-compile
    vllm_server vllm_eagle3 8203 --steps 3
    vllm_server vllm_eagle5 8205 --steps 5
    health 8111 300; health 8112 300
    for c in 1 8; do
        texts eager_plain_c$c 8111 $c; texts eager_chain_c$c 8112 $c
        compare texts_eager_plain_c$c texts_eager_chain_c$c
    done
    compare texts_native_plain_c1 texts_eager_plain_c1; compare texts_vllm_plain_c1 texts_eager_plain_c1
    sweep $W/sweep2 "1 8 32" "chat humaneval" vllm_eagle3:8203 vllm_eagle5:8205
    sweep $W/sweep2 "1 8 32" chat native_plain_eager:8111 native_chain_eager:8112
    python3 -m benchmarks ab side-by-side $W/sweep $W/sweep2 --out $W/res/side_by_side_all 2>&1 | tee -a $W/logs/stages.log
}

manifests() {  # one per record; the source commit comes from the caller (no .git travels)
    python3 - <<EOF
from benchmarks.manifest import write_manifest
mode = "full CUDA graphs without torch.compile (compilation_config mode 0, cudagraph_mode FULL_DECODE_ONLY)"
common = dict(vllm="0.33.0", vllm_mode=mode, source_commit="${SOURCE_COMMIT:-}", tree="slimmed working tree")
claims = {
    "side_by_side": "vLLM 0.33 and the native engine side by side over HTTP on one GPU, SmolLM2-135M-Instruct "
                    "+ EAGLE-3, bf16, held-out chat and HumanEval, concurrency ${CONC// /,}",
    "texts": "vLLM's greedy texts through its offline API equal our server's on vLLM, and with EAGLE-3 equal "
             "plain decoding, on 40 held-out chat prompts in bf16",
}
for topic, claim in claims.items():
    write_manifest("$W/res/manifest_" + topic, claim, command="bash benchmarks/gpu/run.sh vllm", **common)
EOF
}

pack() {
    [ -n "${OUT:-}" ] || return 0
    cp $W/logs/stages.log "$OUT/" 2>/dev/null
    tar -czf "$OUT/results.tgz" -C $W res sweep logs 2>/dev/null
    ls -la "$OUT"
}

stage=${1:-}
recv
case "$stage" in
recv) ;;
setup) setup ;;
vllm)
    OUTDIR=$REPO/.carry/vllm STASH=$STASH/vllm SITE=$SITE bash benchmarks/gpu/vllm_bundle.sh install 2>&1 | grep -v Warning \
        | tee $W/logs/install.log | tail -8
    [ -f $SITE/env.sh ] || { log "vLLM install failed"; pack; exit 3; }
    cp benchmarks/gpu/run.sh $W/run.sh
    (REPO=$REPO setsid nohup bash $W/run.sh pipeline > $W/logs/pipeline.log 2>&1 &)
    log "pipeline started" ;;
pipeline) pipeline ;;
extra) extra; pack ;;
wait)
    t=0; limit=${2:-560}
    until [ -f $W/done ] || [ $t -ge "$limit" ]; do sleep 10; t=$((t + 10)); done
    tail -40 $W/logs/stages.log
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
    pack ;;
*) echo "stage: recv | setup | vllm | wait [SECONDS] | extra" >&2; exit 2 ;;
esac
