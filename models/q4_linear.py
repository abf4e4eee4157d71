"""Linear layers that keep a GGUF's 4-bit blocks (Q4_0, Q4_1) 4-bit, for decoding on CPU.

A decode step of a small model on CPU is weight reads, and float32 weights are seven times
the bytes of Q4_1 (4.5 bits a weight with its scales). torch's int4 weight-only matmul for
CPU (`_weight_int4pack_mm_for_cpu`, the kernel gpt-fast's int4 mode runs on CPU) multiplies
by groups of 32 four-bit values along the input, each with a scale and a zero, computing
w = (q - 8) * scale + zero. A Q4_1 block is w = d * q + m, a Q4_0 block w = d * (q - 8): the
same groups, with scale d and zero m + 8d (or 0). So these layers hold the GGUF's own values
(exact up to float32 rounding of the zero), not a requantization of them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

GROUP = 32        # values per GGUF Q4 block, along the input dimension
PACK_ROWS = 64    # the packed layout tiles output rows by 64: row blocks of 64 concatenate
MIN_ROWS = 16     # the kernel packs output rows in 16s; other shapes stay dense


@dataclass
class Q4Blocks:
    """One weight [out, in] as 4-bit values and per-group scales and zeros (the kernel's form)."""
    q: torch.Tensor       # [out, in] uint8, values 0..15
    scale: torch.Tensor   # [out, in // GROUP] float32
    zero: torch.Tensor    # [out, in // GROUP] float32: w = (q - 8) * scale + zero


def q4_supported() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


class Q4Linear(nn.Module):
    """y = x @ W.T (+ bias) with W held as packed 4-bit groups; CPU only."""

    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, in_features: int,
                 bias: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, scales_and_zeros.shape[1]
        self.register_buffer("packed", packed)                      # [out, in // 2] uint8
        self.register_buffer("scales_and_zeros", scales_and_zeros)  # [in // GROUP, out, 2]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    def from_blocks(cls, b: Q4Blocks, dtype: torch.dtype, bias: torch.Tensor | None = None) -> "Q4Linear":
        out, k = b.q.shape
        if k % GROUP:
            raise ValueError(f"Q4 weight with {k} inputs: not a multiple of {GROUP}")
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(b.q.to(torch.int32), 1)
        sz = torch.stack([b.scale.t(), b.zero.t()], dim=-1).contiguous().to(dtype)
        return cls(packed, sz, k, bias)

    @staticmethod
    def concat(parts: list["Q4Linear"]) -> "Q4Linear | None":
        """One layer whose output is the parts' outputs side by side; None where the packed
        layout cannot be joined (a part other than the last with rows not a multiple of 64)."""
        if any(p.out_features % PACK_ROWS for p in parts[:-1]) or len({p.in_features for p in parts}) > 1:
            return None
        biases = [p.bias for p in parts]
        bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
        return Q4Linear(torch.cat([p.packed for p in parts]), torch.cat([p.scales_and_zeros for p in parts], 1),
                        parts[0].in_features, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.reshape(-1, self.in_features), self.packed, GROUP, self.scales_and_zeros)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def keep_q4(model: nn.Module, blocks: dict[str, Q4Blocks]) -> int:
    """Replace every nn.Linear whose `<name>.weight` is in `blocks` by a Q4Linear (in the
    model's dtype, keeping its bias), unless its rows are not a multiple of 16 (an odd-sized
    lm_head stays dense); returns how many were replaced."""
    n = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            key = f"{name}.{child_name}.weight" if name else f"{child_name}.weight"
            if isinstance(child, nn.Linear) and key in blocks and child.out_features % MIN_ROWS == 0:
                if child.weight.device.type != "cpu":
                    raise ValueError("GGUF 4-bit weights kept 4-bit run on CPU only (torch's int4 CPU kernel)")
                bias = None if child.bias is None else child.bias.detach()
                setattr(module, child_name, Q4Linear.from_blocks(blocks[key], child.weight.dtype, bias))
                n += 1
    return n
