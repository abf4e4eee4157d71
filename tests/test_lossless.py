"""Greedy speculative decoding is lossless: token for token the target-only greedy output.

Checked at the decoder level for steps 1..8 with a random drafter (rejections everywhere)
and a fitted drafter (long accepted runs), for chains and trees, prompt lengths and
batches; and at the engine level for every stop condition that can fall inside an
accepted draft run: EOS, stop token ids, max_tokens and stop strings.
"""
import asyncio
import dataclasses
import json
import shutil

import pytest
import torch

from engine.api import SamplingParams
from engine.decode_state import BACKLOG_STEPS
from engine.decoder import BatchDecoder, SpecConfig
from engine.loading import NativeEngineArgs, build_engine
from engine.prefill import PREFILL_GRAPH_GROUP, Prefill
from engine.sampling import BatchSampling
from models.cpu_forms import CpuForms
from models.kernel_plan import KernelPlan
from tests.engine_runs import decode, greedy, greedy_ids
from tests.lossless_models import N_TOKENS, lossless_models, use_plan
from tests.tiny import export_drafter


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return lossless_models(tmp_path_factory.mktemp("lossless"))


@pytest.mark.parametrize("fast", [True, False], ids=["device-step", "general-step"])
@pytest.mark.parametrize("steps", range(1, 9))
@pytest.mark.parametrize("kind", ["random", "fitted"])
def test_chain_is_lossless(models, steps, kind, fast):
    for prompt, expected in zip(models["prompts"], models["baseline"]):
        out, acc = decode(models["target"], models["drafters"][kind], SpecConfig(steps), [prompt], fast=fast)
        assert out[0] == expected
    if kind == "fitted" and steps >= 3:
        assert 1 + sum(acc[0]) / len(acc[0]) > 2.0  # long accepted runs really happened


@pytest.mark.parametrize("forms", [((64, "linear"),), ((64, "few_rows"),), ((64, "onednn"),),
                                   ((1, "onednn"), (4, "few_rows"), (64, "linear"))],
                         ids=["linear", "few_rows", "onednn", "mixed"])
def test_chain_is_lossless_in_every_cpu_product_form(models, monkeypatch, forms):
    """Greedy speculation gives plain decoding's tokens whichever float32 product form each row
    count takes on this CPU (models/cpu_forms.py, chosen at load by measurement), also where a
    decode step's one row and a verify's rows take different forms."""
    use_plan(monkeypatch, models, KernelPlan(cpu_forms=CpuForms(forms)))
    for prompt in models["prompts"]:
        plain = decode(models["target"], None, None, [prompt])[0][0]
        for steps in (1, 3, 6):
            assert decode(models["target"], models["drafters"]["fitted"], SpecConfig(steps), [prompt])[0][0] == plain


def test_chain_and_tree_are_lossless_with_attention_written_out(models, monkeypatch):
    """The attention form compiled CUDA steps take (models.layers.written_out_attention), forced
    on every call here: speculation by chain and by tree still gives plain decoding's tokens."""
    use_plan(monkeypatch, models, KernelPlan(attention="written_out"))
    for prompt in models["prompts"]:
        plain = decode(models["target"], None, None, [prompt])[0][0]
        for spec in (SpecConfig(3), SpecConfig(3, 4, 8)):
            assert decode(models["target"], models["drafters"]["fitted"], spec, [prompt])[0][0] == plain


@pytest.mark.parametrize("fast", [True, False], ids=["device-step", "general-step"])
@pytest.mark.parametrize("steps,topk,tokens", [(2, 2, 4), (3, 4, 8), (5, 3, 10), (8, 2, 16)])
@pytest.mark.parametrize("kind", ["random", "fitted"])
def test_tree_is_lossless(models, steps, topk, tokens, kind, fast):
    for prompt, expected in zip(models["prompts"], models["baseline"]):
        out, _ = decode(models["target"], models["drafters"][kind], SpecConfig(steps, topk, tokens), [prompt],
                        fast=fast)
        assert out[0] == expected


