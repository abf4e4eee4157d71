#!/usr/bin/env bash
# gpu-native serving at once (--no-compile-before-ready): eager steps from ready while a process of its own
# compiles, the compiled step swapped in while a client streams; then a restart over the same caches.
# benchmarks.startup as the CPU record ran it, here on one GPU. Consecutive device calls on one warm machine,
# the tree slimmed (benchmarks/device_tree.sh slim), the bundle carried as benchmarks/gpu/native_bundle.sh says:
#   bash benchmarks/gpu/first_minute.sh recv      # carried: .carry/bundle/part.00, then part.01
#   bash benchmarks/gpu/first_minute.sh start     # carried: part.02; install, start the run (detached)
#   bash benchmarks/gpu/first_minute.sh wait [S]  # up to S seconds (default 540) for it; results into $OUT
set -uo pipefail
export PYTHONUNBUFFERED=1
source "$(dirname "$0")/native_bundle.sh"
DONE=$W/res/done
RUN=(python3 -m benchmarks startup --server-args "--profile gpu-native --no-compile-before-ready" --clients 1
     --think 3 --cache-dir $W/cache --timeout 1200 --after 10 --out $W/res/swap.json)

start() {
    bundle_install
    cd $SRC
    echo "${RUN[*]}" > $W/res/command.txt
    setsid nohup bash -c "$(printf '%q ' "${RUN[@]}"); touch $DONE" > $W/logs/startup.log 2>&1 &
    log "started: ${RUN[*]}"
}

pack() { mkdir -p "$OUT" && cp -r $W/res $W/logs "$OUT"/; }

bundle_stages "$@"
