"""The models' side of decoding: the static KV caches, attention spans, and the device-side step
functions run eager, replayed as CUDA graphs, compiled by torch.compile or loaded as saved compiles.

torch.compile fuses the many small kernels (norms, RoPE, masks) of a decode step and, at one token,
turns each weight GEMV into a reduction kernel (models.layers.Linear) that COMPILE_OPTIONS tune.
Batch 1 compiles with static shapes; larger (padded) batches share one compile with a dynamic batch
dimension (their products are GEMMs, nothing to tune). The attention span is symbolic in both
(`_span_from_ref`), so spans bucketed to the context in use share the compile: the engine compiles
two graphs per step count, not one per batch size or span. Each compile takes a minute or more on
GPU (`--compile` turns it on; warm_up does it before serving, and inductor's cache,
TORCHINDUCTOR_CACHE_DIR, makes a restart's compiles faster). With compile_cache the steps are
compiled ahead of time and saved there, and a restart loads them without tracing
(engine/saved_compile.py).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.cuda_graphs import GraphRunner
from engine.saved_compile import SavedCompile, marked
from engine.torch_fixes import keep_tuned_configs

# Inductor options for `compile=True`: coordinate descent tunes the block sizes of the
# one-token GEMV reductions (as gpt-fast does), which then read an 8B layer's weights faster
# than cuBLAS. Benchmarked fusion keeps inductor from fusing the RMSNorm/SiLU that feeds a
# GEMV into it when that is slower (it can be).
COMPILE_OPTIONS = {"coordinate_descent_tuning": True, "benchmark_fusion": True}
# Except for trees: their products all have several rows (cuBLAS GEMMs, nothing to tune), and
# with the options above a SmolLM2-shaped tree step did not finish compiling on an H200 within a
# device call (untuned it compiles in about a minute).
TUNED_KINDS = ("plain", "chain", "backlog")


def pow2_bucket(n: int, floor: int, cap: int) -> int:
    """n rounded up to a power of two, at least floor, at most cap: the few shapes that graphs
    are captured (and steps compiled) for."""
    return min(cap, max(floor, 1 << (n - 1).bit_length()))


def unplanned_attention(device: torch.device):
    """For a short eager forward on GPU (a group of short prompts, a shared prompt's token, the
    drafter's backlog read in a host step), attention without cuDNN: torch sends masked
    attention to cuDNN first on Hopper, and cuDNN plans each shape the first time it meets
    it, 36 ms against 0.24 ms a call without; these shapes are
    new most times. Captured and compiled steps keep cuDNN (planned once, at capture), and so
    do a long prompt and the host steps: the only other kernel that takes a mask with
    fewer KV heads than query heads (math) expands K and V to every query head and holds
    every score."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class ModelRunner:
    """`steps`: the device-side step functions by kind, each fn(worker, rows, span, steps);
    `step_tensors()`: the small state tensors they update (restored after a capture's warm-up)."""

    def __init__(self, target, drafter, max_batch: int, cache_len: int, steps: dict[str, Callable],
                 step_tensors: Callable[[], list[torch.Tensor]], span_multiple: int = 64, cuda_graphs: bool = True,
                 compile: bool = False, compile_cache: str | None = None, step_width: int = 0):
        self.target, self.drafter = target, drafter
        self.max_batch, self.cache_len, self.span_multiple = max_batch, cache_len, span_multiple
        self.step_width = step_width
        self.device = target.embed_tokens.weight.device
        # Compiled steps take a symbolic span (_span_from_ref); a span equal to the cache's length
        # would be specialized (the cache slice is then the whole cache): one spare position.
        alloc = cache_len + (1 if compile else 0)
        target.setup_cache(max_batch, alloc)
        if drafter is not None:
            drafter.setup_cache(max_batch, alloc)
        self.graphs = GraphRunner(self.device, step_tensors, enabled=cuda_graphs)
        # Captured graphs and compiles want few shapes: spans in power-of-two buckets, backlog reads at one width.
        self.fixed_shapes = self.graphs.enabled or compile
        self.compiled, self.compile_cache = compile, compile_cache
        self.eager_steps = self.steps = self.steps_rows = steps
        # None: every compiled shape serves, compiling on first use. A set: only those another process
        # compiled and this one loaded (serve_compiled_when_ready); the others run eager.
        self.ready_compiles: set[tuple] | None = None
        self.prefill_fns: tuple = ()
        if compile:
            import torch._dynamo as dynamo
            if self.device.type == "cuda":   # the bug is in the Triton kernels' tuning
                keep_tuned_configs()
            dynamo.config.cache_size_limit = max(dynamo.config.cache_size_limit, 64)
            self.steps = {k: self._compiled(_span_from_ref(f), k, False, dict(COMPILE_OPTIONS) if k in TUNED_KINDS
                                            else {}) for k, f in steps.items()}
            self.steps_rows = {k: self._compiled(_span_from_ref(f), k, True, {}) for k, f in steps.items()}
            self.span_base = torch.empty(cache_len, dtype=torch.uint8, device=self.device)

    def compiled_prefills(self, fns: dict[str, Callable], owner) -> tuple:
        """The prefill forwards `fns` (by name, called with `owner` first) compiled once each with a
        symbolic width (every power-of-two width shares the compile; the graphs are still one per width)."""
        self.prefill_fns = tuple(functools.partial(self._compiled(f, name, True, {}), owner)
                                 for name, f in fns.items())
        return self.prefill_fns

    # -- shapes ----------------------------------------------------------------------------------
    def span(self, need: int) -> int:
        """Attention width for `need` positions, rounded (powers of two when graphs are captured
        or steps compiled: few buckets, each captured once)."""
        if self.fixed_shapes:
            return pow2_bucket(need, 256, self.cache_len)
        m = self.span_multiple
        return min(self.cache_len, -(-need // m) * m)

    def span_buckets(self) -> list[int]:
        """Every span a captured or compiled step can attend over (span's buckets)."""
        spans, n = [], 256
        while n < self.cache_len:
            spans.append(n)
            n *= 2
        return spans + [self.cache_len]

    def padded(self, rows: int) -> int:
        """Rows a device-side step runs: graphs run a power of two (the extra rows are free
        cache rows at length 0), so each is captured (and compiled) once; deterministic mode every row."""
        if self.step_width:
            return self.max_batch
        return pow2_bucket(rows, 1, self.max_batch) if self.graphs.enabled else rows

    # -- device-side steps -----------------------------------------------------------------------
    def run_step(self, kind: str, padded: int, span: int, steps: int, worker):
        """One device-side step: compiled where this shape's compile serves, else eager; replayed
        as a CUDA graph per (kind, rows, span, steps, compiled) where graphs are enabled."""
        fn, compiled = self.eager_steps[kind], False
        if self.compiled and (self.ready_compiles is None or (padded, steps) in self.ready_compiles):
            fn, compiled = (self.steps if padded == 1 else self.steps_rows)[kind], True
        span_arg = self.span_base[:span] if compiled else span   # symbolic in the compile (_compiled)
        if compiled and self.ready_compiles is not None:   # made elsewhere: never compile here
            fn = fn.saved_step(worker, padded, span_arg, steps) or _eager_by_span_ref(self.eager_steps[kind])
        return self.graphs.run((kind, padded, span, steps, compiled), lambda: fn(worker, padded, span_arg, steps))

    def start_copy(self, *tensors: torch.Tensor):
        """Copies of small step outputs on the host (pinned, asynchronous on GPU) and the event
        that marks them complete; a later replay may then overwrite the graph's outputs."""
        if self.device.type != "cuda":
            return (*(t.clone() for t in tensors), None)
        host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
        for h, t in zip(host, tensors):
            h.copy_(t, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return (*host, done)

    # -- caches ----------------------------------------------------------------------------------
    def _compiled(self, step, name: str, dynamic: bool, options: dict):
        """The step compiled: ahead of time and saved in compile_cache (named by the target's kernel
        plan too), or lazily by torch.compile. The batch-1 compile makes its span (argument 2)
        symbolic by marking it; the batched one is dynamic in every size."""
        marks = () if dynamic else ((2, 0),)
        if self.compile_cache:
            return SavedCompile(step, self.compile_cache, f"{name}-{'rows' if dynamic else 'b1'}", dynamic, options,
                                marks, plan=lambda: self.target.kernel_plan)
        compiled = torch.compile(step, dynamic=dynamic or None, options=options)
        return functools.wraps(step)(lambda *args: compiled(*marked(args, marks)))

    def kv(self) -> list[torch.Tensor]:
        """Every K and V cache tensor [rows, heads, positions, dim]: the target's layers, then the drafter's."""
        caches = [layer.self_attn.kv_cache for layer in self.target.layers]
        if self.drafter is not None:
            caches.append(self.drafter.midlayer.self_attn.kv_cache)
        return [t for c in caches for t in (c.k, c.v)]

    def move_row(self, src: int, dst: int) -> None:
        """Every cache's row src into row dst, in one foreach copy: two copies a layer took 1.5 ms
        of launches a move on the H200."""
        kv = self.kv()
        torch._foreach_copy_([t[dst] for t in kv], [t[src] for t in kv])

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Positions 0 .. n - 1 of row src into row dst, in every cache."""
        kv = self.kv()
        torch._foreach_copy_([t[dst, :, :n] for t in kv], [t[src, :, :n] for t in kv])

    # -- saved compiles --------------------------------------------------------------------------
    def saved_compiles(self) -> dict[str, dict[str, int]]:
        """For each step and prefill compiled ahead of time (compile_cache) and called so far: how
        many compiles it loaded from disk and how many it compiled and saved here. A warm start that
        compiled none traced nothing."""
        return {f.name: {"loaded": f.loaded, "compiled": f.compiled} for f in self._saved_compile_fns()
                if f.loaded + f.compiled}

    def refresh_saved_compiles(self) -> int:
        return sum(f.refresh() for f in self._saved_compile_fns())

    def saved_compiles_accept(self, padded: int, steps: int, kind: str, worker) -> bool:
        fn = (self.steps if padded == 1 else self.steps_rows)[kind]
        return isinstance(fn, SavedCompile) and all(
            fn.saved_step(worker, padded, self.span_base[:span], steps) is not None for span in self.span_buckets())

    def saved_prefills_accept(self) -> bool:
        fns = [getattr(f, "func", f) for f in self.prefill_fns]
        return bool(fns) and all(isinstance(f, SavedCompile) and f.saved for f in fns)

    def _saved_compile_fns(self) -> list[SavedCompile]:
        fns = [*self.steps.values(), *self.steps_rows.values(), *(getattr(f, "func", f) for f in self.prefill_fns)]
        return [f for f in fns if isinstance(f, SavedCompile)]


def _eager_by_span_ref(step):
    """An eager step called as a compiled one is (span as a tensor's length)."""
    return lambda worker, rows, span_ref, steps: step(worker, rows, span_ref.shape[0], steps)


def _span_from_ref(step):
    """A device-side step that takes its attention span as the length of a tensor (made
    symbolic by `_compiled`), not as an int, which torch.compile would specialize on: one compile
    then serves every span bucket, and compiled steps attend over the context in use instead of
    the whole cache (which cost a 3-step cycle 43% of its time in attention on an H200)."""
    def step_by_span_ref(worker, rows: int, span_ref: torch.Tensor, steps: int):
        return step(worker, rows, span_ref.shape[0], steps)
    return step_by_span_ref
