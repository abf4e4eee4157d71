"""Accept the longest draft path the target agrees with, plus one bonus token.

Speculative rejection sampling keeps the target distribution exactly: a child drafted from
q is accepted with probability min(1, p(x) / q(x)); on rejection p becomes
norm(max(p - q, 0)) and the next sibling is tried. A deterministic candidate (tree
drafting, or any greedy row) has a one-hot q, which reduces this to: accept with
probability p(x), else remove x from p. When no child is accepted the bonus token is drawn
from what remains of p. With one-hot p (greedy) all of this is exact argmax matching.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.draft_tree import DraftTree
from engine.sampling import BatchSampling, sample, uniform


@dataclass
class Acceptance:
    path: list[int]   # accepted node indices after the root, in order
    tokens: list[int]  # their tokens followed by the bonus token


def accept(tree: DraftTree, p: torch.Tensor, sampling: BatchSampling) -> list[Acceptance]:
    """p [B, N, V]: the target's distribution at every tree node."""
    tokens = tree.tokens.tolist()
    parents = tree.parents.tolist()
    if sampling.all_greedy:
        argmax = p.argmax(-1).tolist()
        return [_accept_greedy(tok, par, am) for tok, par, am in zip(tokens, parents, argmax)]
    return [_accept_sampled(tokens[b], parents[b], p[b], None if tree.q is None else tree.q[b],
                            sampling.generators[b]) for b in range(len(tokens))]


def _children(parents: list[int]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for i, par in enumerate(parents[1:], start=1):
        kids.setdefault(par, []).append(i)
    return kids


def _accept_greedy(tokens: list[int], parents: list[int], argmax: list[int]) -> Acceptance:
    kids, node, path = _children(parents), 0, []
    while True:
        nxt = next((c for c in kids.get(node, []) if tokens[c] == argmax[node]), None)
        if nxt is None:
            return Acceptance(path, [tokens[i] for i in path] + [argmax[node]])
        path.append(nxt)
        node = nxt


def _accept_sampled(tokens, parents, p_nodes: torch.Tensor, q_nodes: torch.Tensor | None,
                    gen: torch.Generator | None) -> Acceptance:
    kids, node, path = _children(parents), 0, []
    dev = p_nodes.device
    while True:
        p = p_nodes[node].clone()
        for c in kids.get(node, []):
            x = tokens[c]
            if q_nodes is None:
                if uniform(gen, dev) < float(p[x]):
                    break
                p[x] = 0.0
            else:
                q = q_nodes[c]
                if uniform(gen, dev) < min(1.0, float(p[x]) / max(float(q[x]), 1e-20)):
                    break
                p = (p - q).clamp_min(0.0)
            total = float(p.sum())
            if total <= 0.0:  # q covered p entirely; fall back to the target distribution
                p = p_nodes[node].clone()
            else:
                p = p / total
        else:
            return Acceptance(path, [tokens[i] for i in path] + [sample(p, gen)])
        path.append(c)
        node = c
