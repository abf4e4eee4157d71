"""Acceptance: which drafts of a verified tree stand, and the bonus token after them.

One interface, two implementations. `accept(tree, logits)` takes the drafted tree (engine/draft_tree.py)
and the target's logits at its nodes and returns an `Accepted`: per row the accepted path's nodes,
the tokens emitted (accepted drafts, then the bonus) and how many drafts stood, as tensors of one
width, so the speculative worker compacts the cache and extends the drafter the same way after either.
`sample(logits)` chooses the token of a step without drafts (and a prefill's first).

- `GreedyAcceptance`: every row greedy, no logits processing: a draft stands while it equals the
  target's argmax at its parent. Tensor operations only, no host read, so the whole step can be
  captured and compiled. `chain_matches` is the one comparison; an acceptance passed in from
  outside (a benchmark's chosen accept rates) replaces it.
- `RejectionSampler`: any row that samples, processes its logits (penalties, bias, a grammar's
  mask) or asks for logprobs. Each row's LogitsProcessor turns the logits at every node into the
  distribution p the row samples from, so a grammar-masked row is this sampler over masked p.
  Speculative rejection sampling keeps p exactly: a child drafted from q is accepted with
  probability min(1, p(x) / q(x)); on rejection p becomes norm(max(p - q, 0)) and the next sibling
  is tried. A deterministic candidate (tree drafting, or any greedy row) has a one-hot q, which
  reduces this to: accept with probability p(x), else remove x from p. When no child is accepted
  the bonus is drawn from what remains of p. With one-hot p (greedy) this is exact argmax matching.
  It walks each row's tree on the host.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.draft_tree import DraftTree
from engine.logits_processing import process_rows
from engine.sampling import BatchSampling, probs_from_logits, sample, sample_rows, uniform


@dataclass
class Accepted:
    path: torch.Tensor | None   # [B, W] the node at each depth of the accepted path (root first; past its
                                # end its last node again); None for a chain, whose path is its nodes
    emitted: torch.Tensor       # [B, W] accepted drafts, then the bonus (repeated past it)
    accepted: torch.Tensor      # [B] drafts accepted
    picks: list[list[tuple[int, int]]] | None = None  # host side: (node, token) of each emitted token


class GreedyAcceptance:
    device_side = True

    def prepare(self) -> None:
        """Called before each device-side step is launched, outside any captured graph."""

    def chain_matches(self, drafts: torch.Tensor, argmax: torch.Tensor) -> torch.Tensor:
        """drafts [B, S] against the target's argmax at each one's parent [B, S]: which would stand."""
        return drafts == argmax

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        return logits[:, 0].argmax(-1)

    def accept(self, tree: DraftTree, logits: torch.Tensor) -> Accepted:
        return self._chain(tree, logits) if tree.chain else self._tree(tree, logits)

    def _chain(self, tree: DraftTree, logits: torch.Tensor) -> Accepted:
        chain, n = tree.tokens, tree.tokens.shape[1]
        argmax = logits[:, :n].argmax(-1)                                                # [B, N]
        accepted = self.chain_matches(chain[:, 1:], argmax[:, :-1]).long().cumprod(-1).sum(-1)
        bonus = argmax.gather(1, accepted.unsqueeze(1))                                  # [B, 1]
        idx = torch.arange(n, device=chain.device).unsqueeze(0)
        emitted = torch.where(idx < accepted.unsqueeze(1), torch.cat([chain[:, 1:], bonus], 1), bonus)
        return Accepted(None, emitted, accepted, None)

    @staticmethod
    def _tree(tree: DraftTree, logits: torch.Tensor) -> Accepted:
        """At most one path is right (siblings differ): its deepest node is the one whose every
        ancestor is the target's argmax at its parent."""
        rows, n = tree.tokens.shape
        dev, w = tree.tokens.device, tree.steps + 1
        argmax = logits.argmax(-1)                                                       # [B, N]
        right = tree.tokens == argmax.gather(1, tree.parents.clamp(min=0))
        right[:, 0] = True                                                               # the root
        ok = ~(tree.ancestors & ~right.unsqueeze(1)).any(-1)                             # [B, N]
        best = torch.where(ok, tree.depth, -1).argmax(-1)                                # [B]
        accepted = tree.depth.gather(1, best.unsqueeze(1))[:, 0]
        on_path = tree.ancestors[torch.arange(rows, device=dev), best]                  # [B, N]
        column = torch.where(on_path, tree.depth, w)                                     # off the path: a spare column
        path = torch.zeros(rows, w + 1, dtype=torch.long, device=dev).scatter_(
            1, column, torch.arange(n, device=dev).expand(rows, n))[:, :w]
        idx = torch.arange(w, device=dev).unsqueeze(0)
        path = torch.where(idx <= accepted.unsqueeze(1), path, best.unsqueeze(1))
        # Each accepted draft is the argmax at its parent; then the bonus.
        return Accepted(path, argmax.gather(1, path), accepted, None)


