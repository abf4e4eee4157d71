# The 0-draft server against --no-spec at 4 requests over HTTP, each sampled by py-spy for 12 s under
# load (pip install py-spy). README.md counts, in the two .raw files here, the samples whose stack
# holds a function. Session 32, AMD EPYC VM. Servers: ../cpu_http/servers.sh.
#   bash benchmarks/results/batch_sweep/zero_steps_s32/profile_c4.sh
set -euo pipefail
OUT=${OUT:-/tmp/zero_steps_profile}
mkdir -p $OUT
declare -A FLAGS=([table]="" [plain]="--no-spec")
source benchmarks/results/batch_sweep/cpu_http/servers.sh
start_servers $OUT "--profile cpu-default" table plain
declare -A PID=([table]=${pids[0]} [plain]=${pids[1]})
for side in table plain; do
    .venv/bin/python -m benchmarks.serving --base-url http://127.0.0.1:${PORT[$side]} --max-concurrency 4 \
        --num-prompts 18 --prompts benchmarks/results/batch_sweep/cpu_http/prompts.jsonl --max-tokens 128 \
        --warmup 1 --out-dir $OUT --name ${side}_c4 > $OUT/${side}_c4.txt &
    load=$!
    sleep 3
    .venv/bin/py-spy record --pid ${PID[$side]} --subprocesses --duration 12 --rate 200 --format raw \
        --output $OUT/$side.raw --nonblocking > /dev/null 2>&1 || true
    wait $load
    echo "$side c=4: $(python3 -c "import json; print(round(json.load(open('$OUT/${side}_c4.json'))['summary']['output_throughput'], 1))") tok/s"
done
