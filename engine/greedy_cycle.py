"""Sync-free greedy steps: everything on the device, fixed shapes, one host read per step.

With every row greedy and a chain drafter, acceptance needs no host decisions: a draft is
accepted while it equals the target's argmax (cumprod of matches), the bonus is the argmax
after the last accepted draft, and the drafter extend runs at fixed width S + 1 with the
unused tail masked by position. Fixed shapes let engine/cuda_graphs.py capture a whole
step — draft, verify, accept, extend, state update — in one CUDA graph.

Both functions read and update the decoder's device state (lens_dev, pending, draft_logits,
draft_hidden) and return (tokens [B, W], counts [B]): row b produced tokens[b, :counts[b]].
"""
from __future__ import annotations

import torch

from engine.draft_tree import chain_draft_step
from engine.masks import block_inputs, causal


def plain_greedy(dec, rows: int, span: int, steps: int = 0):
    base = dec.lens_dev[:rows]
    dev = base.device
    inputs = block_inputs(base, torch.ones(rows, 1, 1, dtype=torch.bool, device=dev),
                          torch.zeros(rows, 1, dtype=torch.long, device=dev), span)
    new = dec.target(dec.pending[:rows].unsqueeze(1), inputs).logits[:, 0].argmax(-1)
    dec.pending[:rows] = new
    dec.lens_dev[:rows] += 1
    return new.unsqueeze(1), torch.ones_like(new)


def chain_greedy(dec, rows: int, span: int, steps: int):
    """`steps` drafts (0: the pending token alone is verified and extended)."""
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
    depth = torch.arange(n, device=dev).expand(rows, n)
    out = dec.target(chain, block_inputs(base, causal(rows, n, dev), depth, span), capture_aux=True)
    argmax = out.logits.argmax(-1)                                                   # [B, N]
    match = chain[:, 1:] == argmax[:, :-1]                                           # [B, S]
    if dec.synthetic is not None:  # benchmarks only (BatchDecoder.use_synthetic_acceptance)
        match = dec.synthetic.uniforms[:rows, :steps] < dec.synthetic.rates[:steps]
    accepted = match.long().cumprod(-1).sum(-1)                                      # [B]
    bonus = argmax.gather(1, accepted.unsqueeze(1))                                  # [B, 1]
    idx = torch.arange(n, device=dev).unsqueeze(0)
    # Emitted tokens: accepted drafts then the bonus; the same sequence feeds the drafter extend.
    emitted = torch.where(idx < accepted.unsqueeze(1), torch.cat([chain[:, 1:], bonus], 1), bonus)
    d = drafter(emitted, out.aux_hidden, block_inputs(base, causal(rows, n, dev), depth, span))
    pick = torch.arange(rows, device=dev)
    dec.draft_logits[:rows] = d.logits[pick, accepted]
    dec.draft_hidden[:rows] = d.hidden[pick, accepted]
    dec.pending[:rows] = bonus[:, 0]
    dec.lens_dev[:rows] = base + accepted + 1
    return emitted, accepted + 1
