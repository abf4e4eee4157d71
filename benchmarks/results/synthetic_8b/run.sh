#!/usr/bin/env bash
# One H200 device call (issue 19): the Llama-3-8B shape with random bf16 weights, compiled, batch 1,
# SYNTHETIC acceptance (BatchDecoder.use_synthetic_acceptance): per-position rates
# 0.9, 0.86, 0.8, 0.75, 0.7, 0.65, 0.6 give an expected accept length of 3.29 at 3 steps and
# 4.42 at 7. Plain compiled decoding and both chains in one run, 3 random prompts of 128
# tokens, 256 new tokens each. Carried: .whl (gguf), runs/clean (the committed engine/ drafter/
# models/ benchmarks/, copied over the tree sent). Writes $OUT/synthetic_8b.{json,log}.
set -uo pipefail
[ -d runs/clean ] && cp -r runs/clean/. .
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
# (Ran as benchmarks.engine_speed --steps 0,3,7 ... --json; folded into batch_sweep in f880bc2.)
timeout "${LIMIT_S:-430}" python3 -m benchmarks.batch_sweep --shape 8b --steps 3,7 --concurrency 1 --rounds 1 \
    --synthetic-accept 0.9,0.86,0.8,0.75,0.7,0.65,0.6 --compile --num-prompts 3 --max-tokens 256 \
    --max-context 1024 --device cuda --dtype bfloat16 --out "$OUT/synthetic_8b.json" 2>&1 | grep -v Warning | tee "$OUT/synthetic_8b.log"
