"""The decode cycle over the rows' DecodeState: draft -> verify in one target forward -> accept ->
compact the accepted path in the target cache -> extend the drafter over the emitted tokens.

Each piece exists once. A device-side step (every row greedy, no host decisions) runs them with
GreedyAcceptance: fixed shapes, no host read, so engine/cuda_graphs.py captures a whole step and
torch.compile traces it as one graph; it returns (tokens [B, W], counts [B], proposed [B]): row b
produced tokens[b, :counts[b]] from a verify of `proposed[b]` drafts deep. A host step (`host_step`:
rows that sample, process logits or ask for logprobs) runs the same pieces with the RejectionSampler,
which decides on the host (engine/acceptance.py); logprobs come from the same verify forward.
Rejected positions need no rollback: they lie beyond the committed length and are masked out, then
overwritten. The drafter extends at the emitted width with the unused tail masked by position.

At 0 draft steps (a steps table's choice for large batches) the drafter is not needed until
drafting resumes, so `backlog_step` only verifies the pending token and keeps what the drafter
would have read; `read_backlog` runs the drafter over that backlog in one forward (its weights read
once, not once a token) before the next draft, or when the backlog is full. A host step reads the
backlog first and then extends the drafter every step.

With step_width set (deterministic mode), every chain or one-token target forward runs that many
tokens a row: a one-token step puts its token at column 0 of a padded block, a shorter chain is
padded too. A token's numbers then come out of one shape whatever the step that verified it, so in
bfloat16 greedy output is the same with speculation and without (docs/speculative-decoding.md).

The models are called here (and in engine/draft_tree.py) with `logits_at` passed even where it is
None, and every method and dataclass a step calls gets every argument. A default that a compiled
step reads becomes a guard on the method's defaults, and torch 2.11 cannot load a saved compile
holding such a guard (its pickling of DefaultsSource passes fields that __init__ does not take), so
every saved step would compile again at each start
(engine/saved_compile.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.acceptance import Accepted, GreedyAcceptance, RejectionSampler
from engine.api import TokenLogprob
from engine.config import SpecConfig
from engine.decode_state import DecodeState
from engine.draft_tree import DraftState, DraftTree, draft_chain, draft_tree
from engine.logits_processing import draft_masks, token_logprobs
from engine.masks import block_inputs, causal
from engine.model_runner import unplanned_attention
from engine.sampling import BatchSampling
from models.layers import AttnInputs


@dataclass
class StepResult:
    tokens: list[int]            # new tokens of this row, in order
    proposed: int = 0            # draft tokens verified (0 without speculation)
    accepted: int = 0            # of which accepted
    logprobs: list[TokenLogprob] | None = None  # one per token, for rows that asked


class SpecWorker:
    def __init__(self, target, drafter, spec: SpecConfig | None, state: DecodeState, step_width: int = 0,
                 acceptance: GreedyAcceptance | None = None):
        self.target, self.drafter, self.spec, self.state = target, drafter, spec, state
        self.step_width = step_width
        self.acceptance = acceptance or GreedyAcceptance()   # of device-side steps
        self.device = target.embed_tokens.weight.device

    def kind(self, steps: int) -> str:
        """The device-side step function for this many draft steps (STEP_KINDS)."""
        return ("tree" if self.spec.topk > 1 else "chain" if steps else "backlog") if self.spec else "plain"

    # -- device-side steps: (worker, rows, span, steps) -> (tokens, counts, proposed) --------------
    def plain_step(self, rows: int, span: int, steps: int):
        new, _ = self.pending_step(rows, span, self.acceptance, False)
        return new.unsqueeze(1), torch.ones_like(new), torch.zeros_like(new)

    def backlog_step(self, rows: int, span: int, steps: int):
        """A plain step that keeps the drafter's input: the new token and the target's aux states at
        the pending one, at backlog index backlog_dev (clamped: padding rows count up too)."""
        st = self.state
        new, out = self.pending_step(rows, span, self.acceptance, True)
        pick = torch.arange(rows, device=new.device)
        at = st.backlog_dev[:rows].clamp(max=st.backlog_tokens.shape[1] - 1)
        st.backlog_tokens[pick, at] = new
        st.backlog_aux[pick, at] = out.aux_hidden[:, 0]
        st.backlog_dev[:rows] += 1
        return new.unsqueeze(1), torch.ones_like(new), torch.zeros_like(new)

    def spec_step(self, rows: int, span: int, steps: int):
        """`steps` >= 1 drafts (a chain, or a tree of spec.draft_tokens nodes), verified, accepted,
        compacted and the drafter extended."""
        acc, _, proposed = self.cycle(rows, span, steps, self.acceptance, None)
        return acc.emitted, acc.accepted + 1, proposed

    # -- the host step -------------------------------------------------------------------------------
    def host_step(self, rows: int, span: int, sampling: BatchSampling) -> list[StepResult]:
        """One step with the RejectionSampler (nothing in flight: the host's lengths are the device's)."""
        st, sampler = self.state, RejectionSampler(sampling)
        st.lens_dev[:rows] = torch.tensor(st.lens[:rows], device=self.device)
        if self.spec is None:
            new, out = self.pending_step(rows, span, sampler, False)
            tokens = new.tolist()
            st.lens[:rows] = [n + 1 for n in st.lens[:rows]]
            logprobs = token_logprobs(out.logits, sampling.logprobs, [[(0, t)] for t in tokens])
            return [StepResult([t], logprobs=lp) for t, lp in zip(tokens, logprobs)]
        if behind := max(st.backlog[:rows]):  # eager, as this whole step is: the longest backlog wide
            with unplanned_attention(self.device):
                self.read_backlog(rows, st.lens_dev[:rows], span, behind)
            st.backlog[:rows] = [0] * rows
        steps = self.spec.steps_for(rows) if self.spec.topk == 1 else self.spec.steps
        acc, out, proposed = self.cycle(rows, span, steps, sampler, sampling)
        logprobs = token_logprobs(out.logits, sampling.logprobs, acc.picks)
        proposed = proposed.tolist()
        results = []
        for b, picks in enumerate(acc.picks):
            st.lens[b] += len(picks)
            results.append(StepResult([t for _, t in picks], proposed=proposed[b], accepted=len(picks) - 1,
                                      logprobs=logprobs[b]))
        return results

    # -- the pieces ----------------------------------------------------------------------------------
    def cycle(self, rows: int, span: int, steps: int, acceptance, sampling: BatchSampling | None
              ) -> tuple[Accepted, object, torch.Tensor]:
        """Draft, verify, accept, compact, extend: (what was accepted, the verify's output, the drafts
        along the deepest path per row: steps for a chain, the tree's depth otherwise)."""
        st, spec = self.state, self.spec
        base = st.lens_dev[:rows].clone()
        drafted = DraftState(st.draft_logits[:rows], st.draft_hidden[:rows])
        if spec.topk == 1:
            masks = draft_masks(self.drafter, sampling.processors) if sampling is not None else None
            tree = draft_chain(self.drafter, drafted, st.pending[:rows], base, steps, sampling, span, masks)
        else:
            tree = draft_tree(self.drafter, drafted, st.pending[:rows], base, steps, spec.topk, spec.draft_tokens,
                              span)
        out = self.verify(tree, base, span)
        acc = acceptance.accept(tree, out.logits)
        width = acc.emitted.shape[1]
        if acc.path is None:   # a chain: the accepted drafts are where they were verified
            aux = out.aux_hidden[:, :width]
        else:
            self.compact(rows, base, acc.path)
            aux = out.aux_hidden.gather(1, acc.path.unsqueeze(-1).expand(-1, -1, out.aux_hidden.shape[-1]))
        self.extend(rows, span, base, acc.emitted, aux, acc.accepted)
        return acc, out, tree.depth.max(-1).values

    def pending_step(self, rows: int, span: int, acceptance, capture_aux: bool):
        """The target over each row's pending token; the token chosen from it becomes pending:
        (that token [B], the target's output)."""
        st = self.state
        out = self.verify_chain(st.pending[:rows].unsqueeze(1), st.lens_dev[:rows], span, capture_aux)
        new = acceptance.sample(out.logits[:, :1])
        st.pending[:rows] = new
        st.lens_dev[:rows] += 1
        return new, out

    def verify(self, tree: DraftTree, base: torch.Tensor, span: int):
        if tree.chain:
            return self.verify_chain(tree.tokens, base, span, capture_aux=True)
        return self.target(tree.tokens, block_inputs(base, tree.ancestors, tree.depth, span), capture_aux=True,
                           logits_at=None)

    def verify_chain(self, tokens: torch.Tensor, base: torch.Tensor, span: int, capture_aux: bool):
        """The target over a chain [B, N] written at base, padded to step_width columns when set:
        then every token comes out of the same shapes and kernels, whatever its step verified."""
        rows, n = tokens.shape
        if self.step_width > n:
            tokens = torch.cat([tokens, tokens.new_zeros(rows, self.step_width - n)], 1)
        w = tokens.shape[1]
        depth = torch.arange(w, device=self.device).expand(rows, w)
        return self.target(tokens, block_inputs(base, causal(rows, w, self.device), depth, span),
                           capture_aux=capture_aux, logits_at=None)

    def compact(self, rows: int, base: torch.Tensor, path: torch.Tensor) -> None:
        """The accepted path's target cache entries [B, W] moved to consecutive positions from base."""
        every_row = torch.arange(rows, device=self.device)
        idx = torch.arange(path.shape[1], device=self.device).unsqueeze(0)
        for layer in self.target.layers:
            layer.self_attn.kv_cache.copy_positions(every_row, base.unsqueeze(1) + path, base.unsqueeze(1) + idx)

    def extend(self, rows: int, span: int, base: torch.Tensor, emitted: torch.Tensor, aux: torch.Tensor,
               accepted: torch.Tensor) -> None:
        """The drafter over the emitted tokens [B, W] (past accepted + 1 they are masked by position
        and later overwritten), and the state the next step starts from."""
        st, w = self.state, emitted.shape[1]
        depth = torch.arange(w, device=self.device).expand(rows, w)
        d = self.drafter(emitted, aux, block_inputs(base, causal(rows, w, self.device), depth, span),
                         logits_at=accepted.unsqueeze(1))
        st.draft_logits[:rows] = d.logits[:, 0]
        st.draft_hidden[:rows] = d.hidden[:, 0]
        st.pending[:rows] = emitted.gather(1, accepted.unsqueeze(1))[:, 0]
        st.lens_dev[:rows] = base + accepted + 1

    def read_backlog(self, rows: int, lens: torch.Tensor, span: int, width: int) -> None:
        """The drafter over each row's backlog (backlog_dev[b] entries, at positions lens[b] - backlog
        .. lens[b] - 1), `width` at least the largest backlog. A shorter backlog repeats its last entry
        (same token, state and position, so the same key and value rewritten), which makes the last
        column every row's newest position. Rows without a backlog keep their draft state."""
        st = self.state
        behind = st.backlog_dev[:rows]
        j = torch.minimum(torch.arange(width, device=lens.device).view(1, -1), (behind - 1).clamp(min=0).view(-1, 1))
        tokens = st.backlog_tokens[:rows].gather(1, j)
        aux = st.backlog_aux[:rows].gather(1, j.unsqueeze(-1).expand(-1, -1, st.backlog_aux.shape[-1]))
        pos = (lens - behind).view(-1, 1) + j                                            # [B, W]
        mask = torch.arange(span, device=lens.device).view(1, 1, -1) <= pos.unsqueeze(-1)
        d = self.drafter(tokens, aux, AttnInputs(positions=pos, slots=pos, mask=mask.unsqueeze(1)),
                         logits_at=torch.full((rows, 1), width - 1, device=lens.device))
        has = (behind > 0).unsqueeze(1)
        st.draft_logits[:rows] = torch.where(has, d.logits[:, 0], st.draft_logits[:rows])
        st.draft_hidden[:rows] = torch.where(has, d.hidden[:, 0], st.draft_hidden[:rows])
        st.backlog_dev[:rows] = 0


# The device-side step functions by kind, each called as fn(worker, rows, span, steps).
STEP_KINDS = {"plain": SpecWorker.plain_step, "chain": SpecWorker.spec_step, "tree": SpecWorker.spec_step,
              "backlog": SpecWorker.backlog_step}
