"""Drafting: a chain (topk = 1) or an SGLang-style tree (topk > 1) of candidate tokens.

Node 0 of every tree is the root: the last token the target produced, not yet verified
into its cache. Chain drafts are sampled from the drafter's distribution q (kept for
rejection sampling); tree candidates are chosen deterministically by cumulative
log-probability (SGLang's meaning of topk and speculative_num_draft_tokens) and carry no q.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from engine.masks import block_inputs
from engine.sampling import BatchSampling, probs_from_logits
from models.eagle3 import Eagle3Drafter


@dataclass
class DraftTree:
    tokens: torch.Tensor     # [B, N] target-vocab ids, node 0 = root
    parents: torch.Tensor    # [B, N] parent node index, -1 for the root
    depth: torch.Tensor      # [B, N]
    ancestors: torch.Tensor  # [B, N, N] bool: node i sees node j (ancestor or itself)
    q: torch.Tensor | None   # [B, N, V] draft distribution each node was sampled from (chain sampling)
    steps: int               # drafting steps: no node is deeper
    chain: bool = False      # node i is draft i (parents i - 1)


@dataclass
class DraftState:
    """The drafter's prediction for the position after each row's root, from the last extend."""
    logits: torch.Tensor  # [B, draft_vocab]
    hidden: torch.Tensor  # [B, H]


def chain_draft_step(drafter: Eagle3Drafter, tok: torch.Tensor, hidden: torch.Tensor, base_len: torch.Tensor,
                     j: int, span: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafter's prediction after chain draft j (1-based) `tok` [B], fed with the hidden state
    that predicted it at depth j - 1 past the root and seeing the chain's earlier drafts:
    (logits [B, Vd], hidden [B, H]) for draft j + 1."""
    b, dev = tok.shape[0], tok.device
    inputs = block_inputs(base_len, torch.ones(b, 1, j, dtype=torch.bool, device=dev),
                          torch.full((b, 1), j - 1, device=dev), span, query_offset=j - 1)
    out = drafter(tok.unsqueeze(1), hidden.unsqueeze(1), inputs, logits_at=None)  # engine/spec_worker.py: why
    return out.logits[:, 0], out.hidden[:, 0]


def draft_chain(drafter: Eagle3Drafter, state: DraftState, root: torch.Tensor, base_len: torch.Tensor,
                steps: int, sampling: BatchSampling | None, span: int,
                allowed: Callable[[list[torch.Tensor]], torch.Tensor | None] | None = None) -> DraftTree:
    """`steps` drafts per row, each sampled (or argmax for greedy rows; every row with sampling
    None) from the drafter. `allowed(drafts so far)`: the draft-vocabulary tokens [B, Vd] each row
    may draft next (a grammar's mask); q is the masked distribution, so rejection sampling stays exact."""
    b, dev = root.shape[0], root.device
    logits, hidden = state.logits, state.hidden
    tokens, qs = [root], []
    want_q = sampling is not None and not sampling.all_greedy
    vocab = drafter.config.vocab_size
    for j in range(1, steps + 1):
        mask = allowed(tokens[1:]) if allowed is not None else None
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        if want_q:
            q = probs_from_logits(logits.unsqueeze(1), sampling)[:, 0]    # [B, Vd]
            tok = drafter.draft_to_target(_pick(q, sampling))
            qs.append(_to_target_vocab(drafter, q, vocab))
        else:   # the argmax, as the one-hot q of a greedy row would pick
            tok = drafter.draft_to_target(logits.argmax(-1))
        tokens.append(tok)
        if j < steps:
            logits, hidden = chain_draft_step(drafter, tok, hidden, base_len, j, span)
    n = steps + 1
    idx = torch.arange(n, device=dev)
    q = None
    if want_q:
        q = torch.stack([torch.zeros(b, vocab, device=dev)] + qs, dim=1)
    return DraftTree(
        tokens=torch.stack(tokens, dim=1),
        parents=(idx - 1).expand(b, n),
        depth=idx.expand(b, n),
        ancestors=torch.ones(n, n, dtype=torch.bool, device=dev).tril().expand(b, n, n),
        q=q, steps=steps, chain=True,
    )


def _to_target_vocab(drafter: Eagle3Drafter, q: torch.Tensor, vocab: int) -> torch.Tensor:
    target_ids = drafter.draft_to_target(torch.arange(q.shape[1], device=q.device))
    return torch.zeros(q.shape[0], vocab, device=q.device, dtype=q.dtype).index_copy_(1, target_ids, q)


def _pick(q: torch.Tensor, sampling: BatchSampling) -> torch.Tensor:
    """Sample one draft id per row from q [B, Vd]; one-hot rows (greedy) give their argmax."""
    picks = [int(row.argmax()) if float(row.max()) >= 1.0 else
             int(torch.multinomial(row, 1, generator=g)) for row, g in zip(q, sampling.generators)]
    return torch.tensor(picks, device=q.device)


