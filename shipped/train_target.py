#!/usr/bin/env python3
"""Train the shipped small Llama-architecture target on the corpus from shipped/build_corpus.py.

The result in --out is a standard Hugging Face `LlamaForCausalLM` checkpoint (config.json,
model.safetensors in bfloat16 with tied embeddings, generation_config.json, tokenizer files
with the ChatML template) plus provenance.json and PROVENANCE.md. transformers, SGLang, vLLM
and models.llama.load_target read it.

Data: every record of the corpus is tokenized (documents as plain text, chat pairs rendered
with the chat template) and packed into one stream per split, each sample preceded by
<|endoftext|>. A training window of seq_len + 1 tokens starts at a random position, or (with
probability --align-prob) at the first token of a random sample, so prompts that start at
position 0 are in distribution. The loss covers every token. Held-out loss is measured on
fixed windows of the held-out split (modules the model never sees, shipped/data/heldout_modules.txt).

Schedule: linear warmup, then cosine to --min-lr-ratio * lr. Progress is the larger of
step / --steps and train time / --time-budget-s, so a time-budgeted run ends its decay when
the time is up. Train time excludes evaluations, checkpoints and the first step after each
start or resume (torch.compile compiles there). bf16 autocast on CUDA, optional torch.compile
(falls back to eager if it fails).
A training state is saved to --work-dir every --ckpt-every-s seconds; --resume continues it.
--export best (default) exports the weights with the lowest held-out loss seen at an eval.

Run from the repository root with the interpreter that has torch + transformers + tokenizers:
  CPU smoke (about a minute):
    python shipped/build_corpus.py --max-files 40 --vocab-size 1024 --out-dir /tmp/sc --data-dir /tmp/sc
    python shipped/train_target.py --corpus /tmp/sc/corpus.jsonl.gz --out /tmp/st --work-dir /tmp/st_work \\
        --hidden 64 --layers 4 --heads 4 --kv-heads 2 --intermediate 128 --steps 50 \\
        --batch-size 8 --seq-len 128 --eval-every 25 --device cpu
  H200: see shipped/README.md.
"""
from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import math
import os
import platform
import shutil
import socket
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from shipped.build_corpus import sha256  # noqa: E402

EOT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Train the shipped small Llama target.")
    ap.add_argument("--corpus", default="runs/shipped/corpus.jsonl.gz")
    ap.add_argument("--tokenizer", default=None,
                    help="tokenizer dir; default: <corpus dir>/tokenizer if it exists, else build one into <work-dir>")
    ap.add_argument("--vocab-size", type=int, default=6144, help="when a tokenizer is built here")
    ap.add_argument("--out", default="shipped/target", help="where the HF checkpoint and provenance go")
    ap.add_argument("--work-dir", default="runs/shipped/train", help="training state (optimizer etc.), not shipped")
    # model
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--max-positions", type=int, default=1024)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    # training
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no step limit)")
    ap.add_argument("--time-budget-s", type=float, default=0.0, help="stop after this much training time (0: none)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--align-prob", type=float, default=0.5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (CUDA; eager on failure)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--ckpt-every-s", type=float, default=120.0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--export", choices=["best", "last"], default="best")
    ap.add_argument("--max-records", type=int, default=0, help="smoke runs: use only the first N corpus records")
    ap.add_argument("--heldout-prompts", default=str(REPO / "shipped" / "data" / "heldout_prompts.jsonl"),
                    help="held-out chat prompts; the first --num-samples are answered after export")
    ap.add_argument("--num-samples", type=int, default=3, help="held-out prompts to answer greedily after export")
    ap.add_argument("--sample-tokens", type=int, default=160)
    args = ap.parse_args(argv)
    if args.steps <= 0 and args.time_budget_s <= 0:
        ap.error("give --steps or --time-budget-s (or both)")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        ap.error("--hidden must divide by --heads, and --heads by --kv-heads")
    if args.seq_len > args.max_positions:
        ap.error("--seq-len must not exceed --max-positions")
    return args


# ---------------------------------------------------------------- sizes

