"""`drafter train`: online EAGLE-3 training with training-time test (drafter/ttt.py).

The target runs in the loop: each batch goes through it once (no grad) for its aux hidden
states and logits, so no hidden-state data set ever touches disk. The drafter's embedding
is the target's (shared, frozen); its lm_head starts from the target's lm_head rows of the
draft vocabulary, which gives step 0 a sensible output space from the first update.
AdamW, linear warm-up then cosine decay, gradient clipping, bf16 autocast on GPU.
Multi-GPU: `torchrun --nproc_per_node N -m drafter train ...` (DDP, initialised only when
WORLD_SIZE > 1; each rank takes every N-th micro-batch).

Run directory: train_config.json, drafter_config.json, log.jsonl, checkpoints/step-XXXXXXXX/
({drafter.safetensors, state.pt}). `--resume` continues from the newest checkpoint with the
same data order; `--stop-at N` ends a run early (a time-limited job) with a checkpoint.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from drafter.shards import TokenShards
from drafter.ttt import TTTModel, TTTStats, target_draft_probs
from drafter.vocab import VOCAB_FILE, DraftVocab
from models.eagle3 import Eagle3Config, Eagle3Drafter
from models.llama import LlamaModel, load_target

CKPT_DIR = "checkpoints"
WEIGHTS = "drafter.safetensors"
STATE = "state.pt"


@dataclass
class TrainConfig:
    target: str
    data: str
    out: str
    vocab: str | None = None                 # default: <data>/draft_vocab.safetensors
    aux_layers: list[int] | None = None      # target layer OUTPUTS to capture; default [1, L//2-1, L-4]
    intermediate_size: int | None = None     # drafter shape; defaults from the target
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    ttt_length: int = 7
    step_weight: float = 0.8
    lr: float = 1e-4
    min_lr_ratio: float = 0.0
    warmup_steps: int = -1                   # -1: warmup_ratio of the total
    warmup_ratio: float = 0.015
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 0.5
    batch_size: int = 4                      # sequences per micro-batch (per rank)
    grad_accum: int = 1
    max_length: int = 2048
    epochs: float = 1.0
    limit_samples: int = 0                   # train on the first N conversations only (0: all)
    max_steps: int = 0                       # 0: from epochs
    stop_at: int = 0                         # end this run after this step (schedule still spans max_steps)
    save_every: int = 1000
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0
    device: str = "auto"
    init_lm_head: bool = True
    resume: bool = False
    extra: dict = field(default_factory=dict)


# -- setup ---------------------------------------------------------------------------------
@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_dist() -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    else:
        dist.init_process_group("gloo")
    return Dist(rank=dist.get_rank(), world=world, local_rank=local)


def pick_device(name: str, d: Dist) -> torch.device:
    if name == "auto":
        return torch.device(f"cuda:{d.local_rank}" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def drafter_config(target: LlamaModel, vocab: DraftVocab, c: TrainConfig) -> Eagle3Config:
    t = target.config
    return Eagle3Config(
        hidden_size=t.hidden_size,   # equals the target's: the embedding is shared
        intermediate_size=c.intermediate_size or t.intermediate_size,
        num_attention_heads=c.num_attention_heads or t.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads or t.num_key_value_heads,
        head_dim=c.head_dim or t.head_dim,
        vocab_size=t.vocab_size, draft_vocab_size=vocab.size, target_hidden_size=t.hidden_size,
        aux_layer_ids=list(target.aux_layer_ids), rms_norm_eps=t.rms_norm_eps, rope_theta=t.rope_theta,
        rope_scaling=t.rope_scaling, max_position_embeddings=t.max_position_embeddings,
    )


def build_drafter(target: LlamaModel, vocab: DraftVocab, cfg: Eagle3Config, init_lm_head: bool,
                  device: torch.device) -> Eagle3Drafter:
    with torch.device(device):
        d = Eagle3Drafter(cfg)
    d.embed_tokens.weight = target.embed_tokens.weight      # shared and frozen
    d.embed_tokens.weight.requires_grad_(False)
    used = vocab.used.to(device)
    d.d2t.copy_(vocab.d2t.to(device))
    d.t2d.copy_(vocab.t2d(cfg.vocab_size).to(device))
    if init_lm_head:
        with torch.no_grad():
            d.lm_head.weight.copy_(target.lm_head.weight[used].float())
    return d


def trainable_state(d: Eagle3Drafter) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous() for k, v in d.state_dict().items() if k != "embed_tokens.weight"}


# -- data order ----------------------------------------------------------------------------
class Batches:
    """Deterministic micro-batches: epoch e shuffles with seed + e; micro-batch g of the whole
    run is batch g % per_epoch of epoch g // per_epoch, so a resumed run sees the same data."""

    def __init__(self, data: TokenShards, batch_size: int, max_length: int, seed: int, limit: int = 0):
        self.data, self.bs, self.max_length, self.seed = data, batch_size, max_length, seed
        self.n = min(len(data), limit) if limit else len(data)  # the first n conversations (data scaling)
        self.per_epoch = self.n // batch_size
        if self.per_epoch == 0:
            raise ValueError(f"{self.n} conversations cannot fill one batch of {batch_size}")
        self._perm_epoch, self._perm = -1, None

    def get(self, g: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        epoch, j = divmod(g, self.per_epoch)
        if epoch != self._perm_epoch:
            gen = torch.Generator().manual_seed(self.seed + epoch)
            self._perm, self._perm_epoch = torch.randperm(self.n, generator=gen), epoch
        items = [self.data[int(i)] for i in self._perm[j * self.bs:(j + 1) * self.bs]]
        items = [(ids[:self.max_length], m[:self.max_length]) for ids, m in items]
        t = max(ids.numel() for ids, _ in items)
        ids = torch.zeros(len(items), t, dtype=torch.long)
        mask = torch.zeros(len(items), t, dtype=torch.bool)
        for b, (x, m) in enumerate(items):
            ids[b, :x.numel()], mask[b, :m.numel()] = x, m
        return ids, mask, epoch


def lr_at(step: int, total: int, warmup: int, base: float, min_ratio: float) -> float:
    """Linear warm-up to `base`, then cosine decay to base * min_ratio at `total`."""
    if step < warmup:
        return base * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


# -- checkpoints ---------------------------------------------------------------------------
def checkpoints(out: Path) -> list[Path]:
    """Complete checkpoints (state.pt is written last), oldest first."""
    return sorted(p for p in (out / CKPT_DIR).glob("step-*") if (p / STATE).exists())


def latest_checkpoint(out: str | Path) -> Path | None:
    found = checkpoints(Path(out))
    return found[-1] if found else None


def save_checkpoint(out: Path, step: int, d: Eagle3Drafter, opt, keep: int) -> Path:
    path = out / CKPT_DIR / f"step-{step:08d}"
    path.mkdir(parents=True, exist_ok=True)
    save_file(trainable_state(d), str(path / WEIGHTS))
    torch.save({"step": step, "optimizer": opt.state_dict()}, path / STATE)
    for old in checkpoints(out)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return path


# -- the loop ------------------------------------------------------------------------------
def _reduce(t: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.world > 1:
        dist.all_reduce(t)
    return t


def summarize(s: TTTStats, n_batches: int) -> dict:
    acc = (s.correct / s.counted.clamp_min(1)).tolist()
    sim = (1 + s.accepted / s.starts.clamp_min(1)).tolist()
    return {"loss_per_step": [round(x / max(1, n_batches), 4) for x in s.loss.tolist()],
            "acc": [round(x, 4) for x in acc], "sim_accept_length": [round(x, 3) for x in sim]}


def train(c: TrainConfig) -> Path:
    d = init_dist()
    device = pick_device(c.device, d)
    out = Path(c.out)
    cuda = device.type == "cuda"
    torch.manual_seed(c.seed)

    ckpt = latest_checkpoint(out) if c.resume else None
    if not c.resume and checkpoints(out):
        raise FileExistsError(f"{out}: already has checkpoints; pass --resume or choose a new --out")

    vocab = DraftVocab.load(c.vocab or Path(c.data) / VOCAB_FILE)
    # Ascending aux layers: SGLang and vLLM concatenate in that order (models/aux_layers.py); a
    # resumed run keeps the order it was trained with.
    recorded = out / "drafter_config.json"
    aux = sorted(c.aux_layers) if c.aux_layers else None
    if ckpt is not None and recorded.exists():
        aux = json.loads(recorded.read_text())["aux_layer_ids"]
    target = load_target(c.target, dtype=torch.bfloat16 if cuda else torch.float32, device=device,
                         aux_layer_ids=aux)
    target.requires_grad_(False)
    cfg = drafter_config(target, vocab, c)
    drafter = build_drafter(target, vocab, cfg, c.init_lm_head and ckpt is None, device)
    model = TTTModel(drafter, c.ttt_length, c.step_weight)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=c.lr, betas=c.betas, weight_decay=c.weight_decay, fused=cuda)
    start = 0
    if ckpt is not None:
        state = load_file(str(ckpt / WEIGHTS), device=str(device))
        drafter.load_state_dict({**state, "embed_tokens.weight": drafter.embed_tokens.weight}, strict=True)
        st = torch.load(ckpt / STATE, map_location=device, weights_only=True)
        opt.load_state_dict(st["optimizer"])
        start = st["step"]
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[d.local_rank] if cuda else None) if d.world > 1 else model

    data = TokenShards(c.data)
    batches = Batches(data, c.batch_size, c.max_length, c.seed, c.limit_samples)
    micro_per_step = c.grad_accum * d.world
    total = c.max_steps or max(1, int(c.epochs * batches.per_epoch) // micro_per_step)
    warmup = c.warmup_steps if c.warmup_steps >= 0 else int(c.warmup_ratio * total)
    used, t2d = vocab.used.to(device), drafter.t2d

    c.extra["target_num_hidden_layers"] = target.config.num_hidden_layers   # for export's capture record
    if d.main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_config.json").write_text(json.dumps(dataclasses.asdict(c), indent=2) + "\n")
        (out / "drafter_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
        if start == 0:
            save_checkpoint(out, 0, drafter, opt, c.keep_checkpoints + 1)   # the untrained drafter
    log = open(out / "log.jsonl", "a") if d.main else None
    bar = tqdm(total=total, initial=start, desc="train", unit="step", disable=not d.main)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    k = c.ttt_length
    acc_stats, n_batches, tokens, t0 = torch.zeros(4 * k + 1, device=device), 0, 0, time.time()
    model.train()
    for step in range(start, total):
        lr = lr_at(step, total, warmup, c.lr, c.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        for a in range(c.grad_accum):
            ids, mask, epoch = batches.get((step * c.grad_accum + a) * d.world + d.rank)
            tokens += int(mask.sum())
            ids, mask = ids.to(device, non_blocking=True), mask.to(device, non_blocking=True)
            with torch.no_grad(), autocast:
                tout = target(ids, capture_aux=True)
                p, in_vocab = target_draft_probs(tout.logits, used, t2d)
                aux = tout.aux_hidden
                del tout   # full-vocab logits: large for big vocabularies, not needed any more
            sync = contextlib.nullcontext() if a == c.grad_accum - 1 or d.world == 1 else ddp.no_sync()
            with sync:
                with autocast:
                    loss, stats = ddp(ids, mask, aux, p, in_vocab)
                (loss / c.grad_accum).backward()
            acc_stats += stats.as_tensor()
            n_batches += 1
        grad_norm = torch.nn.utils.clip_grad_norm_(params, c.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        done = step + 1
        bar.update(1)
        if done % c.log_every == 0 or done == total:
            s = _reduce(acc_stats.clone(), d)
            nb = torch.tensor([n_batches, tokens], device=device, dtype=torch.float64)
            nb = _reduce(nb, d)
            summary = summarize(TTTStats.from_tensor(s, k), int(nb[0]))
            rec = {"step": done, "epoch": epoch, "lr": lr, "loss": round(sum(
                c.step_weight ** i * x for i, x in enumerate(summary["loss_per_step"])), 4),
                "grad_norm": round(float(grad_norm), 4), **summary, "loss_tokens": int(nb[1]),
                "elapsed_s": round(time.time() - t0, 2)}
            if d.main:
                log.write(json.dumps(rec) + "\n")
                log.flush()
                bar.set_postfix(loss=rec["loss"], acc0=summary["acc"][0],
                                accept=summary["sim_accept_length"][min(2, k - 1)])
            acc_stats.zero_()
            n_batches, tokens = 0, 0
        stop = bool(c.stop_at) and done >= c.stop_at
        if d.main and (done % c.save_every == 0 or done == total or stop):
            save_checkpoint(out, done, drafter, opt, c.keep_checkpoints)
        if stop:
            break
    bar.close()
    if log:
        log.close()
    if d.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return out
