"""On a GPU: the CUDA-graph greedy steps (plain, chain, tree) give the same tokens as the eager
general path, and compiled steps give them too (fp32, plain decoding, the 3-step chain and a tree at batch 1, where
one-token GEMVs are Triton reductions: models.layers.Linear).

Random tiny models (bf16 and fp32), plain and chain-speculative decoding, batch 1 and 3
(padded to 4 rows in the graphs). Marked `gpu`: CI (no GPU) deselects them; on the device
machine `python3 -m pytest -m gpu tests/test_gpu.py` runs them. Compiling takes about two
minutes per compiled case with the engine's inductor options.
"""
from __future__ import annotations

import pytest
import torch

from engine.decoder import BatchDecoder, SpecConfig
from engine.sampling import BatchSampling
from models.eagle3 import Eagle3Config, Eagle3Drafter
from models.llama import LlamaConfig, LlamaModel

pytestmark = pytest.mark.gpu
PROMPTS = [[5, 6, 7], list(range(20, 60)), [9] * 11]
COMPILED_CASES = {(0, 1), (3, 1)}   # (steps, batch), fp32


def build(dtype):
    torch.manual_seed(0)
    with torch.device("cuda"):
        t = LlamaModel(LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32), [0, 1, 2])
        for p in t.parameters():
            p.data.normal_(0, 0.3)
        d = Eagle3Drafter(Eagle3Config(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=32, vocab_size=512, draft_vocab_size=512,
                                       target_hidden_size=128, aux_layer_ids=[0, 1, 2]))
    d.embed_tokens.weight = t.embed_tokens.weight
    d.t2d.fill_(True)
    return t.to(dtype).eval(), d.to(dtype).eval()


