"""Compiled steps (`--compile`) give the eager steps' greedy tokens, compile once per shape, save and load
without tracing, and trace as one graph each; on CPU float32 with each product form (models/cpu_forms.py)."""
import dataclasses

import pytest
import torch

from engine.decoder import BatchDecoder, SpecConfig
from models.cpu_forms import CpuForms, onednn_available
from models.kernel_plan import KernelPlan
from tests.engine_runs import decode, greedy
from tests.lossless_models import N_TOKENS, lossless_models, use_plan

# Forms as an AMD EPYC VM measured them: W @ x.T at 1-2 rows, oneDNN from 3 (so compiled at a symbolic count).
MEASURED = ((2, "few_rows"), (64, "onednn"))
ONEDNN_EVERYWHERE = ((1, "onednn"), (64, "onednn"))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return lossless_models(tmp_path_factory.mktemp("compiled"))


@pytest.mark.parametrize("forms", [(), MEASURED], ids=["f-linear", "measured"])
def test_compiled_decoder_matches_eager(models, monkeypatch, forms):
    """`--compile` (torch.compile with the engine's inductor options, then CUDA graphs on GPU):
    after the start-up warm-up, decoding compiles nothing more, also when the context grows into
    the next attention-span bucket, and gives the eager greedy tokens, with a fitted 3-step
    chain (draft steps, verify forward and acceptance compiled; a cold CPU compile takes 1-2
    minutes). With `prefill_graphs` the padded prefills of short prompts compile too, one
    compile for every width. On CPU float32 the compiled products are F.linear's, or with measured
    forms a fixed row count's own form (W @ x.T for a batch-1 draft step) and oneDNN's op at a
    symbolic count (models/cpu_forms.py)."""
    from torch._dynamo.utils import counters
    if forms and not onednn_available():
        pytest.skip("this torch has no oneDNN linear")
    use_plan(monkeypatch, models, KernelPlan(cpu_forms=CpuForms(forms)))
    target, drafter = models["target"], models["drafters"]["fitted"]
    dec = BatchDecoder(target, drafter, SpecConfig(steps=3), max_batch=4, max_context=512, compile=True,
                       prefill_graphs=True)
    dec.warm_up(1)
    assert dec.lens == [0] * 4
    compiled = counters["stats"]["unique_graphs"]
    assert compiled > 0
    out = [dec.prefill(0, models["prompts"][1], greedy())]
    while len(out) < N_TOKENS:
        out += dec.step(1, greedy())[0].tokens
    assert out[:N_TOKENS] == models["baseline"][1]
    long_prompt = (models["prompts"][1] * 40)[:240]            # decoding crosses span 256 -> 512
    out, spans = [dec.prefill(0, long_prompt, greedy())], set()
    while len(out) < N_TOKENS:
        spans.add(dec._span(1, dec._step_reach()))
        out += dec.step(1, greedy())[0].tokens
    assert spans == {256, 512}
    assert out[:N_TOKENS] == decode(target, drafter, SpecConfig(steps=3), [long_prompt], fast=False)[0][0]
    assert counters["stats"]["unique_graphs"] == compiled


def test_compile_prefill_off_compiles_no_prefill(models):
    """`compile_prefill` False (a faster start) with compile and `prefill_graphs`: a prompt's padded
    prefill, the path a captured one takes, runs uncompiled (nothing new for dynamo) and gives
    the same first token and draft state as an engine without compile."""
    from torch._dynamo.utils import counters
    target, drafter, prompt = models["target"], models["drafters"]["fitted"], models["prompts"][1]
    engines = [BatchDecoder(target, drafter, SpecConfig(steps=3), max_batch=1, max_context=512, prefill_graphs=True,
                            **flags) for flags in ({"compile": True, "compile_prefill": False}, {})]
    before = counters["stats"]["unique_graphs"]
    firsts = [dec.prefill(0, prompt, greedy()) for dec in engines]
    assert counters["stats"]["unique_graphs"] == before
    assert firsts[0] == firsts[1]
    assert torch.equal(engines[0].state.draft_logits, engines[1].state.draft_logits)


@pytest.mark.parametrize("steps,forms", [(0, ()), (3, ()), (0, ONEDNN_EVERYWHERE)],
                         ids=["plain", "chain-3", "plain-onednn"])
