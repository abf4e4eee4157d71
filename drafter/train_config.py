"""`drafter train`'s settings: one flat dataclass in sections, and the flags generated from it.

Each field is declared once, with its default, its section and its help (field metadata); the
`drafter train` flags are generated from the fields (`add_train_flags`) and read back into a
TrainConfig (`from_args`), so a default lives in one place. A field's flag is its name with
dashes, less a `_s` unit suffix (time_limit_s -> --time-limit), unless the metadata names
another; a bool field that defaults to False is a switch, one that defaults to True gets a
`--no-...` switch. Fields are plain attributes (`c.lr`), so train_config.json stays flat.

Sections: inputs, capture (where the target's features come from), drafter (its shape and
EAGLE-3.1 options), objective (what the loss is taken on), optimizer, schedule, run control.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
from dataclasses import dataclass, field

SECTIONS = {
    "inputs": "what to train on",
    "capture": "where the target's features come from",
    "drafter": "the drafter's shape (defaults from the target) and EAGLE-3.1 options",
    "objective": "what the loss is taken on",
    "optimizer": "AdamW",
    "schedule": "how long the run is and how its learning rate moves",
    "run control": "devices, checkpoints, logs, resuming",
}
LOSSES = ("kl", "lk-alpha", "lk-lambda")
DTYPES = ("auto", "float32", "bfloat16")


def ints(s: str) -> list[int]:
    return [int(x) for x in s.replace(" ", "").split(",") if x]


def opt(default, section: str, help: str = "", *, flag: str | None = None, type=None, choices=None,
        metavar: str | None = None, required: bool = False, cli: bool = True):
    """A TrainConfig field: its default and how its flag reads (cli=False: no flag)."""
    meta = {"section": section, "help": help, "flag": flag, "type": type, "choices": choices, "metavar": metavar,
            "required": required, "cli": cli}
    if required:
        return field(metadata=meta)
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class TrainConfig:
    # -- inputs
    target: str = opt(None, "inputs", "target folder (config.json + safetensors); any architecture with "
                      "--features transformers/vllm", required=True)
    data: str = opt(None, "inputs", "data directory (`drafter data`)", required=True)
    out: str = opt(None, "inputs", "run directory", required=True)
    vocab: str | None = opt(None, "inputs", "draft vocabulary (default: <data>/draft_vocab.safetensors)")
    limit_samples: int = opt(0, "inputs", "train on the first N conversations (0: all)")
    max_length: int = opt(2048, "inputs", "longest sequence trained on, in tokens (longer ones are cut)")
    # -- capture
    aux_layers: list[int] | None = opt(None, "capture", "target layer OUTPUTS to capture, e.g. 1,15,28 "
                                       "(default [1, L//2-1, L-4])", type=ints)
    aux_convention: str = opt("training", "capture", "what --aux-layers ids mean: training (layer outputs) or "
                              "that engine's config ids, e.g. vllm 2,16,29 = outputs 1,15,28",
                              choices=("training", "vllm", "sglang-llama", "sglang-deepseek"))
    features: str = opt("native", "capture", "where target features come from: native (our engine in the loop), "
                        "transformers or vllm (a capture process streams them through the spool), or a directory "
                        "of kept features")
    spool: str | None = opt(None, "capture", "spool directory for streamed features (default <out>/spool)")
    spool_budget_gb: float = opt(10.0, "capture", "disk the spool (or --keep-features) may use; the capture waits "
                                 "while it is full")
    keep_features: str | None = opt(None, "capture", "capture every conversation's features into DIR once, then "
                                    "train from it (later runs: --features DIR)", metavar="DIR")
    capture_dtype: str = opt("auto", "capture", "capture engine dtype (auto: float32 on CPU, bfloat16 on GPU)",
                             choices=("auto", "float32", "bfloat16", "float16"))
    dtype: str = opt("auto", "capture", "the target in this process and the drafter's autocast (auto: bfloat16 "
                     "on GPU, float32 on CPU)", choices=DTYPES)
    capture_batch: int = opt(64, "capture", "sequences per capture-engine call")
    capture_gpus: str | None = opt(None, "capture", "CUDA_VISIBLE_DEVICES for the capture process")
    vllm_python: str | None = opt(None, "capture", "Python with vLLM for --features vllm "
                                  "(default .venv-vllm/bin/python)")
    vllm_args: dict = opt({}, "capture", "vLLM LLM(...) keyword arguments for the capture (--vllm-args, "
                          "--vllm-arg)", cli=False)
    trust_remote_code: bool = opt(False, "capture", "for the capture engine (transformers, vLLM)")
    # -- drafter
    intermediate_size: int | None = opt(None, "drafter", "MLP width (default: the target's)")
    num_attention_heads: int | None = opt(None, "drafter", "attention heads (default: the target's)",
                                          flag="--num-heads")
    num_key_value_heads: int | None = opt(None, "drafter", "key/value heads (default: the target's)",
                                          flag="--num-kv-heads")
    head_dim: int | None = opt(None, "drafter", "head width (default: the target's)")
    init_lm_head: bool = opt(True, "drafter", "random lm_head instead of the target's rows",
                             flag="--no-init-lm-head")
    shared_head: bool = opt(False, "drafter", "no lm_head of its own: borrow the target's (frozen, not saved, "
                            "full vocabulary; SGLang and vLLM serve it from a config without draft_vocab_size)")
    init: str | None = opt(None, "drafter", "start from this exported drafter (fine-tune it on --data): its "
                           "weights and draft vocabulary", metavar="DRAFTER")
    fc_norm: bool = opt(False, "drafter", "EAGLE-3.1: an RMSNorm on each captured target state before fc "
                        "(config key fc_norm, weights fc_norm.{i}.weight)")
    norm_output: bool = opt(False, "drafter", "EAGLE-3.1: feed the final-normed hidden state back to the next "
                            "draft step instead of the pre-norm one (config key norm_output)")
    # -- objective
    ttt_length: int = opt(7, "objective", "draft steps unrolled per position (training-time test)")
    step_weight: float = opt(0.8, "objective", "weight of unroll step k is step_weight**k")
    loss: str = opt("kl", "objective", "kl: soft cross-entropy against the target's distribution (EAGLE-3); "
                    "lk-alpha: -log of the acceptance rate sum_v min(p_v, q_v); lk-lambda: "
                    "lambda*KL + (1-lambda)*(1 - acceptance), lambda = exp(-eta * acceptance) (LK losses, "
                    "arXiv 2602.23881)", choices=LOSSES)
    lk_eta: float = opt(3.0, "objective", "eta of lk-lambda: how fast the weight moves from KL to acceptance "
                        "as acceptance grows (the paper's best: 3)")
    on_policy: float = opt(0.0, "objective", "weight w of the on-policy loss (after Draft-OPD, arXiv 2605.29343): "
                           "(1-w) * the teacher-forced loss + w * the loss on the states a greedy chain draft "
                           "reaches (the drafter's accepted prefix and first rejection); 0: off (drafter/ttt.py)")
    feature_noise: float = opt(0.0, "objective", "uniform noise in [-x, x] added to the captured target states "
                               "the drafter reads (vLLM speculators trains with 0.05; 0: off); seeded by --seed "
                               "and the micro-batch")
    # -- optimizer
    lr: float = opt(1e-4, "optimizer", "peak learning rate")
    weight_decay: float = opt(0.0, "optimizer", "AdamW weight decay")
    betas: tuple[float, float] = opt((0.9, 0.95), "optimizer", "AdamW betas", cli=False)
    grad_clip: float = opt(0.5, "optimizer", "gradient norm clip")
    batch_size: int = opt(4, "optimizer", "sequences per micro-batch per GPU")
    grad_accum: int = opt(1, "optimizer", "micro-batches per optimizer step")
    length_group: int = opt(64, "optimizer", "batches whose conversations are sorted by length together, "
                            "against padding (1: random)")
    # -- schedule
    epochs: float = opt(1.0, "schedule", "passes over the data (when neither --max-steps nor --time-budget)")
    max_steps: int = opt(0, "schedule", "optimizer steps (0: from --epochs)")
    time_budget_s: float = opt(0, "schedule", "seconds of training: the run's length, its cosine schedule "
                               "spread over them (replaces --epochs/--max-steps; several --time-limit calls add "
                               "up with --resume)")
    warmup_steps: int = opt(-1, "schedule", "linear warm-up steps (-1: --warmup-ratio of the steps)")
    warmup_ratio: float = opt(0.015, "schedule", "share of the run spent warming up")
    min_lr_ratio: float = opt(0.0, "schedule", "the cosine ends at lr * this")
    # -- run control
    stop_at: int = opt(0, "run control", "end this run after step N with a checkpoint; continue later with "
                       "--resume")
    time_limit_s: float = opt(0, "run control", "seconds: end this run with a checkpoint once they have passed; "
                              "continue with --resume")
    save_every: int = opt(1000, "run control", "steps between checkpoints")
    keep_checkpoints: int = opt(2, "run control", "checkpoints to keep", flag="--keep")
    log_every: int = opt(10, "run control", "steps between log records")
    seed: int = opt(0, "run control", "data order, initial weights and feature noise")
    device: str = opt("auto", "run control", "auto: cuda when present, else cpu")
    resume: bool = opt(False, "run control", "continue from the newest checkpoint in --out")
    extra: dict = opt({}, "run control", "what the run records for export", cli=False)


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.removesuffix("_s").replace("_", "-")


def _default_text(f: dataclasses.Field) -> str:
    d = f.default
    if d is dataclasses.MISSING or d is None or d == "" or isinstance(d, bool):
        return ""
    return f" (default {d})"


def add_train_flags(p: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field with cli metadata, grouped by section; the vLLM capture's
    engine arguments come as --vllm-arg KEY=VALUE (repeat) and --vllm-args JSON."""
    groups = {name: p.add_argument_group(name, text) for name, text in SECTIONS.items()}
    for f in dataclasses.fields(TrainConfig):
        m = f.metadata
        if not m.get("cli", True):
            continue
        g, name = groups[m["section"]], flag_of(f)
        if f.type in ("bool", bool):
            action = "store_false" if f.default else "store_true"
            g.add_argument(name, dest=f.name, action=action, help=m["help"])
            continue
        kind = m.get("type") or _scalar(f)
        kw = {"type": kind} if kind is not str else {}
        if m.get("choices"):
            kw["choices"] = m["choices"]
        kw["metavar"] = m.get("metavar") or name[2:].upper().replace("-", "_")
        default = None if m.get("required") else f.default
        g.add_argument(name, dest=f.name, default=default, required=m.get("required", False),
                       help=m["help"] + _default_text(f), **kw)
    capture = groups["capture"]
    capture.add_argument("--vllm-arg", action="append", metavar="KEY=VALUE",
                         help="vLLM engine argument for the capture, VALUE as JSON where it parses (repeat), e.g. "
                              "tensor_parallel_size=8 or "
                              "compilation_config='{\"custom_ops\": [\"all\", \"-rotary_embedding\"]}'")
    capture.add_argument("--vllm-args", help="vLLM engine arguments as one JSON object (--vllm-arg entries "
                                             "override)")


def _scalar(f: dataclasses.Field):
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    for name, kind in (("int", int), ("float", float)):
        if t.split("|")[0].strip() == name:
            return kind
    return str


def vllm_args(a: argparse.Namespace) -> dict:
    """--vllm-args JSON, then each --vllm-arg KEY=VALUE over it (VALUE read as JSON when it parses)."""
    try:
        out = json.loads(a.vllm_args) if a.vllm_args else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"--vllm-args: not a JSON object ({e})") from None
    if not isinstance(out, dict):
        raise ValueError("--vllm-args: not a JSON object")
    for item in a.vllm_arg or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--vllm-arg {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def from_args(a: argparse.Namespace) -> TrainConfig:
    """The TrainConfig the generated flags describe."""
    kw = {f.name: getattr(a, f.name) for f in dataclasses.fields(TrainConfig) if f.metadata.get("cli", True)}
    if kw.get("aux_layers") == []:
        kw["aux_layers"] = None
    return TrainConfig(**kw, vllm_args=vllm_args(a))
