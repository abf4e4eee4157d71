#!/usr/bin/env bash
# Seconds from launch to a healthy /health for cpu-default, each side started cold (an empty
# SPECSERVE_CACHE_DIR: product forms, step costs and any compile measured and made anew) and then warm
# (the same folder again), one server at a time, nothing else running. The engine's own lines on what it
# measured, compiled or loaded are kept beside the times (times.md). Sides: eager (--no-compile) and
# compiled (--compile, cpu-default's compiled steps up to 8 rows, saved under the cache folder).
#   OUT=benchmarks/results/2026-12-cpu-epyc-smollm2-start bash benchmarks/ab/start_times.sh
set -euo pipefail
: "${OUT:?OUT names the record folder to write}"
mkdir -p $OUT
source benchmarks/ab/servers.sh
declare -A SIDE_FLAGS=([eager]="--no-compile" [compiled]="--compile")
rows=()
for side in ${SIDES:-eager compiled}; do
    cache=$OUT/cache_$side; rm -rf $cache
    for start in cold warm; do
        log=$OUT/server_${side}_$start.log
        t0=$(date +%s.%N)
        SPECSERVE_CACHE_DIR=$PWD/$cache .venv/bin/specserve --profile cpu-default ${SIDE_FLAGS[$side]} --port 8799 > $log 2>&1 &
        pid=$!
        wait_up 8799 $pid 900
        s=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
        kill $pid; wait $pid 2> /dev/null || true
        echo "$side $start: healthy after $s s"
        rows+=("| $side | $start | $s | $(grep -Eo "(compiled decode steps|compiles in|steps per batch size).{0,90}" $log | tr '\n' ' ' | sed 's/|/\//g') |")
    done
    rm -rf $cache
done
{ echo "cpu-default, seconds from launch to healthy (\`OUT=$OUT bash $0\`, $(date -u +%F), $(nproc) cores)"; echo
  echo "| side | start | seconds | the engine's lines |"; echo "|---|---|---|---|"; printf '%s\n' "${rows[@]}"; } > $OUT/times.md
cat $OUT/times.md
.venv/bin/python -m benchmarks.manifest $OUT --claim "${CLAIM:-Seconds from launch to healthy of the cpu-default profile, eager and compiled, cold and warm}" \
    --command "OUT=$OUT bash $0"
