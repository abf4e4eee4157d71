"""Sync-free greedy steps: everything on the device, fixed shapes, one host read per step.

With every row greedy, acceptance needs no host decisions: a draft is
accepted while it equals the target's argmax (cumprod of matches), the bonus is the argmax
after the last accepted draft, and the drafter extend runs at fixed width S + 1 with the
unused tail masked by position. Fixed shapes let engine/cuda_graphs.py capture a whole
step — draft, verify, accept, extend, state update — in one CUDA graph.

The step functions read and update the decoder's device state (lens_dev, pending, draft_logits,
draft_hidden, and the drafter's backlog lag_*) and return (tokens [B, W], counts [B], proposed
[B]): row b produced tokens[b, :counts[b]] from a verify of `proposed[b]` drafts deep.

Greedy trees (topk > 1) run device-side too: at most one root-to-node path can match the
target's argmax, found with the tree's ancestor mask, and its cache entries are moved to
consecutive positions inside the same step.

At 0 draft steps (a steps table's choice for large batches) the drafter is not needed until
drafting resumes, so `deferred_greedy` only verifies the pending token and keeps what the
drafter would have read; `drafter_catch_up` runs the drafter over that backlog in one forward
(its weights read once, not once a token) before the next draft, or when the backlog is full.

With the decoder's step_width set (deterministic mode), every target forward here runs that many
tokens a row: a one-token step puts its token at column 0 of a padded block, a shorter chain is
padded too. A token's numbers then come out of one shape whatever the step that verified it, so in
bfloat16 greedy output is the same with speculation and without (docs/speculative-decoding.md).

The models are called here (and in engine/draft_tree.py) with `logits_at` passed even where it is
None. A default that a compiled step reads becomes a guard on the method's defaults, and torch 2.11
cannot load a saved compile holding such a guard (its pickling of DefaultsSource passes fields
that __init__ does not take), so every saved step would compile again at each start
(engine/saved_compile.py).
"""
from __future__ import annotations

import torch

from engine.draft_tree import DraftState, chain_draft_step, draft_tree
from engine.masks import block_inputs, causal
from models.layers import AttnInputs


def _pending_step(dec, rows: int, span: int, capture_aux: bool = False):
    """The target over each row's pending token, which becomes its greedy next token: (that token
    [B], the target's output). Alone, or with dec.step_width set at column 0 of a block that wide
    (the rest padding, written past the row's length and never seen), as a verify step reads it."""
    out = _verify(dec, dec.pending[:rows].unsqueeze(1), dec.lens_dev[:rows], span, capture_aux)
    new = out.logits[:, 0].argmax(-1)
    dec.pending[:rows] = new
    dec.lens_dev[:rows] += 1
    return new, out


def plain_greedy(dec, rows: int, span: int, steps: int = 0):
    new, _ = _pending_step(dec, rows, span)
    return new.unsqueeze(1), torch.ones_like(new), torch.zeros_like(new)


def deferred_greedy(dec, rows: int, span: int, steps: int = 0):
    """A plain step that keeps the drafter's input: the new token and the target's aux states at
    the pending one, at backlog index lag_dev (clamped: padding rows count up too)."""
    new, out = _pending_step(dec, rows, span, capture_aux=True)
    pick = torch.arange(rows, device=new.device)
    at = dec.lag_dev[:rows].clamp(max=dec.lag_tokens.shape[1] - 1)
    dec.lag_tokens[pick, at] = new
    dec.lag_aux[pick, at] = out.aux_hidden[:, 0]
    dec.lag_dev[:rows] += 1
    return new.unsqueeze(1), torch.ones_like(new), torch.zeros_like(new)


def drafter_catch_up(dec, rows: int, lens: torch.Tensor, span: int, width: int) -> None:
    """The drafter over each row's backlog (lag_dev[b] entries, at positions lens[b] - lag ..
    lens[b] - 1), `width` at least the largest backlog. A shorter backlog repeats its last entry (same
    token, state and position, so the same key and value rewritten), which makes the last
    column every row's newest position. Rows without a backlog keep their draft state."""
    lag = dec.lag_dev[:rows]
    j = torch.minimum(torch.arange(width, device=lens.device).view(1, -1), (lag - 1).clamp(min=0).view(-1, 1))
    tokens = dec.lag_tokens[:rows].gather(1, j)
    aux = dec.lag_aux[:rows].gather(1, j.unsqueeze(-1).expand(-1, -1, dec.lag_aux.shape[-1]))
    pos = (lens - lag).view(-1, 1) + j                                               # [B, W]
    mask = torch.arange(span, device=lens.device).view(1, 1, -1) <= pos.unsqueeze(-1)
    d = dec.drafter(tokens, aux, AttnInputs(positions=pos, slots=pos, mask=mask.unsqueeze(1)),
                    logits_at=torch.full((rows, 1), width - 1, device=lens.device))
    behind = (lag > 0).unsqueeze(1)
    dec.draft_logits[:rows] = torch.where(behind, d.logits[:, 0], dec.draft_logits[:rows])
    dec.draft_hidden[:rows] = torch.where(behind, d.hidden[:, 0], dec.draft_hidden[:rows])
    dec.lag_dev[:rows] = 0


