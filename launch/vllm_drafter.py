"""The drafter as vLLM gets it: which aux ids its config must carry, which layer outputs vLLM
then feeds it, and the copy made for vLLM at start-up.

Our drafters record the target layer OUTPUTS training captured (training-side ids); vLLM reads
`eagle_aux_hidden_state_layer_ids` as INPUTS of layers (= outputs + 1, models/aux_layers.py)
and refuses d2t/t2d for a full draft vocabulary, so the profile's drafter is served through a
copy made for vLLM (models.eagle3_checkpoint.vllm_drafter_dir) in a temporary folder removed at
exit. A drafter already exported for vLLM with those ids is served as it is.
"""
from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path

from models.aux_layers import captured_layer_outputs, serving_ids_for
from models.eagle3_checkpoint import config_from_hf


def trained(draft: str, num_layers: int) -> tuple[list[int], bool]:
    """(the layer outputs the drafter was trained on, whether it records them or its capture
    engine); without either, its ids are read as layer outputs (config_from_hf's assumption)."""
    from launch.pair_check import trained_outputs

    cfg = json.loads((Path(draft) / "config.json").read_text())
    known = trained_outputs(cfg, num_layers)
    if known is not None:
        return list(known), True
    return config_from_hf(cfg, str(Path(draft) / "config.json")).aux_layer_ids, False


def aux_plan(draft: str, num_layers: int) -> tuple[list[int], list[int], bool]:
    """(aux ids for vLLM's config, layer outputs vLLM will feed, whether the drafter records
    what training captured)."""
    outputs, recorded = trained(draft, num_layers)
    served = serving_ids_for("vllm", outputs)
    return served, captured_layer_outputs("vllm", served, num_layers), recorded


def needs_copy(draft: str, num_layers: int) -> bool:
    """Whether vLLM would capture other layers from the configured ids, or find d2t/t2d it refuses."""
    from launch.pair_check import weight_names

    cfg = json.loads((Path(draft) / "config.json").read_text())
    parsed = config_from_hf(cfg, str(Path(draft) / "config.json"))
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids != aux_plan(draft, num_layers)[0]:
        return True
    return parsed.draft_vocab_size == parsed.vocab_size and bool({"d2t", "t2d"} & weight_names(draft))


def vllm_copy(draft: str, num_layers: int) -> str:
    """The drafter folder to give vLLM: `draft` itself when it is vLLM's already, else a copy."""
    from models.eagle3_checkpoint import vllm_drafter_dir

    if not needs_copy(draft, num_layers):
        return draft
    out = Path(tempfile.mkdtemp(prefix="specserve-vllm-drafter-"))
    atexit.register(shutil.rmtree, out, True)
    return str(vllm_drafter_dir(draft, out, trained(draft, num_layers)[0]))