def size_report(vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
                draft_vocab: int = 2048, bytes_per_param: int = 2) -> dict:
    """Parameter counts and bf16 bytes of the target (tied embeddings) and its EAGLE-3 drafter."""
    hd = hidden // heads
    attn = hidden * heads * hd * 2 + hidden * kv_heads * hd * 2          # q, o ; k, v
    mlp = 3 * hidden * intermediate
    layer = attn + mlp + 2 * hidden
    target = vocab * hidden + layers * layer + hidden
    d_attn = 2 * hidden * heads * hd + 2 * 2 * hidden * kv_heads * hd + heads * hd * hidden  # q,k,v read 2H
    drafter = 3 * hidden * hidden + d_attn + mlp + 4 * hidden + hidden * draft_vocab
    drafter_bytes = drafter * bytes_per_param + draft_vocab * 8 + vocab  # + d2t int64, t2d bool
    return {"target_params": target, "target_bytes": target * bytes_per_param,
            "drafter_params_estimate": drafter, "drafter_bytes_estimate": drafter_bytes,
            "draft_vocab_assumed": draft_vocab, "drafter_intermediate_assumed": intermediate,
            "total_bytes_estimate": target * bytes_per_param + drafter_bytes}


# ---------------------------------------------------------------- data

def read_corpus(path: Path, max_records: int = 0) -> list[dict]:
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            out.append(json.loads(line))
            if max_records and len(out) >= max_records:
                break
    return out


def get_tokenizer(args, corpus_records: list[dict]):
    # The class by name, not AutoTokenizer: tokenizer_config.json may name a class that another
    # transformers version lacks (5.x writes "TokenizersBackend").
    from transformers import PreTrainedTokenizerFast as Tok

    tok_dir = Path(args.tokenizer) if args.tokenizer else Path(args.corpus).parent / "tokenizer"
    if (tok_dir / "tokenizer.json").is_file():
        return Tok.from_pretrained(str(tok_dir)), tok_dir, "loaded"
    if args.tokenizer:
        raise SystemExit(f"--tokenizer {tok_dir}: no tokenizer.json there")
    built = Path(args.work_dir) / "tokenizer"
    if (built / "tokenizer.json").is_file() and args.resume:
        return Tok.from_pretrained(str(built)), built, "loaded (resume)"
    from models.tokenizer import build_tokenizer

    texts = [r["text"] if r["kind"] == "doc" else "\n".join(m["content"] for m in r["messages"])
             for r in corpus_records if r["split"] == "train"]
    log(f"building a {args.vocab_size}-token BPE tokenizer on {len(texts)} training texts")
    build_tokenizer(texts, args.vocab_size, built)
    return Tok.from_pretrained(str(built)), built, "built"


