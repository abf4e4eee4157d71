"""Large shapes served through vLLM at tensor parallel N with dummy weights, and one measured vLLM start.

The parent (benchmarks/nccl_sweep.py) writes a target and an EAGLE-3 drafter as config.json files only:
vLLM builds them with `load_format="dummy"` (random weights; the drafter's d2t stays zero, so draft id =
target id). The drafter is one Llama layer of the target's width in vLLM's aux-id convention (ids are
INPUTS of target layers: models/eagle3_checkpoint.config_to_hf). Shapes:
  8b        Llama-3.1-8B, whole (the 8B anchor)
  70b       Llama-3.1-70B, cut to the depth that fits the GPUs (`fit_layers`; the record says so)
  deepseek  DeepSeek-V3's MLA attention at reduced depth with dense MLPs in every layer: the GPU bundle
            (benchmarks/gpu/vllm_bundle.sh) drops vLLM's MoE ops and FlashMLA; vLLM picks another MLA
            backend. vLLM's CPU build runs MLA, but with EAGLE-3 only under VLLM_MLA_DISABLE=1.
  tiny      a 4-layer Llama for vLLM's CPU build (its attention needs head_dim 64).

Synthetic acceptance is vLLM's own benchmark option, no patch: speculative_config
`rejection_sample_method="synthetic"` with `synthetic_acceptance_rates`, the UNCONDITIONAL rate of each
position (the share of verifies whose first i+1 drafts are all accepted; non-increasing, one per
speculative token). CURVES hold them for 7 steps; a run with k steps takes the first k. vLLM's CPU
sampling refuses it (vllm/utils/cpu_triton_utils.py), so CPU runs verify for real (`--accept none`).

`python -m benchmarks.tensor_parallel SPEC.json` runs in vLLM's interpreter: one `LLM(**kwargs)`, then
per concurrency c: c random prompts at once, greedy, ignore_eos, timed at max_tokens 1 (prefill) and
N; step time = (t_N - t_1) / verify steps per request; spec counters from `LLM.get_metrics()`.
"""
from __future__ import annotations

import itertools
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "rms_norm_eps": 1e-5,
         "rope_theta": 500000.0, "max_position_embeddings": 8192, "tie_word_embeddings": False,
         "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2, "vocab_size": 128256, "head_dim": 128}
