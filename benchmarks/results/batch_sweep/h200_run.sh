#!/usr/bin/env bash
# One H200 device call of session 8 (issue 19), by stage; the machine keeps ignored files under
# runs/ while warm, so the SmolLM2 GGUF arrives in 6 pieces over consecutive calls and the
# inductor cache (runs/inductor) and a cut sweep (runs/sweep/*.partial.json) carry over.
#   bash benchmarks/results/batch_sweep/h200_run.sh check     # carried: .whl runs/clean runs/gguf_parts/part.00
#   bash ... piece                                             # carried: runs/gguf_parts/part.0N (N = 1..4)
#   bash ... sweep                                             # carried: runs/gguf_parts/part.05: assemble, sweep
#   bash ... resume | startup | synthetic7
set -uo pipefail
[ -d runs/clean ] && cp -r runs/clean/. .
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    2>/dev/null || true
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR="$PWD/runs/inductor"
GGUF=runs/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA=$(cat benchmarks/results/batch_sweep/gguf.sha256)
LIMIT=${LIMIT_S:-560}
SWEEP=(python3 -m benchmarks.batch_sweep --model "$GGUF" --draft shipped/smollm2/drafter --steps 1,2,3
       --concurrency 1,2,4,8,16,32 --num-prompts 32 --rounds 2 --max-tokens 128 --max-context 1024
       --device cuda --dtype bfloat16 --compile --resume --out runs/sweep/h200.json)
keep() { mkdir -p "$OUT/sweep"; cp runs/sweep/* "$OUT/sweep/" 2>/dev/null; ls runs/gguf_parts > "$OUT/parts.txt"; }
case "${1:-check}" in
  check)
    nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader | tee "$OUT/gpu.txt"
    timeout "$LIMIT" python3 -m pytest -q -m gpu tests/test_gpu.py -k "steps_table or (fp32 and not compiled)" \
        -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt"
    keep ;;
  piece) keep ;;
  sweep|resume)
    if [ "$1" = sweep ]; then
        mkdir -p runs/smollm2 runs/sweep
        cat runs/gguf_parts/part.0* > "$GGUF"
        echo "$GGUF_SHA  $GGUF" | sha256sum -c - | tee "$OUT/gguf_check.txt" || exit 3
    fi
    timeout "$LIMIT" "${SWEEP[@]}" 2>&1 | grep -v Warning | tee -a "$OUT/sweep.log"
    keep ;;
  startup)
    timeout "$LIMIT" python3 -m benchmarks.startup --model "$GGUF" --draft shipped/smollm2/drafter \
        --steps-by-batch "${TABLE:-1=2,32=1}" --max-batch 32 --concurrency 1,2,4,8,16,32 --max-tokens 64 \
        --cache-dir /tmp/inductor-startup --out "$OUT/startup/h200.json" 2>&1 | grep -v Warning | tee "$OUT/startup.log" ;;
  synthetic7)
    # (ran as benchmarks.engine_speed --steps 0,7 ... --json; folded into batch_sweep in f880bc2)
    timeout "$LIMIT" python3 -m benchmarks.batch_sweep --shape 8b --steps 7 --concurrency 1 --rounds 1 \
        --synthetic-accept 0.9,0.86,0.8,0.75,0.7,0.65,0.6 --compile --num-prompts 3 --max-tokens 256 \
        --max-context 1024 --device cuda --dtype bfloat16 --out "$OUT/synthetic_8b_7.json" 2>&1 \
        | grep -v Warning | tee "$OUT/synthetic_8b_7.log" ;;
esac
