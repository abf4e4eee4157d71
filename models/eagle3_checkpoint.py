"""The EAGLE-3 checkpoint format read by SGLang (`LlamaForCausalLMEagle3`) and vLLM.

config.json is a one-layer Llama config with `draft_vocab_size` and `eagle_config`; the
safetensors file holds `midlayer.*`, `fc`, `norm`, `lm_head`, `d2t`, `t2d` and no embedding
(the frozen embedding comes from the target at load time). We also record, under
`specserve`, which target layer OUTPUTS training captured and through which engine
(`capture_engine`), so serving can be checked. A drafter whose draft vocabulary is the
target's carries no d2t/t2d: vLLM refuses them then, SGLang and our loader need none.
A drafter that borrows the target's lm_head (`shared_head`) carries no lm_head either, and its
config no `draft_vocab_size`: that absence is what makes SGLang load the target's head (with the
field, even at the full vocabulary, SGLang keeps a random head), and vLLM borrows the target's head
when the checkpoint has none (vLLM PR #28549 on).
EAGLE-3.1 drafters (`fc_norm`, `norm_output`: models/eagle3.py) add those keys to config.json
(true, absent when off) and, with fc_norm, the weights `fc_norm.{i}.weight` (one per captured
state, in fc's block order), the names and keys SGLang's and vLLM's EAGLE-3 models read;
`use_aux_norm` is read as fc_norm's older name. `norm_before_residual` (vLLM only) is refused.
Kimi drafters also come with MLA attention (SGLang/vLLM `Eagle3DeepseekV2ForCausalLM`):
recognised by the checks, served by SGLang and vLLM only.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from models.aux_layers import serving_ids_for
from models.eagle3 import Eagle3Config, Eagle3Drafter
from models.layers import rope_inv_freq
from models.safetensors_io import load_state_dict, save_state_dict, weight_files

ARCHITECTURE = "LlamaForCausalLMEagle3"
MLA_ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")  # vLLM aliases V3 to V2
# EAGLE-3.1 config flags SGLang (llama_eagle3.py, kimi_k25_eagle3.py) and vLLM (llama_eagle3.py,
# deepseek_eagle3.py) read: fc_norm (an RMSNorm per aux state before fc; use_aux_norm is its older
# name), norm_output (the post-norm state fed back), norm_before_residual (vLLM). The native
# engine runs the first three (NATIVE_EAGLE31_OPTIONS).
EAGLE31_OPTIONS = ("fc_norm", "use_aux_norm", "norm_output", "norm_before_residual")
NATIVE_EAGLE31_OPTIONS = ("fc_norm", "use_aux_norm", "norm_output")
WEIGHTS_FILE = "model.safetensors"
WEIGHT_NAMES = frozenset({
    *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
    *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
    *(f"midlayer.{n}.weight" for n in ("hidden_norm", "input_layernorm", "post_attention_layernorm")),
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
})


def weight_names(c: Eagle3Config) -> frozenset[str]:
    """The checkpoint's tensors for this config: WEIGHT_NAMES, and fc_norm's with fc_norm."""
    return WEIGHT_NAMES | {f"fc_norm.{i}.weight" for i in range(c.num_aux if c.fc_norm else 0)}


def config_to_hf(c: Eagle3Config, serving_engine: str = "sglang-llama") -> dict:
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "vocab_size": c.vocab_size,
        **({} if c.shared_head else {"draft_vocab_size": c.draft_vocab_size}),
        "target_hidden_size": c.target_hidden_size,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": c.rope_scaling,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        **({"fc_norm": True} if c.fc_norm else {}),
        **({"norm_output": True} if c.norm_output else {}),
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": serving_ids_for(serving_engine, c.aux_layer_ids),
            "use_aux_hidden_state": True,
        },
        "specserve": {"trained_aux_layer_outputs": c.aux_layer_ids, "serving_engine": serving_engine,
                      "capture_engine": "native"},
    }


def is_mla_drafter(cfg: dict) -> bool:
    return any(a in MLA_ARCHITECTURES for a in cfg.get("architectures") or [])


def borrows_target_head(cfg: dict) -> bool:
    """SGLang's rule for a Llama EAGLE-3 config: no draft_vocab_size means the target's lm_head."""
    return "draft_vocab_size" not in cfg and not is_mla_drafter(cfg)


def config_from_hf(cfg: dict, source: str = "config.json") -> Eagle3Config:
    """Parse an EAGLE-3 config.json (MLA drafters: the fields the pair checks need). Aux ids
    are turned into trained layer outputs."""
    shared_head = borrows_target_head(cfg)
    if "draft_vocab_size" not in cfg:  # SGLang and vLLM: the full vocabulary (a Llama drafter's: the target's head)
        cfg = {**cfg, "draft_vocab_size": cfg.get("vocab_size")}
    missing = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size",
                           "draft_vocab_size") if k not in cfg]
    if missing:
        raise ValueError(f"{source}: missing keys {missing} for an EAGLE-3 drafter config")
    heads = cfg["num_attention_heads"]
    recorded = (cfg.get("specserve") or {}).get("trained_aux_layer_outputs")
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    # Without our record, assume the SGLang Llama convention (configured id == captured output).
    aux = list(recorded if recorded is not None else (ids or []))
    return Eagle3Config(
        hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        num_attention_heads=heads, num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        vocab_size=cfg["vocab_size"], draft_vocab_size=cfg["draft_vocab_size"] or cfg["vocab_size"],
        target_hidden_size=cfg.get("target_hidden_size") or cfg["hidden_size"],
        aux_layer_ids=aux, rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=cfg.get("rope_theta", 10000.0), rope_scaling=cfg.get("rope_scaling"),
        max_position_embeddings=cfg.get("max_position_embeddings", 2048), shared_head=shared_head,
        fc_norm=bool(cfg.get("fc_norm") or cfg.get("use_aux_norm")), norm_output=bool(cfg.get("norm_output")),
    )


def head_mismatch(cfg: dict, weight_names: set[str]) -> str | None:
    """Why SGLang and vLLM would serve this Llama drafter with different heads, or None. SGLang
    borrows the target's lm_head exactly when the config has no draft_vocab_size, vLLM exactly when
    the checkpoint has no lm_head."""
    if is_mla_drafter(cfg):
        return None
    has_head = "lm_head.weight" in {n.removeprefix("model.") for n in weight_names}
    if borrows_target_head(cfg) and has_head:
        return ("config.json has no draft_vocab_size, so SGLang would borrow the target's lm_head, but the "
                "checkpoint holds one, which vLLM would use: drop one of the two")
    if not borrows_target_head(cfg) and not has_head:
        return ("no lm_head in the checkpoint, yet config.json gives draft_vocab_size, so SGLang would serve a "
                "random head: remove draft_vocab_size to borrow the target's lm_head")
    return None


def save_drafter(model: Eagle3Drafter, path: str | Path, *, dtype=torch.bfloat16,
                 serving_engine: str = "sglang-llama", extra: dict | None = None) -> None:
    """Write the checkpoint; fc's input blocks go in ascending aux-layer order, the order SGLang
    and vLLM concatenate in (a run trained on another order is reordered: exact)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    ids = model.config.aux_layer_ids
    order = sorted(range(len(ids)), key=lambda k: ids[k])
    cfg = config_to_hf(dataclasses.replace(model.config, aux_layer_ids=[ids[k] for k in order]), serving_engine)
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")   # what the weights are stored in
    if extra:
        cfg["specserve"].update(extra)
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    state = {k: v for k, v in model.state_dict().items() if k in weight_names(model.config)}
    if model.config.shared_head:
        del state["lm_head.weight"]   # the target's: borrowed at load
    blocks = state["fc.weight"].chunk(len(ids), dim=1)
    state["fc.weight"] = torch.cat([blocks[k] for k in order], dim=1)
    if model.config.fc_norm:   # each norm goes with its fc block
        norms = [state[f"fc_norm.{k}.weight"] for k in range(len(ids))]
        state.update({f"fc_norm.{i}.weight": norms[k] for i, k in enumerate(order)})
    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()}
    if model.config.draft_vocab_size == model.config.vocab_size:
        if state["d2t"].any():
            raise ValueError("a full draft vocabulary must map every draft id to itself (d2t all zero)")
        del state["d2t"], state["t2d"]  # vLLM has no parameter for them then and refuses the checkpoint
    save_state_dict(state, path / WEIGHTS_FILE)


