"""`drafter train`: online EAGLE-3 training with training-time test (drafter/ttt.py).

Features (drafter/features.py): by default the target runs in the loop through the native engine,
each batch once (no grad) for its aux hidden states and logits, so nothing touches disk. With
`--features transformers|vllm` a capture process streams feature shards through a bounded spool
and the trainer holds only the target's embedding, final norm and lm_head (the logits are
recomputed from the captured last-layer output); `--keep-features DIR` / `--features DIR` keep
and reuse them. The drafter's embedding
is the target's (shared, frozen); its lm_head starts from the target's lm_head rows of the
draft vocabulary, which gives step 0 a sensible output space from the first update.
AdamW, linear warm-up then cosine decay, gradient clipping, bf16 autocast on GPU (and on CPU with --dtype bfloat16).
Multi-GPU: `torchrun --nproc_per_node N -m drafter train ...` (DDP, initialised only when
WORLD_SIZE > 1; each rank takes every N-th micro-batch).

Run directory: train_config.json, drafter_config.json, log.jsonl, checkpoints/step-XXXXXXXX/
({drafter.safetensors, state.pt}), spool/ and capture.log with a capture process.
`--resume` continues from the newest checkpoint with the same data order (the capture process
starts at that micro-batch); `--stop-at N` ends a run early (a time-limited job) with a checkpoint.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from drafter import features as fs
from drafter.batches import Batches
from drafter.shards import TokenShards
from drafter.target_head import TargetHead, TargetSpec, load_head_tensors
from drafter.train_config import TrainConfig
from drafter.ttt import TTTModel, TTTStats, calibrate_fc_norm, feature_noise, target_draft_probs
from drafter.vocab import VOCAB_FILE, DraftVocab
from models.aux_layers import default_aux_layer_ids, layer_outputs_for
from models.eagle3 import Eagle3Config, Eagle3Drafter
from models.eagle3_checkpoint import load_drafter, weight_names
from models.hf_config import read_hf_config
from models.llama import load_target

CKPT_DIR = "checkpoints"
WEIGHTS = "drafter.safetensors"
STATE = "state.pt"


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


def drafter_config(t, vocab: DraftVocab, aux: list[int], c: TrainConfig) -> Eagle3Config:
    """`t`: the target's shape (models.llama.LlamaConfig or drafter.target_head.TargetSpec)."""
    return Eagle3Config(
        hidden_size=t.hidden_size,   # equals the target's: the embedding is shared
        intermediate_size=c.intermediate_size or t.intermediate_size,
        num_attention_heads=c.num_attention_heads or t.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads or t.num_key_value_heads,
        head_dim=c.head_dim or t.head_dim,
        vocab_size=t.vocab_size, draft_vocab_size=vocab.size, target_hidden_size=t.hidden_size,
        aux_layer_ids=list(aux), rms_norm_eps=t.rms_norm_eps, rope_theta=t.rope_theta,
        rope_scaling=t.rope_scaling, max_position_embeddings=t.max_position_embeddings, shared_head=c.shared_head,
        fc_norm=c.fc_norm, norm_output=c.norm_output,
    )


def build_drafter(embed: torch.nn.Parameter, lm_head: torch.Tensor, vocab: DraftVocab, cfg: Eagle3Config,
                  init_lm_head: bool, device: torch.device) -> Eagle3Drafter:
    with torch.device(device):
        d = Eagle3Drafter(cfg)
    d.embed_tokens.weight = embed      # the target's, shared and frozen
    d.embed_tokens.weight.requires_grad_(False)
    used = vocab.used.to(device)
    d.d2t.copy_(vocab.d2t.to(device))
    d.t2d.copy_(vocab.t2d(cfg.vocab_size).to(device))
    if cfg.shared_head:   # the target's, shared and frozen, as the embedding
        d.lm_head.weight = lm_head if isinstance(lm_head, torch.nn.Parameter) else torch.nn.Parameter(lm_head)
        d.lm_head.weight.requires_grad_(False)
    elif init_lm_head:
        with torch.no_grad():
            d.lm_head.weight.copy_(lm_head[used].float())
    return d