SHAPES = {
    "8b": {**LLAMA, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8},
    "70b": {**LLAMA, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
            "num_attention_heads": 64, "num_key_value_heads": 8},
    "deepseek": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_act": "silu",
                 "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61, "first_k_dense_replace": 61,
                 "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
                 "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc",
                 "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5,
                 "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
                 "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "head_dim": 64,
                 "vocab_size": 129280, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 8192,
                 "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1},
    "tiny": {**LLAMA, "vocab_size": 512, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
             "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "max_position_embeddings": 1024},
}
# The drafter's attention (DESIGN.md section 1: Kimi-K2.5's drafter is 64 heads of 128 on hidden 7168).
DRAFT_HEADS = {"deepseek": (64, 64, 128)}
DRAFT_VOCAB = {"8b": 32000, "70b": 32000, "deepseek": 32000, "tiny": 256}


def _marginal(conditional: list[float]) -> list[float]:
    return [round(math.prod(conditional[:i + 1]), 4) for i in range(len(conditional))]


# Unconditional per-position rates (vLLM's convention), 7 steps each; accept length at k steps = 1 + sum(first k).
CURVES = {
    # our engine's 8B synthetic run (benchmarks/results/2026-12-h200-8b-synthetic): conditional
    # 0.9 .. 0.6, accept length 3.29 at 3 steps, 4.42 at 7
    "8b": _marginal([0.9, 0.86, 0.8, 0.75, 0.7, 0.65, 0.6]),
    # the reference team's drafter: accept length 2.1 at 2 steps (2.32 at 3, like vLLM's published
    # K2.5 MLA drafter's 0.65 / 0.40 / 0.25)
    "reference": [0.7, 0.4, 0.22, 0.12, 0.065, 0.035, 0.02],
    # the public Kimi-K2 drafter (AQ-MedAI): 3.36 at 3 steps, 5.2 at 7 (its HumanEval / GSM8K figures)
    "kimi-k2": [0.87, 0.78, 0.71, 0.57, 0.49, 0.42, 0.36],
}


def accept_length(curve: list[float], steps: int) -> float:
    return 1.0 + sum(curve[:steps])


def layer_params(c: dict) -> int:
    h, inter = c["hidden_size"], c["intermediate_size"]
    if "kv_lora_rank" in c:  # MLA: q_a, q_b, kv_a, kv_b, o; a dense MLP
        heads, qk = c["num_attention_heads"], c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        attn = (h * c["q_lora_rank"] + c["q_lora_rank"] * heads * qk + h * (c["kv_lora_rank"] + c["qk_rope_head_dim"])
                + c["kv_lora_rank"] * heads * (c["qk_nope_head_dim"] + c["v_head_dim"]) + heads * c["v_head_dim"] * h)
    else:
        hd = c["head_dim"]
        attn = 2 * h * c["num_attention_heads"] * hd + 2 * h * c["num_key_value_heads"] * hd
    return attn + 3 * h * inter


def drafter_config(shape: str, target: dict) -> dict:
    """The EAGLE-3 drafter of the target's shape, vLLM's aux ids (inputs of layers 2, L/2, L-3 in
    SGLang's output ids, + 1)."""
    from models.eagle3 import Eagle3Config
    from models.eagle3_checkpoint import config_to_hf

    layers = target["num_hidden_layers"]
    heads, kv, hd = DRAFT_HEADS.get(shape, (target["num_attention_heads"], target["num_key_value_heads"],
                                            target["head_dim"]))
    aux = [1, layers // 2 - 1, layers - 4]  # vLLM captures each layer once: three distinct layers
    if not 0 <= aux[0] < aux[1] < aux[2]:
        aux = [0, 1, 2]
    cfg = Eagle3Config(hidden_size=target["hidden_size"], intermediate_size=target["intermediate_size"],
                       num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd,
                       vocab_size=target["vocab_size"], draft_vocab_size=DRAFT_VOCAB[shape],
                       target_hidden_size=target["hidden_size"], aux_layer_ids=aux, rope_theta=target["rope_theta"],
                       max_position_embeddings=target["max_position_embeddings"])
    return config_to_hf(cfg, "vllm")


def fit_layers(shape: str, tp: int, gpu_gib: float = 80.0, weight_share: float = 0.7) -> int:
    """The depth whose bf16 weights take at most `weight_share` of the GPUs' memory (the rest: KV
    cache, activations, graphs); the full depth where it fits. The drafter counts as one target layer,
    its fc, head and embedding."""
    c = SHAPES[shape]
    h, layer = c["hidden_size"], layer_params(c)
    fixed = 3 * c["vocab_size"] * h + layer + 3 * h * h + h * DRAFT_VOCAB[shape]
    budget = weight_share * tp * gpu_gib * 2 ** 30 / 2  # parameters
    return max(3, min(c["num_hidden_layers"], int((budget - fixed) // layer)))


def write_pair(shape: str, layers: int, root: Path) -> tuple[Path, Path]:
    """root/target and root/drafter, config.json each (dummy weights need nothing else)."""
    target = {**SHAPES[shape], "num_hidden_layers": layers}
    if "first_k_dense_replace" in target:
        target["first_k_dense_replace"] = layers
    out = []
    for name, cfg in (("target", target), ("drafter", drafter_config(shape, target))):
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        out.append(d)
    return out[0], out[1]


def capture_sizes(concurrency: list[int], steps: int) -> list[int]:
    """Full decode graphs for exactly the batches measured: c requests of steps + 1 tokens."""
    return sorted({c * (steps + 1) for c in concurrency})


# -- in vLLM's interpreter ------------------------------------------------------------------------
def _counters(llm) -> dict:
    """vLLM's spec-decode counters (drafts, draft_tokens, accepted_tokens, accepted_tokens_per_pos), as lists."""
    out: dict = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode_num"):
            k, v = m.name.removeprefix("vllm:spec_decode_num_"), m.values if hasattr(m, "values") else [m.value]
            out[k] = [a + b for a, b in itertools.zip_longest(out.get(k, []), v, fillvalue=0)]
    return out


def measure(spec: dict) -> dict:
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(**spec["kwargs"])
    ready_s = time.perf_counter() - t0
    rng = random.Random(0)
    n, steps = spec["max_tokens"], spec["steps"]

    def timed(prompts, tokens) -> float:
        t = time.perf_counter()
        llm.generate(prompts, SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0, detokenize=False),
                     use_tqdm=False)
        return time.perf_counter() - t

    rows = []
    for c in spec["concurrency"]:
        prompts = [{"prompt_token_ids": [rng.randrange(3, spec["vocab"]) for _ in range(spec["prompt_len"])]}
                   for _ in range(c)]
        timed(prompts, min(n, 16))  # warm-up
        one = statistics.median(timed(prompts, 1) for _ in range(spec["rounds"]))
        before = _counters(llm)
        full = statistics.median(timed(prompts, n) for _ in range(spec["rounds"]))
        after = _counters(llm)
        delta = {k: [a - b for a, b in itertools.zip_longest(v, before.get(k, []), fillvalue=0)]
                 for k, v in after.items()}
        drafts = delta.get("drafts", [0])[0]
        verifies = drafts / (c * spec["rounds"]) if steps and drafts else n - 1
        rows.append({"concurrency": c, "tok_s": c * n / full, "tok_s_per_request": n / full,
                     "step_ms": 1000.0 * (full - one) / verifies, "prefill_s": one, "total_s": full,
                     "accept_length": 1 + delta["accepted_tokens"][0] / drafts if drafts else None,
                     "accept_per_pos": [a / drafts for a in delta.get("accepted_tokens_per_pos", [])] if drafts
                     else None})
        print(json.dumps(rows[-1]), flush=True)
    import vllm
    return {"rows": rows, "ready_s": ready_s, "vllm": vllm.__version__}


if __name__ == "__main__":  # vLLM's engine core starts by spawn: the guard keeps it from re-running this
    job = json.loads(Path(sys.argv[1]).read_text())
    Path(job["out"]).write_text(json.dumps(measure(job)) + "\n")
