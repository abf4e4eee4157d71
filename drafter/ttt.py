"""Training-time test (EAGLE-3): unroll the drafter over its own hidden states, as at inference.

Step 0: at position i the drafter reads the target's aux hidden h_i and token x_{i+1} and
predicts x_{i+2}. Step k: it reads its own step-(k-1) output hidden at i and the next data
token x_{i+1+k}, sits at RoPE position i + k, and predicts x_{i+2+k}. Its query attends to
the step-0 keys of positions 0..i (causal) and, from every step 1..k, only the key of its
own position i (the diagonal) — exactly the cache a chain draft from position i builds
(engine/draft_tree.draft_chain writes step j at slot base + j - 1).

Loss at step k, against the target's next-token distribution p (logits at position i + 1 + k)
restricted to the draft vocabulary and renormalised, on positions whose predicted token is an
assistant token and whose target argmax is in the draft vocabulary (the drafter cannot propose
anything else); steps are weighted `step_weight ** k`. `position_loss` gives three:
- kl (EAGLE-3's): soft cross-entropy -sum_v p_v log q_v (forward KL plus p's entropy);
- lk-alpha: -log alpha, alpha = sum_v min(p_v, q_v), the probability that speculative sampling
  accepts a token drafted from q (LK losses, arXiv 2602.23881);
- lk-lambda: lambda * KL(p || q) + (1 - lambda) * (1 - alpha), lambda = exp(-eta * alpha) with
  alpha held constant (no gradient through the weight): KL's strong gradient while the drafter is
  far off, acceptance itself once it is close (the paper's hybrid; eta 3 its best).
The paper's alpha is over the target's whole vocabulary; here p is renormalised over the draft
vocabulary, as the kl loss has always taken it, so alpha is the acceptance of a drafter that
proposes draft-vocabulary tokens only, on positions whose target argmax it can propose.

On-policy (`on_policy` w > 0, after Draft-OPD, arXiv 2605.29343): the loss becomes
(1 - w) * the teacher-forced loss above + w * the same loss taken only on the states a greedy chain
draft reaches, i.e. step k at position i counts only where the drafter's argmax at steps 0..k-1
from i was the target's (it is the drafter's own rollout, verified by the target: its accepted
prefix and the first rejected proposal, where the target's distribution is the feedback). Where
this differs from the paper: (1) the rollouts are greedy and verified greedily, so on an answer the
target wrote greedily the drafter's accepted proposals are the data's tokens and the target's
feedback at every reached state is already in `target_p`: no extra target forward, and no states
off the target's path, which the paper reaches by sampling proposals; (2) the target-assisted
continuation is the data's answer (what lossless greedy speculative decoding writes), not a
rollout generated during training on fresh prompts; (3) the paper's error-position replay restarts
drafting after each rejection; here every position of the answer starts a chain, so the restart
points are covered, but they are not up-weighted; (4) it mixes with teacher-forced TTT by a fixed
weight, not by the paper's schedule. Sampled rollouts (temperature > 0) would need the target's
distribution on draft-induced prefixes: one target forward over every position's drafted chain
(a tree-attention verify of B x T x K tokens) per step.

`feature_noise` adds uniform noise to the captured target states the drafter reads, as vLLM
speculators trains (0.05 there), from a generator seeded by the run's seed and the micro-batch,
so a resumed run draws the same noise.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from drafter.train_config import LOSSES
from models.eagle3 import Eagle3Drafter
from models.layers import AttnInputs


def ttt_mask(seq_len: int, step: int, device=None) -> torch.Tensor:
    """[T, (step + 1) * T] bool: step-0 block causal, then one identity block per later step."""
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
    eye = torch.eye(seq_len, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * step, dim=1)


class StepKV:
    """Stands in for the drafter's KVCache during the unroll: keeps each step's K/V and hands
    attention their concatenation. No in-place writes, so autograd flows through every step."""

    def __init__(self):
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    def update(self, k: torch.Tensor, v: torch.Tensor, inputs: AttnInputs):
        self.k.append(k)
        self.v.append(v)
        return torch.cat(self.k, dim=2), torch.cat(self.v, dim=2)


def target_draft_probs(target_logits: torch.Tensor, used: torch.Tensor, t2d: torch.Tensor):
    """Target distribution over the draft vocab (renormalised) [B, T, Vd] and whether the
    target's argmax is in the draft vocab [B, T]."""
    in_vocab = t2d[target_logits.argmax(-1)]
    probs = target_logits.index_select(-1, used).float().softmax(-1)
    return probs, in_vocab


def soft_cross_entropy(logits: torch.Tensor, target_p: torch.Tensor, mask: torch.Tensor):
    """(sum over masked positions of -sum_v p_v log q_v, number of masked positions)."""
    ce = -(target_p * F.log_softmax(logits.float(), dim=-1)).sum(-1)
    mask = mask.to(ce.dtype)
    return (ce * mask).sum(), mask.sum()


