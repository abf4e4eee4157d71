"""Synthetic acceptance (benchmarks/synthetic_acceptance.py): a random pair's device-side chain steps accept drafts
at the chosen per-position rates, so target-scale cycle costs can be measured at a realistic
accept length; and nothing a server is configured with can switch it on."""
import dataclasses

import pytest

from benchmarks.shapes import random_pair
from benchmarks.synthetic_acceptance import SyntheticAcceptance
from engine.decoder import BatchDecoder, SpecConfig
from engine.loading import NativeEngineArgs
from engine.sampling import BatchSampling
from launch import profiles


def tokens_per_step(rates: list[float], steps: int = 3, n: int = 120) -> list[int]:
    target, drafter, _ = random_pair("tiny", "cpu", "float32")
    spec = SpecConfig(steps)
    dec = BatchDecoder(target, drafter, spec, max_batch=2, max_context=4 * n + 16,
                       acceptance=SyntheticAcceptance(rates, spec, 2, "cpu", seed=0))
    greedy = BatchSampling.all_greedy_rows(2, "cpu")
    dec.prefill_batch(0, [[5, 6, 7], [8, 9]], greedy)
    return [len(r.tokens) for _ in range(n) for r in dec.step(2, greedy)]


def test_rates_set_the_accepted_drafts():
    assert set(tokens_per_step([1.0, 1.0, 1.0])) == {4}
    assert set(tokens_per_step([0.0, 1.0, 1.0])) == {1}
    counts = tokens_per_step([0.8, 0.5, 0.5])
    assert abs(sum(counts) / len(counts) - (1 + 0.8 + 0.4 + 0.2)) < 0.1   # E[tokens] = 1 + sum of prefix products


def test_one_rate_per_step_in_0_1():
    for bad in ([0.5, 0.5], [0.5, 1.5, 0.5]):
        with pytest.raises(ValueError, match="one rate in"):
            SyntheticAcceptance(bad, SpecConfig(3), 1, "cpu")


def test_no_engine_argument_or_profile_field_reaches_it():
    sections = [NativeEngineArgs, SpecConfig, *(c for c in vars(profiles).values()
                                                 if dataclasses.is_dataclass(c) and isinstance(c, type))]
    assert not [f"{c.__name__}.{f.name}" for c in sections for f in dataclasses.fields(c) if "synth" in f.name]
