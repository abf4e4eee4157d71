"""The SGLang adapter keeps the engine interface's promises over a stand-in for sglang.Engine
(SGLang's GPU kernels cannot run here): cumulative chunks become deltas that add up to the
final text, meta_info statistics (0.5.23 and older names) become the same SpecStats the
native engine reports, a client that goes away or runs past the server's deadline aborts its
SGLang request, and a missing sglang package is one clear error."""
from __future__ import annotations

import asyncio
import importlib.util
import signal

import pytest

from engine.api import EngineError, SamplingParams
from server.engines import sglang_engine as se

ARGS = {"model_path": "/models/t", "tp_size": 8, "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "/models/d", "speculative_num_steps": 2,
        "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3}


class FakeTokenizerManager:
    context_len = 4096

    def __init__(self):
        self.aborted: list[str] = []
        self.loop_attached = False

    def abort_request(self, rid: str = "", abort_all: bool = False):
        self.aborted.append(rid)

    def auto_create_handle_loop(self):  # what SGLang does: its own SIGTERM handler on the loop
        self.loop_attached = True
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: None)


class FakeSGLang:
    """Plays back cumulative chunks the way sglang.Engine.async_generate(stream=True) yields them."""

    def __init__(self, chunks, delay: float = 0.0):
        self.chunks, self.delay = chunks, delay
        self.tokenizer_manager = FakeTokenizerManager()
        self.calls: list[dict] = []
        self.shut = False

    async def async_generate(self, **kw):
        self.calls.append(kw)

        async def gen():
            for c in self.chunks:
                await asyncio.sleep(self.delay)
                yield c
        return gen()

    def shutdown(self):
        self.shut = True


def cumulative(texts, final_meta):
    ids, out = [], []
    for i, t in enumerate(texts):
        ids = ids + [100 + i]
        meta = {"prompt_tokens": 5, "completion_tokens": len(ids), "finish_reason": None}
        if i == len(texts) - 1:
            meta.update(final_meta)
        out.append({"text": t, "output_ids": list(ids), "meta_info": meta})
    return out


def make_engine(chunks, delay=0.0, args=ARGS):
    fake = FakeSGLang(chunks, delay)
    eng = se.SGLangEngine(args, served_model_name="kimi", engine_factory=lambda **kw: fake,
                          tokenizer_loader=lambda path, trust: object())
    return eng, fake


async def collect(eng, params=None, rid="r1"):
    return [o async for o in eng.generate(rid, [1, 2, 3, 4, 5], params or SamplingParams(max_tokens=8))]


def run(coro):
    return asyncio.run(coro)


def test_cumulative_chunks_become_deltas_and_0523_stats():
    meta = {"finish_reason": {"type": "length"}, "spec_verify_ct": 2, "spec_num_correct_drafts": 1,
            "spec_num_proposed_drafts": 4, "spec_correct_drafts_histogram": [1, 1], "spec_accept_length": 1.5}
    eng, fake = make_engine(cumulative(["He", "Hello", "Hello world"], meta))

    async def go():
        await eng.start()
        outs = await collect(eng)
        await eng.shutdown()
        return outs
    outs = run(go())
    assert "".join(o.text for o in outs) == "Hello world"
    assert [t for o in outs for t in o.token_ids] == [100, 101, 102]
    last = outs[-1]
    assert [o.finished for o in outs] == [False, False, True]
    assert (last.finish_reason, last.prompt_tokens, last.completion_tokens) == ("length", 5, 3)
    s = last.spec
    assert (s.verify_steps, s.proposed_draft_tokens, s.accepted_draft_tokens) == (2, 4, 1)
    assert s.accepted_per_position == [1]
    assert s.accept_length(last.completion_tokens) == 1.5 and s.accept_rate == 0.25
    assert fake.calls[0]["stream"] is True and fake.calls[0]["input_ids"] == [1, 2, 3, 4, 5]
    assert fake.calls[0]["rid"] == "r1"
    assert fake.shut and eng.info.max_context == 4096


def test_older_meta_names_are_read():
    meta = {"completion_tokens": 7, "spec_verify_ct": 3, "spec_accept_token_num": 4, "spec_draft_token_num": 6,
            "spec_accept_histogram": [0, 2, 1]}
    s = se.spec_stats_from_meta(meta, draft_tokens=3)
    assert (s.verify_steps, s.proposed_draft_tokens, s.accepted_draft_tokens) == (3, 6, 4)
    assert s.accepted_per_position == [3, 1]  # position 0 accepted in 3 steps, position 1 in 1


def test_missing_counts_fall_back_to_design_formulas():
    s = se.spec_stats_from_meta({"completion_tokens": 9, "spec_verify_ct": 4}, draft_tokens=4)
    assert (s.accepted_draft_tokens, s.proposed_draft_tokens) == (5, 12)  # completion - verify; verify * (N - 1)
    assert se.spec_stats_from_meta({"completion_tokens": 1}, 4).verify_steps == 0


def test_sampling_params_use_sglang_names():
    p = SamplingParams(max_tokens=12, temperature=0.0, top_p=0.9, top_k=0, seed=7, stop=["\n\n"],
                       stop_token_ids=[2], ignore_eos=True)
    assert se.to_sglang_sampling(p) == {"max_new_tokens": 12, "temperature": 0.0, "top_p": 0.9, "top_k": -1,
                                         "ignore_eos": True, "stop": ["\n\n"], "stop_token_ids": [2],
                                         "sampling_seed": 7}


