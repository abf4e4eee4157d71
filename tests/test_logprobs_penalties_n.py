"""Logprobs, penalties, logit_bias, min_tokens and n > 1 through the official `openai` client.

Properties: greedy logprobs and top logprobs are the same with speculation and without (fp32,
1e-3) and are the target's own log-softmax at each emitted token; streamed logprobs equal the
non-streamed ones; every penalty setting gives the same greedy tokens with speculation as
without (the verify forward is processed node by node), and changes them where it should;
n choices are indexed, summed in usage, reproducible with a seed, streamed and not; echo
prepends the prompt. A tree
drafter (topk > 1) is lossless under penalties, grammars and logprobs too.
"""
from __future__ import annotations

import asyncio
import json

import openai
import pytest
import torch

from tests import server_harness as h

TOL = 1e-3


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat(server, prompt: str, **kw):
    kw = {"temperature": 0, "max_tokens": h.MAX_TOKENS, **kw}
    return client(server).chat.completions.create(model=server.model, messages=[{"role": "user", "content": prompt}],
                                                  **kw)


def complete(server, prompt: str, **kw):
    kw = {"temperature": 0, "max_tokens": h.MAX_TOKENS, **kw}
    return client(server).completions.create(model=server.model, prompt=prompt, **kw)


def as_lists(content) -> list[tuple]:
    return [(c.token, c.logprob, [(t.token, t.logprob) for t in c.top_logprobs]) for c in content]


def close(a: list[tuple], b: list[tuple]) -> bool:
    if [x[0] for x in a] != [x[0] for x in b]:
        return False
    for (_, la, ta), (_, lb, tb) in zip(a, b):
        if abs(la - lb) > TOL or len(ta) != len(tb):
            return False
        # Near-ties may swap places between two forwards: compare each top token's value (by
        # text, so only texts that name one token: partial UTF-8 tokens all read U+FFFD).
        texts = [t for t, _ in ta + tb]
        db = dict(tb)
        if any(tok in db and texts.count(tok) == 2 and abs(v - db[tok]) > TOL for tok, v in ta):
            return False
    return True


def test_chat_top_logprobs_identical_with_and_without_speculation(plain, spec):
    for prompt in h.CHAT_PROMPTS:
        a, b = (chat(s, prompt, logprobs=True, top_logprobs=5) for s in (plain, spec))
        assert a.choices[0].message.content == b.choices[0].message.content
        la, lb = as_lists(a.choices[0].logprobs.content), as_lists(b.choices[0].logprobs.content)
        assert len(la) == a.usage.completion_tokens and all(len(x[2]) == 5 for x in la)
        assert close(la, lb), (la, lb)
        for token, lp, top in la:  # greedy: the chosen token is the most likely one
            assert abs(lp - top[0][1]) < TOL and all(top[i][1] >= top[i + 1][1] for i in range(4))
        c = a.choices[0].logprobs.content[0]
        assert c.bytes == list(c.token.encode())


def test_logprobs_are_the_targets_log_softmax(spec):
    """Checked against a fresh forward of the target over prompt + output."""
    from models.llama import load_target
    models = h.models()
    prompt = h.COMPLETION_PROMPTS[3]
    r = complete(spec, prompt, logprobs=3)
    ids = models.completion_ids(prompt)
    out = models.greedy[("completion", prompt)][:h.MAX_TOKENS]
    target = load_target(models.target)
    with torch.inference_mode():
        logp = target(torch.tensor([ids + out])).logits[0].float().log_softmax(-1)
    want = [float(logp[len(ids) - 1 + i, t]) for i, t in enumerate(out)]
    got = r.choices[0].logprobs.token_logprobs
    assert len(got) == len(want) and max(abs(x - y) for x, y in zip(got, want)) < TOL


def test_completion_logprobs_shape_streamed_and_not(plain, spec):
    prompt = h.COMPLETION_PROMPTS[0]
    full = complete(spec, prompt, logprobs=5).choices[0]
    lp = full.logprobs
    n = len(lp.tokens)
    assert n == h.MAX_TOKENS == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(n)]
    # 5 (6 with the sampled token), fewer where several tokens decode to one text (U+FFFD)
    assert all(1 <= len(top) <= 6 and lp.tokens[i] in top for i, top in enumerate(lp.top_logprobs))
    assert sum(len(top) >= 5 for top in lp.top_logprobs) > n // 2
    chunks = [c for c in complete(spec, prompt, logprobs=5, stream=True) if c.choices]
    streamed = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for c in chunks:
        if c.choices[0].logprobs:
            for k in streamed:
                streamed[k] += getattr(c.choices[0].logprobs, k)
    assert streamed["tokens"] == lp.tokens and streamed["text_offset"] == lp.text_offset
    assert max(abs(x - y) for x, y in zip(streamed["token_logprobs"], lp.token_logprobs)) < TOL
    other = complete(plain, prompt, logprobs=5).choices[0].logprobs
    assert other.tokens == lp.tokens
    assert max(abs(x - y) for x, y in zip(other.token_logprobs, lp.token_logprobs)) < TOL