def tokenize_split(records: list[dict], tok, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed token stream of one split (int32) and the offsets where samples begin."""
    texts = [r["text"] if r["kind"] == "doc" else tok.apply_chat_template(r["messages"], tokenize=False)
             for r in records if r["split"] == split]
    eot = tok.convert_tokens_to_ids(EOT)
    enc = tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False) if texts else []
    total = sum(len(e.ids) + 1 for e in enc)
    stream = torch.empty(total, dtype=torch.int32)
    starts = torch.empty(len(enc), dtype=torch.long)
    pos = 0
    for i, e in enumerate(enc):
        stream[pos] = eot
        stream[pos + 1: pos + 1 + len(e.ids)] = torch.tensor(e.ids, dtype=torch.int32)
        starts[i] = pos + 1
        pos += len(e.ids) + 1
    return stream, starts


class Windows:
    """Random training windows from a packed stream, reproducible from a CPU generator."""

    def __init__(self, stream: torch.Tensor, starts: torch.Tensor, seq_len: int, device, align_prob: float):
        self.stream = stream.to(device)
        self.n = len(stream) - seq_len - 1
        if self.n <= 0:
            raise SystemExit(f"the training stream has {len(stream)} tokens, fewer than --seq-len + 1 = {seq_len + 1}")
        self.starts = starts[starts <= self.n]
        self.seq_len, self.device, self.align_prob = seq_len, device, align_prob
        self.ar = torch.arange(seq_len + 1, device=device)

    def batch(self, batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        off = torch.randint(0, self.n + 1, (batch_size,), generator=gen)
        if len(self.starts):
            aligned = self.starts[torch.randint(0, len(self.starts), (batch_size,), generator=gen)]
            use = torch.rand(batch_size, generator=gen) < self.align_prob
            off = torch.where(use, aligned, off)
        x = self.stream[off.to(self.device)[:, None] + self.ar].long()
        return x[:, :-1], x[:, 1:]


def fixed_windows(stream: torch.Tensor, seq_len: int, count: int, seed: int) -> torch.Tensor:
    """`count` evaluation windows spread over a stream (fewer if it is short)."""
    t = min(seq_len, len(stream) - 1)
    n = len(stream) - t - 1
    if t < 8:
        return torch.empty(0, t + 1, dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    count = min(count, max(1, (len(stream) - 1) // t))
    off = torch.randint(0, n + 1, (count,), generator=g)
    return stream[off[:, None] + torch.arange(t + 1)].long()


# ---------------------------------------------------------------- model

def make_config(args, tok):
    from transformers import LlamaConfig

    eot, im_end = tok.convert_tokens_to_ids(EOT), tok.convert_tokens_to_ids(IM_END)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads, max_position_embeddings=args.max_positions,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=None, eos_token_id=[im_end, eot],
        pad_token_id=eot, initializer_range=0.02, hidden_act="silu",
        rope_theta=args.rope_theta,
    )
    cfg.architectures = ["LlamaForCausalLM"]
    return cfg


def lr_at(args, step: int, elapsed: float) -> float:
    warm = min(1.0, (step + 1) / max(1, args.warmup_steps))
    p = 0.0
    if args.steps > 0:
        p = max(p, step / args.steps)
    if args.time_budget_s > 0:
        p = max(p, elapsed / args.time_budget_s)
    p = min(p, 1.0)
    return args.lr * warm * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


@torch.no_grad()
def eval_loss(model, windows: torch.Tensor, batch_size: int, device, amp) -> float | None:
    if len(windows) == 0:
        return None
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        w = windows[i: i + batch_size].to(device)
        with amp():
            logits = model(input_ids=w[:, :-1]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten(), reduction="sum")
        total += loss.item()
        count += w[:, 1:].numel()
    model.train(was_training)
    return total / count


def save_atomic(obj, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def export_checkpoint(state: dict, cfg, tok, tok_dir: Path, out: Path) -> None:
    """Write a bf16 HF checkpoint + tokenizer + generation config, readable by transformers 4.x and 5.x."""
    from transformers import GenerationConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(state)
    model = model.to(torch.bfloat16)
    eot, im_end = tok.convert_tokens_to_ids(EOT), tok.convert_tokens_to_ids(IM_END)
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=[im_end, eot], pad_token_id=eot,
                                               do_sample=False)
    model.save_pretrained(str(out))
    os.chmod(out / "model.safetensors", 0o644)
    c = json.loads((out / "config.json").read_text())
    theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") or getattr(cfg, "rope_theta", 10000.0)
    c.setdefault("rope_theta", theta)  # older readers look here
    c.setdefault("torch_dtype", "bfloat16")
    (out / "config.json").write_text(json.dumps(c, indent=2) + "\n")
    for name in ("tokenizer.json", "chat_template.jinja"):
        if (tok_dir / name).is_file():
            shutil.copy(tok_dir / name, out / name)
    tc = json.loads((tok_dir / "tokenizer_config.json").read_text())
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"    # a class name transformers 4.x knows too
    tc["model_max_length"] = cfg.max_position_embeddings
    tc["chat_template"] = tok.chat_template               # also inline, for readers without chat_template.jinja
    (out / "tokenizer_config.json").write_text(json.dumps(tc, indent=2) + "\n")


def verify_export(out: Path, held_windows: torch.Tensor, device, num_samples: int, sample_tokens: int,
                  prompts: list[dict]) -> dict:
    """Reload with transformers and models.llama; compare logits; greedy answers to held-out prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.llama import load_target

    res: dict = {}
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids = held_windows[:1, :64] if len(held_windows) else torch.tensor([[1, 2, 3, 4]])
    try:
        ours = load_target(out, dtype=torch.float32)
        with torch.no_grad():
            a, b = hf(input_ids=ids).logits, ours(ids).logits
        res["hf_vs_models_llama_max_abs_logit_diff"] = float((a - b).abs().max())
        res["hf_vs_models_llama_argmax_agree"] = float((a.argmax(-1) == b.argmax(-1)).float().mean())
    except Exception as e:  # noqa: BLE001 - reported in provenance; the samples below still run
        res["error"] = f"models.llama.load_target: {type(e).__name__}: {e}"
    tok = AutoTokenizer.from_pretrained(str(out))
    hf = hf.to(device)
    samples = []
    for p in prompts[:num_samples]:
        text = tok.apply_chat_template(p["messages"], tokenize=False, add_generation_prompt=True)
        ids = torch.tensor([tok.encode(text, add_special_tokens=False)], device=device)
        with torch.no_grad():
            gen = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=sample_tokens,
                              do_sample=False)
        samples.append({"prompt": p["messages"][-1]["content"],
                        "response": tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=False)})
    res["samples"] = samples
    return res


