#!/usr/bin/env python3
"""Build the tiny DeepSeek-V3 target (`shipped/deepseek_tiny/target/`): a DeepseekV3ForCausalLM (MLA
attention + MoE, Kimi-K2.5's architecture) small enough for CPU tests, trained briefly on the
Python standard library so that its greedy continuations are code-like text a drafter can learn,
not the noise a random model emits.

Why these numbers: vLLM's CPU MLA kernel needs kv_lora_rank 512 and qk_rope_head_dim 64;
vLLM's DeepSeek MoE needs topk_method "noaux_tc" and scoring_func "sigmoid" (Kimi-K2.5's and
DeepSeek-V3's own). 8 layers so that the default aux layers and their off-by-one neighbours are
distinct layers; the tokenizer is the shipped Llama target's (BPE 6144 over Python source, ChatML).

Deterministic: seeded, a fixed step count, files in sorted order (the same interpreter gives the
same model). 1,200 steps: 20 minutes on 2 shared CPU cores:

    .venv/bin/python shipped/deepseek_tiny/build_target.py

Held out: the stdlib modules named in shipped/data/heldout_modules.txt are not trained on; the
loop's prompts (shipped/deepseek_tiny/loop.py) come from them.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def stdlib_files(held_out: bool) -> list[Path]:
    """Top-level stdlib modules, sorted; the held-out ones (shipped/data/heldout_modules.txt) or the rest."""
    names = set((REPO / "shipped" / "data" / "heldout_modules.txt").read_text().split())
    files = sorted(Path(f) for f in glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    return [f for f in files if (f.stem in names) == held_out]


def tiny_config(vocab_size: int, eos: list[int]) -> dict:
    """The DeepseekV3 config: MLA (no q LoRA), 1 dense layer then MoE (4 routed + 1 shared, top 2). No
    pad token: transformers would keep that token's embedding row at zero, and <|endoftext|> (the
    pad token of the tokenizer) opening a window then gave NaN gradients."""
    return dict(
        architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", vocab_size=vocab_size,
        hidden_size=64, intermediate_size=128, moe_intermediate_size=64, num_hidden_layers=8,
        num_attention_heads=2, num_key_value_heads=2, q_lora_rank=None, kv_lora_rank=512,
        qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32, n_routed_experts=4, n_shared_experts=1,
        num_experts_per_tok=2, first_k_dense_replace=1, n_group=1, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=1.0, topk_method="noaux_tc", scoring_func="sigmoid", max_position_embeddings=1024,
        rms_norm_eps=1e-6, tie_word_embeddings=False, eos_token_id=eos, pad_token_id=None, bos_token_id=None,
        rope_theta=10000.0, initializer_range=0.02, num_nextn_predict_layers=0)


def token_stream(tok, files: list[Path]):
    import torch

    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    ids: list[int] = []
    for f in files:
        ids += [eot] + tok.encode(f.read_text(errors="replace"))
    return torch.tensor(ids)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "shipped" / "deepseek_tiny" / "target"))
    ap.add_argument("--tokenizer", default=str(REPO / "shipped" / "target"), help="folder with tokenizer files")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--teacher", default=str(REPO / "shipped" / "target"),
                    help="distil from this model's next-token distributions (same tokenizer); '' for labels only")
    ap.add_argument("--kd-weight", type=float, default=0.9, help="share of the loss that is KL to the teacher")
    a = ap.parse_args(argv)

    import torch
    from transformers import AutoTokenizer, DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    eos = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    cfg_dict = tiny_config(len(tok), eos)
    config = DeepseekV3Config(**cfg_dict)
    config._experts_implementation = "eager"   # a loop over experts (the grouped-mm kernel is for GPUs)
    model = DeepseekV3ForCausalLM(config)
    train = token_stream(tok, stdlib_files(held_out=False))
    held = token_stream(tok, stdlib_files(held_out=True))
    print(f"{sum(p.numel() for p in model.parameters()):,} parameters; {len(train):,} training and "
          f"{len(held):,} held-out tokens", flush=True)

    teacher = None
    if a.teacher:   # soft targets carry far more per token than labels: minutes of CPU reach a usable model
        from transformers import AutoModelForCausalLM
        teacher = AutoModelForCausalLM.from_pretrained(a.teacher, dtype=torch.float32).eval().requires_grad_(False)
        if teacher.config.vocab_size != len(tok):
            raise ValueError(f"--teacher {a.teacher}: vocabulary {teacher.config.vocab_size} != tokenizer {len(tok)}")
    gen = torch.Generator().manual_seed(a.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, a.steps // 20)
    model.train()
    skipped: list[int] = []
    t0 = time.monotonic()
    for step in range(1, a.steps + 1):
        lr = a.lr * min(1.0, step / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / a.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train) - a.seq_len - 1, (a.batch_size,), generator=gen)
        x = torch.stack([train[s:s + a.seq_len + 1] for s in starts.tolist()])
        logits = model(input_ids=x[:, :-1]).logits.flatten(0, 1)
        loss = ce = torch.nn.functional.cross_entropy(logits, x[:, 1:].flatten())
        if teacher is not None:
            with torch.no_grad():
                t_logp = teacher(input_ids=x[:, :-1]).logits.flatten(0, 1).log_softmax(-1)
            kd = torch.nn.functional.kl_div(logits.log_softmax(-1), t_logp, log_target=True, reduction="batchmean")
            loss = a.kd_weight * kd + (1 - a.kd_weight) * ce
        if not torch.isfinite(loss):
            raise FloatingPointError(f"step {step}: loss {loss.item()}; try a smaller --lr")
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if not torch.isfinite(norm):   # skipped, as a loss scaler would; counted in the provenance
            skipped.append(step)
            print(f"step {step}: gradient norm {norm.item()}, step skipped", flush=True)
            continue
        opt.step()
        if step % 50 == 0 or step == a.steps:
            print(f"step {step}/{a.steps} loss {loss.item():.3f} (cross-entropy {ce.item():.3f}) lr {lr:.2e} "
                  f"{time.monotonic() - t0:.0f}s", flush=True)

    model.eval()
    with torch.no_grad():
        w = held[: (len(held) // (a.seq_len + 1)) * (a.seq_len + 1)].view(-1, a.seq_len + 1)[:32]
        held_loss = torch.nn.functional.cross_entropy(model(input_ids=w[:, :-1]).logits.flatten(0, 1),
                                                      w[:, 1:].flatten()).item()
        prompt = tok.encode("def read_config(path):\n")
        out = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)
        sample = tok.decode(out[0, len(prompt):])
    print(f"held-out loss {held_loss:.3f}; greedy sample: {sample!r}", flush=True)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(topk_method="noaux_tc", scoring_func="sigmoid")  # vLLM reads these; transformers drops them
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in TOKENIZER_FILES:
        shutil.copy(Path(a.tokenizer) / f, out / f)
    args = {k: (os.path.relpath(v, REPO) if isinstance(v, str) and v.startswith(str(REPO)) else v)
            for k, v in vars(a).items()}
    prov = {"script": "shipped/deepseek_tiny/build_target.py", "argv": sys.argv[1:], "args": args,
            "train_files": len(stdlib_files(False)), "train_tokens": len(train), "heldout_tokens": len(held),
            "final_train_loss": round(loss.item(), 4), "final_train_cross_entropy": round(ce.item(), 4),
            "heldout_loss": round(held_loss, 4), "skipped_steps": skipped,
            "greedy_sample": sample, "train_seconds": round(time.monotonic() - t0, 1),
            "python": sys.version.split()[0], "torch": torch.__version__,
            "transformers": __import__("transformers").__version__}
    (out / "provenance.json").write_text(json.dumps(prov, indent=2) + "\n")
    print(json.dumps({"out": str(out), "heldout_loss": prov["heldout_loss"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
