"""Attention inputs for a block of new tokens appended after each row's committed cache."""
from __future__ import annotations

import torch

from models.layers import AttnInputs


def block_inputs(base_len: torch.Tensor, block_mask: torch.Tensor, depth: torch.Tensor, span: int,
                 row_offset: int | torch.Tensor = 0, query_offset: int | torch.Tensor = 0) -> AttnInputs:
    """Inputs for T query tokens of each row b written at cache positions base_len[b] + query_offset + t.

    block_mask [B, T, R]: which of the R block positions (base_len .. base_len + R - 1) each
    query sees (its ancestors and itself); everything before base_len is visible.
    depth [B, T]: RoPE position offsets from base_len.
    """
    b, t, r = block_mask.shape
    dev = block_mask.device
    s = torch.arange(span, device=dev)
    rel = s.view(1, -1) - base_len.view(-1, 1)                        # [B, S]
    committed = (rel < 0).unsqueeze(1)                                # [B, 1, S]
    in_block = ((rel >= 0) & (rel < r)).unsqueeze(1)                  # [B, 1, S]
    idx = rel.clamp(0, r - 1).unsqueeze(1).expand(b, t, span)
    mask = committed | (in_block & block_mask.gather(2, idx))
    slots = base_len.view(-1, 1) + query_offset + torch.arange(t, device=dev).view(1, -1)
    return AttnInputs(positions=base_len.view(-1, 1) + depth, slots=slots, mask=mask.unsqueeze(1),
                      row_offset=row_offset)


def one_token_inputs(base_len: torch.Tensor, span: int, row_offset: int = 0) -> AttnInputs:
    """Inputs for one new token per row, written at cache position base_len[b] (a decode step)."""
    b, dev = base_len.shape[0], base_len.device
    return block_inputs(base_len, torch.ones(b, 1, 1, dtype=torch.bool, device=dev),
                        torch.zeros(b, 1, dtype=torch.long, device=dev), span, row_offset=row_offset)


def causal(b: int, t: int, device) -> torch.Tensor:
    return torch.ones(t, t, dtype=torch.bool, device=device).tril().expand(b, t, t)