def chain_greedy(dec, rows: int, span: int, steps: int):
    """`steps` >= 1 drafts, verified, accepted, and the drafter extended over what was emitted."""
    drafter, dev = dec.drafter, dec.device
    base = dec.lens_dev[:rows].clone()
    logits, hidden = dec.draft_logits[:rows], dec.draft_hidden[:rows]
    drafts = []
    for j in range(1, steps + 1):
        tok = drafter.draft_to_target(logits.argmax(-1))
        drafts.append(tok)
        if j < steps:
            logits, hidden = chain_draft_step(drafter, tok, hidden, base, j, span)
    n = steps + 1
    chain = torch.stack([dec.pending[:rows]] + drafts, dim=1)                        # [B, N]
    out = _verify(dec, chain, base, span, capture_aux=True)
    argmax = out.logits[:, :n].argmax(-1)                                            # [B, N]
    match = chain[:, 1:] == argmax[:, :-1]                                           # [B, S]
    if dec.synthetic is not None:  # benchmarks only (BatchDecoder.use_synthetic_acceptance)
        match = dec.synthetic.uniforms[:rows, :steps] < dec.synthetic.rates[:steps]
    accepted = match.long().cumprod(-1).sum(-1)                                      # [B]
    # Emitted tokens: accepted drafts then the bonus (the argmax after the last accepted draft).
    bonus = argmax.gather(1, accepted.unsqueeze(1))                                  # [B, 1]
    idx = torch.arange(n, device=dev).unsqueeze(0)
    emitted = torch.where(idx < accepted.unsqueeze(1), torch.cat([chain[:, 1:], bonus], 1), bonus)
    _extend(dec, rows, span, base, emitted, out.aux_hidden[:, :n], accepted)
    return emitted, accepted + 1, torch.full_like(accepted, steps)


def tree_greedy(dec, rows: int, span: int, steps: int):
    """An SGLang-style tree of spec.draft_tokens nodes, `steps` deep (engine/draft_tree.py),
    verified in one forward. Greedy, at most one path is right (siblings differ): its deepest
    node is the one whose every ancestor is the target's argmax at its parent. The accepted
    path's cache entries move to consecutive positions, then the drafter extends as a chain's."""
    spec, dev = dec.spec, dec.device
    base = dec.lens_dev[:rows].clone()
    tree = draft_tree(dec.drafter, DraftState(dec.draft_logits[:rows], dec.draft_hidden[:rows]), dec.pending[:rows],
                      base, steps, spec.topk, spec.draft_tokens, span)
    out = dec.target(tree.tokens, block_inputs(base, tree.ancestors, tree.depth, span), capture_aux=True,
                     logits_at=None)
    argmax = out.logits.argmax(-1)                                                   # [B, N]
    right = tree.tokens == argmax.gather(1, tree.parents.clamp(min=0))
    right[:, 0] = True                                                               # the root
    ok = ~(tree.ancestors & ~right.unsqueeze(1)).any(-1)                             # [B, N]
    best = torch.where(ok, tree.depth, -1).argmax(-1)                                # [B]
    accepted = tree.depth.gather(1, best.unsqueeze(1))[:, 0]
    # path[b, d]: the node at depth d on the accepted path; past its end, its last node again.
    n, w = tree.tokens.shape[1], steps + 1
    on_path = tree.ancestors[torch.arange(rows, device=dev), best]                  # [B, N]
    column = torch.where(on_path, tree.depth, w)                                     # off the path: a spare column
    path = torch.zeros(rows, w + 1, dtype=torch.long, device=dev).scatter_(
        1, column, torch.arange(n, device=dev).expand(rows, n))[:, :w]
    idx = torch.arange(w, device=dev).unsqueeze(0)
    path = torch.where(idx <= accepted.unsqueeze(1), path, best.unsqueeze(1))
    emitted = argmax.gather(1, path)          # each accepted draft is the argmax at its parent; then the bonus
    every_row = torch.arange(rows, device=dev)
    for layer in dec.target.layers:
        layer.self_attn.kv_cache.copy_positions(every_row, base.unsqueeze(1) + path, base.unsqueeze(1) + idx)
    aux = out.aux_hidden.gather(1, path.unsqueeze(-1).expand(-1, -1, out.aux_hidden.shape[-1]))
    _extend(dec, rows, span, base, emitted, aux, accepted)
    return emitted, accepted + 1, tree.depth.max(-1).values


def _verify(dec, tokens: torch.Tensor, base: torch.Tensor, span: int, capture_aux: bool):
    """The target over a chain [B, N] written at base, padded to dec.step_width columns when set:
    then every token comes out of the same shapes and kernels, whatever its step verified."""
    rows, n = tokens.shape
    if dec.step_width > n:
        tokens = torch.cat([tokens, tokens.new_zeros(rows, dec.step_width - n)], 1)
    w = tokens.shape[1]
    depth = torch.arange(w, device=dec.device).expand(rows, w)
    return dec.target(tokens, block_inputs(base, causal(rows, w, dec.device), depth, span), capture_aux=capture_aux,
                      logits_at=None)


def _extend(dec, rows: int, span: int, base: torch.Tensor, emitted: torch.Tensor, aux: torch.Tensor,
            accepted: torch.Tensor) -> None:
    """The drafter over the emitted tokens [B, W] (fixed width; past accepted + 1 they are
    masked by position and later overwritten), and the state the next step starts from."""
    w = emitted.shape[1]
    depth = torch.arange(w, device=dec.device).expand(rows, w)
    d = dec.drafter(emitted, aux, block_inputs(base, causal(rows, w, dec.device), depth, span),
                    logits_at=accepted.unsqueeze(1))
    dec.draft_logits[:rows] = d.logits[:, 0]
    dec.draft_hidden[:rows] = d.hidden[:, 0]
    dec.pending[:rows] = emitted.gather(1, accepted.unsqueeze(1))[:, 0]
    dec.lens_dev[:rows] = base + accepted + 1
