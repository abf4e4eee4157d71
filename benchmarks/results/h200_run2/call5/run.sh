#!/bin/bash
# Fifth device call (one H200): HTTP overhead again, now that the in-process measurement runs
# the same overlapped loop as the server's engine (the fourth call compared the server's
# overlapped loop with a step-by-step in-process loop, and HTTP came out "faster").
# Run from the repository root:  bash benchmarks/results/h200_run2/call5/run.sh   (writes $OUT/results.tgz)
set -u
source "$(dirname "$0")/../../device_call.sh"
device_call 170 http_overhead
{
    for s in 0 5; do
        run 50 python3 -m benchmarks.http_overhead --steps $s --num-prompts 8 --max-tokens 128 --name h200-steps$s \
            --out-dir $R/http_overhead
    done
    run 80 python3 -m benchmarks.http_overhead --compile --steps 0 --num-prompts 8 --max-tokens 128 \
        --name h200-compiled-steps0 --out-dir $R/http_overhead
} > $R/run.log 2>&1
tar czf $OUT/results.tgz -C $R .
grep -h -E "^===|SKIPPED|HTTP /|engine in|HTTP stream" $R/run.log | tail -n 30
