"""The CPU product form is chosen by measurement, and either form gives F.linear's products."""
import torch
import torch.nn.functional as F

from models.cpu_products import faster_few_rows
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