@pytest.mark.parametrize("shape", [(1, 8192), (3, 8, 8192), (2, 4, 32000), (2, 1000)])
def test_two_stage_vocab_topk_is_torch_topk(shape):
    """A tree's top k over the draft vocabulary (two stages when it splits into chunks) is
    exactly torch.topk's: the same values and indices."""
    from engine.draft_tree import vocab_topk
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    values, indices = vocab_topk(x, 8)
    assert torch.equal(values, x.topk(8).values) and torch.equal(indices, x.topk(8).indices)


@pytest.mark.parametrize("steps,topk,tokens", [(3, 4, 8), (6, 8, 32)])
def test_device_side_tree_accepts_what_the_general_path_accepts(models, steps, topk, tokens):
    """Rows of different lengths in one batch: the device-side tree step (ancestor-mask
    acceptance, cache compaction inside the step) accepts the same path lengths, step for step,
    as the host's walk of the same tree, and the fitted drafter's long paths really happen."""
    spec = SpecConfig(steps, topk, tokens)
    target, drafter, prompts = models["target"], models["drafters"]["fitted"], models["prompts"]
    device_side = decode(target, drafter, spec, prompts)
    assert device_side == decode(target, drafter, spec, prompts, fast=False)
    assert device_side[0] == models["baseline"]
    assert max(max(a) for a in device_side[1]) >= 3


@pytest.mark.parametrize("fast", [True, False], ids=["device-step", "general-step"])
def test_batched_rows_match_single_rows(models, fast):
    """Rows of different lengths decoded together give each row's solo output."""
    out, _ = decode(models["target"], models["drafters"]["fitted"], SpecConfig(3), models["prompts"], fast=fast)
    assert out == models["baseline"]


@pytest.mark.parametrize("kind", ["none", "fitted"])
def test_batched_prefill_matches_prefill_alone(models, kind):
    """Prompts of lengths 1, 7 and 33 prefilled in one padded forward decode as they do alone
    (the padding lies past each row's committed length), with and without a drafter."""
    drafter = models["drafters"].get(kind)
    spec = SpecConfig(3) if drafter else None
    out, _ = decode(models["target"], drafter, spec, models["prompts"], batched_prefill=True)
    assert out == models["baseline"]
    if drafter:  # the drafter's prefill state is the same too: same acceptance step by step
        _, alone = decode(models["target"], drafter, spec, models["prompts"])
        _, together = decode(models["target"], drafter, spec, models["prompts"], batched_prefill=True)
        assert alone == together


@pytest.mark.parametrize("kind", ["none", "fitted"])
def test_prefill_padded_for_graphs_matches_prefill_alone(models, kind):
    """The prompt of a captured prefill (`prefill_graphs`) is padded to a power-of-two width
    (lengths 1, 7 and 33 to 16, 16 and 64) and read from the graph's input buffers: the same
    tokens, and with a drafter the same acceptance step by step, as the unpadded prefill.
    The capture itself needs a GPU (tests/test_gpu.py)."""
    drafter = models["drafters"].get(kind)
    spec = SpecConfig(3) if drafter else None
    out, accepted = decode(models["target"], drafter, spec, models["prompts"], prefill_graphs=True)
    assert out == models["baseline"]
    if drafter:
        assert accepted == decode(models["target"], drafter, spec, models["prompts"])[1]


@pytest.mark.parametrize("kind", ["none", "fitted"])
def test_group_prefill_for_graphs_matches_prefill_alone(models, kind):
    """With `prefill_graphs`, a group of prompts prefills one prompt at a time through its graph's
    path (its buffers, its padded width), read once at the end: the same tokens, and with a
    drafter the same acceptance step by step, as each prompt prefilled alone."""
    drafter = models["drafters"].get(kind)
    spec = SpecConfig(3) if drafter else None
    out, accepted = decode(models["target"], drafter, spec, models["prompts"], batched_prefill=True,
                           prefill_graphs=True)
    assert out == models["baseline"]
    if drafter:
        assert accepted == decode(models["target"], drafter, spec, models["prompts"])[1]


