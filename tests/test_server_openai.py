"""The official `openai` client against live servers: chat and text completions, streaming
and not, usage and the usage.spec_decoding extension, stop strings and stop token ids, and
greedy output that is the same streamed or not, with speculation or without."""
from __future__ import annotations

import openai
import pytest

from tests import server_harness as h


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def chat(server, content: str, stream: bool = False, **kw):
    return client(server).chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": content}], temperature=0,
        max_tokens=kw.pop("max_tokens", h.MAX_TOKENS), stream=stream, **kw)


def complete(server, prompt, stream: bool = False, **kw):
    return client(server).completions.create(model=server.model, prompt=prompt, temperature=0,
                                             max_tokens=kw.pop("max_tokens", h.MAX_TOKENS), stream=stream, **kw)


def streamed_chat(server, content: str, **kw) -> tuple[str, list]:
    chunks = list(chat(server, content, stream=True, stream_options={"include_usage": True}, **kw))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def streamed_completion(server, prompt, **kw) -> tuple[str, list]:
    chunks = list(complete(server, prompt, stream=True, stream_options={"include_usage": True}, **kw))
    return "".join(c.choices[0].text for c in chunks if c.choices), chunks


def check_spec_usage(usage, completion_tokens: int) -> dict:
    s = usage.model_extra["spec_decoding"]
    assert s["verify_steps"] > 0
    assert s["proposed_draft_tokens"] == h.STEPS * s["verify_steps"]  # a 3-step chain proposes 3 per step
    assert 0 <= s["accepted_draft_tokens"] <= s["proposed_draft_tokens"]
    assert sum(s["accepted_per_position"]) == s["accepted_draft_tokens"]
    assert len(s["accepted_per_position"]) <= h.STEPS
    assert s["accept_length"] == pytest.approx(completion_tokens / s["verify_steps"], abs=1e-3)
    assert s["accept_rate"] == pytest.approx(s["accepted_draft_tokens"] / s["proposed_draft_tokens"], abs=1e-3)
    return s


def test_models_lists_the_served_model(spec):
    models = client(spec).models.list().data
    assert [m.id for m in models] == [spec.model]
    assert models[0].model_extra["max_model_len"] == 512


def test_chat_completion_usage_and_spec_decoding(spec):
    models = h.models()
    r = chat(spec, h.CHAT_PROMPTS[0])
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == spec.model
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == len(models.chat_ids(h.CHAT_PROMPTS[0]))
    greedy = models.greedy[("chat", h.CHAT_PROMPTS[0])]
    assert r.usage.completion_tokens == min(h.MAX_TOKENS, len(greedy))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    s = check_spec_usage(r.usage, r.usage.completion_tokens)
    assert s["accepted_draft_tokens"] > 0, "the fitted drafter should have some tokens accepted"


def test_text_completion_usage_and_spec_decoding(spec):
    prompt = h.COMPLETION_PROMPTS[0]
    r = complete(spec, prompt)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.choices[0].text and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(h.models().completion_ids(prompt)), h.MAX_TOKENS)
    check_spec_usage(r.usage, h.MAX_TOKENS)


def test_token_id_prompt_equals_text_prompt(spec):
    prompt = h.COMPLETION_PROMPTS[1]
    by_text = complete(spec, prompt).choices[0].text
    assert complete(spec, h.models().completion_ids(prompt)).choices[0].text == by_text
    assert complete(spec, [h.models().completion_ids(prompt)]).choices[0].text == by_text


def test_no_speculation_server_has_no_spec_extension(plain):
    r = complete(plain, h.COMPLETION_PROMPTS[0])
    assert r.usage.completion_tokens == h.MAX_TOKENS
    assert r.usage.model_extra.get("spec_decoding") is None


@pytest.mark.parametrize("content", h.CHAT_PROMPTS[:3])
def test_chat_streamed_equals_non_streamed_equals_no_speculation(spec, plain, content):
    outputs = {}
    for name, server in (("spec", spec), ("plain", plain)):
        full = chat(server, content)
        text, chunks = streamed_chat(server, content)
        assert chunks[0].choices[0].delta.role == "assistant"
        assert {c.id for c in chunks} == {chunks[0].id}
        finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finals == [full.choices[0].finish_reason]
        usage = chunks[-1].usage
        assert chunks[-1].choices == [] and usage is not None
        assert all(c.usage is None for c in chunks[:-1])
        assert usage.prompt_tokens == full.usage.prompt_tokens
        assert usage.completion_tokens == full.usage.completion_tokens
        if name == "spec":
            check_spec_usage(usage, usage.completion_tokens)
        assert text == full.choices[0].message.content
        outputs[name] = text
    assert outputs["spec"] == outputs["plain"]


