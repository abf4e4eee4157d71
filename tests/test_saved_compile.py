"""engine/saved_compile.py on a toy function (the engine's steps: test_lossless.py, and test_gpu.py on a
GPU): a call that no saved compile accepts compiles another and logs the guards it failed; a new
process loads every compile and compiles none; compiles saved by another version are removed."""
from __future__ import annotations

import logging

import torch

from engine.saved_compile import SavedCompile


def twice_plus_one(dec, x):
    return x * 2 + 1


def test_saved_compiles_load_log_their_misses_and_drop_other_versions(tmp_path, caplog):
    stale = tmp_path / "toy-0123456789abcdef-0.aot"   # another fingerprint: another version's
    other = tmp_path / "toy2-0123456789abcdef-0.aot"  # another function's
    stale.write_bytes(b"old"), other.write_bytes(b"not mine")
    first = SavedCompile(twice_plus_one, tmp_path, "toy", False, {})
    with caplog.at_level(logging.INFO, logger="engine.saved_compile"):
        assert first(None, torch.ones(2)).tolist() == [3.0, 3.0]
        assert first(None, torch.ones(3)).tolist() == [3.0] * 3
    assert (first.loaded, first.compiled) == (0, 2)
    assert "toy: none of its 1 saved compiles accepts this call (tensor 'L['x']' size mismatch" in caplog.text
    assert not stale.exists() and other.exists()
    again = SavedCompile(twice_plus_one, tmp_path, "toy", False, {})   # as a restarted process
    assert again(None, torch.ones(3)).tolist() == [3.0] * 3 and again(None, torch.ones(2)).tolist() == [3.0] * 2
    assert (again.loaded, again.compiled) == (2, 0)
