#!/usr/bin/env bash
# Session 33, call 4: does a warm start still tune its kernels with engine/torch_fixes.py? A random
# pair of SmolLM2's shape (no GGUF to carry), plain decoding, compiled, saved steps, up to MAX_BATCH
# rows (default 1), prefills captured uncompiled: cold, then warm (the call had to fit in what was
# left of the device time). DRAFT=1 adds a random drafter of that shape, chain STEPS (default 4): the
# speculative engine's start, in one call with nothing but .whl carried.
#   bash benchmarks/results/h200_s33/warm_tuning.sh     (carry .whl)
#   DRAFT=1 MAX_BATCH=16 LIMIT_S=580 bash benchmarks/results/h200_s33/warm_tuning.sh
set -uo pipefail
source benchmarks/results/device_call.sh
device_call "${LIMIT_S:-150}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
python3 -c "import torch; print(torch.__version__)" >> "$OUT/gpu.txt"
name=startup_fix_${DRAFT:+chain${STEPS:-4}_}b${MAX_BATCH:-1}
run "${LIMIT_S:-150}" python3 -m benchmarks.startup --shape smollm2 ${DRAFT:+--draft random --steps ${STEPS:-4}} \
    --max-batch "${MAX_BATCH:-1}" --prefill-graphs --no-compile-prefill --saved-steps --concurrency 1 \
    --cache-dir /tmp/s33_inductor --out "$OUT/$name.json" 2>&1 | grep -v Warning | tee "$OUT/$name.log"
