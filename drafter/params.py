"""Parameter breakdown of an EAGLE-3 drafter config and a side-by-side comparison of two.

Counting convention (why model cards disagree, "1B vs 2.6B"): the drafter's embedding is
the target's, frozen and not saved, so "trainable" excludes it; cards that count every
tensor the model uses include it, and some drafters carry an lm_head over the full target
vocabulary instead of the draft vocabulary. We print each convention with its number.
Also says which target layer OUTPUTS the aux ids capture in each engine (models/aux_layers).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from models.aux_layers import captured_layer_outputs, serving_ids_for

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


def read_config(path: str | Path) -> tuple[dict, str]:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no drafter config.json")
    return json.loads(p.read_text()), str(p)


def shape_from_config(cfg: dict, name: str, target_layers: int | None = None) -> DrafterShape:
    heads = cfg["num_attention_heads"]
    eagle = cfg.get("eagle_config") or {}
    ours = cfg.get("specserve") or {}
    return DrafterShape(
        name=name, hidden=cfg["hidden_size"], intermediate=cfg["intermediate_size"], heads=heads,
        kv_heads=cfg.get("num_key_value_heads") or heads, head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        vocab=cfg["vocab_size"], draft_vocab=cfg.get("draft_vocab_size") or cfg["vocab_size"],
        target_hidden=cfg.get("target_hidden_size") or cfg["hidden_size"], num_aux=3,
        aux_ids=list(eagle.get("eagle_aux_hidden_state_layer_ids") or []),
        trained_outputs=ours.get("trained_aux_layer_outputs"), serving_engine=ours.get("serving_engine"),
        # A count recorded with the config (our export) wins; --target-layers fills in where none is.
        target_layers=ours.get("target_num_hidden_layers") or cfg.get("target_num_hidden_layers") or target_layers,
    )


def breakdown(s: DrafterShape) -> dict[str, int]:
    """Parameter counts by part. fc: 3H_t -> H; attention: q/k/v read 2H; MLP: SwiGLU;
    norms: input_layernorm, hidden_norm, post_attention_layernorm, final norm."""
    h, hd = s.hidden, s.head_dim
    parts = {
        "embedding (frozen, the target's)": s.vocab * h,
        "fc": s.num_aux * s.target_hidden * h,
        "attention": 2 * h * (s.heads + 2 * s.kv_heads) * hd + s.heads * hd * h,
        "mlp": 3 * h * s.intermediate,
        "norms": 4 * h,
        "lm_head": h * s.draft_vocab,
    }
    parts["trainable"] = sum(v for k, v in parts.items() if not k.startswith("embedding"))
    parts["total (with embedding)"] = parts["trainable"] + parts["embedding (frozen, the target's)"]
    parts["total, full-vocab lm_head"] = parts["total (with embedding)"] + h * (s.vocab - s.draft_vocab)
    return parts


def captures(s: DrafterShape) -> dict[str, list[int]] | None:
    """Layer outputs captured by training and by each engine, or None without the layer count."""
    if s.target_layers is None or not s.aux_ids:
        return None
    out = {"training": s.trained_outputs if s.trained_outputs is not None else list(s.aux_ids)}
    for e in ENGINES:
        out[e] = captured_layer_outputs(e, s.aux_ids, s.target_layers)
    return out


def capture_warnings(s: DrafterShape) -> list[str]:
    cap = captures(s)
    if cap is None:
        return []
    how = "recorded at export" if s.trained_outputs is not None else "assumed: ids taken as HF layer outputs"
    warns = []
    for e in ENGINES:
        if cap[e] != cap["training"]:
            warns.append(f"WARNING {s.name}: {e} captures outputs of layers {cap[e]} but training captured "
                         f"{cap['training']} ({how}); to serve on {e} set eagle_aux_hidden_state_layer_ids "
                         f"= {serving_ids_for(e, cap['training'])}")
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
        ("hidden / intermediate", [f"{s.hidden} / {s.intermediate}" for s in shapes]),
        ("heads / kv heads / head_dim", [f"{s.heads} / {s.kv_heads} / {s.head_dim}" for s in shapes]),
        ("vocab / draft vocab", [f"{s.vocab} / {s.draft_vocab}" for s in shapes]),
        ("target hidden", [str(s.target_hidden) for s in shapes]),
    ]
    parts = [breakdown(s) for s in shapes]
    for key in parts[0]:
        rows.append((key, [f"{fmt(p[key])} ({p[key]:,})" for p in parts]))
    rows.append(("aux ids (config)", [str(s.aux_ids) for s in shapes]))
    rows.append(("target layers", [str(s.target_layers) if s.target_layers else "? (--target-layers)" for s in shapes]))
    caps = [captures(s) for s in shapes]
    for key in ("training", *ENGINES):
        label = {"training": "outputs captured: training", "sglang-llama": "  SGLang Llama rule",
                 "sglang-deepseek": "  SGLang DeepSeek rule", "vllm": "  vLLM"}[key]
        rows.append((label, [("?" if not c else str(c[key]) + (" (assumed)" if key == "training" and
                                                              s.trained_outputs is None else ""))
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


def inspect_text(path: str, target_layers: int | None = None) -> str:
    cfg, where = read_config(path)
    s = shape_from_config(cfg, _name(path), target_layers)
    out = [table([s]), "", convention_note(s)]
    out += capture_warnings(s)
    return "\n".join(out)


def compare_text(a: str, b: str, target_layers: int | None = None) -> str:
    shapes = []
    for path in (a, b):
        cfg, _ = read_config(path)
        shapes.append(shape_from_config(cfg, _name(path), target_layers))
    out = [table(shapes), ""]
    out.append(convention_note(max(shapes, key=lambda s: breakdown(s)["trainable"])))
    for s in shapes:
        out += capture_warnings(s)
    return "\n".join(out)
