#!/usr/bin/env bash
# The CPU steps table checked over HTTP (issue 19): cpu-default as shipped (float32, its steps
# per batch size) against the same profile with --no-spec and with 1, 2 or 3 steps at every
# batch size, at concurrency 1 and 8, nine held-out chat prompts (one per category; 18 requests
# at 8), 128 tokens, greedy. One server per side, sides one after another on an otherwise idle
# 2-core machine. SIDES picks some: SIDES="table plain" bash benchmarks/results/batch_sweep/cpu_http/run.sh;
# EXTRA adds flags to every side and TAG to the result names (EXTRA="--cpu-threads 2" TAG=_t2);
# PROFILE serves another profile (PROFILE=cpu-fast TAG=_fast).
#   bash benchmarks/results/batch_sweep/cpu_http/run.sh
set -euo pipefail
OUT=benchmarks/results/batch_sweep/cpu_http
PROMPTS=$OUT/prompts.jsonl
python3 -c "
import json
seen = set()
for line in open('shipped/smollm2/heldout/chat.jsonl'):
    r = json.loads(line)
    if r['category'] not in seen:
        seen.add(r['category']); print(json.dumps(r))" > $PROMPTS
PORT=8790
declare -A FLAGS=([table]="" [plain]="--no-spec" [chain1]="--steps 1" [chain2]="--steps 2" [chain3]="--steps 3")
for name in ${SIDES:-table plain chain1 chain2 chain3}; do
    flags=${FLAGS[$name]}
    name=$name${TAG:-}
    .venv/bin/specserve --profile ${PROFILE:-cpu-default} --port $PORT $flags ${EXTRA:-} > $OUT/server_$name.log 2>&1 &
    pid=$!
    .venv/bin/python -c "from benchmarks.server_proc import wait_healthy; wait_healthy('http://127.0.0.1:$PORT', timeout_s=600)"
    for c in 1 8; do
        .venv/bin/python -m benchmarks.serving --base-url http://127.0.0.1:$PORT --max-concurrency $c \
            --num-prompts $((c == 1 ? 9 : 18)) --prompts $PROMPTS --max-tokens 128 --warmup 2 \
            --out-dir $OUT --name ${name}_c$c > $OUT/${name}_c$c.txt
    done
    kill $pid; wait $pid || true
done