def test_streamed_chat_logprobs_equal_non_streamed(spec):
    prompt = h.CHAT_PROMPTS[2]
    full = as_lists(chat(spec, prompt, logprobs=True, top_logprobs=2).choices[0].logprobs.content)
    streamed = []
    for c in chat(spec, prompt, logprobs=True, top_logprobs=2, stream=True):
        if c.choices and c.choices[0].logprobs:
            streamed += as_lists(c.choices[0].logprobs.content)
    assert close(full, streamed)


PENALTIES = [
    {"frequency_penalty": 1.5},
    {"presence_penalty": 1.2},
    {"repetition_penalty": 1.6},
    {"frequency_penalty": 0.7, "presence_penalty": -0.5, "repetition_penalty": 1.2},
    {"logit_bias": {"40": 8.0, "41": -100}},
]


@pytest.mark.parametrize("kw", PENALTIES, ids=lambda kw: ",".join(kw))
def test_penalties_are_lossless_under_speculation(plain, spec, kw):
    """Same greedy text with and without speculation, streamed and not; and the setting has an
    effect on at least one prompt (the tiny model repeats itself a lot)."""
    changed = False
    for prompt in h.COMPLETION_PROMPTS[:4]:
        base = complete(plain, prompt).choices[0].text
        a = complete(plain, prompt, extra_body=kw).choices[0].text
        b = complete(spec, prompt, extra_body=kw).choices[0].text
        s = "".join(c.choices[0].text for c in complete(spec, prompt, stream=True, extra_body=kw) if c.choices)
        assert a == b == s, (prompt, a, b, s)
        changed |= a != base
    assert changed


def test_logit_bias_forces_and_forbids(plain, spec):
    models = h.models()
    prompt = h.COMPLETION_PROMPTS[5]
    forced = complete(spec, prompt, max_tokens=6, logit_bias={"77": 100}).choices[0].text
    assert forced == models.tokenizer.decode([77] * 6)
    first = models.greedy[("completion", prompt)][0]
    for server in (plain, spec):
        r = complete(server, prompt, max_tokens=8, logprobs=0, logit_bias={str(first): -100})
        assert models.tokenizer.encode(r.choices[0].logprobs.tokens[0], add_special_tokens=False)[:1] != [first]


def test_min_tokens_blocks_stop_token_ids(plain, spec):
    models = h.models()
    prompt = h.COMPLETION_PROMPTS[6]
    second = models.greedy[("completion", prompt)][1]
    short = complete(plain, prompt, extra_body={"stop_token_ids": [second]})
    assert short.usage.completion_tokens == 2
    outs = [complete(s, prompt, max_tokens=12, extra_body={"stop_token_ids": [second], "min_tokens": 6})
            for s in (plain, spec)]
    assert outs[0].choices[0].text == outs[1].choices[0].text
    assert outs[0].usage.completion_tokens >= 6


def test_n_choices_greedy_sampled_streamed(plain, spec):
    prompt = h.CHAT_PROMPTS[0]
    one = chat(spec, prompt)
    three = chat(spec, prompt, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert {c.message.content for c in three.choices} == {one.choices[0].message.content}
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    sd = three.usage.model_extra["spec_decoding"]
    assert sd["verify_steps"] == 3 * one.usage.model_extra["spec_decoding"]["verify_steps"]
    for server in (plain, spec):
        sampled = chat(server, prompt, n=4, temperature=1.0, seed=7)
        texts = [c.message.content for c in sampled.choices]
        assert len(set(texts)) > 1
        assert texts == [c.message.content for c in chat(server, prompt, n=4, temperature=1.0, seed=7).choices]
        assert texts[0] == chat(server, prompt, temperature=1.0, seed=7).choices[0].message.content
        parts, usage = {}, None
        for c in chat(server, prompt, n=4, temperature=1.0, seed=7, stream=True,
                      stream_options={"include_usage": True}):
            for ch in c.choices:
                parts[ch.index] = parts.get(ch.index, "") + (ch.delta.content or "")
            usage = c.usage or usage
        assert [parts[i] for i in range(4)] == texts
        assert usage.completion_tokens == sampled.usage.completion_tokens
    completions = complete(spec, h.COMPLETION_PROMPTS[1], n=2, logprobs=1)
    assert [c.index for c in completions.choices] == [0, 1]
    assert completions.choices[0].logprobs.tokens == completions.choices[1].logprobs.tokens


def test_tree_speculation_is_lossless_with_processing():
    """topk > 1 (SGLang-style trees): each node is processed along its own path."""
    from engine.api import Constraint, SamplingParams
    from engine.decoder import SpecConfig
    from engine.loading import NativeEngineArgs, build_engine
    models = h.models()
    plain = h.plain_server().engine
    tree = build_engine(NativeEngineArgs(model=str(models.target), draft=str(models.draft), device="cpu",
                                         spec=SpecConfig(3, 2, 6)))
    tree.start_blocking()
    schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}},
                         "required": ["n"]})

    async def run(engine, ids, params):
        toks, lps = [], []
        async for out in engine.generate(f"tree-{id(params)}-{id(engine)}", ids, params):
            toks += out.token_ids
            lps += out.logprobs or []
        return toks, [x.logprob for x in lps]
    try:
        for prompt in h.COMPLETION_PROMPTS[:3]:
            ids = models.completion_ids(prompt)
            for params in (SamplingParams(max_tokens=20, temperature=0, frequency_penalty=1.0, repetition_penalty=1.3,
                                          logprobs=2),
                           SamplingParams(max_tokens=20, temperature=0, constraint=Constraint("json_schema", schema))):
                (ta, la), (tb, lb) = (asyncio.run(run(e, ids, params)) for e in (plain, tree))
                assert ta == tb
                assert all(abs(x - y) < TOL for x, y in zip(la, lb))
    finally:
        tree.stop_blocking()


