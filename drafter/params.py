"""Parameter breakdown of an EAGLE-3 drafter config and a side-by-side comparison of two.

Counting convention (why model cards disagree, "1B vs 2.6B"): the drafter's embedding is
the target's, frozen and not saved, so "trainable" excludes it; cards that count every
tensor the model uses include it, and some drafters carry an lm_head over the full target
vocabulary instead of the draft vocabulary. We print each convention with its number.
Also says which target layer OUTPUTS the aux ids capture in each engine (models/aux_layers).
What training captured is the recorded `trained_aux_layer_outputs` (our export), else what the
recorded capture engine (`specserve.capture_engine`, or `--captured-by` for a drafter that
records none) fed for the configured ids: a SpecForge drafter whose features came through
SGLang itself fits SGLang as configured. With neither, the ids are assumed to be HF layer
outputs and the warnings say so. MLA drafters (Kimi `Eagle3DeepseekV2ForCausalLM`: SGLang's
models/kimi_k25_eagle3.py, vLLM's deepseek_eagle3.py, the layout of lightseekorg's
kimi-k2.5-eagle3-mla) count their attention as MLA; the EAGLE-3.1 options both engines read
(`fc_norm`: an RMSNorm per aux state before fc; `norm_output`: the post-norm state fed back)
are shown, and the aux-state count is the config's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from models.aux_layers import capture_convention, captured_layer_outputs, serving_ids_for
from models.eagle3_checkpoint import EAGLE31_OPTIONS, borrows_target_head, is_mla_drafter

ENGINES = ("sglang-llama", "sglang-deepseek", "vllm")


@dataclass
class DrafterShape:
    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    draft_vocab: int
    target_hidden: int
    num_aux: int
    aux_ids: list[int]                   # as configured (eagle_aux_hidden_state_layer_ids)
    trained_outputs: list[int] | None    # recorded by our export, else None
    serving_engine: str | None
    target_layers: int | None
    capture_engine: str | None = None    # recorded, or --captured-by; None: unknown
    mla: dict | None = None              # q_lora_rank, kv_lora_rank, qk_nope/qk_rope/v head dims
    options: list[str] | None = None     # EAGLE-3.1 options set in the config (EAGLE31_OPTIONS)
    architecture: str = ""
    shared_head: bool = False            # no draft_vocab_size (a Llama drafter): the target's lm_head, borrowed


MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# Which engine code loads each drafter architecture (SGLang 0.5.23 / vLLM 0.32 model files).
LOADERS = {"LlamaForCausalLMEagle3": "SGLang llama_eagle3.py, vLLM llama_eagle3.py",
           "Eagle3DeepseekV2ForCausalLM": "SGLang kimi_k25_eagle3.py, vLLM deepseek_eagle3.py",
           "Eagle3DeepseekV3ForCausalLM": "vLLM deepseek_eagle3.py (alias of Eagle3DeepseekV2ForCausalLM)"}


def read_config(path: str | Path) -> tuple[dict, str]:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no drafter config.json")
    return json.loads(p.read_text()), str(p)


def shape_from_config(cfg: dict, name: str, target_layers: int | None = None,
                      captured_by: str | None = None) -> DrafterShape:
    heads = cfg["num_attention_heads"]
    eagle = cfg.get("eagle_config") or {}
    ours = cfg.get("specserve") or {}
    mla = {k: cfg[k] for k in MLA_KEYS} if is_mla_drafter(cfg) else None
    if mla is not None:  # MLA: q/k carry nope + rope dims, v its own
        cfg = {**cfg, "head_dim": mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]}
    return DrafterShape(
        name=name, hidden=cfg["hidden_size"], intermediate=cfg["intermediate_size"], heads=heads,
        kv_heads=cfg.get("num_key_value_heads") or heads, head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        vocab=cfg["vocab_size"], draft_vocab=cfg.get("draft_vocab_size") or cfg["vocab_size"],
        target_hidden=cfg.get("target_hidden_size") or cfg["hidden_size"],
        num_aux=len(eagle.get("eagle_aux_hidden_state_layer_ids") or []) or cfg.get("num_aux_hidden_states") or 3,
        aux_ids=list(eagle.get("eagle_aux_hidden_state_layer_ids") or []),
        trained_outputs=ours.get("trained_aux_layer_outputs"), serving_engine=ours.get("serving_engine"),
        # A count recorded with the config (our export) wins; --target-layers fills in where none is.
        target_layers=ours.get("target_num_hidden_layers") or cfg.get("target_num_hidden_layers") or target_layers,
        capture_engine=ours.get("capture_engine") or captured_by, mla=mla,
        options=[k for k in EAGLE31_OPTIONS if cfg.get(k)], architecture=(cfg.get("architectures") or ["?"])[0],
        shared_head=borrows_target_head(cfg),
    )


def breakdown(s: DrafterShape) -> dict[str, int]:
    """Parameter counts by part. fc: 3H_t -> H; attention: q/k/v read 2H; MLP: SwiGLU;
    norms: input_layernorm, hidden_norm, post_attention_layernorm, final norm."""
    h, hd = s.hidden, s.head_dim
    attention = 2 * h * (s.heads + 2 * s.kv_heads) * hd + s.heads * hd * h
    if s.mla:  # q_a, kv_a read the 2H input; q_b, kv_b expand the latents; a-norms; o_proj
        m = s.mla
        attention = (2 * h * (m["q_lora_rank"] + m["kv_lora_rank"] + m["qk_rope_head_dim"])
                     + m["q_lora_rank"] * s.heads * hd
                     + m["kv_lora_rank"] * s.heads * (m["qk_nope_head_dim"] + m["v_head_dim"])
                     + m["q_lora_rank"] + m["kv_lora_rank"] + s.heads * m["v_head_dim"] * h)
    parts = {
        "embedding (frozen, the target's)": s.vocab * h,
        "fc": s.num_aux * s.target_hidden * h,
        "attention": attention,
        "mlp": 3 * h * s.intermediate,
        "norms": 4 * h + (s.num_aux * s.target_hidden if {"fc_norm", "use_aux_norm"} & set(s.options or []) else 0),
        "lm_head": 0 if s.shared_head else h * s.draft_vocab,   # a shared head is the target's
    }
    parts["trainable"] = sum(v for k, v in parts.items() if not k.startswith("embedding"))
    parts["total (with embedding)"] = parts["trainable"] + parts["embedding (frozen, the target's)"]
    parts["total, full-vocab lm_head"] = parts["total (with embedding)"] + h * (s.vocab - s.draft_vocab)
    return parts


def captures(s: DrafterShape) -> dict[str, list[int]] | None:
    """Layer outputs captured by training and by each engine, or None without the layer count."""
    if s.target_layers is None or not s.aux_ids:
        return None
    if s.trained_outputs is not None:
        trained = list(s.trained_outputs)
    else:  # the engine that captured the features fed what it feeds for these ids
        trained = captured_layer_outputs(capture_convention(s.capture_engine or "training"), s.aux_ids,
                                         s.target_layers)
    out = {"training": trained}
    for e in ENGINES:
        out[e] = captured_layer_outputs(e, s.aux_ids, s.target_layers)
    return out


def capture_warnings(s: DrafterShape) -> list[str]:
    cap = captures(s)
    if cap is None:
        return []
    known = s.trained_outputs is not None or s.capture_engine is not None
    how = ("recorded at export" if s.trained_outputs is not None else
           f"captured through {s.capture_engine}" if known else "assumed: ids taken as HF layer outputs")
    tag = "WARNING" if known else "CHECK"
    # features captured through one SGLang rule say which model the target is: the other rule is moot
    moot = {"sglang-llama": "sglang-deepseek", "sglang-deepseek": "sglang-llama"}.get(s.capture_engine or "")
    warns = []
    for e in ENGINES:
        if cap[e] == cap["training"] or e == moot:
            continue
        try:
            fix = f"set eagle_aux_hidden_state_layer_ids = {serving_ids_for(e, cap['training'])}"
        except ValueError as err:
            fix = f"no ids can: {err}"
        warns.append(f"{tag} {s.name}: {e} captures outputs of layers {cap[e]} but training captured "
                     f"{cap['training']} ({how}); to serve on {e} {fix}")
    if warns and not known:
        warns.append(f"CHECK {s.name}: no capture engine recorded; if its features were captured through SGLang "
                     f"or vLLM itself (SpecForge's SGLang backend), that engine needs no change: pass "
                     f"--captured-by ENGINE")
    return warns


def fmt(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}K"
    return str(n)


def _rows(shapes: list[DrafterShape]) -> list[tuple[str, list[str]]]:
    rows = [
        ("architecture", [s.architecture for s in shapes]),
        ("loaded by", [LOADERS.get(s.architecture, "? (not an EAGLE-3 architecture SGLang or vLLM knows)")
                       for s in shapes]),
        ("EAGLE-3.1 options", [", ".join(s.options) if s.options else "none" for s in shapes]),
        ("hidden / intermediate", [f"{s.hidden} / {s.intermediate}" for s in shapes]),
        ("heads / kv heads / head_dim", [f"{s.heads} / {s.kv_heads} / {s.head_dim}" for s in shapes]),
        ("attention", [f"MLA (q_lora {s.mla['q_lora_rank']}, kv_lora {s.mla['kv_lora_rank']})" if s.mla
                       else "MHA/GQA" for s in shapes]),
        ("vocab / draft vocab", [f"{s.vocab} / {s.draft_vocab}" for s in shapes]),
        ("target hidden", [str(s.target_hidden) for s in shapes]),
    ]
    parts = [breakdown(s) for s in shapes]
    for key in parts[0]:
        rows.append((key, [f"{fmt(p[key])} ({p[key]:,})" for p in parts]))
    rows.append(("aux ids (config)", [str(s.aux_ids) for s in shapes]))
    rows.append(("target layers", [str(s.target_layers) if s.target_layers else "? (--target-layers)" for s in shapes]))
    rows.append(("capture engine", [s.capture_engine or "? (--captured-by)" for s in shapes]))
    caps = [captures(s) for s in shapes]
    for key in ("training", *ENGINES):
        label = {"training": "outputs captured: training", "sglang-llama": "  SGLang Llama rule",
                 "sglang-deepseek": "  SGLang DeepSeek rule", "vllm": "  vLLM"}[key]
        rows.append((label, [("?" if not c else str(c[key]) + (" (assumed)" if key == "training" and
                                                              s.trained_outputs is None and
                                                              s.capture_engine is None else ""))
                             for s, c in zip(shapes, caps)]))
    return rows


def table(shapes: list[DrafterShape]) -> str:
    rows = [("", [s.name for s in shapes])] + _rows(shapes)
    w0 = max(len(r[0]) for r in rows)
    ws = [max(len(r[1][i]) for r in rows) for i in range(len(shapes))]
    lines = [f"{label:<{w0}}  " + "  ".join(f"{v:>{w}}" for v, w in zip(vals, ws)) for label, vals in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def convention_note(s: DrafterShape) -> str:
    p = breakdown(s)
    emb = p["embedding (frozen, the target's)"]
    return (
        f"Counting conventions ({s.name}): trained weights = {fmt(p['trainable'])} (fc + decoder layer + norms "
        f"{fmt(p['trainable'] - p['lm_head'])}, lm_head over the {s.draft_vocab}-id draft vocab {fmt(p['lm_head'])}). "
        f"The embedding ({s.vocab} x {s.hidden} = {fmt(emb)}) is the target's: frozen, shared, not saved in the "
        f"checkpoint; counting it too gives {fmt(p['total (with embedding)'])}. An lm_head over the full "
        f"{s.vocab}-id vocab would add {fmt(p['total, full-vocab lm_head'] - p['total (with embedding)'])}. "
        f"That is why model cards give the Kimi-K2 drafter shape as \"1B\" (trained: 1.19B) or \"2.6B\" "
        f"(everything it runs, embedding included: 2.37B, more with extra saved tensors): one model, two "
        f"conventions."
    )


def _name(path: str) -> str:
    p = Path(path)
    return p.stem if p.is_file() else p.name


def inspect_text(path: str, target_layers: int | None = None, captured_by: str | None = None) -> str:
    cfg, where = read_config(path)
    s = shape_from_config(cfg, _name(path), target_layers, captured_by)
    out = [table([s]), "", convention_note(s)]
    out += capture_warnings(s)
    return "\n".join(out)


def compare_text(a: str, b: str, target_layers: int | None = None, captured_by: str | None = None) -> str:
    shapes = []
    for path in (a, b):
        cfg, _ = read_config(path)
        shapes.append(shape_from_config(cfg, _name(path), target_layers, captured_by))
    out = [table(shapes), ""]
    out.append(convention_note(max(shapes, key=lambda s: breakdown(s)["trainable"])))
    for s in shapes:
        out += capture_warnings(s)
    return "\n".join(out)
