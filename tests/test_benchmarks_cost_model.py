"""The cost model: its formula on hand-made costs, and the step-costs -> cost-model pipeline
on a tiny random pair on CPU (files and labels, never timings)."""
import json

import pytest

from benchmarks import costs as cost_model

COSTS = cost_model.Costs(name="hand", verify_ms={n: 1.0 + 0.1 * n for n in range(1, 9)}, draft_step_ms=0.2,
                         extend_ms={n: 0.3 for n in range(1, 9)}, decode_ms=1.0, overhead_ms=0.1)


def test_formula():
    # S = 3: verify(4) 1.4 + 2 drafter steps 0.4 + extend(4) 0.3 + overhead 0.1 = 2.2 ms for 3 tokens.
    assert COSTS.cycle_ms(3) == pytest.approx(2.2)
    (row,) = cost_model.predict(COSTS, {3: 3.0})
    assert row["speedup"] == pytest.approx(3.0 * 1.0 / 2.2)
    assert row["tok_s"] == pytest.approx(1000 * 3.0 / 2.2)
    assert COSTS.cycle_ms(8) is None  # verify(9) not measured
    timed = cost_model.Costs(**{**COSTS.__dict__, "measured_cycle_ms": {3: 2.0}})
    assert cost_model.predict(timed, {3: 3.0}, source="cycle")[0]["speedup"] == pytest.approx(1.5)


def test_replies_that_end_pay_the_step_launched_ahead():
    # 30 decode tokens: plain 30 + 1 steps of 1 ms; speculative 30 / 3 + 1 = 11 cycles of 2.2 ms.
    (row,) = cost_model.predict(COSTS, {3: 3.0}, reply=30.0)
    assert row["speedup"] == pytest.approx(31 * 1.0 / (11 * 2.2))
    assert row["tok_s"] == pytest.approx(1000 * 30 / (11 * 2.2))
    rows = [{"steps": 0, "topk": 0, "decode_tokens_per_reply": 30.0}, {"steps": 3, "topk": 1}]
    assert cost_model.reply_tokens({"rows": rows}) == 30.0


def sweep(tmp_path, rows):
    p = tmp_path / "sweep.json"
    p.write_text(json.dumps({"name": "pair", "rows": rows}))
    return p


def test_validation_error_percent(tmp_path):
    s = sweep(tmp_path, [{"steps": 0, "topk": 0, "tok_s": 100.0, "speedup": 1.0},
                         {"steps": 3, "topk": 1, "tok_s": 150.0, "speedup": 1.5, "tokens_per_step": 3.0}])
    v = cost_model.validate(COSTS, json.loads(s.read_text()))
    assert v["rows"][0]["error_pct"] == pytest.approx(100 * (3.0 / 2.2 - 1.5) / 1.5)


def test_costs_then_model_write_reports(tmp_path):
    costs = cost_model.main(["measure", "--shape", "tiny", "--device", "cpu", "--context", "16", "--max-verify", "5",
                             "--cycle-steps", "1,3", "--iters", "2", "--name", "tiny", "--out-dir", str(tmp_path)])
    assert set(costs["verify_ms"]) == {1, 2, 3, 4, 5} and costs["overhead_ref_steps"] == 3
    for ext in ("json", "md"):
        assert (tmp_path / f"tiny.{ext}").stat().st_size > 0
    s = sweep(tmp_path, [{"steps": 0, "topk": 0, "tok_s": 10.0, "speedup": 1.0},
                         {"steps": 1, "topk": 1, "tok_s": 12.0, "speedup": 1.2, "tokens_per_step": 1.8},
                         {"steps": 3, "topk": 1, "tok_s": 15.0, "speedup": 1.5, "tokens_per_step": 2.9},
                         {"steps": 3, "topk": 2, "draft_tokens": 6, "tok_s": 9.0, "speedup": 0.9}])
    out = tmp_path / "model"
    result = cost_model.main(["model", "--sweep", str(s), "--validate", str(tmp_path / "tiny.json"),
                              "--predict", str(tmp_path / "tiny.json"), "--name", "m", "--out-dir", str(out)])
    assert [v["source"] for v in result["validations"]] == ["parts", "cycle"]
    # Whole cycles are always timed; a parts sum that timing noise makes <= 0 is left out (tiny
    # timings on a shared machine), so only the cycle source is sure to keep both step counts.
    assert {r["steps"] for r in result["validations"][0]["rows"]} <= {1, 3}
    assert [r["steps"] for r in result["validations"][1]["rows"]] == [1, 3]
    assert result["predictions"][0]["label"] == "PREDICTION"
    assert "PREDICTION" in (out / "m.md").read_text()
    assert json.loads((out / "m.json").read_text())["acceptance"]


def test_batch_sweeps_are_read_at_their_summed_decode_rate():
    # a(S) / cycle(S) predicts every reply's tokens over every reply's seconds, not the median
    # reply's rate; a sweep without decode_tok_s records only the median.
    row = {"concurrency": 1, "steps": 3, "request_tok_s": 250.0, "x_plain_request": 1.2,
           "decode_tok_s": 200.0, "x_plain_decode": 1.3}
    old = {k: v for k, v in row.items() if "decode" not in k}
    assert cost_model.batch_one({"rows": [row]})["rows"][0]["speedup"] == 1.3
    assert cost_model.batch_one({"rows": [old]})["rows"][0]["speedup"] == 1.2


def test_compiled_costs_are_read_at_their_whole_cycle():
    # costs measure --compile compiles the engine's steps but times the parts uncompiled.
    timed = cost_model.Costs(**{**COSTS.__dict__, "measured_cycle_ms": {3: 2.0}})
    assert timed.sources() == ["parts", "cycle"]
    assert cost_model.Costs(**{**timed.__dict__, "compiled": True}).sources() == ["cycle"]
