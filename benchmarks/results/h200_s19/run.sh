#!/usr/bin/env bash
# Session 19's H200 calls (issue 19), one stage per call on one warm machine. The tree is slimmed
# (benchmarks/device_tree.sh slim) and every call carries .whl:
#   bash benchmarks/results/h200_s19/run.sh part     # carries runs/gguf_parts/part.00
#   bash benchmarks/results/h200_s19/run.sh prefill  # carries part.01: GGUF -> HF target (sha256 checked);
#       the GPU prefill tests; prefill_profile.py compiled with the eager prefill (a cold start), with
#       the captured one (--prefill-graphs), then eager again (a start from a warm inductor cache)
#   bash benchmarks/results/h200_s19/run.sh pair     # carries shipped/smollm2/drafter/model.safetensors:
#       the pair at batch 1, compiled, chain 4 against plain, with --prefill-graphs, then without
#   bash benchmarks/results/h200_s19/run.sh conc     # carries the drafter too: plain and STEPS (default
#       2,4) at concurrency 1..32 and the table it picks (PREFILL_GRAPHS=1 adds --prefill-graphs); resumable
#   bash benchmarks/results/h200_s19/run.sh assemble # carries part.01: the target alone, for a machine that
#       went cold after `prefill` (part.01 and the drafter together exceed a call's 64 MiB)
# Session 19 ran part, prefill, pair, then (machine cold) part, assemble, `STEPS=4 PREFILL_GRAPHS=1 ... conc`.
# Everything lives under runs/ (kept on a warm machine between calls), with one inductor cache, so a
# stage cut by a call's limit goes on in the next call and later stages reuse earlier compiles.
set -uo pipefail
source benchmarks/results/device_call.sh
device_call "${LIMIT_S:-585}"
work_dir h200_s19
T=runs/smollm2/target
D=shipped/smollm2/drafter
sweep() {  # name, cap, args...
    local name=$1 cap=$2; shift 2
    run "$cap" python3 -m benchmarks.batch_sweep --model $T --draft $D --compile --device cuda \
        --dtype bfloat16 --resume --out $W/$name.json "$@" 2>&1 | grep -v Warning | tee -a "$OUT/$name.log"
    cp $W/$name.* "$OUT/" 2>/dev/null
}
profile() {  # name, args...
    local name=$1; shift
    run 200 python3 benchmarks/results/h200_s18/prefill_profile.py --model $T --compile --out "$OUT/$name" "$@" \
        2>&1 | grep -v Warning > "$OUT/$name.log"
    grep -E "engine ready|repeat|one prefill" "$OUT/$name.log"
}
case "$1" in
part) ls -l runs/gguf_parts ;;
assemble) bash shipped/smollm2/gpu_build.sh assemble 2>&1 | tail -3 ;;
prefill)
    bash shipped/smollm2/gpu_build.sh assemble 2>&1 | tail -3
    run 120 python3 -m pytest -m gpu tests/test_gpu.py -k prefill -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.txt" | tail -3
    profile eager_cold
    profile graphs --prefill-graphs
    profile eager_warm ;;
pair)
    P="--steps 4 --concurrency 1 --num-prompts 12 --rounds 1 --max-tokens 256"
    sweep pair_graphs 400 $P --prefill-graphs
    sweep pair_eager 400 $P ;;
conc)
    sweep conc${TAG:-} 585 --steps ${STEPS:-2,4} --concurrency 1,2,4,8,16,32 --num-prompts 32 --rounds 2 --max-tokens 128 \
        ${PREFILL_GRAPHS:+--prefill-graphs} ;;
*) echo "stage: part | prefill | pair | conc | assemble" >&2; exit 2 ;;
esac
echo "stage $1 done after $(( $(date +%s) - START ))s"
