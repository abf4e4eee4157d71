#!/usr/bin/env bash
# Our engine over HTTP against transformers `generate` on the same weights (issue 18: speculation
# >= 2x transformers), batch 1, greedy, the nine held-out chat prompts of ab_run.sh, 128 tokens.
# Our sides: servers all up at once, measured in turn (benchmarks/serving.py, concurrency 1), every
# one decoding on both cores (the faster setting on session 16's VM, ../batch_sweep/cpu_http/ab_s16/).
# transformers' sides: benchmarks/hf_generate.py in a fresh process each, float32 and bfloat16, static
# and dynamic cache, torch's default threads (2). The order is reversed every other round. A side's
# figure is its median per-reply decode rate, (tokens - 1) / (last - first token): the same measure on
# both engines (ab_summary.py METRIC=decode). transformers reads runs/smollm2-hf, the GGUF's weights
# written by `python -m drafter export-hf <gguf> runs/smollm2-hf`; our sides load the GGUF itself.
#   ROUNDS=2 bash benchmarks/results/cpu_real_pair/vs_transformers.sh
set -euo pipefail
OUT=benchmarks/results/cpu_real_pair/vs_transformers${TAG:-}
PROMPTS=benchmarks/results/batch_sweep/cpu_http/prompts.jsonl
HF=${HF:-runs/smollm2-hf}
OURS=(q4_chain1 q4_chain2 q4_plain fp32_chain2 fp32_plain)
THEIRS=(hf_bf16_static hf_bf16_dynamic hf_fp32_static hf_fp32_dynamic)
declare -A FLAGS=([q4_chain1]="--profile cpu-fast --steps 1" [q4_chain2]="--profile cpu-fast --steps 2"
                  [q4_plain]="--profile cpu-fast" [fp32_chain2]="--profile cpu-default"
                  [fp32_plain]="--profile cpu-default --no-spec")
mkdir -p $OUT
source benchmarks/results/batch_sweep/cpu_http/servers.sh
start_servers $OUT "--cpu-threads 2" "${OURS[@]}"
measure() {  # side round
    local side=$1 r=$2 name=${1}_r${2}_c1
    if [ -n "${PORT[$side]:-}" ]; then
        .venv/bin/python -m benchmarks.serving --base-url http://127.0.0.1:${PORT[$side]} --max-concurrency 1 \
            --num-prompts 9 --prompts $PROMPTS --max-tokens 128 --warmup 1 --out-dir $OUT --name $name > $OUT/$name.txt
    else
        IFS=_ read -r _ dtype cache <<< "$side"   # hf_<bf16|fp32>_<cache>
        dtype=$([ "$dtype" = bf16 ] && echo bfloat16 || echo float32)
        .venv/bin/python -m benchmarks.hf_generate --model $HF --prompts $PROMPTS --num-prompts 9 --max-tokens 128 \
            --dtype $dtype --cache $cache --out $OUT/$name.json 2>/dev/null | tee $OUT/$name.txt
    fi
    echo "round $r $side: $(python3 -c "import json; print(round(json.load(open('$OUT/$name.json'))['summary']['decode_tok_s']['median'], 1))") tok/s per reply"
}
SIDES=("${OURS[@]}" "${THEIRS[@]}")
for r in $(seq 1 ${ROUNDS:-2}); do
    order=("${SIDES[@]}")
    [ $((r % 2)) = 0 ] && order=($(printf '%s\n' "${SIDES[@]}" | tac))
    for side in "${order[@]}"; do measure $side $r; done
done
for base in "${THEIRS[@]}" fp32_plain q4_plain; do  # summary_<base>_decode.md: every side against that one
    BASE=$base CONC=1 METRIC=decode .venv/bin/python benchmarks/results/batch_sweep/cpu_http/ab_summary.py $OUT "${SIDES[@]}" > /dev/null
done
