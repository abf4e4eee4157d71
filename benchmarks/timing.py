"""Timing for benchmarks: median time of a function (a CUDA graph replay on GPU, so launch
overhead is not measured; eager on CPU) and the GPU's copy bandwidth, the figure decode is
held against."""
from __future__ import annotations

import functools
import statistics
import time

import torch

from engine.cuda_graphs import GraphRunner


def time_ms(fn, device: torch.device, iters: int, rounds: int = 5) -> float:
    """Median milliseconds per call: on GPU, of `rounds` rounds of `iters` graph replays timed
    with CUDA events (captured as the engine captures its steps); on CPU, of `iters` calls."""
    if device.type != "cuda":
        fn()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000.0)
        return statistics.median(times)
    runner = GraphRunner(device, lambda: [])  # fn keeps no state to restore
    runner.run((), fn)  # warm-up and capture
    torch.cuda.synchronize()

    def replays():
        for _ in range(iters):
            runner.run((), fn)

    return statistics.median(_event_ms(replays) / iters for _ in range(rounds))


def _event_ms(run) -> float:
    """GPU milliseconds of the work run() enqueues, between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def copy_bandwidth(gib: int = 4) -> float:
    """Bytes read + written per second by a device-to-device copy of `gib` GiB on the current GPU."""
    src = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = time_ms(functools.partial(dst.copy_, src), torch.device("cuda"), iters=10) / 1000
    del src, dst
    torch.cuda.empty_cache()
    return 2 * (gib << 30) / seconds