def test_echo_prepends_the_prompt(spec):
    prompt = h.COMPLETION_PROMPTS[4]
    plain_text = complete(spec, prompt).choices[0].text
    assert complete(spec, prompt, echo=True).choices[0].text == prompt + plain_text
    streamed = "".join(c.choices[0].text for c in complete(spec, prompt, echo=True, stream=True) if c.choices)
    assert streamed == prompt + plain_text
    ids = h.models().completion_ids(prompt)
    assert complete(spec, ids, echo=True).choices[0].text == h.models().tokenizer.decode(ids) + plain_text


def test_a_prompt_held_by_a_running_row_is_not_prefilled_again():
    """Requests with a prompt that a running row (or another of their admission group) holds
    copy that row's prompt cache instead of prefilling (decoder.prefill_shared), and give
    exactly the same greedy tokens and logprobs, with speculation and without."""
    from engine.api import SamplingParams
    models = h.models()
    prompt = h.COMPLETION_PROMPTS[7]
    ids, want = models.completion_ids(prompt), models.greedy[("completion", prompt)][:h.MAX_TOKENS]
    for engine in (h.plain_server().engine, h.native_engine(models, speculative=True)):
        if not engine.ready:
            engine.start_blocking()
        shared, real = [], engine.decoder.prefill_shared
        engine.decoder.prefill_shared = lambda *a: shared.append(len(a[1])) or real(*a)

        async def one(rid, max_tokens, started=None):
            params = SamplingParams(max_tokens=max_tokens, temperature=0, logprobs=1, ignore_eos=True)
            toks, lps = [], []
            async for out in engine.generate(rid, ids, params):
                toks += out.token_ids
                lps += [x.logprob for x in out.logprobs or []]
                if started is not None and len(toks) >= 3:
                    started.set()
            return toks, lps

        async def go():
            started = asyncio.Event()
            first = asyncio.ensure_future(one("a", 400, started))  # still running when the others come
            await started.wait()
            return [await first] + list(await asyncio.gather(one("b", 200), one("c", 200)))
        try:
            (a, la), (b, lb), (c, lc) = asyncio.run(go())
        finally:
            engine.decoder.prefill_shared = real
        assert a[:h.MAX_TOKENS] == want and b == c == a[:200]
        assert max(abs(x - y) for x, y in zip(la, lb)) < TOL and max(abs(x - y) for x, y in zip(lb, lc)) < TOL
        assert sum(shared) >= 1  # c at least: b runs for 200 tokens
        if engine is not h.plain_server().engine:
            engine.stop_blocking()


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "spec"])
def test_prefill_shared_equals_a_prefill(speculative):
    """Decoder level, deterministic: a row that copies a running row's prompt cache decodes the
    same greedy tokens as a row that prefilled the prompt itself."""
    from engine.decoder import BatchDecoder, SpecConfig
    from engine.sampling import BatchSampling
    from models.eagle3_checkpoint import load_drafter
    from models.llama import load_target
    models = h.models()
    target = load_target(models.target)
    drafter = None
    if speculative:
        drafter = load_drafter(models.draft, target.embed_tokens.weight)
        target.aux_layer_ids = list(drafter.config.aux_layer_ids)
    ids = models.completion_ids(h.COMPLETION_PROMPTS[8])
    g = lambda n: BatchSampling.all_greedy_rows(n, "cpu")  # noqa: E731

    def run(share: bool) -> list[int]:
        dec = BatchDecoder(target, drafter, SpecConfig(h.STEPS) if speculative else None, max_batch=2,
                           max_context=512)
        dec.prefill(0, ids, g(1))
        for _ in range(3):
            dec.step(1, g(1))
        first = dec.prefill_shared(1, [0], [ids], g(1)) if share else dec.prefill_rows(1, [ids], g(1))
        out = list(first[0].tokens)
        while len(out) < 20:
            out += dec.step(2, g(2))[1].tokens
        return out[:20]
    assert run(share=True) == run(share=False) == models.greedy[("completion", h.COMPLETION_PROMPTS[8])][:20]