@torch.inference_mode()
def decode(t, d, spec, prompts, fast, n=48, compile=False, prefill_graphs=False, alone=False, compile_cache=None,
           dec=None):
    """alone: one prefill per prompt (a lone prompt is what `prefill_graphs` captures); dec: on this
    decoder instead of a new one."""
    dec = dec or BatchDecoder(t, d if spec else None, spec, 4, 512, fast_greedy=fast, compile=compile,
                              prefill_graphs=prefill_graphs, compile_cache=compile_cache)
    if alone:
        outs = [dec.prefill_rows(row, [p], BatchSampling.all_greedy_rows(1, "cuda"))[0].tokens
                for row, p in enumerate(prompts)]
    else:
        outs = [[tok] for tok in dec.prefill_batch(0, prompts, BatchSampling.all_greedy_rows(len(prompts), "cuda"))]
    while min(map(len, outs)) < n:
        for i, r in enumerate(dec.step(len(prompts), BatchSampling.all_greedy_rows(len(prompts), "cuda"))):
            outs[i] += r.tokens
    return [o[:n] for o in outs]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("steps", [0, 1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_graph_and_compiled_steps_equal_eager(dtype, steps, batch):
    t, d = build(dtype)
    spec = SpecConfig(steps) if steps else None
    prompts = PROMPTS[:batch]
    eager = decode(t, d, spec, prompts, fast=False)
    assert decode(t, d, spec, prompts, fast=True) == eager
    if dtype == torch.float32 and (steps, batch) in COMPILED_CASES:
        assert decode(t, d, spec, prompts, fast=True, compile=True) == eager


@pytest.mark.timeout(900)
def test_saved_steps_load_and_equal_eager(tmp_path):
    """compile_cache under CUDA graphs: the 3-step chain (fp32) at batch 1, then 3, and its captured
    prefills are compiled ahead of time and saved by one decoder, then loaded by another, which
    compiles nothing; both give the eager tokens (engine/saved_compile.py; its CPU test is in
    test_lossless.py). Torch 2.11 cannot load a saved step that reads a default argument: the
    counts say which compile a new decoder does not load."""
    t, d = build(torch.float32)
    eager = {b: decode(t, d, SpecConfig(3), PROMPTS[:b], fast=False, alone=True) for b in (1, 3)}
    for run in ("saves", "loads"):
        dec = BatchDecoder(t, d, SpecConfig(3), 4, 512, fast_greedy=True, compile=True, prefill_graphs=True,
                           compile_cache=str(tmp_path))
        for b in (1, 3):
            assert decode(t, d, SpecConfig(3), PROMPTS[:b], fast=True, alone=True, dec=dec) == eager[b], run
        counts = dec.saved_compiles()
        print(run, counts)
        assert {"chain-b1", "chain-rows", "prefill_target-rows"} <= set(counts)
        assert all(c == ({"loaded": 0, "compiled": 1} if run == "saves" else {"loaded": 1, "compiled": 0})
                   for c in counts.values()), (run, counts)


@pytest.mark.parametrize("compile", [False, True], ids=["graphs", "compiled"])
def test_tree_steps_on_graphs_equal_eager(compile):
    """A greedy tree (4 deep, topk 4, 12 nodes) as one captured step (compiled: batch 1, fp32):
    ancestor-mask acceptance and the cache compaction inside the graph give the host walk's tokens."""
    t, d = build(torch.float32)
    spec = SpecConfig(4, 4, 12)
    prompts = PROMPTS[:1] if compile else PROMPTS
    assert decode(t, d, spec, prompts, fast=True, compile=compile) == decode(t, d, spec, prompts, fast=False)


@pytest.mark.parametrize("steps,compile", [(0, False), (3, False), (3, True)], ids=["0", "3", "3-compiled"])
def test_captured_prefill_equals_eager(steps, compile):
    """`prefill_graphs` (fp32): each prompt prefilled alone as a captured graph (widths 16 and 64,
    rows 0..2; rows 0 and 2 replay one width-16 graph with the row from its buffer; compiled: one
    compile with a symbolic width, captured per width) decodes as the eager prefill of the same
    prompt alone does."""
    t, d = build(torch.float32)
    spec = SpecConfig(steps) if steps else None
    eager = decode(t, d, spec, PROMPTS, fast=True, alone=True, compile=compile)
    assert decode(t, d, spec, PROMPTS, fast=True, prefill_graphs=True, alone=True, compile=compile) == eager


@pytest.mark.parametrize("compile", [False, True], ids=["graphs", "compiled"])
def test_steps_table_on_graphs_equals_eager(compile):
    """Steps per batch size on device-side steps (CUDA graphs; compiled: batch 1 static and the
    dynamic-batch compile for 2 and 4 rows): rows joining change the steps, tokens stay eager's."""
    t, d = build(torch.float32)
    spec = SpecConfig(3, steps_by_batch=((1, 3), (2, 2), (4, 0)))
    eager = decode(t, d, SpecConfig(3), PROMPTS, fast=False)
    dec = BatchDecoder(t, d, spec, 4, 512, compile=compile)
    g = lambda n: BatchSampling.all_greedy_rows(n, "cuda")  # noqa: E731
    outs = [[] for _ in PROMPTS]
    with torch.inference_mode():
        for row, prompt in enumerate(PROMPTS):
            outs[row] = [dec.prefill(row, prompt, g(1))]
            for _ in range(4):
                for i, r in enumerate(dec.step(row + 1, g(row + 1))):
                    outs[i] += r.tokens
        while min(map(len, outs)) < 48:
            for i, r in enumerate(dec.step(len(PROMPTS), g(len(PROMPTS)))):
                outs[i] += r.tokens
    assert [o[:48] for o in outs] == eager


@pytest.mark.parametrize("compile", [False, True], ids=["graphs", "compiled"])
def test_drafter_backlog_on_graphs_equals_eager(compile):
    """At 0 draft steps the captured (or compiled) step leaves the drafter a backlog it reads when
    drafting resumes (tests/backlog_schedule.py): same draft state, acceptance and tokens as the
    eager host step, which extends the drafter every step."""
    from tests.backlog_schedule import run_backlog_schedule
    t, d = build(torch.float32)
    spec = SpecConfig(3, steps_by_batch=((1, 3), (2, 0), (3, 0)))
    fast = run_backlog_schedule(BatchDecoder(t, d, spec, 4, 512, compile=compile), PROMPTS)
    eager = run_backlog_schedule(BatchDecoder(t, d, spec, 4, 512, fast_greedy=False), PROMPTS)
    assert fast["backlogs"] == [[8, 8, 8], [10, 10]]
    for a, b in zip(fast["state"], eager["state"]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert fast["accepted"] == eager["accepted"] and fast["outs"] == eager["outs"]


@pytest.mark.parametrize("steps", [0, 3])
def test_warm_up_captures_every_shape_served(steps):
    """After warm_up, decoding (1 and 3 rows, context crossing span 256 -> 512) captures no graph:
    a capture in serving syncs the device and stalls every request in flight."""
    t, d = build(torch.bfloat16)
    spec = SpecConfig(steps) if steps else None
    dec = BatchDecoder(t, d if spec else None, spec, 4, 600)
    dec.warm_up(4)
    captured = set(dec.graphs.graphs)
    prompts = [list(range(1, 240)), [5, 6, 7], list(range(30, 130))]
    g = lambda n: BatchSampling.all_greedy_rows(n, "cuda")  # noqa: E731
    with torch.inference_mode():
        dec.prefill(0, prompts[0], g(1))
        for _ in range(24):
            dec.step(1, g(1))
        dec.prefill_batch(1, prompts[1:], g(2))
        for _ in range(24):
            dec.step(3, g(3))
    assert max(dec.lens[:3]) > 256 and set(dec.graphs.graphs) == captured