def hardware(device: torch.device) -> dict:
    import transformers

    hw = {"hostname": socket.gethostname(), "python": platform.python_version(), "torch": torch.__version__,
          "transformers": transformers.__version__, "cpu_count": os.cpu_count(), "device": str(device),
          "platform": platform.platform()}
    try:
        import tokenizers
        hw["tokenizers"] = tokenizers.__version__
    except ImportError:
        pass
    if device.type == "cuda":
        hw["gpu"] = torch.cuda.get_device_name(device)
        hw["cuda"] = torch.version.cuda
    return hw


def write_provenance_md(out: Path, prov: dict) -> None:
    r, f = prov["run"], prov["final"]

    def fmt(x):
        return "n/a" if x is None else f"{x:.4f}"

    lines = [
        "# Provenance of this model", "",
        f"- Script: `{prov['script']}`; command: `{prov['command']}`",
        f"- Data: `{prov['data']['corpus']}` (sha256 {prov['data']['corpus_sha256'][:16]}…), "
        f"{prov['data']['train_tokens']:,} training and {prov['data']['heldout_tokens']:,} held-out tokens; "
        f"{prov['data'].get('description', '')}",
        f"- Held-out modules: {len(prov['data'].get('heldout_modules', []))} (shipped/data/heldout_modules.txt)",
        f"- Seed {prov['args']['seed']}; started {r['start_utc']}, ended {r['end_utc']}; "
        f"{r['steps']} steps, {r['tokens_seen']:,} tokens, {r['train_seconds']:.0f} s of training "
        f"({r['tokens_per_s']:,.0f} tokens/s)",
        f"- Hardware: {prov['hardware'].get('gpu', prov['hardware']['device'])}, torch {prov['hardware']['torch']}, "
        f"transformers {prov['hardware']['transformers']}, Python {prov['hardware']['python']}",
        f"- Model: {prov['model']['params']:,} parameters, {prov['model']['weights_bytes']:,} bytes of bf16 weights",
        f"- Exported: {f['exported']} (step {f['exported_step']}); train loss {fmt(f['train_loss'])}, "
        f"held-out loss {fmt(f['heldout_loss'])} (nats/token)",
        "", "See provenance.json for the full arguments, evaluation history and sample answers.", "",
    ]
    (out / "PROVENANCE.md").write_text("\n".join(lines))


# ---------------------------------------------------------------- main

