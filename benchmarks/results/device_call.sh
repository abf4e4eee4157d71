# Sourced by h200_runN/callM/run.sh: what every device call shares (the h200_run2 calls ran with
# these lines inline; folded here afterwards, with the union of their environment settings).
#   device_call BUDGET_S [RESULT_SUBDIRS...]   deadline, /tmp/r result tree, carried wheels, env
#   run CAP_S command...                       timeout min(CAP_S, time left before the deadline)
#   work_dir NAME                              W=runs/NAME (kept on a warm machine), its inductor cache, gpu.txt
#   pack_inductor                              the inductor cache into $OUT, for the next session to carry
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
    # A cold machine compiles for minutes (plain decoding at 16 rows 108 s, chain 4 161 s on the
    # H200, h200_s24/): a session that carries an earlier session's packed cache
    # (runs/inductor_pack/inductor.tgz.*, from pack_inductor) starts from it.
    if [ ! -d "$TORCHINDUCTOR_CACHE_DIR" ] && ls runs/inductor_pack/inductor.tgz.* >/dev/null 2>&1; then
        cat runs/inductor_pack/inductor.tgz.* | tar -xz -C "$W" && echo "inductor cache unpacked: $(du -sh "$W/inductor")"
    fi
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
}

pack_inductor() {  # [FIRST]
    # A call returns at most ~64 MiB: the cache, gzipped once into $W in pieces of 15 MiB, comes back
    # four pieces a call from piece FIRST (default 0; session 25's pack was 77 MB, five pieces: a
    # second call with FIRST=4 on the still-warm machine returns the rest). Locally:
    # mkdir -p runs/inductor_pack && cp /work/.device/N/inductor.tgz.* runs/inductor_pack/, then carry
    # runs/inductor_pack's pieces with calls that have room (the slimmed tree, .whl and the drafter take
    # ~32 MiB); pieces carried in earlier calls stay on a warm machine, as the GGUF's do.
    local first=${1:-0}
    ls "$W"/inductor.tgz.* >/dev/null 2>&1 || tar -cz -C "$W" inductor | split -b 15M -d -a 1 - "$W/inductor.tgz."
    ls "$W"/inductor.tgz.* | sed -n "$((first + 1)),$((first + 4))p" | xargs -r cp -t "$OUT"
    ls -l "$W"/inductor.tgz.*
}
