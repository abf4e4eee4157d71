# Sourced by h200_runN/callM/run.sh: what every device call shares (the h200_run2 calls ran with
# these lines inline; folded here afterwards, with the union of their environment settings).
#   device_call BUDGET_S [RESULT_SUBDIRS...]   deadline, /tmp/r result tree, carried wheels, env
#   run CAP_S command...                       timeout min(CAP_S, time left before the deadline)
#   work_dir NAME                              W=runs/NAME (kept on a warm machine), its inductor cache, gpu.txt
device_call() {
    START=$(date +%s)
    DEADLINE=$((START + ${BUDGET_S:-$1})); shift
    R=/tmp/r; rm -rf $R; mkdir -p $R
    for d in "$@"; do mkdir -p "$R/$d"; done
    # Server-side wheels carried in .whl (fastapi, uvicorn, pydantic, openai, ...): none there.
    if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl > $R/pip.log 2>&1 || echo "wheel install failed" >> $R/pip.log
    fi
    export PYTHONPATH=/tmp/site:$PWD TORCHINDUCTOR_CACHE_DIR=/tmp/inductor NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
}

run() {
    local cap=$1; shift
    local left=$((DEADLINE - $(date +%s)))
    local t=$(( cap < left ? cap : left ))
    if [ "$t" -le 5 ]; then echo "SKIPPED (no time left): $*"; return; fi
    echo "=== [$(date +%T)] (limit ${t}s) $*"
    timeout "$t" "$@"
    echo "=== rc=$? after $(( $(date +%s) - START ))s"
}

work_dir() {
    # Ignored files stay on a warm machine between calls: a session's resumable sweeps and its inductor
    # cache live under runs/NAME, so a stage cut by a call's limit goes on in the next call.
    W=runs/$1; mkdir -p "$W"
    export TORCHINDUCTOR_CACHE_DIR=$PWD/$W/inductor
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
}