def main(argv=None) -> dict:
    args = parse_args(argv)
    start_utc = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    torch.manual_seed(args.seed)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")

    def amp():
        if device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    out, work = Path(args.out), Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    corpus_path = Path(args.corpus)
    t0 = time.time()
    records = read_corpus(corpus_path, args.max_records)
    tok, tok_dir, tok_how = get_tokenizer(args, records)
    log(f"corpus {corpus_path}: {len(records)} records; tokenizer {tok_how} from {tok_dir} ({len(tok)} tokens)")
    train_stream, train_starts = tokenize_split(records, tok, "train")
    held_stream, _ = tokenize_split(records, tok, "heldout")
    log(f"tokenized in {time.time() - t0:.1f} s: train {len(train_stream):,} tokens "
        f"({len(train_starts)} samples), held-out {len(held_stream):,} tokens")
    manifest_path = corpus_path.parent / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    del records

    cfg = make_config(args, tok)
    sizes = size_report(len(tok), args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate)
    log("sizes (bf16): target {target_params:,} params = {target_bytes:,} B; drafter estimate "
        "{drafter_params_estimate:,} params = {drafter_bytes_estimate:,} B; total {total_bytes_estimate:,} B"
        .format(**sizes))

    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(cfg).to(device)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(args.seed)
    train_windows = Windows(train_stream, train_starts, args.seq_len, device, args.align_prob)
    n_eval = args.eval_batches * args.batch_size
    held_windows = fixed_windows(held_stream, args.seq_len, n_eval, seed=1234)
    train_eval_windows = fixed_windows(train_stream, args.seq_len, n_eval, seed=4321)

    step, elapsed, tokens_seen, history = 0, 0.0, 0, []
    best = {"loss": float("inf"), "step": -1, "state": None}
    state_path = work / "train_state.pt"
    if args.resume and state_path.is_file():
        st = torch.load(state_path, map_location="cpu", weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optim"])
        gen.set_state(st["gen"])
        step, elapsed, tokens_seen, history, best = st["step"], st["elapsed"], st["tokens"], st["history"], st["best"]
        start_utc = st.get("start_utc", start_utc)
        log(f"resumed from {state_path} at step {step} ({elapsed:.0f} s trained)")

    def checkpoint():
        save_atomic({"model": model.state_dict(), "optim": opt.state_dict(), "gen": gen.get_state(), "step": step,
                     "elapsed": elapsed, "tokens": tokens_seen, "history": history, "best": best,
                     "start_utc": start_utc, "args": vars(args)}, state_path)

    def do_eval():
        nonlocal best
        hl = eval_loss(model, held_windows, args.batch_size, device, amp)
        tl = eval_loss(model, train_eval_windows, args.batch_size, device, amp)
        history.append({"step": step, "tokens": tokens_seen, "elapsed_s": round(elapsed, 1), "train_loss": tl,
                        "heldout_loss": hl, "lr": lr_at(args, step, elapsed)})
        key = hl if hl is not None else tl
        if key < best["loss"]:
            best = {"loss": key, "step": step, "state": {k: v.detach().to("cpu", copy=True)
                                                         for k, v in model.state_dict().items()}}
        log(f"eval step {step}: train loss {tl:.4f}, held-out loss "
            f"{'n/a' if hl is None else f'{hl:.4f}'} (best {best['loss']:.4f} at step {best['step']})")

    def forward_loss(x, y):
        with amp():
            logits = model(input_ids=x).logits
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    fwd = forward_loss
    if args.compile:
        log("torch.compile: on (the first steps include compilation)")
        fwd = torch.compile(forward_loss)

    def train_step(x, y):
        loss = fwd(x, y)
        loss.backward()
        return loss

    tok_per_step = args.batch_size * args.seq_len
    log(f"training {n_params:,} params on {device}: batch {args.batch_size} x {args.seq_len} = {tok_per_step:,} "
        f"tokens/step, lr {args.lr}, steps {args.steps or '-'}, time budget {args.time_budget_s or '-'} s")
    # Training time = wall time of the loop minus evaluations and checkpoints (added to `paused`).
    loop_start, elapsed_before, paused, first_step = time.time(), elapsed, 0.0, step
    last_ckpt, window_t, window_tok, loss_acc = time.time(), time.time(), 0, []

    def done() -> bool:
        return (args.steps > 0 and step >= args.steps) or (args.time_budget_s > 0 and elapsed >= args.time_budget_s)

    while not done():
        lr = lr_at(args, step, elapsed)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = train_windows.batch(args.batch_size, gen)
        try:
            loss = train_step(x, y)
        except Exception as e:  # noqa: BLE001 - a compile failure must not lose the run
            if fwd is forward_loss:
                raise
            log(f"torch.compile failed ({type(e).__name__}: {str(e)[:300]}); continuing in eager mode")
            fwd = forward_loss
            opt.zero_grad(set_to_none=True)
            loss = train_step(x, y)
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens_seen += tok_per_step
        window_tok += tok_per_step
        loss_acc.append(loss.detach())
        if step == first_step + 1:  # compilation and warm-up: not counted as training time
            if device.type == "cuda":
                torch.cuda.synchronize()
            paused += time.time() - loop_start
            log(f"first step took {time.time() - loop_start:.1f} s (not counted in the time budget)")
        elapsed = elapsed_before + time.time() - loop_start - paused
        if step % args.log_every == 0 or step == 1:
            lv = torch.stack(loss_acc).float().mean().item()  # one sync per log line
            loss_acc = []
            now = time.time()
            rate = window_tok / max(1e-9, now - window_t)
            window_t, window_tok = now, 0
            left = []
            if args.steps:
                left.append(f"step {step}/{args.steps}")
            if args.time_budget_s:
                left.append(f"{elapsed:.0f}/{args.time_budget_s:.0f} s")
            log(f"step {step} loss {lv:.4f} lr {lr:.2e} {rate:,.0f} tok/s tokens {tokens_seen:,} ({', '.join(left)})")
        if step % args.eval_every == 0 or time.time() - last_ckpt >= args.ckpt_every_s:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t_p = time.time()
            elapsed = elapsed_before + t_p - loop_start - paused
            if step % args.eval_every == 0:
                do_eval()
            if time.time() - last_ckpt >= args.ckpt_every_s:
                checkpoint()
                last_ckpt = time.time()
                log(f"checkpoint: {state_path}")
            pause = time.time() - t_p
            paused += pause
            window_t += pause  # keep evaluation and checkpoint time out of the tokens/s figure

    if not history or history[-1]["step"] != step:
        do_eval()
    checkpoint()
    train_seconds = elapsed
    last = history[-1]
    if args.export == "best" and best["state"] is not None:
        export_state, exported, exp_step = best["state"], "best held-out loss", best["step"]
        exp_eval = next(h for h in history if h["step"] == best["step"])
    else:
        export_state, exported, exp_step, exp_eval = model.state_dict(), "last", step, last
    export_state = {k: v.detach().float().cpu() for k, v in export_state.items()}
    export_checkpoint(export_state, cfg, tok, tok_dir, out)
    log(f"exported {exported} weights (step {exp_step}) to {out}")

    prompts_path = Path(args.heldout_prompts)
    prompts = ([json.loads(line) for line in prompts_path.read_text().splitlines() if line.strip()]
               if prompts_path.is_file() else [])
    try:
        verify = verify_export(out, held_windows, device, args.num_samples, args.sample_tokens, prompts)
    except Exception as e:  # noqa: BLE001 - the weights are written; report, do not lose the run
        verify = {"error": f"{type(e).__name__}: {e}", "samples": []}
    if "error" in verify:
        log(f"reload check FAILED: {verify['error']}")
    else:
        log(f"reload check: max |logit diff| transformers vs models.llama = "
            f"{verify['hf_vs_models_llama_max_abs_logit_diff']:.2e}")
    for s in verify["samples"]:
        log(f"sample — prompt: {s['prompt'][:120]!r}\n--- response:\n{s['response']}\n---")

    weights = out / "model.safetensors"
    prov = {
        "script": "shipped/train_target.py",
        "command": "python3 " + " ".join([os.path.relpath(__file__, REPO)]
                                         + (list(argv) if argv is not None else sys.argv[1:])),
        "args": vars(args),
        "data": {
            "corpus": str(corpus_path), "corpus_sha256": sha256(corpus_path),
            "description": "Python source documents and (signature/docstring -> code) chat pairs from the "
                           "standard library and installed packages; built by shipped/build_corpus.py",
            "corpus_manifest": {k: manifest.get(k)
                                for k in ("command", "created", "versions", "holdout_rule", "stats")},
            "heldout_modules": manifest.get("heldout_modules", []),
            "train_tokens": len(train_stream), "heldout_tokens": len(held_stream),
            "tokenizer": {"dir": str(tok_dir), "how": tok_how, "vocab_size": len(tok)},
            "max_records": args.max_records,
        },
        "seed": args.seed,
        "run": {"start_utc": start_utc, "end_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "steps": step, "tokens_seen": tokens_seen, "train_seconds": round(train_seconds, 1),
                "tokens_per_s": tokens_seen / max(1e-9, train_seconds),
                "epochs_over_train_tokens": tokens_seen / max(1, len(train_stream))},
        "hardware": hardware(device),
        "model": {"architecture": "LlamaForCausalLM", "params": n_params, "weights_bytes": weights.stat().st_size,
                  "config": {k: getattr(cfg, k) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                          "num_hidden_layers", "num_attention_heads",
                                                          "num_key_value_heads", "head_dim",
                                                          "max_position_embeddings", "tie_word_embeddings")},
                  "size_report": sizes},
        "final": {"exported": exported, "exported_step": exp_step, "train_loss": exp_eval["train_loss"],
                  "heldout_loss": exp_eval["heldout_loss"], "last_step_train_loss": last["train_loss"],
                  "last_step_heldout_loss": last["heldout_loss"]},
        "eval_history": history,
        "verify": verify,
    }
    (out / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    write_provenance_md(out, prov)
    log(f"done: {step} steps, {tokens_seen:,} tokens in {train_seconds:.0f} s; "
        f"exported train loss {exp_eval['train_loss']:.4f}, "
        f"held-out loss {exp_eval['heldout_loss'] or float('nan'):.4f}; "
        f"weights {weights.stat().st_size:,} B")
    return prov


if __name__ == "__main__":
    main()