def position_loss(logits: torch.Tensor, target_p: torch.Tensor, mask: torch.Tensor, kind: str = "kl",
              eta: float = 3.0):
    """(sum over masked positions of the per-position loss, number of masked positions)."""
    if kind == "kl":
        return soft_cross_entropy(logits, target_p, mask)
    logq = F.log_softmax(logits.float(), dim=-1)
    alpha = torch.minimum(target_p, logq.exp()).sum(-1)
    if kind == "lk-alpha":
        per = -torch.log(alpha.clamp_min(1e-6))
    elif kind == "lk-lambda":
        kl = (target_p * (torch.log(target_p.clamp_min(1e-30)) - logq)).sum(-1)
        lam = torch.exp(-eta * alpha.detach())
        per = lam * kl + (1 - lam) * (1 - alpha)
    else:
        raise ValueError(f"loss {kind!r}: choose one of {', '.join(LOSSES)}")
    mask = mask.to(per.dtype)
    return (per * mask).sum(), mask.sum()


def feature_noise(aux: torch.Tensor, amount: float, seed: int, micro: int) -> torch.Tensor:
    """aux + U(-amount, amount), drawn from a generator seeded by (seed, micro-batch); aux itself
    when amount is 0 (no random numbers drawn)."""
    if amount <= 0:
        return aux
    g = torch.Generator(device=aux.device)
    g.manual_seed(seed * 1_000_003 + micro)
    noise = torch.rand(aux.shape, generator=g, device=aux.device, dtype=torch.float32)
    return aux + ((2 * noise - 1) * amount).to(aux.dtype)


@torch.no_grad()
def calibrate_fc_norm(drafter: Eagle3Drafter, aux: torch.Tensor, mask: torch.Tensor) -> None:
    """Set each fc_norm weight to its captured state's RMS over the batch's tokens, so that
    fc_norm(x) is x up to each token's own scale and a drafter trained without fc_norm starts
    where it was."""
    parts = aux.float().chunk(drafter.config.num_aux, dim=-1)
    keep = mask.bool() if mask.any() else torch.ones_like(mask, dtype=torch.bool)
    for norm, x in zip(drafter.fc_norm, parts):
        norm.weight.fill_(float(x[keep].pow(2).mean().sqrt()))


@dataclass
class TTTStats:
    """Sums over a batch (add them up across batches and ranks, then divide).

    correct[k]: positions whose step-k draft equals the target's argmax (teacher-forced);
    counted[k]: positions whose step-k prediction is an assistant token;
    accepted[s]: sum over start positions of the simulated chain acceptance with s + 1 steps
    (consecutive correct steps, capped); starts: number of start positions.
    Simulated accept length at s steps = 1 + accepted[s - 1] / starts (bonus token included):
    an average over every position, which overweights easy stretches, where a chain runs long.
    walk_cycles[s]: verify steps of a greedy engine with s + 1 steps over the same answers
    (`walked_cycles`); walk_tokens: the answer tokens those steps make (all but each answer's first,
    which the prefill makes). walk_tokens / walk_cycles[s - 1] is the accept length the engine
    reports on these answers (tests/test_ttt_walk.py checks it against the engine).
    """
    loss: torch.Tensor         # [K] per-step loss (mean over its positions)
    correct: torch.Tensor      # [K]
    counted: torch.Tensor      # [K]
    accepted: torch.Tensor     # [K]
    starts: torch.Tensor       # []
    walk_cycles: torch.Tensor  # [K]
    walk_tokens: torch.Tensor  # []

    def as_tensor(self) -> torch.Tensor:
        return torch.cat([self.loss, self.correct, self.counted, self.accepted, self.starts.view(1),
                          self.walk_cycles, self.walk_tokens.view(1)])

    @staticmethod
    def size(k: int) -> int:
        return 5 * k + 2

    @classmethod
    def from_tensor(cls, t: torch.Tensor, k: int) -> "TTTStats":
        return cls(t[:k], t[k:2 * k], t[2 * k:3 * k], t[3 * k:4 * k], t[4 * k], t[4 * k + 1:5 * k + 1], t[5 * k + 1])


def walked_cycles(run: torch.Tensor, loss_mask: torch.Tensor, caps: list[int]) -> torch.Tensor:
    """Verify steps [len(caps)] a greedy engine drafting chains of each cap takes over the answers.

    run [B, n]: consecutive correct steps of a chain drafted at position i (predicting x_{i+2}
    on); loss_mask [B, n + 1]: answer tokens. The engine's first cycle of an answer drafts after
    its first token (which the prefill makes); a cycle at i keeps a = min(run[i], cap) drafts and
    a bonus token, and the next one starts at i + a + 1; cycles stop at the answer's last token.
    Which positions the walk visits is found in log2(n) vectorized jumps (each level doubles the
    jump length and adds the positions it reaches), not in a loop over cycles."""
    b, n = run.shape
    lm = loss_mask.bool()
    valid = lm[:, 1:] & F.pad(lm[:, 2:], (0, 1))                  # x_{i+1} and x_{i+2} answer tokens
    seeds = valid & ~lm[:, :n]                                     # x_{i+1}: an answer's first token
    pos = torch.arange(n, device=run.device)
    end = run.new_full((b, 1), n)                                  # column n: where walks end
    start = torch.cat([seeds, seeds.new_zeros(b, 1)], dim=1)
    cycles = []
    for cap in caps:
        jump = torch.cat([torch.where(valid, pos + run.clamp(max=cap) + 1, n).clamp(max=n), end], dim=1)
        visited = start
        for _ in range(max(1, n.bit_length())):
            reached = torch.zeros_like(jump).scatter_add_(1, jump, visited.long()) > 0
            visited = visited | reached
            jump = jump.gather(1, jump)
        cycles.append((visited[:, :n] & valid).sum().float())
    return torch.stack(cycles)


