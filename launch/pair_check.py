"""Start-up checks: the drafter fits its target (from the two config.json files only), and the
checkpoint files are complete (config.json parses, safetensors headers parse and cover their
tensors).

No weights are loaded, so it runs before any engine process starts and works for SGLang
profiles (whose weights this process never sees). The size checks are engine.loading.check_pair's
own; the aux-layer check asks models.aux_layers what the serving engine captures for the
drafter's configured ids and compares it with the layer outputs training captured (recorded,
or what the recorded capture engine fed). Kimi-K2.5 (`KimiK25ForConditionalGeneration`, the
DeepSeek rule) keeps its LM config under text_config and ships INT4 compressed-tensors weights;
MLA drafters (`Eagle3DeepseekV2ForCausalLM`) and vLLM's `norm_before_residual` serve on SGLang or
vLLM, not on the native engine, which runs EAGLE-3.1's fc_norm and norm_output. A mismatch names
the convention the ids were written in and the one the serving engine reads them by (the reference
team's wiring bug); a drafter that records no training capture gets a CHECK where SGLang's rule
reads its ids as inputs of layers.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from models.aux_layers import SGLANG_NO_EAGLE3, sglang_rule
from models.eagle3_checkpoint import EAGLE31_OPTIONS, NATIVE_EAGLE31_OPTIONS
from models.hf_config import read_hf_config


class PairMismatch(ValueError):
    """The drafter does not fit the target; the message names both values and the files."""


class CheckpointError(ValueError):
    """A checkpoint file is missing or corrupt; the message names the file and the field."""


@dataclass
class TargetShape:
    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    architectures: list[str]


def read_config(path: str) -> dict:
    try:
        return read_hf_config(path)
    except ValueError as e:  # invalid JSON: a launch error like any other mismatch
        raise PairMismatch(str(e)) from e


def target_shape(cfg: dict, source: str) -> TargetShape:
    """Llama-family and DeepSeek/Kimi configs; multimodal ones keep the LM under text_config."""
    text = cfg.get("text_config") or cfg
    missing = [k for k in ("hidden_size", "vocab_size", "num_hidden_layers") if k not in text]
    if missing:
        raise PairMismatch(f"{source}: missing {missing} in the target config")
    return TargetShape(text["hidden_size"], text["vocab_size"], text["num_hidden_layers"],
                       list(cfg.get("architectures") or text.get("architectures") or []))


def sglang_convention(archs: list[str]) -> str:
    return sglang_rule(archs)


def quantization(cfg: dict) -> str | None:
    """"INT4 compressed-tensors, group 32"-style summary of a target's quantization_config."""
    q = cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config")
    if not q:
        return None
    method = q.get("quant_method", "?")
    for group in (q.get("config_groups") or {}).values():  # compressed-tensors
        w = group.get("weights") or {}
        if w.get("num_bits"):
            return (f"{w.get('type', '?')}{w['num_bits']} {method}"
                    + (f", group {w['group_size']}" if w.get("group_size") else ""))
    return method


def weight_names(path: str) -> set[str]:
    """The tensor names in a checkpoint's safetensors files, read from their headers (none: empty).
    A file that is not a complete safetensors file raises check_safetensors' ValueError."""
    from models.safetensors_io import check_safetensors, weight_files

    try:
        files = weight_files(path)
    except FileNotFoundError:
        return set()
    return {name for f in files for name in check_safetensors(f)}


