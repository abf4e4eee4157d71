"""The aux hidden-state layer conventions — the one place that knows them.

Training (SpecForge / HF style) captures the OUTPUT of decoder layers `ids`
(HF `hidden_states[i + 1]`); default `[1, L//2 - 1, L - 4]`.
SGLang (Llama family) captures the INPUT of layer `id + 1` for configured ids, i.e. the
same tensors; default `[2, L//2, L - 3]` (input-of-layer ids) when none are configured.
SGLang's DeepSeek-V2/V3 model adds the +1 only when the first id is 1.
vLLM uses configured ids as given: the input of layer `id` = output of layer `id - 1`.
"""
from __future__ import annotations


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """Training-side default: outputs of layers [1, L//2 - 1, L - 4]."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def captured_layer_outputs(engine: str, configured_ids: list[int] | None, num_layers: int) -> list[int]:
    """Which decoder-layer OUTPUTS an engine captures for a drafter config's aux ids.

    engine: "training" (ours / SpecForge), "sglang-llama", "sglang-deepseek", "vllm".
    A returned -1 means the embedding output (input of layer 0).
    """
    if engine == "training":
        return list(configured_ids or default_aux_layer_ids(num_layers))
    if engine == "sglang-llama":
        if not configured_ids:
            return [2 - 1, num_layers // 2 - 1, num_layers - 3 - 1]
        return list(configured_ids)  # captures input of id + 1 == output of id
    if engine == "sglang-deepseek":
        if not configured_ids:
            return [2 - 1, num_layers // 2 - 1, num_layers - 3 - 1]
        if configured_ids[0] == 1:
            return list(configured_ids)          # +1 applied: input of id + 1 == output of id
        return [i - 1 for i in configured_ids]   # used as given: input of id == output of id - 1
    if engine == "vllm":
        return [i - 1 for i in (configured_ids or default_aux_layer_ids(num_layers))]
    raise ValueError(f"unknown engine {engine!r}")


def serving_ids_for(engine: str, trained_outputs: list[int]) -> list[int]:
    """The aux ids to put in a drafter config so `engine` captures `trained_outputs`."""
    if engine in ("sglang-llama", "training"):
        return list(trained_outputs)
    if engine == "sglang-deepseek":
        return list(trained_outputs) if trained_outputs[0] == 1 else [i + 1 for i in trained_outputs]
    if engine == "vllm":
        return [i + 1 for i in trained_outputs]
    raise ValueError(f"unknown engine {engine!r}")