def test_penalties_bias_and_grammars_reach_sglang_under_its_names():
    from engine.api import Constraint
    p = SamplingParams(max_tokens=4, presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.2,
                       min_tokens=2, logit_bias={7: -100.0})
    d = se.to_sglang_sampling(p)
    assert (d["presence_penalty"], d["frequency_penalty"], d["repetition_penalty"], d["min_new_tokens"],
            d["logit_bias"]) == (0.5, -0.5, 1.2, 2, {"7": -100.0})
    kinds = {"json_object": ("json_schema", '{"type": "object"}'), "json_schema": ("json_schema", '{"a": 1}'),
             "regex": ("regex", "[a-z]+"), "grammar": ("ebnf", 'root ::= "x"'), "choice": ("regex", "(yes|no)")}
    specs = {"json_schema": '{"a": 1}', "regex": "[a-z]+", "grammar": 'root ::= "x"', "choice": ("yes", "no")}
    for kind, (key, value) in kinds.items():
        assert se.to_sglang_sampling(SamplingParams(constraint=Constraint(kind, specs.get(kind, ""))))[key] == value
    assert "presence_penalty" not in se.to_sglang_sampling(SamplingParams())


def test_logprobs_are_refused_with_a_400_code():
    from engine.api import ErrorCode
    eng, fake = make_engine(cumulative(["a"], {"finish_reason": {"type": "stop"}}))

    async def go():
        await eng.start()
        return await collect(eng, SamplingParams(logprobs=2))
    with pytest.raises(EngineError) as e:
        run(go())
    assert e.value.code == ErrorCode.INVALID_REQUEST and "logprobs" in str(e.value) and not fake.calls


def test_finish_reasons():
    assert se.finish_from_meta({"finish_reason": {"type": "stop", "matched": 2}}) == ("stop", None)
    assert se.finish_from_meta({"finish_reason": None}) == (None, None)
    assert se.finish_from_meta({"finish_reason": {"type": "abort", "message": "too long"}}) == ("abort", "too long")


def test_abort_reaches_the_client():
    meta = {"finish_reason": {"type": "abort", "message": "scheduler aborted"}}
    eng, _ = make_engine(cumulative(["a"], meta))

    async def go():
        await eng.start()
        return await collect(eng)
    outs = run(go())
    assert outs[-1].finish_reason == "abort" and outs[-1].error == "scheduler aborted"


def test_client_disconnect_aborts_the_sglang_request():
    eng, fake = make_engine(cumulative(["a", "ab", "abc", "abcd"], {"finish_reason": {"type": "length"}}))

    async def go():
        await eng.start()
        gen = eng.generate("gone", [1, 2], SamplingParams())
        first = await gen.__anext__()
        await gen.aclose()  # what the HTTP layer does when the client disconnects
        return first
    first = run(go())
    assert first.text == "a"
    assert fake.tokenizer_manager.aborted == ["gone"]
    assert eng.load == (0, 0)


def test_the_servers_deadline_aborts_the_sglang_request():
    """The deadline is the server's (server/generation.py) for SGLang too: past it the request
    gets 504 and its stream is closed, which aborts it in SGLang."""
    from server.errors import APIError
    from server.generation import Generation
    from server.metrics import ServerMetrics

    eng, fake = make_engine(cumulative(["a", "ab"], {"finish_reason": {"type": "length"}}), delay=0.5)

    async def go():
        await eng.start()
        gen = Generation(eng, ServerMetrics(eng).request(), "slow", "slow", [1, 2, 3], SamplingParams(), 0.1)
        with pytest.raises(APIError) as e:
            await gen.start()
        return e.value
    err = run(go())
    assert (err.status, err.code, err.message) == (504, "timeout", "request timed out after 0.1 s")
    assert fake.tokenizer_manager.aborted == ["slow"] and eng.load == (0, 0)


def test_server_sigterm_handler_survives_sglang_start():
    """SGLang puts its own SIGTERM handler on the loop; uvicorn's (graceful drain) must stay."""
    def ours(signum, frame):
        pass
    old = signal.signal(signal.SIGTERM, ours)
    try:
        eng, fake = make_engine(cumulative(["a"], {"finish_reason": {"type": "stop"}}))
        run(eng.start())
        assert fake.tokenizer_manager.loop_attached
        assert signal.getsignal(signal.SIGTERM) is ours
    finally:
        signal.signal(signal.SIGTERM, old)


def test_engine_info_from_server_args():
    eng, _ = make_engine([])
    i = eng.info
    assert (i.engine, i.model, i.speculative, i.steps, i.topk, i.draft_tokens, i.tp) == \
        ("sglang", "kimi", True, 2, 1, 3, 8)


def test_not_ready_before_start():
    eng, _ = make_engine([])

    async def go():
        return [o async for o in eng.generate("x", [1], SamplingParams())]
    with pytest.raises(EngineError):
        run(go())


def test_missing_sglang_is_one_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a))
    with pytest.raises(EngineError, match=r"pip install \.\[sglang\]"):
        se.SGLangEngine(ARGS)
