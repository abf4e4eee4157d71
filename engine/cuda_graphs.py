"""Replay fixed-shape decode steps as CUDA graphs (no per-kernel launch overhead).

A step function reads and writes only persistent device state, so it can be captured once
per (kind, rows, span) key and replayed. Before capture it runs once eagerly to warm up
kernels; the small state tensors it mutates are restored afterwards (its KV-cache writes
land beyond the committed lengths, where they are harmless). On CPU it just runs eagerly.
Capture is thread-local and starts after the warm-up has finished on the device: another
thread's CUDA calls (the c10d watchdog's event queries under tensor parallelism, a server
thread) and the warm-up's collectives cannot invalidate it.
"""
from __future__ import annotations

from typing import Callable

import torch


class GraphRunner:
    def __init__(self, device: torch.device, state: Callable[[], list[torch.Tensor]], enabled: bool = True):
        self.enabled = enabled and device.type == "cuda"
        self.state = state
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, object]] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.enabled else None

    def run(self, key: tuple, fn: Callable[[], object]):
        if not self.enabled:
            return fn()
        if key not in self.graphs:
            saved = [t.clone() for t in self.state()]
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fn()  # warm-up: lazy kernel initialisation must not happen during capture
            torch.cuda.current_stream().wait_stream(stream)
            for t, s in zip(self.state(), saved):
                t.copy_(s)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                out = fn()
            self.graphs[key] = (graph, out)
        graph, out = self.graphs[key]
        graph.replay()
        return out
