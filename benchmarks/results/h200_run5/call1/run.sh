#!/bin/bash
# Session 5, first device call (one H200): the new shipped target (32 layers, hidden 128: the
# defaults of shipped/train_target.py) and the first part of its drafter data.
# Run from the repository root, carrying runs/shipped/{corpus.jsonl.gz,tokenizer,manifest.json,train_prompts.jsonl}:
mkdir -p $OUT && bash shipped/gpu_build_target.sh target > $OUT/call.log 2>&1
# (the script's defaults then: TRAIN_S=120 N_PROMPTS=16000 DATA_S=240; 4,630 conversations in the 240 s)
