"""Per-GPU gauges read from NVML at scrape time (nvidia-ml-py's `pynvml`).

Read at scrape time rather than polled, so an idle server does no work and a scrape always
sees fresh values. Without NVML (no GPU, no driver, CPU machine) the collector yields no
series and never raises: a CPU server's /metrics simply has no specserve_gpu_* samples.
The `gpu` label is the NVML index (physical order, not CUDA_VISIBLE_DEVICES order).
The metric names themselves are defined in server/metrics.py.
"""
from __future__ import annotations

import logging
import threading

from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger("specserve.metrics")


class GpuCollector:
    def __init__(self, names: dict[str, tuple[str, str]], nvml=None):
        """names: {"utilization" | "memory" | "power": (metric name, help)}. nvml: the pynvml
        module (None: import it on first scrape)."""
        self.names = names
        self._nvml = nvml
        self._handles: list | None = None  # None: not tried yet; []: no NVML
        self._lock = threading.Lock()

    def _devices(self) -> list:
        with self._lock:
            if self._handles is None:
                self._handles = []
                try:
                    if self._nvml is None:
                        import pynvml
                        self._nvml = pynvml
                    self._nvml.nvmlInit()
                    n = self._nvml.nvmlDeviceGetCount()
                    self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
                    log.info("NVML: %d GPU(s) exported as specserve_gpu_*", n)
                except Exception as e:  # no library, no driver, no GPU
                    log.info("NVML unavailable, no GPU metrics: %s", e)
            return self._handles

    def _memory_info(self, h):
        """v2 when the driver has it: `used` then excludes driver-reserved memory, as nvidia-smi shows."""
        nv = self._nvml
        if hasattr(nv, "nvmlMemory_v2"):
            try:
                return nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
            except Exception:
                pass
        return nv.nvmlDeviceGetMemoryInfo(h)

    def describe(self):
        return []

    def collect(self):
        handles = self._devices()
        if not handles:
            return []
        nv = self._nvml
        readers = {
            "utilization": lambda h: float(nv.nvmlDeviceGetUtilizationRates(h).gpu),
            "memory": lambda h: float(self._memory_info(h).used),
            "power": lambda h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,  # milliwatts -> watts
        }
        families = []
        for key, read in readers.items():
            name, doc = self.names[key]
            fam = GaugeMetricFamily(name, doc, labels=["gpu"])
            for i, h in enumerate(handles):
                try:
                    fam.add_metric([str(i)], read(h))
                except Exception:  # e.g. power readings not supported on this board
                    pass
            families.append(fam)
        return families
