"""The CPU product form of each row count is chosen by measurement and kept per machine, and every
form gives F.linear's products."""
import json
import logging

import pytest
import torch
import torch.nn.functional as F

from models.cpu_forms import CPU_FEW_ROWS, CpuForms, onednn_available
from models.cpu_products import CALIBRATED_ROWS, kept_forms, machine_key, measured_forms
from models.kernel_plan import KernelPlan
from models.layers import Linear

FORMS = ["linear", "few_rows"] + (["onednn"] if onednn_available() else [])


def test_the_measured_choice_names_a_form_for_every_calibrated_row_count():
    chosen = measured_forms(torch.get_num_threads(), reps=1)
    assert [n for n, _ in chosen.measured] == list(CALIBRATED_ROWS)
    assert all(form in FORMS and (form != "few_rows" or n <= CPU_FEW_ROWS) for n, form in chosen.measured)
    assert measured_forms(torch.get_num_threads(), reps=1) is chosen  # measured once per thread count


def test_row_counts_between_and_past_the_measured_ones_take_the_next_and_the_last():
    forms = CpuForms(((1, "onednn"), (2, "few_rows"), (8, "linear"), (32, "onednn")))
    assert [forms.form(n) for n in (1, 2, 3, 8, 9, 32, 33, 500)] == [
        "onednn", "few_rows", "linear", "linear", "onednn", "onednn", "onednn", "onednn"]
    assert CpuForms().form(4) == "linear"


@pytest.mark.parametrize("form", FORMS)
def test_every_form_gives_f_linear_products(form):
    """At every row count, in 2-D and 3-D, with and without gradients; oneDNN only without them
    (it has no autograd), and after an in-place change of the weight it reads the new weight."""
    lin = Linear(576, 1536, bias=True)
    lin.plan = KernelPlan(cpu_forms=CpuForms(((64, form),)))
    for rows in (*range(1, CPU_FEW_ROWS + 2), 16, 40):
        for x in (torch.randn(rows, 576), torch.randn(1, rows, 576)):
            with torch.no_grad():
                torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
            lin(x).sum().backward()
    x = torch.randn(4, 576)
    with torch.no_grad():
        lin.weight.mul_(-1)
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)


def test_the_kept_choice_is_measured_once_and_read_by_later_starts(tmp_path):
    """kept_forms writes the choice with its timings under this machine's key; a later start
    (its in-process cache cleared) reads the file instead of measuring: here a choice no
    measurement made, written under the same key, comes back as written."""
    path = tmp_path / "cache" / "cpu_products.json"
    threads = torch.get_num_threads()
    chosen = kept_forms(threads, str(path.parent))
    entry = json.loads(path.read_text())[machine_key(threads)]
    assert [tuple(p) for p in entry["forms"]] == list(chosen.measured)
    assert sorted(map(int, entry["ms"])) == list(CALIBRATED_ROWS)
    assert set(entry["ms"]["1"]) == set(FORMS) and set(entry["ms"]["32"]) == set(FORMS) - {"few_rows"}
    kept = {machine_key(threads): {**entry, "forms": [[3, "few_rows"], [5, "linear"]]}, "another machine": {}}
    path.write_text(json.dumps(kept))
    kept_forms.cache_clear()
    assert kept_forms(threads, str(path.parent)) == CpuForms(((3, "few_rows"), (5, "linear")))
    assert json.loads(path.read_text()) == kept  # read, not measured again


def test_an_unreadable_kept_choice_is_measured_again(tmp_path, caplog):
    path = tmp_path / "cpu_products.json"
    path.write_text("{not json")
    kept_forms.cache_clear()
    with caplog.at_level(logging.WARNING):
        chosen = kept_forms(torch.get_num_threads(), str(tmp_path))
    assert "is unreadable" in caplog.text
    entry = json.loads(path.read_text())[machine_key(torch.get_num_threads())]
    assert [tuple(p) for p in entry["forms"]] == list(chosen.measured)


def test_compiled_steps_take_onednn_only_where_f_linear_lost_at_every_row_count():
    assert CpuForms(((1, "onednn"), (32, "onednn"))).compiled == "onednn"
    assert CpuForms(((1, "few_rows"), (2, "onednn"), (32, "onednn"))).compiled == "onednn"
    assert CpuForms(((1, "onednn"), (32, "linear"))).compiled == "linear"
    assert CpuForms(((1, "few_rows"),)).compiled == CpuForms().compiled == "linear"


@pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN linear")
def test_compiled_onednn_products_are_f_linear_in_one_graph_for_every_row_count():
    """Compiled without gradients, a Linear takes oneDNN as one opaque op (specserve::onednn_linear):
    one graph without breaks, one compile for every row count past one (dynamic), F.linear's products."""
    import torch._dynamo as dynamo

    lin = Linear(576, 1536, bias=True)
    lin.plan = KernelPlan(cpu_forms=CpuForms(((1, "onednn"), (64, "onednn"))))
    with torch.no_grad():
        e = dynamo.explain(lin)(torch.randn(3, 576))
        assert (e.graph_count, e.graph_break_count) == (1, 0)
        assert "specserve.onednn_linear" in str(e.graphs[0].code)
        compiled = torch.compile(lin, dynamic=True)
        for rows in (2, 5, 9, 40):   # one row is a static compile of its own (as the engine's batch-1 steps)
            x = torch.randn(1, rows, 576)
            torch.testing.assert_close(compiled(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
            if rows == 2:
                traced = dynamo.utils.counters["stats"]["unique_graphs"]
        assert dynamo.utils.counters["stats"]["unique_graphs"] == traced