def check_pair_configs(model_path: str, draft_path: str, engine: str) -> str:
    """Raise PairMismatch when the drafter does not fit; return a one-line summary when it does."""
    from engine.loading import check_pair
    from models.aux_layers import captured_layer_outputs
    from models.eagle3_checkpoint import ARCHITECTURE, config_from_hf, head_mismatch, is_mla_drafter

    t_file, d_file = Path(model_path) / "config.json", Path(draft_path) / "config.json"
    t_cfg, d_cfg = read_config(model_path), read_config(draft_path)
    t = target_shape(t_cfg, str(t_file))
    try:
        d = config_from_hf(d_cfg, str(d_file))
    except ValueError as e:
        raise PairMismatch(str(e)) from e
    try:
        names = weight_names(draft_path)
    except ValueError:   # a broken file: check_checkpoint_files names it, with the setting that gave the path
        names = set()
    mismatch = head_mismatch(d_cfg, names) if names else None   # a config-only shape has no weights to check
    if mismatch:
        raise PairMismatch(f"{draft_path}: {mismatch}")
    try:
        check_pair(SimpleNamespace(config=t), SimpleNamespace(config=d), draft_path)
    except ValueError as e:
        raise PairMismatch(f"{e} (target: {t_file})") from e
    mla = is_mla_drafter(d_cfg)
    quant = quantization(t_cfg)
    summary = (f"drafter fits target: hidden {t.hidden_size}, vocab {t.vocab_size}, "
               f"aux layer outputs {d.aux_layer_ids} of {t.num_hidden_layers} layers"
               + (", MLA drafter" if mla else "") + (f", target weights {quant}" if quant else ""))
    if engine == "vllm":
        trained = trained_outputs(d_cfg, t.num_hidden_layers)
        return summary + "; " + vllm_feed(trained if trained is not None else d.aux_layer_ids,
                                          t.num_hidden_layers, d_file)
    if engine != "sglang":
        if mla:
            raise PairMismatch(f"{d_file}: an MLA drafter ({d_cfg['architectures'][0]}) serves on SGLang or vLLM; "
                               f"the native engine runs {ARCHITECTURE} drafters only")
        options = [k for k in EAGLE31_OPTIONS if d_cfg.get(k) and k not in NATIVE_EAGLE31_OPTIONS]
        if options:
            raise PairMismatch(f"{d_file}: EAGLE-3.1 options {options} serve on vLLM; the native engine runs "
                               f"{list(NATIVE_EAGLE31_OPTIONS)} only")
        return summary
    no_eagle3 = [a for a in t.architectures if a in SGLANG_NO_EAGLE3]
    if no_eagle3:
        raise PairMismatch(f"{t_file}: SGLang 0.5.23 has no EAGLE-3 for {no_eagle3[0]} (its model captures no "
                           f"aux hidden states); serve it without speculation")
    conv = sglang_convention(t.architectures)
    configured = (d_cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    trained = trained_outputs(d_cfg, t.num_hidden_layers)
    captured = captured_layer_outputs(conv, configured, t.num_hidden_layers)
    if trained is not None and list(captured) != list(trained):
        why = "re-export the drafter for " + conv
        if list(trained) != sorted(trained):
            why = ("its fc expects them in that order but SGLang concatenates in ascending layer order; "
                   "`drafter export` reorders the fc")
        elif len(set(trained)) < len(trained):
            why = "SGLang captures a layer once, so a duplicated layer cannot be fed; serve it on the native engine"
        else:
            why = wiring_fix(configured, trained, conv, t.num_hidden_layers)
        raise PairMismatch(
            f"{d_file}: eagle_aux_hidden_state_layer_ids {configured} make SGLang ({conv}, target "
            f"{t_file}) capture the outputs of layers {captured}, but the drafter was trained on the "
            f"outputs of layers {trained}; {why}")
    vllm = captured_layer_outputs("vllm", configured, t.num_hidden_layers)
    line = summary + (f"; SGLang ({conv}) captures outputs of layers {captured} (vLLM would feed {vllm}"
                      f"{'' if vllm == captured else ': different layers'})")
    if trained is None and configured and list(captured) != sorted(configured):
        from models.aux_layers import serving_ids_for
        line += (f"; CHECK: the drafter records no training capture, and {conv} does not read these ids as layer "
                 f"outputs: trained on the outputs of layers {sorted(configured)} (transformers, SpecForge's HF "
                 f"backend) it needs ids {serving_ids_for(conv, sorted(configured))} here; trained through SGLang "
                 f"itself (SpecForge's SGLang backend) it fits as it is")
    return line


def wiring_fix(configured: list[int] | None, trained: list[int], serving: str, num_layers: int) -> str:
    """The reference team's wiring bug, explained: which convention the configured ids were
    written in, which one the serving engine reads them by, and the ids it needs instead."""
    from models.aux_layers import CONVENTION_RULES, conventions_reading, serving_ids_for

    written = conventions_reading(configured or [], num_layers, trained) if configured else []
    origin = (f"the ids are written for {' / '.join(written)} ({CONVENTION_RULES[written[0]]})" if written
              else "no engine's convention reads these ids as the trained layers")
    try:
        ids = serving_ids_for(serving, trained)
        fix = f"re-export with `drafter export RUN OUT --serving-engine {serving}` (ids {ids})"
    except ValueError as e:
        fix = f"no {serving} ids capture them ({e})"
    return f"{origin}, but this target takes {serving} ({CONVENTION_RULES[serving]}); {fix}"


def trained_outputs(d_cfg: dict, num_layers: int) -> list[int] | None:
    """The layer outputs a drafter was trained on: recorded, or what its recorded capture engine
    fed for its configured ids (SpecForge's SGLang backend); None when it records neither."""
    from models.aux_layers import capture_convention, captured_layer_outputs

    configured = (d_cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    ours = d_cfg.get("specserve") or {}
    trained = ours.get("trained_aux_layer_outputs")
    if trained is None and ours.get("capture_engine"):
        trained = captured_layer_outputs(capture_convention(ours["capture_engine"]), configured, num_layers)
    return trained


def vllm_feed(trained: list[int], num_layers: int, d_file: Path) -> str:
    """What vLLM feeds a drafter served through its vLLM copy (ids = trained outputs + 1, as
    launch/vllm_drafter.py writes them); PairMismatch when no ids can feed what training captured."""
    from models.aux_layers import captured_layer_outputs, serving_ids_for

    try:
        served = serving_ids_for("vllm", trained)
    except ValueError as e:
        raise PairMismatch(f"{d_file}: {e}") from e
    fed = captured_layer_outputs("vllm", served, num_layers)
    if fed != list(trained):
        raise PairMismatch(f"{d_file}: trained on the outputs of layers {trained}, but vLLM captures each layer "
                           f"once and would feed {fed}; serve it on the native engine")
    return f"vLLM gets aux ids {served} (inputs of layers) and feeds the outputs of layers {fed}"


def check_checkpoint_files(model_path: str, draft_path: str | None) -> str:
    """Raise CheckpointError unless the target (and drafter) directories hold a readable
    config.json with the fields serving needs and complete safetensors files (headers only:
    seconds even for a sharded 1 TB checkpoint), or a complete GGUF file for the target.
    Returns a one-line summary."""
    from models.eagle3_checkpoint import config_from_hf
    from models.gguf import gguf_file, read_checked_header
    from models.safetensors_io import check_safetensors, weight_files

    parts = []
    for role, path in (("target", model_path), ("drafter", draft_path)):
        if path is None:
            continue
        try:
            cfg = read_config(path)
            gguf = gguf_file(path)
            source = str(gguf or Path(path) / "config.json")
            if role == "target":
                target_shape(cfg, source)
            else:
                config_from_hf(cfg, source)
            if gguf is not None:  # the header check finds truncated tensor data too
                files, tensors = [gguf], len(read_checked_header(gguf).tensors)
            else:
                files = weight_files(path)
                tensors = sum(len(check_safetensors(f)) for f in files)
        except (ValueError, FileNotFoundError) as e:  # PairMismatch is a ValueError
            raise CheckpointError(f"{role} checkpoint: {e}") from e
        parts.append(f"{role} {len(files)} file{'s' if len(files) > 1 else ''}, {tensors} tensors")
    return "checkpoint files complete: " + ", ".join(parts)
