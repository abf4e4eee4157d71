#!/bin/bash
# Session 5, second device call (one H200): more drafter data (continuing call 1's answers),
# draft vocabulary, drafter training and export, held-out accept lengths on the GPU.
# Run from the repository root with call 1's build.tgz unpacked in runs/gpu_build/, carrying
# runs/shipped/train_prompts.jsonl, runs/gpu_build/target, runs/gpu_build/generated.jsonl:
DATA_S=140 DRAFT_S=250 DRAFT_STEPS=900 EVAL_S=70 bash shipped/gpu_build_target.sh drafter > $OUT/call.log 2>&1
