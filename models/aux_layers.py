"""The aux hidden-state layer conventions — the one place that knows them.

Training (SpecForge / HF style) captures the OUTPUT of decoder layers `ids`
(HF `hidden_states[i + 1]`); default `[1, L//2 - 1, L - 4]`.
SGLang (Llama family) captures the INPUT of layer `id + 1` for configured ids, i.e. the
same tensors; default `[2, L//2, L - 3]` (input-of-layer ids) when none are configured.
SGLang's DeepSeek-V2/V3 model adds the +1 only when the first id is 1 (SGLANG_DEEPSEEK_RULE).
vLLM uses configured ids as given: the input of layer `id` = output of layer `id - 1`; with
none configured it captures inputs of (2, L//2, L - 3), i.e. outputs of (1, L//2 - 1, L - 4).

Order: both engines concatenate the captured tensors in ascending layer order (SGLang walks
the layers; vLLM sorts the set of ids), so an fc trained on another order is permuted and a
duplicated id is captured once. We sort: training concatenates ascending, export reorders an
older run's fc blocks (exact), and the launch checks refuse what neither engine can feed.
"""
from __future__ import annotations

# SGLang 0.5.23 models whose set_eagle3_layers_to_capture adds +1 only when the first id is 1:
# deepseek_v2.py and its subclasses, kimi_k25.py (wraps DeepseekV3ForCausalLM), glm4_moe_lite.py.
SGLANG_DEEPSEEK_RULE = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM",
                        "GlmMoeDsaForCausalLM", "MistralLarge3ForCausalLM", "KimiK25ForConditionalGeneration",
                        "Glm4MoeLiteForCausalLM")
# Served by SGLang 0.5.23 but without EAGLE-3 aux capture (no set_eagle3_layers_to_capture).
SGLANG_NO_EAGLE3 = ("KimiVLForConditionalGeneration",)