def test_large_group_prefill_stays_one_forward(models, monkeypatch):
    """More than PREFILL_GRAPH_GROUP prompts prefill in one eager forward even with `prefill_graphs`
    (replays queue up one after another), and each still decodes as it does alone."""
    prompts = models["prompts"] * 3
    assert len(prompts) > PREFILL_GRAPH_GROUP

    def replayed(*_):
        raise AssertionError("a large group replayed the captured prefill")
    monkeypatch.setattr(Prefill, "_graphed", replayed)
    out, _ = decode(models["target"], None, None, prompts, batched_prefill=True, prefill_graphs=True)
    assert out == models["baseline"] * 3


def test_group_prefill_for_graphs_keeps_each_rows_sampling(models):
    """A group prefilled one prompt at a time keeps each row's own sampling: a greedy row with
    logprobs and a seeded sampled row get what each gets prefilled alone."""
    prompts = models["prompts"][1:]

    def sampling(rows: list[int]) -> BatchSampling:
        temperature, top_p, gen, logprobs = [0.0, 0.8], [1.0, 0.9], [None, 3], [2, None]
        return BatchSampling(torch.tensor([temperature[r] for r in rows]), torch.tensor([top_p[r] for r in rows]),
                             torch.zeros(len(rows), dtype=torch.long),
                             [None if gen[r] is None else torch.Generator().manual_seed(gen[r]) for r in rows],
                             logprobs=[logprobs[r] for r in rows] if any(logprobs[r] for r in rows) else None)

    dec = BatchDecoder(models["target"], None, None, max_batch=2, max_context=512, prefill_graphs=True)
    together = dec.prefill_rows(0, prompts, sampling([0, 1]))
    alone = [dec.prefill_rows(r, [prompts[r]], sampling([r]))[0] for r in range(2)]
    assert together == alone
    assert together[0].logprobs is not None and together[1].logprobs is None


def test_engine_admission_in_groups_matches_baseline(models, fitted_dir):
    """Offline admission (engine prefills up to two requests at a time, only once two rows are
    free, under a small token budget) answers every request as the target alone does,
    including the last one that waits for a row with fewer requests than prefill_min_rows."""
    engine = build_engine(NativeEngineArgs(model=str(models["target_dir"]), draft=str(fitted_dir), spec=SpecConfig(3),
                                           device="cpu", max_context=512, max_batch=2, prefill_min_rows=2,
                                           prefill_tokens=40))
    prompts = models["prompts"] * 2 + models["prompts"][:1]
    expected = models["baseline"] * 2 + models["baseline"][:1]
    assert greedy_ids(engine, prompts, [N_TOKENS] * len(prompts)) == expected


# -- stop conditions inside accepted runs, through the engine -----------------------------------

def run_engine(target_dir, draft_dir, steps, prompt, **params):
    spec = SpecConfig(steps) if draft_dir else None
    engine = build_engine(NativeEngineArgs(model=str(target_dir), draft=draft_dir and str(draft_dir), spec=spec,
                                           device="cpu", max_context=512))

    async def go():
        await engine.start()
        engine.decoder.overlap = True  # the GPU engine loop (step n+1 launched before n is read)
        try:
            ids, text, last = [], "", None
            async for out in engine.generate("r", prompt, SamplingParams(temperature=0, **params)):
                ids += out.token_ids
                text += out.text
                last = out
            return ids, text, last
        finally:
            await engine.shutdown()
    return asyncio.run(go())


@pytest.fixture(scope="module")
def fitted_dir(models):
    return export_drafter(models["drafters"]["fitted"], models["root"] / "fitted")


def inner_run_token(models, steps=3):
    """A token that the fitted drafter proposes and gets accepted with more accepted drafts after it."""
    prompt = models["prompts"][2]
    dec = BatchDecoder(models["target"], models["drafters"]["fitted"], SpecConfig(steps), 1, 512)
    out = [dec.prefill(0, prompt, greedy())]
    while len(out) < N_TOKENS:
        r = dec.step(1, greedy())[0]
        if r.accepted >= 2 and r.tokens[0] not in out:
            return prompt, len(out), r.tokens[0]
        out += r.tokens
    pytest.fail("no accepted run of >= 2 drafts found")