def drafter_vocab(d: Eagle3Drafter, data_vocab: Path) -> DraftVocab:
    """The draft vocabulary of a drafter a run starts from (--init), with the data's token counts
    where the data has them (for the coverage report)."""
    used = d.d2t.long() + torch.arange(d.config.draft_vocab_size)
    counts = (DraftVocab.load(data_vocab).counts if data_vocab.is_file()
              else torch.zeros(d.config.vocab_size, dtype=torch.long))
    return DraftVocab(used=used, counts=counts)


def aux_outputs(c: TrainConfig, num_layers: int) -> list[int]:
    """The layer OUTPUTS to train on, ascending (SGLang and vLLM concatenate in that order)."""
    if not c.aux_layers:
        return default_aux_layer_ids(num_layers)
    aux = layer_outputs_for(c.aux_convention, c.aux_layers, num_layers)
    if len(aux) != 3:
        raise ValueError(f"--aux-layers {c.aux_layers} ({c.aux_convention}) name layer outputs {aux}: EAGLE-3's fc "
                         f"fuses exactly 3")
    return aux


def borrowed(d: Eagle3Drafter) -> dict[str, torch.Tensor]:
    """The target's weights the drafter holds: never saved, put back on load."""
    return {"embed_tokens.weight": d.embed_tokens.weight,
            **({"lm_head.weight": d.lm_head.weight} if d.config.shared_head else {})}


def trainable_state(d: Eagle3Drafter) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous() for k, v in d.state_dict().items() if k not in borrowed(d)}


def lr_at(step: int, total: int, warmup: int, base: float, min_ratio: float) -> float:
    """Linear warm-up to `base`, then cosine decay to base * min_ratio at `total`."""
    if step < warmup:
        return base * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def lr_at_time(seconds: float, budget: float, warmup_ratio: float, base: float, min_ratio: float) -> float:
    """lr_at with training seconds for steps: a time-budgeted run's schedule ends with its budget,
    however fast its steps turn out to be (they vary with the device, the data's lengths and the
    allocator's warm-up: a step-count probe on an H200 was off by 1.6x)."""
    scale = 10**6
    return lr_at(int(scale * seconds / budget), scale, int(scale * warmup_ratio), base, min_ratio)


# -- checkpoints ---------------------------------------------------------------------------
def checkpoints(out: Path) -> list[Path]:
    """Complete checkpoints (state.pt is written last), oldest first."""
    return sorted(p for p in (out / CKPT_DIR).glob("step-*") if (p / STATE).exists())


def latest_checkpoint(out: str | Path) -> Path | None:
    found = checkpoints(Path(out))
    return found[-1] if found else None


def save_checkpoint(out: Path, step: int, d: Eagle3Drafter, opt, keep: int, trained_s: float = 0.0) -> Path:
    path = out / CKPT_DIR / f"step-{step:08d}"
    path.mkdir(parents=True, exist_ok=True)
    save_file(trainable_state(d), str(path / WEIGHTS))
    torch.save({"step": step, "optimizer": opt.state_dict(), "trained_s": trained_s}, path / STATE)
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
    walked = (s.walk_tokens / s.walk_cycles.clamp_min(1)).tolist()
    return {"loss_per_step": [round(x / max(1, n_batches), 4) for x in s.loss.tolist()],
            "acc": [round(x, 4) for x in acc], "sim_accept_length": [round(x, 3) for x in sim],
            "walked_accept_length": [round(x, 3) for x in walked]}


def _out_of_time(c: TrainConfig, started: float, d: Dist, device) -> bool:
    """Whether the run's time limit has passed; every rank gets rank 0's answer (they must stop
    at the same step)."""
    late = c.time_limit_s > 0 and time.time() - started >= c.time_limit_s
    if c.time_limit_s <= 0 or d.world == 1:
        return late
    flag = torch.tensor([float(late)], device=device)
    dist.broadcast(flag, 0)
    return bool(flag.item())