@pytest.mark.parametrize("prompt", h.COMPLETION_PROMPTS[2:5])
def test_completion_streamed_equals_non_streamed_equals_no_speculation(spec, plain, prompt):
    texts = set()
    for server in (spec, plain):
        full = complete(server, prompt)
        text, chunks = streamed_completion(server, prompt)
        assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens == h.MAX_TOKENS
        texts |= {text, full.choices[0].text}
    assert len(texts) == 1


def test_stop_string_is_honoured_streaming_and_not(spec):
    prompt = h.COMPLETION_PROMPTS[5]
    full = complete(spec, prompt).choices[0].text
    stop = full[len(full) // 2:len(full) // 2 + 2]
    expected = full[:full.index(stop)]
    r = complete(spec, prompt, stop=[stop, "never-appears"])
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < h.MAX_TOKENS
    text, chunks = streamed_completion(spec, prompt, stop=stop)
    assert text == expected
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert stop not in "".join(c.choices[0].text for c in chunks if c.choices)


def test_stop_string_in_chat(spec):
    content = h.CHAT_PROMPTS[1]
    full = chat(spec, content).choices[0].message.content
    stop = full[len(full) // 3:len(full) // 3 + 2]
    r = chat(spec, content, stop=stop)
    assert r.choices[0].message.content == full[:full.index(stop)] and r.choices[0].finish_reason == "stop"


def test_stop_token_ids_end_the_completion(spec):
    prompt = h.COMPLETION_PROMPTS[6]
    greedy = h.models().greedy[("completion", prompt)]
    k = 5
    stop_id = greedy[k]
    first = greedy.index(stop_id)  # the stop applies at its first occurrence
    r = complete(spec, prompt, extra_body={"stop_token_ids": [stop_id]})
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == first + 1  # the stop token is counted, its text is not returned


def test_ignore_eos_and_max_completion_tokens(spec):
    r = client(spec).chat.completions.create(
        model=spec.model, messages=[{"role": "user", "content": h.CHAT_PROMPTS[2]}], temperature=0,
        max_completion_tokens=7, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"


def test_seeded_sampling_is_reproducible(spec):
    kw = dict(temperature=1.0, top_p=0.9, seed=1234, max_tokens=12, extra_body={"top_k": 50})
    a = client(spec).completions.create(model=spec.model, prompt=h.COMPLETION_PROMPTS[7], **kw).choices[0].text
    b = client(spec).completions.create(model=spec.model, prompt=h.COMPLETION_PROMPTS[7], **kw).choices[0].text
    assert a == b


def test_default_max_tokens_fills_the_context(plain):
    """Unset max_tokens means the rest of the context, as in vLLM."""
    prompt_ids = (h.models().completion_ids(h.COMPLETION_PROMPTS[8]) * 100)[:490]
    r = client(plain).completions.create(model=plain.model, prompt=prompt_ids, temperature=0,
                                         extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 512 - 490 and r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("fmt", ["ChatFormat", "CompletionFormat"])
def test_stream_chunks_are_the_pydantic_models_bytes(fmt):
    """Deltas are written from a per-response template (server/responses.py): the same bytes as
    the pydantic chunk models, escapes and non-ASCII text included."""
    from server import protocol as p
    from server import responses

    f = getattr(responses, fmt)("id-1", 'a "model"')
    for text in ["", "hello", ' "q" \\ \n\t\r\x00\x1b\x7f', "é 中文 🚀 \u2028"]:
        for finish in (None, "stop", "length"):
            if fmt == "ChatFormat":
                model = p.ChatCompletionChunk(id=f.id, created=f.created, model=f.model, choices=[
                    p.ChatChunkChoice(delta=p.ChatDelta(content=text or None), finish_reason=finish)])
            else:
                model = p.CompletionResponse(id=f.id, created=f.created, model=f.model,
                                             choices=[p.CompletionChoice(text=text, finish_reason=finish)])
            assert f.chunk(text, finish) == responses.sse(model.model_dump_json(exclude={"usage"}))
