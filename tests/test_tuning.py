"""An engine that serves at once measures what its tuning cache lacks between its steps (engine/tuning.py):
it answers before measuring ends, applies the product forms and the steps table once measured, keeps
them for a restart, and no token changes on the way."""
import asyncio
import json
import time

import pytest

from engine.api import SamplingParams
from engine.config import SpecConfig
from engine.loading import NativeEngineArgs, build_engine
from engine.steps_by_cost import choose_steps, provisional_steps
from tests.tiny import export_drafter, make_target_dir, random_drafter

RATES = [0.6, 0.4, 0.25]
PROMPTS = [[5, 17, 99, 3], [7, 1, 300], [42] * 20]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from models.llama import load_target
    root = tmp_path_factory.mktemp("tuning")
    target_dir = make_target_dir(root / "target", init_std=0.2)
    return dict(target_dir=str(target_dir),
                draft_dir=str(export_drafter(random_drafter(load_target(target_dir)), root / "drafter")))


def answers(engine, tag: str) -> list[list[int]]:
    """Every prompt at once, greedy, through a started engine."""
    async def one(i: int, prompt: list[int]) -> list[int]:
        ids = []
        async for out in engine.generate(f"{tag}{i}", prompt, SamplingParams(temperature=0, max_tokens=16 + 8 * i,
                                                                             ignore_eos=True, detokenize=False)):
            ids += out.token_ids
        return ids

    async def all_of_them():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS)))
    return asyncio.run(all_of_them())


def test_an_engine_that_serves_at_once_answers_before_measuring_then_serves_and_keeps_what_it_measured(
        pair, tmp_path, monkeypatch):
    """The first answers come while nothing is measured (the product forms alone take seconds of
    measuring, and while requests are in, measuring takes at most a quarter of the engine's time)."""
    monkeypatch.setattr("engine.tuning.ROUNDS", 1)   # the step costs' rounds: one is enough for a tiny pair
    base = dict(model=pair["target_dir"], device="cpu", dtype="float32", max_context=512, max_batch=4,
                compile_before_ready=False)
    plain = build_engine(NativeEngineArgs(**base, tuning_cache=str(tmp_path / "plain")))
    plain.start_blocking()
    try:
        expected = answers(plain, "p")
    finally:
        plain.stop_blocking()
    args = NativeEngineArgs(**base, draft=pair["draft_dir"], spec=SpecConfig(3, accept_rates=RATES),
                            tuning_cache=str(tmp_path))
    engine = build_engine(args)
    engine.start_blocking()
    try:
        assert engine.compile_status == {"tuning": {"measured": [], "measuring": ["CPU product forms", "step costs"]}}
        assert engine.decoder.spec.steps_by_batch == provisional_steps(3, 4) == ((1, 3), (4, 1))
        assert not engine.decoder.target.kernel_plan.cpu_forms.measured   # F.linear until the forms are measured
        assert answers(engine, "a") == expected
        assert not engine.tuning.done, "answered before measuring ends"
        deadline = time.monotonic() + 300
        while not engine.tuning.done:   # idle: it measures back to back
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert engine.compile_status == {"tuning": {"measured": ["CPU product forms", "step costs"], "measuring": []}}
        costs = {int(rows): ms for rows, ms in only_entry(tmp_path / "step_costs.json")["ms"].items()}
        assert sorted(costs) == [1, 2, 4]
        table = choose_steps(costs, RATES)
        assert engine.decoder.spec.steps_by_batch == table
        forms = engine.decoder.target.kernel_plan.cpu_forms.measured
        assert [list(p) for p in forms] == only_entry(tmp_path / "cpu_products.json")["forms"]
        assert answers(engine, "b") == expected
    finally:
        engine.stop_blocking()
    again = build_engine(args)   # a restart reads both at load: nothing left to measure
    again.start_blocking()
    try:
        assert again.tuning is None and again.compile_status is None
        assert again.decoder.spec.steps_by_batch == table
        assert again.decoder.target.kernel_plan.cpu_forms.measured == forms
        assert answers(again, "c") == expected
    finally:
        again.stop_blocking()


def only_entry(path) -> dict:
    kept = json.loads(path.read_text())
    assert len(kept) == 1
    return next(iter(kept.values()))
