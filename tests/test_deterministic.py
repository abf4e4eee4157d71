"""Deterministic mode (native.deterministic): every decode step runs the target over max_batch rows
of the verify width, so in bfloat16 greedy output is the same with speculation and without.

On CPU, in bfloat16, the real shipped pair (SmolLM2-135M-Instruct and its drafter): held-out chat
prompts submitted together with different lengths (rows join and leave the batch), chain 4 against
no speculation (without deterministic mode these replies part in places). Its GPU twin, compiled
as gpu-native serves, is tests/test_gpu_deterministic.py.
"""
from __future__ import annotations

from benchmarks.gpu.texts import prompt_ids, read_prompts
from engine.config import SpecConfig
from engine.loading import NativeEngineArgs, build_engine
from models.model_source import resolve_model_path
from models.tokenizer import load_tokenizer
from tests.engine_runs import greedy_ids
from tests.test_smollm2 import DRAFTER, GGUF, HELDOUT


def chat_prompts(n: int) -> list[list[int]]:
    """The first n held-out chat prompts as the server renders them."""
    tok = load_tokenizer(resolve_model_path(GGUF))
    return [prompt_ids(tok, r["messages"]) for r in read_prompts(HELDOUT / "chat.jsonl", n)]


def test_speculation_changes_no_token_in_bfloat16():
    prompts = chat_prompts(6)
    lengths = [40 + 6 * i for i in range(len(prompts))]
    runs = {}
    for name, draft in (("speculative", str(DRAFTER)), ("plain", None)):
        args = NativeEngineArgs(model=str(resolve_model_path(GGUF)), draft=draft, spec=SpecConfig(steps=4),
                                device="cpu", dtype="bfloat16", max_batch=4, deterministic=True, verify_width=5)
        assert args.step_width == 5
        runs[name] = greedy_ids(build_engine(args), prompts, lengths)
    assert runs["speculative"] == runs["plain"]
