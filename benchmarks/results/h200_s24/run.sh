#!/usr/bin/env bash
# Session 24's H200 calls (issues 18 and 19), one stage per call on one warm machine; the tree is slimmed
# (benchmarks/device_tree.sh slim), every call carries .whl, and h200_s19's `part` and `assemble` come first.
#   bash benchmarks/results/h200_s24/run.sh tests    # the GPU tests without compile, and the compiled catch-up
#   bash benchmarks/results/h200_s24/run.sh batch1   # carries the drafter: the pair at batch 1, compiled on every
#       side, plain against chains of STEPS (default 4,5) and TREES (none), on PROMPTS (default chat; humaneval
#       for code); resumable
#   bash benchmarks/results/h200_s24/run.sh conc     # carries the drafter: compiled at 16 and 32 requests (plain,
#       chain 4, 0 steps, then the table it picks), the sweep session 23 left unrun; resumable
#   bash benchmarks/results/h200_s24/run.sh costs    # carries the drafter: step_costs of the pair compiled (cycles of
#       STEPS, default 4,5), and the cost model validated against SWEEP (default batch1's chat sweep)
#   bash benchmarks/results/h200_s24/run.sh pack     # the inductor cache into $OUT, four pieces from FIRST (default 0)
#   bash benchmarks/results/h200_s24/run.sh startup  # benchmarks.startup, cold then warm, up to MAX_BATCH (default
#       32) rows: plain decoding, or with DRAFT=1 (carries the drafter) chain STEPS (default 4); its cache is
#       CACHE (default $W/startup_inductor, emptied first; $W/inductor warms the sweeps' plain compile) (session 26 on);
#       SAVED_STEPS=1 saves the compiled decode steps there and the warm start loads them (session 27 on)
# WORK names the work folder under runs/ (default h200_s24; session 25 ran these stages as h200_s25), TESTS_K
# the tests' -k expression (default "not compiled or deferred"), TESTS_S their time limit (default 300; session 29
# on); NO_COMPILE_PREFILL=1 captures the sweeps' prefills uncompiled (session 26 on); ATTENTION sets the attention
# form (batch_sweep --attention; batch1's name gains _$ATTENTION; session 36 on): sdpa in session 36, when compiled
# CUDA steps wrote attention out by default; auto writes it out from session 37 on, when SDPA is the default.
# REPEATS=3 makes each sweep row the median of three runs (session 24 ran one). Sweeps and the inductor cache
# live under runs/h200_s24 (kept on a warm machine), so a cut stage goes on in the
# next call and later stages reuse earlier compiles; from session 28 the sweeps also save their compiled decode
# steps there (--compile-cache), so a resumed sweep loads them instead of tracing and compiling again.
set -uo pipefail
source benchmarks/results/device_call.sh
device_call "${LIMIT_S:-585}"
work_dir "${WORK:-h200_s24}"
T=runs/smollm2/target
D=${DRAFT_DIR:-shipped/smollm2/drafter}  # DRAFT_DIR: another drafter (session 27: one trained in an earlier call)
sweep() {  # name, args...
    local name=$1; shift
    run 585 python3 -m benchmarks.batch_sweep --model $T --draft $D --compile --device cuda --dtype bfloat16 \
        --resume --out $W/$name.json --max-tokens 256 --prefill-graphs --repeats "${REPEATS:-1}" \
        --compile-cache $W/compiled_steps \
        ${NO_COMPILE_PREFILL:+--no-compile-prefill} ${ATTENTION:+--attention $ATTENTION} "$@" 2>&1 \
        | grep -v Warning | tee -a "$OUT/$name.log"
    cp $W/$name.* "$OUT/" 2>/dev/null
}
case "$1" in
tests)
    run "${TESTS_S:-300}" python3 -m pytest -s -m gpu tests/test_gpu.py -k "${TESTS_K:-not compiled or deferred}" \
        -p no:cacheprovider \
        2>&1 | tee "$OUT/gpu_tests.txt" | tail -3 ;;
batch1)
    P=${PROMPTS:-chat}
    sweep batch1_$P${ATTENTION:+_$ATTENTION} --prompts shipped/smollm2/heldout/$P.jsonl --steps "${STEPS:-4,5}" --trees "${TREES:-}" \
        --concurrency 1 --num-prompts 12 --rounds 1 ;;
conc)
    sweep conc --steps 4 --concurrency "${CONC:-16,32}" --num-prompts 16 --rounds 3 ;;
costs)
    [ -f $W/costs.json ] || run 400 python3 -m benchmarks.step_costs --model $T --draft $D --compile \
        --cycle-steps "${STEPS:-4,5}" --ref-steps 4 --device cuda --dtype bfloat16 --name costs --out-dir $W 2>&1 \
        | grep -v Warning | tee -a "$OUT/costs.log"
    S=${SWEEP:-$W/batch1_chat.json}
    [ -f $S ] && [ -f $W/costs.json ] && run 60 python3 -m benchmarks.cost_model \
        --sweep $S --validate $W/costs.json --name smollm2_compiled --out-dir "$OUT" 2>&1 | tail -20
    cp $W/costs.* "$OUT/" 2>/dev/null ;;
startup)
    name=startup_${DRAFT:+chain${STEPS:-4}_}b${MAX_BATCH:-32}${NO_COMPILE_PREFILL:+_eager_prefill}${SAVED_STEPS:+_saved_steps}
    run 585 python3 -m benchmarks.startup --model $T ${DRAFT:+--draft $D --steps ${STEPS:-4}} \
        --max-batch "${MAX_BATCH:-32}" --prefill-graphs ${NO_COMPILE_PREFILL:+--no-compile-prefill} ${SAVED_STEPS:+--saved-steps} \
        --concurrency 1,2,16,32 --cache-dir "${CACHE:-$W/startup_inductor}" --out $W/$name.json 2>&1 \
        | grep -v Warning | tee -a "$OUT/$name.log"
    cp $W/$name.* "$OUT/" 2>/dev/null ;;
pack) pack_inductor "${FIRST:-0}" ;;   # the cache the stages above left (a next session carries it: device_call.sh)
*) echo "stage: tests | batch1 | conc | costs | pack | startup" >&2; exit 2 ;;
esac
echo "stage $1 done after $(( $(date +%s) - START ))s"
