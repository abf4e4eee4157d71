"""Llama building blocks with a static KV cache (gpt-fast style).

Every attention call gets explicit cache write slots, RoPE positions and a boolean
visibility mask, so the same code serves prefill, chain verification, tree verification
and batched decoding: the caller decides what each query may see.
"""
from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.cpu_forms import few_rows_cpu, onednn_linear, onednn_weight
from models.kernel_plan import DEFAULT_PLAN, KernelPlan
from models.q4_linear import Q4Linear


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies for the RoPE variants Llama checkpoints use (default, linear, llama3)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv_freq.float()
    if kind == "linear":
        return (inv_freq / scaling["factor"]).float()
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        return torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled).float()
    raise ValueError(f"unsupported rope scaling type {kind!r} (supported: default, linear, llama3)")


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """cos/sin of shape [B, T, head_dim] for integer positions [B, T]."""
    freqs = positions.unsqueeze(-1).float() * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, T, D] (HF's rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


@dataclass
class AttnInputs:
    """What one forward pass tells every attention layer.

    positions: RoPE positions [B, T]; slots: cache positions written by each query token [B, T];
    mask: which cache positions each query may attend to, [B, 1, T, S] bool, S <= cache length;
    row_offset: batch element i uses cache row row_offset + i (active rows are contiguous); a
    one-element device tensor instead makes the row data, so that one captured graph serves
    every row (the captured prefill, engine/decoder.py).
    """
    positions: torch.Tensor
    slots: torch.Tensor
    mask: torch.Tensor
    row_offset: int | torch.Tensor = 0


class KVCache(nn.Module):
    """Static per-layer cache [max_batch, kv_heads, max_len, head_dim]; rows are batch slots."""

    def __init__(self, max_batch: int, kv_heads: int, max_len: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (max_batch, kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, k: torch.Tensor, v: torch.Tensor, inputs: "AttnInputs"):
        """Write k, v ([B, H, T, D]) at `inputs.slots`; return the first S positions of the B rows."""
        b, off, span = k.shape[0], inputs.row_offset, inputs.mask.shape[-1]
        data_row = isinstance(off, torch.Tensor)   # rows from device data: gathered, not sliced
        ids = off + torch.arange(b, device=k.device) if data_row else torch.arange(off, off + b, device=k.device)
        rows = ids.unsqueeze(1).expand_as(inputs.slots)
        self.k[rows, :, inputs.slots] = k.transpose(1, 2)
        self.v[rows, :, inputs.slots] = v.transpose(1, 2)
        if data_row:
            return self.k[:, :, :span].index_select(0, ids), self.v[:, :, :span].index_select(0, ids)
        return self.k[off:off + b, :, :span], self.v[off:off + b, :, :span]

    def copy_positions(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor):
        """Move cache entries within rows: position src[i, j] -> dst[i, j] (tree compaction)."""
        r = rows.unsqueeze(1).expand_as(src)
        self.k[r, :, dst] = self.k[r, :, src]
        self.v[r, :, dst] = self.v[r, :, src]


def own_cache_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The same weights in a second module tree, for a second decoder alive at the same time
    (a sweep's plain and speculative engines): a decoder keeps its KV cache in the model's
    attention modules (setup_cache, as gpt-fast does), so the second would replace the first's,
    and CUDA graphs the first captured would go on reading the replaced (freed) cache."""
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo=shared)


class Linear(nn.Linear):
    """nn.Linear whose one-token product on GPU, under torch.compile, is a reduction over the input.

    At batch 1 a decode step is weight reads: cuBLAS cuts a narrow matrix (q/k/v, o_proj,
    down_proj of an 8B layer) into fewer tiles than the GPU has SMs and reads it below copy
    bandwidth; written as multiply-and-sum, inductor emits one GEMV kernel over many more
    blocks, faster once tuned (engine.model_runner.COMPILE_OPTIONS). Accumulates in fp32 like cuBLAS. Eager, CPU and
    multi-token calls use F.linear, except float32 CPU calls: they take the form measured fastest
    on this processor for their row count, or where a compile makes the count symbolic, oneDNN
    where F.linear lost at every count (models/cpu_forms.py). Both choices are its model's
    KernelPlan (set_kernel_plan).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.plan = DEFAULT_PLAN   # F.linear at every CPU row count until the engine sets its model's plan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self.plan.gemv_as_reduction and x.is_cuda and x.numel() == self.in_features
                and torch.compiler.is_compiling()):
            return gemv_reduction(x, self.weight, self.bias)
        if x.device.type == "cpu" and x.dtype == torch.float32:
            # A row count fixed in a compile (a batch-1 step) takes its measured form like an eager call; a
            # symbolic one (a prefill's width, a dynamic batch) one form for every count (CpuForms.form).
            form = self.plan.cpu_forms.form(x.numel() // self.in_features)
            if form == "few_rows":
                return few_rows_cpu(x, self.weight, self.bias)
            if form == "onednn" and not torch.is_grad_enabled():
                if torch.compiler.is_compiling():   # one opaque op: its cache of reordered weights is not traced
                    return torch.ops.specserve.onednn_linear(x, self.weight, self.bias)
                return onednn_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def gemv_reduction(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear for one input row as multiply-and-sum in fp32 (one fused reduction once compiled)."""
    y = (x.unsqueeze(-2).float() * weight.float()).sum(-1)
    return (y if bias is None else y + bias.float()).to(x.dtype)


def concat_linears(parts: list[nn.Module]) -> nn.Module | None:
    """One Linear whose output is the concatenation of the outputs of `parts` (same input);
    None where 4-bit parts cannot be joined (then they stay apart)."""
    if isinstance(parts[0], Q4Linear):
        return Q4Linear.concat(parts)
    weight = torch.cat([p.weight.detach() for p in parts])
    fused = Linear(weight.shape[1], weight.shape[0], bias=parts[0].bias is not None, device="meta")
    fused.plan = parts[0].plan
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if parts[0].bias is not None:
        fused.bias = nn.Parameter(torch.cat([p.bias.detach() for p in parts]), requires_grad=False)
    return fused


def written_out_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked attention as two batched products, the query heads that share a KV head folded into
    the query length (q [B, H, T, D], k/v [B, KVH, S, D], mask [B, 1, T, S] bool). Scores come out of
    the product in q's dtype and take the softmax in fp32, as HF's eager attention does."""
    b, h, t, d = q.shape
    g = h // k.shape[1]
    scores = (q.reshape(b, k.shape[1], g * t, d) @ k.transpose(-1, -2)).float() * d ** -0.5
    scores = scores.masked_fill(~mask.repeat(1, 1, g, 1), float("-inf"))
    return (scores.softmax(-1).to(q.dtype) @ v).reshape(b, h, t, d)


class Attention(nn.Module):
    """Grouped-query attention over the static KV cache, through SDPA.

    `written_out_attention` is the other form: alone, compiled, on an H100 it took 6.5-6.9 us a call
    where cuDNN's SDPA kernel took 9.8-16.8 us at SmolLM2's shapes. In the engine's whole compiled
    steps it did not pay: chain 4 ran 4% slower with it and the speculative engine at 0 steps 5%
    slower (H100, batch_sweep --attention), so the default is SDPA and the written-out form is a
    choice of the model's KernelPlan: "auto" writes attention out in compiled CUDA steps of at most
    WRITTEN_OUT_MAX_QUERIES queries.
    """
    WRITTEN_OUT_MAX_QUERIES = 16

    def __init__(self, in_dim: int, heads: int, kv_heads: int, head_dim: int, out_dim: int, bias: bool = False):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = Linear(in_dim, heads * head_dim, bias=bias)
        self.k_proj = Linear(in_dim, kv_heads * head_dim, bias=bias)
        self.v_proj = Linear(in_dim, kv_heads * head_dim, bias=bias)
        self.o_proj = Linear(heads * head_dim, out_dim, bias=False)
        self.qkv_proj: nn.Module | None = None  # set by fuse(): q, k, v in one GEMM
        self.kv_cache: KVCache | None = None
        self.plan = DEFAULT_PLAN

    def fuse(self) -> None:
        """Inference only: read the q, k, v weights in one GEMM (one kernel instead of three)."""
        if self.qkv_proj is None and (fused := concat_linears([self.q_proj, self.k_proj, self.v_proj])):
            self.qkv_proj = fused
            del self.q_proj, self.k_proj, self.v_proj

    def _qkv(self, x: torch.Tensor):
        if self.qkv_proj is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.qkv_proj(x).split([q_dim, kv_dim, kv_dim], dim=-1)

    def forward(self, x: torch.Tensor, cos, sin, inputs: AttnInputs | None) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self._qkv(x)
        q = q.reshape(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_cache is None or inputs is None:
            # Cache-less causal attention (training, parity tests); mask given by caller or causal.
            mask = inputs.mask if inputs is not None else None
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                                 enable_gqa=self.heads != self.kv_heads)
        else:
            k, v = self.kv_cache.update(k, v, inputs)
            if self._writes_out(q):
                out = written_out_attention(q, k, v, inputs.mask)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=inputs.mask,
                                                     enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def _writes_out(self, q: torch.Tensor) -> bool:
        if self.plan.attention != "auto":
            return self.plan.attention == "written_out"
        t = q.shape[2]   # symbolic (not an int) in a compiled prefill of dynamic width: that keeps SDPA
        return (q.is_cuda and torch.compiler.is_compiling() and type(t) is int
                and t <= self.WRITTEN_OUT_MAX_QUERIES)


def set_kernel_plan(plan: KernelPlan, *models: nn.Module | None) -> None:
    """The plan every product and attention of `models` reads from its next call (None skipped);
    each model holds it as `kernel_plan`."""
    for model in filter(None, models):
        model.kernel_plan = plan
        for m in model.modules():
            if isinstance(m, (Linear, Attention)):
                m.plan = plan


def onednn_weights(*models: nn.Module | None) -> Iterator[None]:
    """Makes the oneDNN copy of each float32 CPU product's weight (models/cpu_forms.onednn_weight), one
    weight per step of the iteration. Otherwise the first step under a plan whose forms take oneDNN
    makes them all, a pause of a copy of every weight."""
    for model in filter(None, models):
        for m in model.modules():
            if isinstance(m, Linear) and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32:
                onednn_weight(m.weight)
                yield


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = Linear(dim, hidden, bias=False)
        self.up_proj = Linear(dim, hidden, bias=False)
        self.down_proj = Linear(hidden, dim, bias=False)
        self.gate_up_proj: nn.Module | None = None  # set by fuse()

    def fuse(self) -> None:
        """Inference only: gate and up projections in one GEMM."""
        if self.gate_up_proj is None and (fused := concat_linears([self.gate_proj, self.up_proj])):
            self.gate_up_proj = fused
            del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


def fuse_projections(model: nn.Module) -> nn.Module:
    """Fuse q/k/v and gate/up projections of every layer (after loading and any TP slicing).

    What serving engines do (vLLM's QKVParallelLinear, gpt-fast's wqkv): fewer, larger GEMMs
    per layer, which matters at batch 1 where each GEMM is a weight read plus a kernel launch.
    The fused model has different parameter names; never save it as a checkpoint.
    """
    for m in list(model.modules()):
        if isinstance(m, (Attention, SwiGLU)):
            m.fuse()
    return model
