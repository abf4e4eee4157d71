"""engine/saved_compile.py on a small function (the decoder's use of it: tests/test_lossless.py):
a second process-like start loads what the first saved, a call its guards reject gets a compile of
its own beside it (the log names the guards it failed), a broken cache entry is compiled again
instead of failing the start, and entries another version saved are removed."""
import logging
from types import SimpleNamespace

import torch

from engine.saved_compile import SavedCompile, code_only
from models.kernel_plan import KernelPlan


def scaled(state, x):
    return x * state.scale + 1


def fresh(folder) -> SavedCompile:
    """A SavedCompile as a new start makes it: nothing loaded yet."""
    return SavedCompile(scaled, folder, "scaled", dynamic=False, options={})


def test_saved_compile_loads_recompiles_by_guards_and_replaces_broken_and_stale_entries(tmp_path, caplog):
    state, x = SimpleNamespace(scale=torch.full((4,), 2.0)), torch.arange(4.0)
    caplog.set_level(logging.INFO, logger="engine.saved_compile")
    stale = tmp_path / "scaled-0123456789abcdef-0.aot"    # another fingerprint: another version's
    other = tmp_path / "scaled2-0123456789abcdef-0.aot"   # another function's
    stale.write_bytes(b"old"), other.write_bytes(b"not mine")
    first = fresh(tmp_path)
    assert torch.equal(first(state, x), scaled(state, x)) and (first.compiled, first.loaded) == (1, 0)
    assert not stale.exists() and other.exists()
    other.unlink()
    second = fresh(tmp_path)
    assert torch.equal(second(state, x), scaled(state, x)) and (second.compiled, second.loaded) == (0, 1)
    x64 = torch.arange(4.0, dtype=torch.float64)   # a dtype the saved guards reject: a compile of its own
    assert torch.equal(second(state, x64), scaled(state, x64)) and second.compiled == 1
    assert "scaled: none of its 1 saved compiles accepts this call (tensor 'L['x']' dtype mismatch" in caplog.text
    assert len(list(tmp_path.glob("*.aot"))) == 2

    broken = sorted(tmp_path.glob("*.aot"))[0]
    broken.write_bytes(b"not a saved step")
    third = fresh(tmp_path)
    assert torch.equal(third(state, x), scaled(state, x))
    assert "does not load" in caplog.text and (third.loaded, third.compiled) == (1, 1)
    assert len(list(tmp_path.glob("*.aot"))) == 2 and fresh(tmp_path)(state, x64) is not None


def test_code_only_ignores_docstrings_comments_and_layout_but_not_code():
    source = 'def f(x):\n    return x + 1\n\n\nclass C:\n    def g(self):\n        return "text"\n'
    reworded = ('"""A module."""\n# a comment\n\ndef f(x):\n    """Adds one."""\n    return x + 1  # one\n\n'
                'class C:\n    """A class."""\n\n    def g(self):\n        """Only a docstring left? No."""\n'
                '        return "text"\n')
    assert code_only(reworded) == code_only(source)
    assert code_only(source.replace("x + 1", "x + 2")) != code_only(source)
    assert code_only(source.replace('"text"', '"other"')) != code_only(source)   # a string that is not a docstring
    assert code_only('def h():\n    """Only a docstring."""\n') != code_only('def h():\n    return 1\n')


MODEL = SimpleNamespace(kernel_plan=KernelPlan())


def attention_sign(x):
    """Reads its model's kernel plan, as the model's layers do (models.kernel_plan)."""
    return x + 1 if MODEL.kernel_plan.attention == "auto" else x - 1


def test_a_step_saved_under_one_plan_is_not_loaded_under_another(tmp_path, monkeypatch):
    """A saved compile's guards do not cover the kernel plan: loaded under another attention form,
    the step traced under the first would run its form. The plan names the artifacts, so the
    other form compiles its own (and the first form's, saved under another name, is removed)."""
    x = torch.zeros(2)
    monkeypatch.setattr(MODEL, "kernel_plan", KernelPlan(attention="auto"))
    first = SavedCompile(attention_sign, tmp_path, "sign", dynamic=False, options={}, plan=lambda: MODEL.kernel_plan)
    assert torch.equal(first(x), x + 1) and first.compiled == 1
    monkeypatch.setattr(MODEL, "kernel_plan", KernelPlan(attention="sdpa"))
    other = SavedCompile(attention_sign, tmp_path, "sign", dynamic=False, options={}, plan=lambda: MODEL.kernel_plan)
    assert torch.equal(other(x), x - 1) and (other.compiled, other.loaded) == (1, 0)
    assert len(list(tmp_path.glob("sign-*.aot"))) == 1
