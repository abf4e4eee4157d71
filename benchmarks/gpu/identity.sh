#!/usr/bin/env bash
# Greedy texts of the native engine with and without speculation, in bfloat16 on one GPU, with and
# without deterministic mode: four engines (gpu-native; deterministic spec / plain, natural spec / plain)
# compile side by side, then each decodes 40 held-out chat prompts at 1 and 8 requests in flight, one
# engine at a time (benchmarks/gpu/texts.py native --turn); the pairs compared; bf16_rows beside them.
# Consecutive device calls on one warm machine, the tree slimmed (benchmarks/device_tree.sh slim):
#   bash benchmarks/gpu/identity.sh recv     # carried: .carry/bundle/part.00, then part.01
#   bash benchmarks/gpu/identity.sh start    # carried: part.02; install, start the engines (detached)
#   bash benchmarks/gpu/identity.sh wait [S] # up to S seconds (default 540) for the runs, then the GPU test
#                                            # (python3 -m pytest -m gpu tests/test_gpu_deterministic.py); into $OUT
set -uo pipefail
export PYTHONUNBUFFERED=1
source "$(dirname "$0")/native_bundle.sh"
DONE=$W/res/pytest.done   # the bundle: .carry/bundle/part.00 to .02, a call each

start() {
    bundle_install
    cd $SRC
    for run in "det_spec:true:" "det_plain:true:--no-spec" "nat_spec:false:" "nat_plain:false:--no-spec"; do
        IFS=: read -r name det flag <<< "$run"
        SPECSERVE_CACHE_DIR=$W/cache_$name setsid nohup python3 -m benchmarks.gpu.texts native --profile gpu-native \
            $flag --set native.deterministic=$det --concurrency 1,8 --turn $W/turn --out $W/res/$name.json \
            > $W/logs/$name.log 2>&1 &
        log "started $name (deterministic $det $flag)"
    done
    setsid nohup python3 -m benchmarks.gpu.bf16_rows --out $W/res/bf16_rows.json > $W/logs/bf16_rows.log 2>&1 &
    # the GPU test once the measured runs are over (it compiles two more engines)
    setsid nohup bash -c "until [ \$(ls $W/res/*-c8.json 2> /dev/null | wc -l) -ge 4 ]; do sleep 5; done
        python3 -m pytest -m gpu -q tests/test_gpu_deterministic.py > $W/logs/pytest.log 2>&1; touch $W/res/pytest.done" \
        > /dev/null 2>&1 &
}

pack() {
    cd $SRC
    for c in 1 8; do
        for mode in det nat; do
            [ -f $W/res/${mode}_spec-c$c.json ] && [ -f $W/res/${mode}_plain-c$c.json ] && PYTHONPATH=$SRC:$BASE \
                python3 -m benchmarks.gpu.texts compare $W/res/${mode}_spec-c$c.json $W/res/${mode}_plain-c$c.json \
                --out $W/res/compare_${mode}-c$c.json
        done
    done
    mkdir -p "$OUT" && cp -r $W/res $W/logs "$OUT"/
}

bundle_stages "$@"