def unroll(drafter: Eagle3Drafter, input_ids: torch.Tensor, aux_hidden: torch.Tensor, length: int):
    """Yield the drafter's output at each of `length` unroll steps over positions 0 .. T-2."""
    b, t = input_ids.shape
    n, dev = t - 1, input_ids.device
    pos = torch.arange(n, device=dev).expand(b, n)
    hidden = aux_hidden[:, :n]
    attn = drafter.midlayer.self_attn
    saved, attn.kv_cache = attn.kv_cache, StepKV()
    try:
        for k in range(length):
            tokens = F.pad(input_ids[:, 1 + k:], (0, k))          # x_{i+1+k}; zeros past the end
            inputs = AttnInputs(positions=pos + k, slots=pos, mask=ttt_mask(n, k, dev)[None, None])
            out = drafter(tokens, hidden, inputs)
            hidden = out.hidden
            yield out
    finally:
        attn.kv_cache = saved


class TTTModel(nn.Module):
    """The drafter unrolled over `length` steps; one forward = the whole unroll (one DDP call)."""

    def __init__(self, drafter: Eagle3Drafter, length: int = 7, step_weight: float = 0.8, loss: str = "kl",
                 lk_eta: float = 3.0, on_policy: float = 0.0):
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"loss {loss!r}: choose one of {', '.join(LOSSES)}")
        self.drafter = drafter
        self.length = length
        self.step_weight = step_weight
        self.loss = loss
        self.lk_eta = lk_eta
        self.on_policy = on_policy

    def forward(self, input_ids: torch.Tensor, loss_mask: torch.Tensor, aux_hidden: torch.Tensor,
                target_p: torch.Tensor, in_vocab: torch.Tensor) -> tuple[torch.Tensor, TTTStats]:
        """input_ids, loss_mask, in_vocab [B, T]; aux_hidden [B, T, 3H]; target_p [B, T, Vd]
        (the target's distribution for the token after each position)."""
        b, t = input_ids.shape
        n, dev, steps = t - 1, input_ids.device, self.length
        zero = torch.zeros((), device=dev)
        losses, correct, counted = [zero] * steps, [zero] * steps, [zero] * steps
        hits = torch.zeros(steps, b, n, dtype=torch.bool, device=dev)
        total = zero
        reached = torch.ones(b, n, dtype=torch.bool, device=dev)   # chains whose steps so far were all accepted
        steps_out = unroll(self.drafter, input_ids, aux_hidden, steps)
        for k, out in enumerate(steps_out):
            m = n - 1 - k                       # positions whose predicted token x_{i+2+k} exists
            if m <= 0:
                break
            p = target_p[:, 1 + k:1 + k + m]
            lm = loss_mask[:, 2 + k:2 + k + m].bool()
            use = lm & in_vocab[:, 1 + k:1 + k + m]
            logits = out.logits[:, :m]
            s, c = position_loss(logits, p, use, self.loss, self.lk_eta)
            step_loss = s / c.clamp_min(1)
            if self.on_policy > 0:   # the same loss on the states a greedy chain draft reaches
                s_on, c_on = position_loss(logits, p, use & reached[:, :m], self.loss, self.lk_eta)
                step_loss = (1 - self.on_policy) * step_loss + self.on_policy * s_on / c_on.clamp_min(1)
            total = total + self.step_weight ** k * step_loss
            with torch.no_grad():
                ok = use & (logits.argmax(-1) == p.argmax(-1))
                hits[k, :, :m] = ok
                reached = reached[:, :m] & ok
                losses[k], correct[k], counted[k] = step_loss.detach(), ok.sum().float(), lm.sum().float()
        steps_out.close()  # restores the attention's own cache now, not at garbage collection
        with torch.no_grad():
            run = hits.long().cumprod(0).sum(0)                     # consecutive correct steps from i
            starts = F.pad(loss_mask[:, 2:].bool(), (0, 1))          # step-0 prediction is an assistant token
            caps = torch.arange(1, steps + 1, device=dev).view(-1, 1)
            accepted = torch.minimum(run[starts].view(1, -1), caps).sum(1).float()
            lm = loss_mask.bool()
            walk_tokens = (lm[:, 1:] & lm[:, :-1]).sum().float()     # answer tokens after each answer's first
            walk = walked_cycles(run, loss_mask, list(range(1, steps + 1)))
            stats = TTTStats(torch.stack(losses), torch.stack(correct), torch.stack(counted), accepted,
                             starts.sum().float(), walk, walk_tokens)
        return total, stats