def load_drafter(path: str | Path, embed_tokens: torch.Tensor | None, *, lm_head: torch.Tensor | None = None,
                 dtype=torch.float32, device="cpu") -> Eagle3Drafter:
    """Load an EAGLE-3 checkpoint; `embed_tokens` is the target's embedding weight (frozen, shared),
    `lm_head` the target's head, which a drafter with `shared_head` borrows (None: zeros, for
    inspecting the rest)."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{cfg_file}: missing drafter config.json")
    cfg = json.loads(cfg_file.read_text())
    if ARCHITECTURE not in (cfg.get("architectures") or []):
        raise ValueError(f"{cfg_file}: architectures {cfg.get('architectures')} lacks {ARCHITECTURE!r}")
    if cfg.get("norm_before_residual"):
        raise ValueError(f"{cfg_file}: norm_before_residual (a vLLM EAGLE-3 option) is not served by the native "
                         f"engine")
    config = config_from_hf(cfg, str(cfg_file))
    state = load_state_dict(path)
    state = {k.removeprefix("model."): v for k, v in state.items()}
    if "midlayer.self_attn.q_proj.weight" not in state and "layers.0.self_attn.q_proj.weight" in state:
        state = {k.replace("layers.0.", "midlayer."): v for k, v in state.items()}
    legacy = {"aux_norm_low": "fc_norm.0", "aux_norm_mid": "fc_norm.1", "aux_norm_high": "fc_norm.2"}
    state = {legacy.get(k.split(".")[0], k.split(".")[0]) + k[len(k.split(".")[0]):]: v for k, v in state.items()}
    state.pop("embed_tokens.weight", None)
    if "d2t" not in state:  # draft vocab == full vocab
        state["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
        state["t2d"] = torch.ones(config.vocab_size, dtype=torch.bool)
    mismatch = head_mismatch(cfg, set(state))
    if mismatch:
        raise ValueError(f"{path}: {mismatch}")
    if config.shared_head:
        state["lm_head.weight"] = torch.zeros(config.vocab_size, config.hidden_size) if lm_head is None else lm_head
    names = weight_names(config)
    unknown = set(state) - names
    missing = names - set(state)
    if unknown or missing:
        raise ValueError(f"{path}: unexpected weights {sorted(unknown)}, missing weights {sorted(missing)}")
    if embed_tokens is None:
        embed_tokens = torch.zeros(config.vocab_size, config.hidden_size)
    elif embed_tokens.shape != (config.vocab_size, config.hidden_size):
        raise ValueError(f"{path}: drafter embedding shape {(config.vocab_size, config.hidden_size)} "
                         f"does not fit the target embedding {tuple(embed_tokens.shape)}")
    state["embed_tokens.weight"] = embed_tokens  # shared with the target, not copied
    state["d2t"] = state["d2t"].long()
    state["t2d"] = state["t2d"].bool()
    with torch.device("meta"):
        model = Eagle3Drafter(config)
    model.load_state_dict(state, strict=True, assign=True)
    model.embed_tokens.weight.requires_grad_(False)
    model.lm_head.weight.requires_grad_(not config.shared_head)
    model.inv_freq = torch.empty(0)  # replaced below; meta buffers cannot move
    model = model.to(device=device, dtype=dtype).eval()
    model.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling).to(device)
    return model


def vllm_drafter_dir(draft: str | Path, out: str | Path, trained: list[int] | None = None) -> Path:
    """A copy of the drafter at `out` that vLLM serves with the layers it was trained on: aux ids
    from the trained outputs (given, or recorded; models.aux_layers; vLLM reads them as INPUTS of
    layers), no d2t/t2d when the draft vocabulary is the target's. Unchanged weights are linked."""
    draft, out = Path(draft).resolve(), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((draft / "config.json").read_text())
    parsed = config_from_hf(cfg, str(draft / "config.json"))
    trained = list(trained) if trained is not None else parsed.aux_layer_ids
    cfg["eagle_config"] = {**cfg.get("eagle_config", {}), "use_aux_hidden_state": True,
                           "eagle_aux_hidden_state_layer_ids": serving_ids_for("vllm", trained)}
    cfg["specserve"] = {**cfg.get("specserve", {}), "trained_aux_layer_outputs": trained, "serving_engine": "vllm"}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if parsed.draft_vocab_size == parsed.vocab_size:
        state = {k: v for k, v in load_state_dict(draft).items() if k not in ("d2t", "t2d")}
        save_state_dict(state, out / WEIGHTS_FILE)
    else:
        for f in weight_files(draft):
            (out / f.name).symlink_to(f)
        index = draft / "model.safetensors.index.json"
        if index.is_file():
            (out / index.name).symlink_to(index)
    return out