class RejectionSampler:
    device_side = False

    def __init__(self, sampling: BatchSampling):
        self.sampling = sampling

    def prepare(self) -> None:
        pass

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        """One token per row from the processed logits at one position [B, 1, V] (on the device)."""
        s = self.sampling
        p = probs_from_logits(process_rows(logits, s.processors, [[[]]] * logits.shape[0]), s)[:, 0]
        return p.argmax(-1) if s.all_greedy else sample_rows(p, s.generators)

    def accept(self, tree: DraftTree, logits: torch.Tensor) -> Accepted:
        s, dev = self.sampling, tree.tokens.device
        logits = logits[:, :tree.tokens.shape[1]]
        p = probs_from_logits(process_rows(logits, s.processors, node_paths(tree) if s.processors else None), s)
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        if s.all_greedy:
            rows = [_accept_greedy(t, par, am) for t, par, am in zip(tokens, parents, p.argmax(-1).tolist())]
        else:
            rows = [_accept_sampled(tokens[b], parents[b], p[b], None if tree.q is None else tree.q[b],
                                    s.generators[b]) for b in range(len(tokens))]
        w = max(len(path) for path, _ in rows) + 1
        paths = [[0] + path + [path[-1] if path else 0] * (w - 1 - len(path)) for path, _ in rows]
        emitted = [toks + [toks[-1]] * (w - len(toks)) for _, toks in rows]
        return Accepted(None if tree.chain else torch.tensor(paths, device=dev), torch.tensor(emitted, device=dev),
                        torch.tensor([len(path) for path, _ in rows], device=dev),
                        picks=[list(zip([0] + path, toks)) for path, toks in rows])


def node_paths(tree: DraftTree) -> list[list[list[int]]]:
    """[b][i]: the draft tokens from the root's child down to node i (node 0: [])."""
    out = []
    for toks, parents in zip(tree.tokens.tolist(), tree.parents.tolist()):
        paths = [[]]
        for i in range(1, len(toks)):
            paths.append(paths[parents[i]] + [toks[i]])
        out.append(paths)
    return out


def _children(parents: list[int]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for i, par in enumerate(parents[1:], start=1):
        kids.setdefault(par, []).append(i)
    return kids


def _accept_greedy(tokens: list[int], parents: list[int], argmax: list[int]) -> tuple[list[int], list[int]]:
    """(accepted nodes after the root, their tokens then the bonus)."""
    kids, node, path = _children(parents), 0, []
    while True:
        nxt = next((c for c in kids.get(node, []) if tokens[c] == argmax[node]), None)
        if nxt is None:
            return path, [tokens[i] for i in path] + [argmax[node]]
        path.append(nxt)
        node = nxt


def _accept_sampled(tokens, parents, p_nodes: torch.Tensor, q_nodes: torch.Tensor | None,
                    gen: torch.Generator | None) -> tuple[list[int], list[int]]:
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
            return path, [tokens[i] for i in path] + [sample(p, gen)]
        path.append(c)
        node = c
