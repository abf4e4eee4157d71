#!/usr/bin/env bash
# Session 12's H200 calls (issue 19), one stage per call on one warm machine, carrying .whl:
#   bash benchmarks/results/h200_s12/run.sh sweep|chain7|costs|startup
# All on the Llama-3-8B shape (random bf16 weights), compiled, SYNTHETIC acceptance (conditional
# rates 0.9 / 0.86 / 0.8 / 0.75 / 0.7 / 0.65 / 0.6: accept length 3.29 at 3 steps, 4.42 at 7).
# sweep    plain vs chain 3 at concurrency 1..32, then the table it picks beside plain again (also
#          the first GPU run of the sweep's own-cache plain decoder: "plain again" must give
#          plain's tokens, 0 mismatches)
# chain7   plain vs chains 3 and 7 at batch 1 (256-token replies, as session 11's 8b stage)
# costs    benchmarks.step_costs --compile: the parts and whole cycles for the cost model
# startup  benchmarks.startup: cold and warm inductor cache, chain 3 up to batch 8, gaps after ready
# Sweeps resume (--resume) from runs/h200_s12 and share the inductor cache there: ignored files stay
# on a warm machine between calls, so a stage cut by the call's limit goes on in the next call.
set -uo pipefail
source benchmarks/results/device_call.sh
device_call "${LIMIT_S:-560}"
work_dir h200_s12
ACC=0.9,0.86,0.8,0.75,0.7,0.65,0.6
sweep() {  # name, cap, args...
    local name=$1 cap=$2; shift 2
    run "$cap" python3 -m benchmarks.batch_sweep --shape 8b --compile --device cuda --dtype bfloat16 --resume \
        --synthetic-accept $ACC --out $W/$name.json "$@" 2>&1 | grep -v Warning | tee -a "$OUT/$name.log"
    cp $W/$name.* "$OUT/" 2>/dev/null
}
case "$1" in
sweep)
    sweep sweep_8b 540 --steps 3 --concurrency 1,2,4,8,16,32 --num-prompts 16 --rounds 1 --max-tokens 128 ;;
chain7)
    sweep chain7_8b 540 --steps 3,7 --concurrency 1 --num-prompts 3 --rounds 1 --max-tokens 256 ;;
costs)
    run 540 python3 -m benchmarks.step_costs --shape 8b --compile --cycle-steps 3,7 --max-verify 8 --iters 30 \
        --device cuda --dtype bfloat16 --name llama8b_compiled --out-dir "$OUT" 2>&1 | grep -v Warning ;;
startup)
    run 540 python3 -m benchmarks.startup --shape 8b --draft random --steps 3 --max-batch 8 --concurrency 1,2,4,8 \
        --max-tokens 64 --cache-dir /tmp/inductor-startup --out "$OUT/startup_8b.json" 2>&1 | grep -v Warning \
        | tee "$OUT/startup.log" ;;
*) echo "stage: sweep | chain7 | costs | startup" >&2; exit 2 ;;
esac
echo "stage $1 done after $(( $(date +%s) - START ))s"
