"""On a GPU, in bfloat16, as gpu-native serves: greedy output with speculation is the output without it.

The shipped SmolLM2 pair (the profile's model and drafter) decodes held-out chat prompts all at once
with different lengths (rows join and leave the batch), once with 4 draft steps and once without
speculation; deterministic mode (the profile's default) makes the two token-identical. Marked `gpu`:
`python3 -m pytest -m gpu tests/test_gpu_deterministic.py` on the device machine (compiling the
two engines' steps takes a few minutes).
"""
from __future__ import annotations

import pytest

from benchmarks.gpu.texts import CHAT, prompt_ids, read_prompts
from engine.loading import build_engine
from launch.engine_args import native_engine_args
from launch.profiles import Overrides, resolve
from models.tokenizer import load_tokenizer
from tests.engine_runs import greedy_ids

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(1200)
def test_speculation_changes_no_token_in_bfloat16():
    outputs = {}
    for no_spec in (False, True):
        args = native_engine_args(resolve("gpu-native", Overrides(no_spec=no_spec)).profile)
        assert args.deterministic and args.dtype == "bfloat16"
        tok = load_tokenizer(args.model)
        prompts = [prompt_ids(tok, r["messages"]) for r in read_prompts(CHAT, 16)]
        outputs[no_spec] = greedy_ids(build_engine(args), prompts, [64 + 8 * i for i in range(len(prompts))])
    assert outputs[False] == outputs[True]
