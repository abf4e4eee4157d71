"""A compiled plain step at one row with dynamo's guards checked on every call (as the engine runs it) and skipped
(torch.compiler.set_stance(skip_guard_eval_unsafe=True)), taking turns three times (session 37, AMD EPYC VM).

  PYTHONPATH=$PWD python benchmarks/results/cpu_real_pair/compiled_plain_profile_s37/guards.py > guards.txt
"""
import torch
from profile_steps import smollm2_and_prompt  # this folder's (python puts a script's folder on the path)

from benchmarks.step_costs import loop_step_ms
from engine.decoder import BatchDecoder

loaded, prompt = smollm2_and_prompt()
dec = BatchDecoder(loaded.target, None, None, 1, 4096, compile=True)
loop_step_ms(dec, prompt, 2)
for turn in range(3):
    a = loop_step_ms(dec, prompt, 20)
    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
        b = loop_step_ms(dec, prompt, 20)
    print(f"guards checked {a:.2f} ms | guards skipped {b:.2f} ms")
