"""On a GPU, in bfloat16, compiled: with consistent kernels (models.layers.set_consistent_kernels) greedy
speculation gives plain decoding's tokens, at one row and at three (padded to four in the graphs): one-token
steps take the products and attention that verify steps take, so a verify step's rows round as plain steps'
rows do. Marked `gpu`; compiling takes a few minutes per case with the engine's inductor options.

    python3 -m pytest -m gpu tests/test_gpu_consistent.py
"""
from __future__ import annotations

import pytest
import torch

from engine.decoder import SpecConfig
from models.layers import Attention, Linear, set_consistent_kernels
from tests.test_gpu import build, decode

pytestmark = pytest.mark.gpu
PROMPTS = [[5, 6, 7], list(range(20, 60)), [9] * 11]


@pytest.fixture
def consistent():
    saved = Linear.gemv_as_reduction, Attention.form
    set_consistent_kernels(True)
    yield
    Linear.gemv_as_reduction, Attention.form = saved


@pytest.mark.parametrize("batch", [1, 3])
def test_compiled_chain_repeats_plain_tokens_in_bf16(consistent, batch):
    assert not Linear.gemv_as_reduction and Attention.form == "sdpa"
    t, d = build(torch.bfloat16)
    prompts = PROMPTS[:batch]
    plain = decode(t, d, None, prompts, True, n=96, compile=True)
    chain = decode(t, d, SpecConfig(steps=3, topk=1, draft_tokens=4), prompts, True, n=96, compile=True)
    assert chain == plain