def sglang_rule(architectures: list[str]) -> str:
    """"sglang-deepseek" or "sglang-llama" for a target's config.json architectures."""
    return "sglang-deepseek" if any(a in SGLANG_DEEPSEEK_RULE for a in architectures) else "sglang-llama"


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """Training-side default: outputs of layers [1, L//2 - 1, L - 4], ascending (tiny targets)."""
    return sorted([1, num_layers // 2 - 1, num_layers - 4])


def fed_in_order(ids: list[int]) -> list[int]:
    """What an engine concatenates for capture ids: each layer once, ascending."""
    return sorted(set(ids))


CAPTURE_ENGINES = ("native", "transformers", "training", "sglang-llama", "sglang-deepseek", "vllm")


def capture_convention(capture_engine: str) -> str:
    """The convention a drafter's ids had in the engine that captured its training features:
    ours and transformers (SpecForge's HF backend too) take ids as layer outputs ("training");
    SpecForge's SGLang backend captures what SGLang serves with the same ids."""
    if capture_engine not in CAPTURE_ENGINES:
        raise ValueError(f"unknown capture engine {capture_engine!r}: one of {', '.join(CAPTURE_ENGINES)}")
    return "training" if capture_engine in ("native", "transformers", "training") else capture_engine


def captured_layer_outputs(engine: str, configured_ids: list[int] | None, num_layers: int) -> list[int]:
    """Which decoder-layer OUTPUTS an engine captures for a drafter config's aux ids.

    engine: "training" (ours, transformers, SpecForge's HF backend: ids are layer outputs, in
    the order given), "sglang-llama", "sglang-deepseek", "vllm" (what the engine feeds the
    drafter, in its concatenation order). A returned -1 means the embedding output.
    """
    if engine == "training":
        return list(configured_ids or default_aux_layer_ids(num_layers))
    if not configured_ids:  # every engine's default: inputs of (2, L//2, L - 3)
        return fed_in_order([2 - 1, num_layers // 2 - 1, num_layers - 3 - 1])
    if engine == "sglang-llama":
        return fed_in_order(configured_ids)  # captures input of id + 1 == output of id
    if engine == "sglang-deepseek":
        if configured_ids[0] == 1:
            return fed_in_order(configured_ids)          # +1 applied: input of id + 1 == output of id
        return fed_in_order([i - 1 for i in configured_ids])   # as given: input of id == output of id - 1
    if engine == "vllm":
        return fed_in_order([i - 1 for i in configured_ids])
    raise ValueError(f"unknown engine {engine!r}")


def serving_ids_for(engine: str, trained_outputs: list[int]) -> list[int]:
    """The aux ids to put in a drafter config so `engine` captures `trained_outputs`, which
    must be ascending: both engines concatenate in that order (duplicates, which only tiny
    targets get by default, serve on the native engine alone; the launch check says so)."""
    if list(trained_outputs) != sorted(trained_outputs):
        raise ValueError(f"trained layer outputs {list(trained_outputs)} are not ascending: SGLang and vLLM "
                         f"concatenate {sorted(trained_outputs)}, so this fc would be fed permuted inputs "
                         f"(`drafter export` reorders the fc of such a run)")
    if engine == "sglang-deepseek" and trained_outputs[0] == 0:
        raise ValueError("SGLang's DeepSeek rule cannot capture layer 0's output first (id 1 adds +1, id 0 is "
                         "the embedding)")
    if engine in ("sglang-llama", "training"):
        return list(trained_outputs)
    if engine == "sglang-deepseek":
        return list(trained_outputs) if trained_outputs[0] == 1 else [i + 1 for i in trained_outputs]
    if engine == "vllm":
        return [i + 1 for i in trained_outputs]
    raise ValueError(f"unknown engine {engine!r}")


def layer_outputs_for(convention: str, ids: list[int], num_layers: int) -> list[int]:
    """The decoder-layer OUTPUTS that aux `ids` name in `convention`, ascending: "training"
    (ours, transformers: ids are outputs), or an engine's ids as its config would hold them
    ("vllm", "sglang-llama", "sglang-deepseek"). Refuses what no layer output is (the
    embedding, ids past the last layer), naming both conventions."""
    outputs = sorted(captured_layer_outputs(convention, list(ids), num_layers))
    bad = [o for o in outputs if not 0 <= o < num_layers]
    if bad:
        raise ValueError(f"aux ids {list(ids)} ({convention} convention) name layer outputs {outputs}; "
                         f"{bad} is not the output of one of the target's {num_layers} decoder layers "
                         f"(training-convention ids run 0..{num_layers - 1}; -1 would be the embedding)")
    return outputs


def last_layer_output(num_layers: int) -> int:
    """The last decoder layer's output (before the final norm): what the target's lm_head reads."""
    return num_layers - 1


def vllm_extract_ids(outputs: list[int], num_layers: int) -> list[int]:
    """`eagle_aux_hidden_state_layer_ids` for vLLM's `extract_hidden_states` method that capture
    the layer `outputs` and the last layer's output (vLLM id num_layers): each once, ascending,
    the order of the `hidden_states` axis vLLM writes."""
    wanted = sorted(set(outputs) | {last_layer_output(num_layers)})
    return fed_in_order(serving_ids_for("vllm", wanted))


def vllm_extract_rows(outputs: list[int], num_layers: int) -> tuple[list[int], int]:
    """Rows of vLLM's `hidden_states` [T, len(vllm_extract_ids), H] axis holding each of
    `outputs` (in their order) and the last layer's output."""
    ids = vllm_extract_ids(outputs, num_layers)
    row = {o: ids.index(serving_ids_for("vllm", [o])[0]) for o in {*outputs, last_layer_output(num_layers)}}
    return [row[o] for o in outputs], row[last_layer_output(num_layers)]


# How each convention reads a config's ids: named in every message about a mismatch.
CONVENTION_RULES = {
    "training": "training: ids are layer outputs",
    "sglang-llama": "SGLang's Llama rule: ids are layer outputs",
    "sglang-deepseek": "SGLang's DeepSeek rule: ids are layer outputs if the first id is 1, else inputs of layers",
    "vllm": "vLLM: ids are inputs of layers",
}


def conventions_reading(ids: list[int], num_layers: int, outputs: list[int]) -> list[str]:
    """The serving conventions in which config `ids` make the engine feed the layer `outputs`
    (which engine a drafter config was written for); empty when none does."""
    return [e for e in ("sglang-llama", "sglang-deepseek", "vllm")
            if captured_layer_outputs(e, list(ids), num_layers) == list(outputs)]