def _trained_seconds(before: float, loop_start: float, d: Dist, device) -> float:
    """Training seconds so far (earlier calls' included); every rank takes rank 0's clock, so
    their learning rates and their stop agree."""
    seconds = before + time.time() - loop_start
    if d.world == 1:
        return seconds
    t = torch.tensor([seconds], device=device, dtype=torch.float64)
    dist.broadcast(t, 0)
    return float(t.item())


def _memory(device: torch.device) -> dict:
    """CUDA allocator figures for the log. A retry (a failed cudaMalloc that frees the cache and
    tries again, synchronizing) or a growing malloc count is what steps slower than their kernels
    look like when batches of changing shapes fragment the cache (a padded H200 run: 0 retries,
    ~109 mallocs in a whole run)."""
    if device.type != "cuda":
        return {}
    s = torch.cuda.memory_stats(device)
    return {"alloc_retries": s.get("num_alloc_retries", 0), "cuda_mallocs": s.get("num_device_alloc", 0),
            "peak_gb": round(s.get("allocated_bytes.all.peak", 0) / 2**30, 1)}


def train(c: TrainConfig) -> dict:
    """Train (or resume) the run; returns where it stands: {"run", "step", "steps", "finished"}."""
    started = time.time()
    d = init_dist()
    device = pick_device(c.device, d)
    out = Path(c.out)
    cuda = device.type == "cuda"
    torch.manual_seed(c.seed)

    ckpt = latest_checkpoint(out) if c.resume else None
    if not c.resume and checkpoints(out):
        raise FileExistsError(f"{out}: already has checkpoints; pass --resume or choose a new --out")

    vocab_file = Path(c.vocab or Path(c.data) / VOCAB_FILE)
    target_cfg = read_hf_config(c.target)
    start_from = load_drafter(c.init, None) if c.init else None
    recorded = out / "drafter_config.json"   # a resumed run keeps its drafter's shape
    resumed = json.loads(recorded.read_text()) if ckpt is not None and recorded.exists() else None
    if resumed is not None and bool(resumed.get("shared_head")) != c.shared_head:
        raise ValueError(f"{out}: the run was started {'without' if c.shared_head else 'with'} --shared-head; "
                         f"resume it the same way")
    for option in ("fc_norm", "norm_output"):
        flag = "--" + option.replace("_", "-")
        if resumed is not None and bool(resumed.get(option)) != getattr(c, option):
            raise ValueError(f"{out}: the run was started {'without' if getattr(c, option) else 'with'} {flag}; "
                             f"resume it the same way")
        if start_from is not None and getattr(start_from.config, option) and not getattr(c, option):
            raise ValueError(f"--init {c.init} has EAGLE-3.1's {option}: fine-tune it with {flag}")
    if start_from is not None and start_from.config.shared_head and not c.shared_head:
        raise ValueError(f"--init {c.init} borrows the target's lm_head: fine-tune it with --shared-head")
    if c.shared_head and (c.vocab or not c.init_lm_head):
        raise ValueError("--shared-head drafts with the target's own head: it takes no --vocab or --no-init-lm-head")
    if c.shared_head:   # the target's whole vocabulary: its head's rows, in order
        vocab_size = target_cfg["vocab_size"]
        vocab = DraftVocab(used=torch.arange(vocab_size), counts=torch.zeros(vocab_size, dtype=torch.long))
    elif start_from is None:
        vocab = DraftVocab.load(vocab_file)
    else:
        vocab = drafter_vocab(start_from, vocab_file)
    engine, store_dir, capture_store = fs.parse_features(c.features, c.keep_features)
    in_loop = engine == "native" and store_dir is None
    num_layers = target_cfg["num_hidden_layers"]
    # Ascending aux layers: SGLang and vLLM concatenate in that order (models/aux_layers.py); a
    # resumed run keeps the layers it was trained with.
    aux = aux_outputs(c, num_layers)
    if resumed is not None:
        aux = resumed["aux_layer_ids"]
    if start_from is not None and sorted(start_from.config.aux_layer_ids) != aux:
        raise ValueError(f"--init {c.init}: trained on layer outputs {start_from.config.aux_layer_ids}, this run "
                         f"trains on {aux} (--aux-layers)")
    # bfloat16 is the GPU recipe; on a CPU with AMX it also trains 1.6x faster than float32.
    bf16 = c.dtype == "bfloat16" or (c.dtype == "auto" and cuda)
    dtype = torch.bfloat16 if bf16 else torch.float32
    target = head = None
    if in_loop:
        target = load_target(c.target, dtype=dtype, device=device, aux_layer_ids=aux)
        target.requires_grad_(False)
        shape, embed, lm_head = target.config, target.embed_tokens.weight, target.lm_head.weight
    else:   # no target here: its embedding, final norm and lm_head only
        shape = TargetSpec.from_dir(c.target)
        t = {k: v.to(device, dtype) for k, v in load_head_tensors(c.target).items()}
        if t["embed"].shape != (shape.vocab_size, shape.hidden_size):
            raise ValueError(f"{c.target}: embedding {tuple(t['embed'].shape)} does not match config.json's "
                             f"vocab_size x hidden_size {(shape.vocab_size, shape.hidden_size)}")
        embed = torch.nn.Parameter(t["embed"], requires_grad=False)
        lm_head = embed.data if shape.tie_word_embeddings else t["lm_head"]
        head = TargetHead(t["norm"], lm_head, shape.rms_norm_eps)
    cfg = drafter_config(shape, vocab, aux, c)
    drafter = build_drafter(embed, lm_head, vocab, cfg, c.init_lm_head and ckpt is None and not c.init, device)
    if start_from is not None and ckpt is None:   # onto the target's head: the layers only
        keep = weight_names(cfg) - ({"lm_head.weight", "d2t", "t2d"} if c.shared_head else set())
        drafter.load_state_dict({k: v for k, v in trainable_state(start_from).items() if k in keep}, strict=False)
    # fc_norm new to this drafter (not resumed, not in --init): its norms start at each captured
    # state's RMS on the first batch, so fc first sees inputs at the scale it was trained on
    calibrate = c.fc_norm and ckpt is None and not (start_from is not None and start_from.config.fc_norm)
    model = TTTModel(drafter, c.ttt_length, c.step_weight, loss=c.loss, lk_eta=c.lk_eta, on_policy=c.on_policy)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=c.lr, betas=c.betas, weight_decay=c.weight_decay, fused=cuda)
    start, trained_before = 0, 0.0
    if ckpt is not None:
        state = load_file(str(ckpt / WEIGHTS), device=str(device))
        drafter.load_state_dict({**state, **borrowed(drafter)}, strict=True)
        st = torch.load(ckpt / STATE, map_location=device, weights_only=True)
        opt.load_state_dict(st["optimizer"])
        start, trained_before = st["step"], st.get("trained_s", 0.0)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[d.local_rank] if cuda else None) if d.world > 1 else model

    data = TokenShards(c.data)
    batches = Batches(data, c.batch_size, c.max_length, c.seed, c.limit_samples, c.length_group)
    micro_per_step = c.grad_accum * d.world
    budget = c.time_budget_s
    if budget > 0 and c.max_steps:
        raise ValueError("--time-budget is the run's length: it takes no --max-steps")
    # A time-budgeted run has no step count (total None): the loop ends on the budget (`spent`),
    # and its learning rate follows the seconds trained (lr_at_time), not the steps.
    total = None if budget > 0 else c.max_steps or max(1, int(c.epochs * batches.per_epoch) // micro_per_step)
    warmup = c.warmup_steps if c.warmup_steps >= 0 else int(c.warmup_ratio * (total or 0))
    used, t2d = vocab.used.to(device), drafter.t2d

    c.extra["capture_engine"] = engine   # export records it with the layer outputs
    c.extra["target_num_hidden_layers"] = num_layers   # for export's capture record
    if d.main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_config.json").write_text(json.dumps(dataclasses.asdict(c), indent=2) + "\n")
        (out / "drafter_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
        if start == 0:
            save_checkpoint(out, 0, drafter, opt, c.keep_checkpoints + 1)   # the untrained drafter
    source = fs.open_source(c, main=d.main, world=d.world, device=device, dtype=dtype, batches=batches,
                            target=target, head=head, aux=aux, spec=shape, engine=engine, store_dir=store_dir,
                            capture_store=capture_store, first=start * micro_per_step,
                            end=None if total is None else total * micro_per_step,
                            out=out)
    log = open(out / "log.jsonl", "a") if d.main else None
    bar = tqdm(total=total, initial=start, desc="train", unit="step", disable=not d.main)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    k = c.ttt_length
    acc_stats, n_batches, tokens, t0 = torch.zeros(TTTStats.size(k), device=device), 0, 0, time.time()
    model.train()
    done, trained_s, loop_start = start, trained_before, time.time()
    try:
        for step in itertools.count(start) if total is None else range(start, total):
            if budget > 0:
                lr = lr_at_time(trained_s, budget, c.warmup_ratio, c.lr, c.min_lr_ratio)
            else:
                lr = lr_at(step, total, warmup, c.lr, c.min_lr_ratio)
            for g in opt.param_groups:
                g["lr"] = lr
            for a in range(c.grad_accum):
                with torch.no_grad(), autocast:
                    micro = (step * c.grad_accum + a) * d.world + d.rank
                    ids, mask, aux, logits, epoch = source.get(micro)
                    aux = feature_noise(aux, c.feature_noise, c.seed, micro)
                    if calibrate:
                        calibrate_fc_norm(drafter, aux, mask)
                        calibrate = False
                    p, in_vocab = target_draft_probs(logits, used, t2d)
                    del logits   # full-vocab: large for big vocabularies, not needed any more
                tokens += int(mask.sum())
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
            trained_s = _trained_seconds(trained_before, loop_start, d, device)
            bar.update(1)
            if done % c.log_every == 0 or done == total:
                s = _reduce(acc_stats.clone(), d)
                nb = torch.tensor([n_batches, tokens], device=device, dtype=torch.float64)
                nb = _reduce(nb, d)
                summary = summarize(TTTStats.from_tensor(s, k), int(nb[0]))
                rec = {"step": done, "epoch": epoch, "lr": lr, "loss": round(sum(
                    c.step_weight ** i * x for i, x in enumerate(summary["loss_per_step"])), 4),
                    "grad_norm": round(float(grad_norm), 4), **summary, "loss_tokens": int(nb[1]),
                    "elapsed_s": round(time.time() - t0, 2), "trained_s": round(trained_s, 2), **_memory(device)}
                if d.main:
                    log.write(json.dumps(rec) + "\n")
                    log.flush()
                    bar.set_postfix(loss=rec["loss"], acc0=summary["acc"][0],
                                    accept=summary["walked_accept_length"][min(2, k - 1)])
                acc_stats.zero_()
                n_batches, tokens = 0, 0
            spent = budget > 0 and trained_s >= budget
            stop = (bool(c.stop_at) and done >= c.stop_at) or _out_of_time(c, started, d, device)
            if d.main and (done % c.save_every == 0 or done == total or stop or spent):
                save_checkpoint(out, done, drafter, opt, c.keep_checkpoints, trained_s)
            if stop or spent:
                break
    finally:
        source.close()
        bar.close()
        if log:
            log.close()
    if d.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    finished = trained_s >= budget if total is None else done >= total
    return {"run": str(out), "step": done, "steps": done if total is None else total, "finished": finished,
            "trained_s": round(trained_s, 1)}
