#!/bin/bash
# Session 5, fourth device call (one H200), CUDA graphs, no compile. Call 3's sweep decoded 128
# tokens per prompt whatever the target emitted: past <|im_end|> the target continues with text
# the drafter never trained on, so its accept length (2.88 at 5 steps on 8 prompts) was far below
# the held-out eval's (3.67 at 5 steps on 40 prompts, which ends each reply at EOS, as a server does).
# The in-process measurement now ends each reply at the target's EOS (--ignore-eos: the old way).
#   1. step sweep on the held-out eval's 40 prompts, ending at EOS (filed under h200-native)
#   2. the same prompts with --ignore-eos, for the side-by-side difference
# Run from the repository root:  bash benchmarks/results/h200_run5/call4/run.sh   (writes $OUT/results.tgz)
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 450 step_sweep
{
    run 250 python3 -m benchmarks.step_sweep --profile h200-native --max-steps 8 --trees '' --num-prompts 40 \
        --max-tokens 128 --repeats 2 --out-dir $R/step_sweep
    run 160 python3 -m benchmarks.step_sweep --name h200-native-ignore-eos --ignore-eos --max-steps 6 --trees '' \
        --num-prompts 40 --max-tokens 128 --repeats 1 --out-dir $R/step_sweep
} > $R/run.log 2>&1
echo "total $(( $(date +%s) - START ))s" >> $R/run.log
tar czf $OUT/results.tgz -C $R .
grep -h -E "^===|SKIPPED|Best|^\| [bc]|total" $R/run.log | tail -n 40