def test_stop_token_inside_accepted_run(models, fitted_dir):
    prompt, pos, tok = inner_run_token(models)
    ids, _, last = run_engine(models["target_dir"], fitted_dir, 3, prompt, max_tokens=N_TOKENS, stop_token_ids=[tok])
    assert ids == models["baseline"][2][:pos + 1] and last.finish_reason == "stop"
    assert run_engine(models["target_dir"], None, 0, prompt, max_tokens=N_TOKENS, stop_token_ids=[tok])[0] == ids


def test_eos_inside_accepted_run(models, fitted_dir, tmp_path):
    prompt, pos, tok = inner_run_token(models)
    target_dir = tmp_path / "target_eos"
    shutil.copytree(models["target_dir"], target_dir)
    cfg = json.loads((target_dir / "config.json").read_text())
    cfg["eos_token_id"] = tok
    (target_dir / "config.json").write_text(json.dumps(cfg))
    ids, _, last = run_engine(target_dir, fitted_dir, 3, prompt, max_tokens=N_TOKENS)
    assert ids == models["baseline"][2][:pos + 1] and last.finish_reason == "stop"
    ids_ignored, _, last = run_engine(target_dir, fitted_dir, 3, prompt, max_tokens=N_TOKENS, ignore_eos=True)
    assert ids_ignored == models["baseline"][2] and last.finish_reason == "length"


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 8, 13, 21])
def test_max_tokens_cuts_accepted_runs(models, fitted_dir, max_tokens):
    prompt = models["prompts"][2]
    ids, text, last = run_engine(models["target_dir"], fitted_dir, 4, prompt, max_tokens=max_tokens)
    assert ids == models["baseline"][2][:max_tokens]
    assert last.finish_reason == "length" and last.completion_tokens == max_tokens


