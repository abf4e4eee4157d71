"""Summary statistics of latency samples, in the shape vLLM's benchmark_serving prints."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class Summary:
    mean: float
    median: float
    p90: float
    p99: float
    min: float
    max: float
    count: int

    @classmethod
    def of(cls, samples: list[float], scale: float = 1.0) -> "Summary | None":
        """`scale` converts units (1000.0: seconds -> milliseconds). None for no samples."""
        if not samples:
            return None
        a = np.asarray(samples, dtype=float) * scale
        return cls(mean=float(a.mean()), median=float(np.median(a)), p90=float(np.percentile(a, 90)),
                   p99=float(np.percentile(a, 99)), min=float(a.min()), max=float(a.max()), count=int(a.size))

    def to_dict(self) -> dict:
        return asdict(self)
