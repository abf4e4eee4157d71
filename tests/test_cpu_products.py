"""The CPU product form is chosen by measurement, kept per machine, and either form gives F.linear's
products."""
import json
import logging

import torch
import torch.nn.functional as F

from models.cpu_products import faster_few_rows, kept_few_rows, machine_key
from models.layers import CPU_FEW_ROWS, Linear


def test_the_measured_choice_names_row_counts_in_range():
    chosen = faster_few_rows(torch.get_num_threads(), reps=1)
    assert chosen <= set(range(1, CPU_FEW_ROWS + 1))
    assert faster_few_rows(torch.get_num_threads(), reps=1) is chosen  # measured once per thread count


def test_both_forms_give_f_linear_products(monkeypatch):
    lin = Linear(576, 1536, bias=True)
    for rows in range(1, CPU_FEW_ROWS + 2):
        x = torch.randn(rows, 576)
        for chosen in (frozenset(), frozenset(range(1, CPU_FEW_ROWS + 1))):
            monkeypatch.setattr(Linear, "cpu_few_rows", chosen)
            torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)


def test_the_kept_choice_is_measured_once_and_read_by_later_starts(tmp_path):
    """kept_few_rows writes the choice with its timings under this machine's key; a later start
    (its in-process cache cleared) reads the file instead of measuring: here a choice no
    measurement made, written under the same key, comes back as written."""
    path = tmp_path / "cache" / "cpu_products.json"
    threads = torch.get_num_threads()
    chosen = kept_few_rows(threads, str(path.parent))
    entry = json.loads(path.read_text())[machine_key(threads)]
    assert set(entry["rows"]) == chosen and sorted(entry["ms"]) == [str(n) for n in range(1, CPU_FEW_ROWS + 1)]
    kept = {machine_key(threads): {**entry, "rows": [3, 5]}, "another machine": {"rows": [1]}}
    path.write_text(json.dumps(kept))
    kept_few_rows.cache_clear()
    assert kept_few_rows(threads, str(path.parent)) == {3, 5}
    assert json.loads(path.read_text()) == kept  # read, not measured again


def test_an_unreadable_kept_choice_is_measured_again(tmp_path, caplog):
    path = tmp_path / "cpu_products.json"
    path.write_text("{not json")
    kept_few_rows.cache_clear()
    with caplog.at_level(logging.WARNING):
        chosen = kept_few_rows(torch.get_num_threads(), str(tmp_path))
    assert "is unreadable" in caplog.text
    assert set(json.loads(path.read_text())[machine_key(torch.get_num_threads())]["rows"]) == chosen
