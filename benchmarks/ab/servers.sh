# Sourced by run.sh: one specserve per side, all up together (an idle server waits on
# its engine's queue, so the sides not being measured cost nothing). They start one after another: a
# float32 CPU engine times its product forms at load (models/cpu_products.py), and two servers loading
# side by side can choose differently; cpu-default keeps the first server's choice in its tuning cache
# (native.tuning_cache) and the others read it.
#   start_servers OUT_DIR "FLAGS FOR ALL" SIDE...   side S gets FLAGS[S] too, and the environment ENVS[S]
#                                                   and the command CMDS[S] (default specserve) where set,
#                                                   port PORT[S] (8790 on); each healthy before the next
#                                                   starts (failing at once if it exits), stopped on exit
wait_up() {  # PORT PID SECONDS: /health answers 200, or fail when the server exits or time runs out
    local t=0
    until curl -sf http://127.0.0.1:$1/health > /dev/null; do
        kill -0 $2 2> /dev/null || { echo "the server on port $1 exited before it was healthy" >&2; return 1; }
        t=$((t + 1)); [ $t -lt $3 ] || { echo "the server on port $1 was not healthy in $3 s" >&2; return 1; }
        sleep 1
    done
}

start_servers() {
    local out=$1 common=$2 i=0 side; shift 2
    declare -gA PORT ENVS CMDS   # ENVS and CMDS keep what the caller set
    pids=()
    trap 'kill ${pids[*]} 2>/dev/null || true' EXIT
    for side in "$@"; do
        PORT[$side]=$((8790 + i)); i=$((i + 1))
        env ${ENVS[$side]:-} ${CMDS[$side]:-.venv/bin/specserve} $common ${FLAGS[$side]} --port ${PORT[$side]} > $out/server_$side.log 2>&1 &
        pids+=($!)
        wait_up ${PORT[$side]} $! 600 || { tail -5 $out/server_$side.log >&2; return 1; }
    done
    grep -Ho "product forms by row count.*" $out/server_*.log || true   # the float32 product forms each side chose
}