def vocab_topk(x: torch.Tensor, k: int, chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """x.topk(k) over the last dim (the draft vocabulary) in two stages: the top k of each chunk,
    then the top k of those; exact, as each of the overall top k is among its chunk's. On GPU
    torch.topk over a few long rows runs one block per row, a fifth of a compiled tree cycle;
    two stages spread it over many blocks."""
    v = x.shape[-1]
    if v % chunk or v < 4 * chunk:
        return x.topk(k, dim=-1)
    vals, idx = x.unflatten(-1, (v // chunk, chunk)).topk(k, dim=-1)        # [..., C, k]
    top, at = vals.flatten(-2).topk(k, dim=-1)
    idx = idx + torch.arange(0, v, chunk, device=x.device).unsqueeze(-1)
    return top, idx.flatten(-2).gather(-1, at)


def draft_tree(drafter: Eagle3Drafter, state: DraftState, root: torch.Tensor, base_len: torch.Tensor,
               steps: int, topk: int, draft_tokens: int, span: int) -> DraftTree:
    """SGLang's EAGLE tree: expand the top-k frontier each step, keep the best N-1 nodes overall."""
    b, dev, k = root.shape[0], root.device, topk
    logp = state.logits.float().log_softmax(-1)
    scores, draft = vocab_topk(logp, k)                                   # [B, K]
    cand_tok = [drafter.draft_to_target(draft)]
    cand_score = [scores]
    cand_parent = [torch.full((b, k), -1, device=dev)]                    # candidate index, -1 = root
    frontier_cand = torch.arange(k, device=dev).expand(b, k)              # candidate index of each frontier node
    frontier_hidden = state.hidden.unsqueeze(1).expand(b, k, -1)
    frontier_anc = torch.eye(k, dtype=torch.bool, device=dev).expand(b, k, k)
    n_cand = k
    for j in range(2, steps + 1):
        tok = torch.gather(torch.cat(cand_tok, 1), 1, frontier_cand)
        inputs = block_inputs(base_len, frontier_anc, torch.full((b, k), j - 2, device=dev), span,
                              query_offset=(j - 2) * k)
        out = drafter(tok, frontier_hidden, inputs, logits_at=None)  # engine/spec_worker.py: why
        child_logp = out.logits.float().log_softmax(-1)                   # [B, K, Vd]
        top_logp, top_ids = vocab_topk(child_logp, k)                     # [B, K, K]
        frontier_score = torch.gather(torch.cat(cand_score, 1), 1, frontier_cand)
        child_score = (frontier_score.unsqueeze(-1) + top_logp).flatten(1)  # [B, K*K]
        cand_tok.append(drafter.draft_to_target(top_ids.flatten(1)))
        cand_score.append(child_score)
        cand_parent.append(frontier_cand.repeat_interleave(k, dim=1))
        best = child_score.topk(k, dim=-1).indices                        # [B, K] within this step
        parent_slot = best // k
        frontier_cand = n_cand + best
        frontier_hidden = torch.gather(out.hidden, 1, parent_slot.unsqueeze(-1).expand(-1, -1, out.hidden.shape[-1]))
        prev = torch.gather(frontier_anc, 1, parent_slot.unsqueeze(-1).expand(-1, -1, frontier_anc.shape[-1]))
        frontier_anc = torch.cat([prev, torch.eye(k, dtype=torch.bool, device=dev).expand(b, k, k)], dim=-1)
        n_cand += k * k
    return _select_tree(root, torch.cat(cand_tok, 1), torch.cat(cand_score, 1), torch.cat(cand_parent, 1),
                        draft_tokens, steps)


def _select_tree(root, cand_tok, cand_score, cand_parent, draft_tokens: int, steps: int) -> DraftTree:
    """Keep the N-1 best candidates (parents always outscore children), in candidate order."""
    b, dev = root.shape[0], root.device
    m = cand_tok.shape[1]
    n = min(draft_tokens, m + 1)
    # Depth penalty breaks ties toward parents so a kept node's ancestors are kept too.
    order_bias = torch.arange(m, device=dev) * 1e-6
    chosen = (cand_score - order_bias).topk(n - 1, dim=-1).indices.sort(dim=-1).values  # [B, N-1]
    node_of_cand = torch.zeros(b, m, dtype=torch.long, device=dev)
    node_of_cand.scatter_(1, chosen, torch.arange(1, n, device=dev).expand(b, n - 1))
    par_cand = torch.gather(cand_parent, 1, chosen)
    parents = torch.where(par_cand < 0, 0, torch.gather(node_of_cand, 1, par_cand.clamp_min(0)))
    parents = torch.cat([torch.full((b, 1), -1, device=dev), parents], dim=1)
    tokens = torch.cat([root.unsqueeze(1), torch.gather(cand_tok, 1, chosen)], dim=1)
    # Ancestors by walking every node up `steps` parents at once (no node is deeper): a few
    # whole-tree ops per level rather than one pass per node, so a compiled step stays short.
    node = torch.arange(n, device=dev)
    anc = (node.view(n, 1) == node).expand(b, n, n)
    up = parents                                                          # -1 past the root
    for _ in range(steps):
        anc = anc | (up.unsqueeze(-1) == node)
        up = torch.where(up >= 0, parents.gather(1, up.clamp_min(0)), -1)
    depth = anc.sum(-1) - 1
    return DraftTree(tokens=tokens, parents=parents, depth=depth, ancestors=anc, q=None, steps=steps, chain=False)
