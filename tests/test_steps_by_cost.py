"""Steps per batch size from measured step costs (engine/steps_by_cost.py): the choice, the costs
kept per machine, and an engine that serves by them answering as the target alone does."""
import json

import pytest
import torch

from engine.decoder import BatchDecoder, SpecConfig
from engine.loading import NativeEngineArgs, build_engine, cpu_threads
from engine.sampling import BatchSampling
from engine.steps_by_cost import batch_sizes, choose_steps, costs_key, kept_costs
from models.llama import load_target
from tests.engine_runs import greedy_ids
from tests.tiny import export_drafter, make_target_dir, random_drafter

RATES = [0.6, 0.4, 0.25]


def test_each_batch_size_drafts_the_steps_with_the_most_tokens_per_ms():
    # tokens per cycle at 0..3 steps: 1, 1.6, 2.0, 2.25. 1 row: tokens/ms .100, .145, .167, .173;
    # 3 steps gain only 4% on 2 -> 2 (with no MIN_GAIN, 3). 8 rows: a verify's rows cost more than its
    # drafts give -> 0. 2 rows: 1/10 = 1.6/16, a tie -> the fewer steps.
    costs = {1: [10, 11, 12, 13], 2: [10, 16, 30, 40], 8: [20, 45, 60, 70]}
    assert choose_steps(costs, RATES) == ((1, 2), (2, 0), (8, 0))
    assert choose_steps(costs, RATES, min_gain=0) == ((1, 3), (2, 0), (8, 0))
    assert choose_steps({4: [10, 12, 13, 50]}, RATES) == ((4, 2),)  # .100, .133, .154, .045


def test_batch_sizes_are_powers_of_two_up_to_max_batch():
    assert batch_sizes(8) == [1, 2, 4, 8] and batch_sizes(6) == [1, 2, 4, 6] and batch_sizes(1) == [1]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("steps_by_cost")
    target_dir = make_target_dir(root / "target", init_std=0.2)
    target = load_target(target_dir)
    drafter = random_drafter(target)
    return dict(target_dir=target_dir, target=target, drafter=drafter,
                draft_dir=export_drafter(drafter, root / "drafter"))


def greedy_decode(dec: BatchDecoder, prompt: list[int], n: int = 40) -> list[int]:
    out = [dec.prefill(0, prompt, BatchSampling.all_greedy_rows(1, "cpu"))]
    while len(out) < n:
        out += dec.step(1, BatchSampling.all_greedy_rows(1, "cpu"))[0].tokens
    return out[:n]


def test_costs_are_measured_once_kept_and_leave_the_decoder_as_it_was(pair, tmp_path):
    """Measuring times every step count at each batch size and leaves no trace in what the
    decoder then generates; the costs are kept under the machine's key, and a later start reads
    them: here costs no measurement made, written under the same key, come back as written."""
    prompt = [5, 17, 99, 3]
    spec = SpecConfig(3, accept_rates=RATES)
    plain = greedy_decode(BatchDecoder(pair["target"], None, None, max_batch=4, max_context=512), prompt)
    dec = BatchDecoder(pair["target"], pair["drafter"], spec, max_batch=4, max_context=512)
    costs = kept_costs(dec, "t", "d", str(tmp_path))
    assert sorted(costs) == [1, 2, 4] and all(len(ms) == 4 and min(ms) > 0 for ms in costs.values())
    assert dec.lens == [0] * 4 and dec.spec.steps_by_batch == ()
    assert greedy_decode(dec, prompt) == plain
    path = tmp_path / "step_costs.json"
    key = costs_key(dec, "t", "d", [1, 2, 4])
    kept = json.loads(path.read_text())
    assert list(kept) == [key]
    kept[key]["ms"] = {"1": [1.0, 1.0, 1.0, 1.0], "2": [1.0, 9.0, 9.0, 9.0], "4": [1.0, 9.0, 9.0, 9.0]}
    path.write_text(json.dumps(kept))
    assert kept_costs(dec, "t", "d", str(tmp_path)) == {1: [1.0] * 4, 2: [1.0, 9.0, 9.0, 9.0], 4: [1.0, 9.0, 9.0, 9.0]}


@pytest.mark.parametrize("compile", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "compiled"])
def test_an_engine_with_accept_rates_serves_the_table_its_costs_give_and_changes_no_token(pair, tmp_path, compile):
    """The engine picks its table from the kept costs at load (3 steps alone, none from 2 rows:
    costs written before it starts) and answers four requests at once, rows joining and leaving,
    as the target alone does; compiled, it reads the same costs (an eager twin's, kept under the
    same key) and compiles the steps they choose."""
    args = dict(model=str(pair["target_dir"]), device="cpu", dtype="float32", max_context=512, max_batch=4)
    engine = build_engine(NativeEngineArgs(**args, draft=str(pair["draft_dir"]), tuning_cache=str(tmp_path),
                                           spec=SpecConfig(3, accept_rates=RATES), compile=compile))
    dec = BatchDecoder(pair["target"], pair["drafter"], SpecConfig(3, accept_rates=RATES), max_batch=4,
                       max_context=512)
    torch.set_num_threads(cpu_threads(0))  # the key names the thread count, which the engine's load sets
    key = costs_key(dec, str(pair["target_dir"]), str(pair["draft_dir"]), [1, 2, 4])
    (tmp_path / "step_costs.json").write_text(json.dumps({key: {
        "ms": {"1": [10, 10, 10, 10], "2": [10, 30, 30, 30], "4": [10, 40, 40, 40]}, "measured": "then"}}))
    prompts = [[int(t) for t in torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(n))]
               for n in (1, 7, 33, 12)]

    def answers(engine) -> tuple[list[list[int]], tuple]:
        outs = greedy_ids(engine, prompts, [24 + 8 * i for i in range(len(prompts))])
        return outs, engine.decoder.spec.steps_by_batch if engine.decoder.spec else ()

    speculative, table = answers(engine)
    assert table == ((1, 3), (2, 0), (4, 0))
    assert speculative == answers(build_engine(NativeEngineArgs(**args)))[0]


def test_a_cpu_without_a_cxx_compiler_serves_eager_steps_and_says_why(pair, tmp_path, monkeypatch, caplog):
    """Inductor builds CPU kernels with a C++ compiler: where there is none (a fresh machine without
    g++), an engine asked to compile, as cpu-default asks, serves eager steps, with a warning that
    says why, instead of failing its start."""
    monkeypatch.setenv("CXX", "no-such-cxx")
    engine = build_engine(NativeEngineArgs(model=str(pair["target_dir"]), draft=str(pair["draft_dir"]),
                                           spec=SpecConfig(2), device="cpu", dtype="float32", max_context=512,
                                           max_batch=2, compile=True, compile_max_batch=2))
    with caplog.at_level("WARNING", logger="specserve.engine"):
        outs = greedy_ids(engine, [[5, 6, 7]], [12])
    assert not engine.decoder.compiled and "no C++ compiler (no-such-cxx)" in caplog.text
    assert outs == greedy_ids(build_engine(NativeEngineArgs(model=str(pair["target_dir"]), device="cpu",
                                                            dtype="float32", max_context=512)), [[5, 6, 7]], [12])