def test_saved_compiled_steps_load_without_tracing(models, tmp_path, monkeypatch, steps, forms):
    """`compile_cache`: a compiled engine compiles its decode steps (batch 1, and the dynamic batch)
    and its captured prefill ahead of time and saves them; a second engine over the same folder
    loads them, so dynamo traces nothing and nothing compiles again. Both give the eager greedy
    tokens (the folder's housekeeping: test_saved_compile.py). Torch 2.11 (the H200 image's) pickles
    a guard on a method's default argument with arguments its class does not take, so there the
    steps would never load; that pickling is reproduced here, so a step
    that reads a default fails this test on any torch. The 3-step chain, whose draft and verify
    calls that adds, runs at batch 1 with eager prefills only: one compile, not four, on 2 cores.
    A step calling oneDNN's op (models/cpu_forms.py) saves and loads too."""
    if forms and not onednn_available():
        pytest.skip("this torch has no oneDNN linear")
    use_plan(monkeypatch, models, KernelPlan(cpu_forms=CpuForms(forms)))
    from torch._dynamo.source import DefaultsSource
    from torch._dynamo.utils import counters
    monkeypatch.setattr(DefaultsSource, "__reduce__",
                        lambda s: (type(s), tuple(getattr(s, f.name) for f in dataclasses.fields(s))))
    prompts, expected = models["prompts"][1:], models["baseline"][1:]
    drafter, spec = (models["drafters"]["fitted"], SpecConfig(steps)) if steps else (None, None)
    batches = (1,) if steps else (1, 2)

    def decode_alone_then_both():
        dec = BatchDecoder(models["target"], drafter, spec, max_batch=2, max_context=512, compile=True,
                           prefill_graphs=not steps, compile_cache=str(tmp_path))
        outs = []
        for rows in batches:
            out = [[dec.prefill(i, p, greedy())] for i, p in enumerate(prompts[:rows])]
            while min(map(len, out)) < N_TOKENS:
                for i, r in enumerate(dec.step(rows, greedy(rows))):
                    out[i] += r.tokens
            outs += [o[:N_TOKENS] for o in out]
        return outs, dec.saved_compiles()

    names = ("chain-b1",) if steps else ("plain-b1", "plain-rows", "prefill_target-rows")
    want = [o for rows in batches for o in expected[:rows]]
    outs, saved = decode_alone_then_both()
    assert outs == want and saved == {k: {"loaded": 0, "compiled": 1} for k in names}
    traced = counters["stats"]["unique_graphs"]
    outs, saved = decode_alone_then_both()
    assert outs == want and saved == {k: {"loaded": 1, "compiled": 0} for k in names}
    assert counters["stats"]["unique_graphs"] == traced


def test_compiled_shapes_compile_once_for_every_width_and_batch(models, monkeypatch):
    """A compiled engine compiles its captured prefill once for every power-of-two width and its
    step twice (batch 1, then one dynamic batch for 2-4 rows), also where CPU float32 row counts
    take other product forms in eager steps (the models' KernelPlan, set at load by measurement): its
    test of the row count once specialized the compiles to each width and batch size."""
    from torch._dynamo.utils import counters

    use_plan(monkeypatch, models, KernelPlan(cpu_forms=CpuForms(((8, "few_rows"), (64, "onednn")))))
    prompts = [(models["prompts"][1] * 8)[:n] for n in (10, 20, 40)]
    eager = BatchDecoder(models["target"], None, None, max_batch=4, max_context=512, prefill_graphs=True)
    firsts = [eager.prefill(0, p, greedy()) for p in prompts]   # before `dec` takes the target's caches
    dec = BatchDecoder(models["target"], None, None, max_batch=4, max_context=512, compile=True, prefill_graphs=True)
    before = counters["stats"]["unique_graphs"]
    dec.warm_up(4)   # prefill widths 16..256, then batch sizes 1, 2 and 4 at every span
    assert counters["stats"]["unique_graphs"] == before + 3
    assert [dec.prefill(0, p, greedy()) for p in prompts] == firsts
    assert counters["stats"]["unique_graphs"] == before + 3


def test_device_side_steps_trace_as_one_graph(models):
    """torch.compile sees a whole plain step, a whole 3-step chain cycle (drafts, verify,
    accept, extend) and a whole tree cycle as one graph: no graph breaks, so nothing in them falls back to eager."""
    import torch._dynamo as dynamo

    from engine.spec_worker import SpecWorker
    for spec, fns in ((SpecConfig(steps=3), (SpecWorker.plain_step, SpecWorker.spec_step, SpecWorker.backlog_step)),
                      (SpecConfig(3, 4, 8), (SpecWorker.spec_step,))):
        dec = BatchDecoder(models["target"], models["drafters"]["fitted"], spec, max_batch=1,
                           max_context=512, cuda_graphs=False)
        dec.prefill(0, models["prompts"][1], greedy())
        with torch.inference_mode():
            for fn in fns:
                e = dynamo.explain(fn)(dec.worker, 1, dec.cache_len, 3)
                assert (e.graph_count, e.graph_break_count) == (1, 0), (fn.__name__, e.break_reasons)