def test_stop_strings_match_baseline(models, fitted_dir):
    prompt = models["prompts"][2]
    _, full_text, _ = run_engine(models["target_dir"], None, 0, prompt, max_tokens=N_TOKENS)
    assert len(full_text) > 12
    for start in (3, len(full_text) // 2, len(full_text) - 5):
        stop = full_text[start:start + 3]
        ids, text, last = run_engine(models["target_dir"], fitted_dir, 3, prompt, max_tokens=N_TOKENS, stop=[stop])
        assert text == full_text[:full_text.index(stop)] and last.finish_reason == "stop"
        assert run_engine(models["target_dir"], None, 0, prompt, max_tokens=N_TOKENS, stop=[stop])[:2] == (ids, text)


def test_context_limit_inside_accepted_run(models, fitted_dir):
    prompt = models["prompts"][2]
    spec = build_engine(NativeEngineArgs(model=str(models["target_dir"]), draft=str(fitted_dir), spec=SpecConfig(4),
                                         device="cpu", max_context=len(prompt) + 11))

    async def go():
        await spec.start()
        ids = []
        async for out in spec.generate("r", prompt, SamplingParams(temperature=0, max_tokens=100)):
            ids += out.token_ids
        await spec.shutdown()
        return ids, out.finish_reason
    ids, reason = asyncio.run(go())
    assert ids == models["baseline"][2][:11] and reason == "length"


@pytest.mark.parametrize("steps", [0, 3])
def test_launching_ahead_matches_step_by_step(models, steps):
    """The server launches step n+1 before reading step n (overlap): same tokens, all rows."""
    target, prompts = models["target"], models["prompts"]
    drafter, spec = (models["drafters"]["fitted"], SpecConfig(steps)) if steps else (None, None)
    want = decode(target, drafter, spec, prompts)[0]
    dec = BatchDecoder(target, drafter, spec, max_batch=len(prompts), max_context=512)
    outs = [[dec.prefill(i, p, greedy())] for i, p in enumerate(prompts)]
    current = dec.launch(len(prompts))
    while min(len(o) for o in outs) < N_TOKENS:
        ahead = dec.launch(len(prompts))
        for o, r in zip(outs, dec.collect(current)):
            o += r.tokens
        current = ahead
    dec.collect(current)
    assert [o[:N_TOKENS] for o in outs] == want
    assert dec.room_to_launch(len(prompts))
    dec.lens[0] = dec.cache_len  # a row whose cache is full: no step may be launched
    assert not dec.room_to_launch(len(prompts))


def test_overlapped_engine_loop_matches_step_by_step(models, fitted_dir):
    """The engine loop as it runs on GPU (step n+1 launched before step n is read), forced on
    here: concurrent requests that finish at different steps (max_tokens, a stop token inside
    an accepted run), a client that leaves midway and a request that arrives while a step is
    in flight all get exactly the step-by-step loop's outputs."""
    prompt, _, tok = inner_run_token(models)
    jobs = [(models["prompts"][0], dict(max_tokens=7)), (models["prompts"][1], dict(max_tokens=N_TOKENS)),
            (prompt, dict(max_tokens=N_TOKENS, stop_token_ids=[tok])), (models["prompts"][2], dict(max_tokens=13))]

    def run(overlap: bool):
        engine = build_engine(NativeEngineArgs(model=str(models["target_dir"]), draft=str(fitted_dir),
                                               spec=SpecConfig(3), device="cpu", max_context=512))

        async def one(i, p, params, leave_after=None, delay=0.0):
            await asyncio.sleep(delay)
            ids, last = [], None
            async for out in engine.generate(f"r{i}", p, SamplingParams(temperature=0, **params)):
                ids, last = ids + out.token_ids, out
                if leave_after is not None and len(ids) >= leave_after:
                    break
            return ids, last.finish_reason if last else None

        async def go():
            await engine.start()
            engine.decoder.overlap = overlap
            try:
                done = await asyncio.gather(*(one(i, p, kw) for i, (p, kw) in enumerate(jobs)),
                                            one(9, models["prompts"][1], dict(max_tokens=N_TOKENS), leave_after=5),
                                            one(10, models["prompts"][0], dict(max_tokens=20), delay=0.05))
                for _ in range(200):  # the slot of the client that left is freed by the engine thread
                    if engine.load == (0, 0):
                        break
                    await asyncio.sleep(0.01)
                assert engine.load == (0, 0)
                return done
            finally:
                await engine.shutdown()
        return asyncio.run(go())

    step_by_step, overlapped = run(False), run(True)
    assert overlapped[:4] == step_by_step[:4] and overlapped[5] == step_by_step[5]
    assert overlapped[2][1] == "stop" and overlapped[0][1] == "length"
    assert overlapped[4][0][:5] == step_by_step[4][0][:5]


def test_shipped_pair_is_lossless_and_accepts_long_runs():
    """The pair `make serve` serves: the same 48 greedy tokens with and without speculation for
    three held-out prompts decoded as one batch, with long accepted runs (the held-out eval
    measures 3.66 tokens per verify at 5 steps)."""
    from pathlib import Path

    from benchmarks.engine_load import load_prompts
    from engine.loading import load_models, load_tokenizer

    repo = Path(__file__).resolve().parents[1]
    target, drafter, _ = load_models(NativeEngineArgs(model=str(repo / "shipped/target"),
                                                      draft=str(repo / "shipped/drafter"),
                                                      spec=SpecConfig(5), device="cpu"))
    tok = load_tokenizer(str(repo / "shipped/target"))
    prompts = load_prompts(str(repo / "shipped/data/heldout_prompts.jsonl"), tok, 3)
    expected, _ = decode(target, None, None, prompts, n=48)
    out, acc = decode(target, drafter, SpecConfig(5), prompts, n=48)
    assert out == expected
    assert 1 + sum(sum(a) for a in acc) / sum(len(a) for a in acc) > 2.5


@pytest.mark.parametrize("fast", [True, False], ids=["device-step", "general-step"])
def test_steps_by_batch_size_is_lossless(models, fast):
    """With a steps table the draft steps change as rows join and leave (4 steps alone, 2 with a
    second row, none with three, where the target verifies the pending token alone and the
    drafter keeps up): every row still gets its solo greedy output, and each step drafts what
    the table says for the batch size it ran at."""
    spec = SpecConfig(4, steps_by_batch=((1, 4), (2, 2), (3, 0)))
    dec = BatchDecoder(models["target"], models["drafters"]["fitted"], spec, max_batch=3, max_context=512,
                       fast_greedy=fast)
    prompts, outs, proposed = models["prompts"], [[], [], []], {1: set(), 2: set(), 3: set()}

    def run(rows: int, n_steps: int) -> None:
        for _ in range(n_steps):
            for i, r in enumerate(dec.step(rows, greedy(rows))):
                outs[i] += r.tokens
                proposed[rows].add(r.proposed)

    outs[0] = [dec.prefill(0, prompts[0], greedy())]
    run(1, 3)
    outs[1] = [dec.prefill(1, prompts[1], greedy())]
    run(2, 3)
    outs[2] = [dec.prefill(2, prompts[2], greedy())]
    run(3, 4)
    dec.move_row(2, 0)  # row 0's request leaves; the third takes its row
    done, outs[0] = outs[0], outs[2]
    run(2, 20)
    assert proposed == {1: {4}, 2: {2}, 3: {0}}
    for out, expected in [(done, models["baseline"][0]), (outs[0], models["baseline"][2]),
                          (outs[1], models["baseline"][1])]:
        n = min(len(out), len(expected))
        assert n > 10 and out[:n] == expected[:n]


@pytest.mark.parametrize("backlog_steps, backlogs",
                         [(BACKLOG_STEPS, [[8, 8, 8], [10, 10]]), (None, [[24, 24, 19], [21, 26]])])
def test_drafter_backlog_equals_extending_every_step(models, backlog_steps, backlogs):
    """At 0 draft steps the device-side step leaves the drafter a backlog it reads in one
    forward (when drafting resumes, or when the backlog is full); the host step extends it every
    step. Rows joining at different times (backlogs of different lengths), more 0-step steps
    than a backlog of BACKLOG_STEPS holds (graphs and compiled steps) or fewer than the CPU's default
    holds (the read as wide as the longest backlog), and a moved row: both leave the same draft
    state, so drafting resumes with the same drafts, the same acceptance and the solo greedy outputs."""
    from tests.backlog_schedule import run_backlog_schedule
    spec = SpecConfig(3, steps_by_batch=((1, 3), (2, 0), (3, 0)))
    runs = {fast: run_backlog_schedule(BatchDecoder(models["target"], models["drafters"]["fitted"], spec,
                                                    max_batch=3, max_context=512, fast_greedy=fast,
                                                    backlog_steps=backlog_steps),
                                       models["prompts"])
            for fast in (True, False)}
    fast, general = runs[True], runs[False]
    assert fast["backlogs"] == backlogs
    for a, b in zip(fast["state"], general["state"]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert fast["accepted"] == general["accepted"] and max(map(max, fast["accepted"][-3:])) > 0
    for out, expected in zip(fast["outs"], [models["baseline"][0], models["baseline"][2], models["baseline"][1]]):
        n = min(len(out), len(expected))
        assert n > 10 and out[:n] == expected[:n]
    assert fast["outs"] == general["outs"]


def test_sampled_and_logprobs_rows_step_through_the_device_cycle(models):
    """A greedy batch (device-side), a sampled row and a logprobs row (host steps) each step
    through the one SpecWorker.cycle (draft, verify, accept, compact, extend): only the acceptance
    differs, GreedyAcceptance against the RejectionSampler."""
    from engine.acceptance import GreedyAcceptance, RejectionSampler
    dec = BatchDecoder(models["target"], models["drafters"]["fitted"], SpecConfig(steps=3), max_batch=1,
                       max_context=512)
    seen, cycle = [], dec.worker.cycle
    dec.worker.cycle = lambda rows, span, steps, acceptance, sampling: (
        seen.append(type(acceptance)) or cycle(rows, span, steps, acceptance, sampling))
    sampled = dataclasses.replace(greedy(), temperature=torch.ones(1), greedy=False,
                                  generators=[torch.Generator().manual_seed(0)])
    for sampling in (greedy(), sampled, dataclasses.replace(greedy(), logprobs=[2])):
        dec.prefill(0, models["prompts"][1], sampling)
        assert len(dec.step(1, sampling)[0].tokens) >= 1
    assert seen == [GreedyAcceptance, RejectionSampler, RejectionSampler]
