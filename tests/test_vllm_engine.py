"""Our server on the vLLM engine, for real: `.venv-vllm/bin/python -m launch.cli --profile cpu-vllm`
(vLLM's CPU build, the shipped pair, EAGLE-3 with 3 speculative tokens) as a process, one for
the module. The official openai client checks chat and completions, streamed and not, usage and
stops; greedy texts equal the native engine's on the same pair; /metrics agrees with the
responses; a client that leaves frees its request in vLLM; a dead vLLM engine core turns
/health 503 (last: it kills the server's engine).

`make test-slow` runs it (a whole vLLM start); `make test` creates .venv-vllm, without which it is skipped.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from benchmarks.server_proc import VLLM_PYTHON, cpu_vllm_server

ROOT = Path(__file__).resolve().parent.parent
TARGET, DRAFT = ROOT / "shipped" / "target", ROOT / "shipped" / "drafter"
STEPS = 3
MAX_TOKENS = 48
MODEL = "specserve-small"

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(600),
              pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason="no .venv-vllm (make vllm-venv)")]


@dataclass
class Served:
    url: str
    proc: subprocess.Popen
    log: Path


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with cpu_vllm_server(log) as (url, proc):
        yield Served(url, proc, log)


def client(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def prompts() -> dict:
    """Three held-out chat prompts as the server renders them, and three completion prompts."""
    from models.tokenizer import load_tokenizer
    from server.prompts import chat_prompt_ids
    from server.protocol import ChatCompletionRequest

    tok = load_tokenizer(TARGET)
    lines = (ROOT / "shipped" / "data" / "heldout_prompts.jsonl").read_text().splitlines()[:3]
    chats = [json.loads(line)["messages"][0]["content"] for line in lines]
    texts = ["def parse_header(line):", "import os\n\n", "class Stack:\n    def push(self, x):"]
    ids = [chat_prompt_ids(tok, ChatCompletionRequest(model=MODEL, messages=[{"role": "user", "content": c}]))
           for c in chats] + [tok.encode(t) for t in texts]
    return {"chats": chats, "texts": texts, "ids": ids}


@pytest.fixture(scope="module")
def native(prompts) -> list[dict]:
    """The native engine's greedy outputs on the same pair and prompts (3-step chains)."""
    from benchmarks.engine_load import run_load
    from engine.config import SpecConfig
    from engine.loading import NativeEngineArgs, build_engine
    engine = build_engine(NativeEngineArgs(model=str(TARGET), draft=str(DRAFT), spec=SpecConfig(STEPS), device="cpu",
                                           dtype="float32", max_batch=1))
    engine.start_blocking()
    try:
        replies = run_load(engine, prompts["ids"], 1, MAX_TOKENS, detokenize=True).replies
    finally:
        engine.stop_blocking()
    return [{"token_ids": r.token_ids, "text": r.text, "finish_reason": r.finish_reason,
             "verify_steps": r.spec.verify_steps, "proposed_draft_tokens": r.spec.proposed_draft_tokens,
             "accepted_draft_tokens": r.spec.accepted_draft_tokens} for r in replies]


def check_spec(usage) -> dict:
    s = usage.model_extra["spec_decoding"]
    assert s["verify_steps"] > 0 and s["proposed_draft_tokens"] == STEPS * s["verify_steps"]
    assert 0 < s["accepted_draft_tokens"] <= s["proposed_draft_tokens"]
    assert sum(s["accepted_per_position"]) == s["accepted_draft_tokens"] and len(s["accepted_per_position"]) <= STEPS
    assert s["accept_length"] == pytest.approx(usage.completion_tokens / s["verify_steps"], abs=1e-3)
    return s


def test_models_health_and_launch_info(vllm):
    assert [m.id for m in client(vllm).models.list().data] == [MODEL]
    assert httpx.get(vllm.url + "/health").json()["status"] == "ok"
    info = next(line for line in httpx.get(vllm.url + "/metrics").text.splitlines()
                if line.startswith("specserve_launch_info"))
    assert 'engine="vllm"' in info and 'steps="3"' in info and 'max_context="1024"' in info


def test_greedy_chat_equals_native_streamed_and_not(vllm, prompts, native):
    for i, content in enumerate(prompts["chats"]):
        kw = dict(model=MODEL, messages=[{"role": "user", "content": content}], temperature=0,
                  max_tokens=MAX_TOKENS)
        full = client(vllm).chat.completions.create(**kw)
        assert full.choices[0].message.content == native[i]["text"]
        assert full.usage.prompt_tokens == len(prompts["ids"][i])
        assert full.usage.completion_tokens == len(native[i]["token_ids"])
        assert full.choices[0].finish_reason == native[i]["finish_reason"]
        assert check_spec(full.usage)["verify_steps"] == native[i]["verify_steps"]  # the same drafts accepted
        chunks = list(client(vllm).chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == native[i]["text"]
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
        check_spec(chunks[-1].usage)


def test_greedy_completions_equal_native_text_and_token_prompts(vllm, prompts, native):
    for j, text in enumerate(prompts["texts"]):
        i = len(prompts["chats"]) + j
        kw = dict(model=MODEL, temperature=0, max_tokens=MAX_TOKENS)
        full = client(vllm).completions.create(prompt=text, **kw)
        assert full.choices[0].text == native[i]["text"]
        assert client(vllm).completions.create(prompt=prompts["ids"][i], **kw).choices[0].text == native[i]["text"]
        streamed = list(client(vllm).completions.create(prompt=text, stream=True, **kw))
        assert "".join(c.choices[0].text for c in streamed if c.choices) == native[i]["text"]
        assert full.usage.completion_tokens == len(native[i]["token_ids"])


def test_stop_strings_stop_ids_max_tokens_and_ignore_eos(vllm, prompts, native):
    i = len(prompts["chats"])
    text, ids = native[i]["text"], native[i]["token_ids"]
    stop = text[len(text) // 2:len(text) // 2 + 3]
    kw = dict(model=MODEL, prompt=prompts["texts"][0], temperature=0, max_tokens=MAX_TOKENS)
    r = client(vllm).completions.create(stop=[stop, "never-appears"], **kw)
    assert r.choices[0].text == text[:text.index(stop)] and r.choices[0].finish_reason == "stop"
    streamed = list(client(vllm).completions.create(stop=stop, stream=True, **kw))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text[:text.index(stop)]
    r = client(vllm).completions.create(extra_body={"stop_token_ids": [ids[5]]}, **kw)
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == ids.index(ids[5]) + 1
    r = client(vllm).completions.create(**{**kw, "max_tokens": 7})
    assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"
    r = client(vllm).completions.create(**{**kw, "max_tokens": 200}, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 200 and r.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="maximum context length is 1024"):  # vLLM's max_model_len
        client(vllm).completions.create(**{**kw, "max_tokens": 1020})


def test_seeds_logprobs_n_and_structured_outputs_reach_vllm(vllm):
    # vLLM takes the seed, but with speculation its samples are not reproducible per seed (0.32, CPU)
    kw = dict(model=MODEL, prompt="def main():", temperature=1.0, top_p=0.9, seed=7, max_tokens=12)
    assert client(vllm).completions.create(**kw, extra_body={"ignore_eos": True}).usage.completion_tokens == 12
    r = client(vllm).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi."}],
                                             temperature=0, max_tokens=6, logprobs=True, top_logprobs=2, n=2)
    assert len(r.choices) == 2 and r.choices[0].message.content == r.choices[1].message.content
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens // 2 and all(len(t.top_logprobs) == 2 for t in lp)
    assert all(t.logprob <= 0 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob for t in lp)
    r = client(vllm).completions.create(model=MODEL, prompt="Answer:", temperature=0, max_tokens=8,
                                        extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert r.choices[0].text in ("yes", "no")
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    r = client(vllm).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "A number?"}], temperature=0, max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    assert isinstance(json.loads(r.choices[0].message.content)["n"], int)
    kw = dict(model=MODEL, prompt="def parse_header(line):", temperature=0, max_tokens=32)
    plain = client(vllm).completions.create(**kw).choices[0].text
    penalized = client(vllm).completions.create(**kw, presence_penalty=1.5, frequency_penalty=1.0,
                                                extra_body={"repetition_penalty": 1.3})
    assert penalized.choices[0].text != plain and penalized.usage.completion_tokens == 32


def test_what_vllm_cannot_serve_is_a_400_naming_the_field(vllm):
    with pytest.raises(openai.BadRequestError) as e:
        client(vllm).completions.create(model=MODEL, prompt="x", max_tokens=4, logit_bias={"5": 3})
    assert e.value.body["param"] == "logit_bias" and "speculative" in e.value.body["message"]


def _scrape(s: Served) -> dict[str, float]:
    out = {}
    for line in httpx.get(s.url + "/metrics").text.splitlines():
        m = re.match(r"^(specserve_[a-z_]+(?:\{[^}]*\})?) ([0-9.e+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def test_metrics_agree_with_the_responses(vllm, prompts):
    before = _scrape(vllm)
    usages = [client(vllm).completions.create(model=MODEL, prompt=p, temperature=0, max_tokens=MAX_TOKENS).usage
              for p in prompts["texts"]]
    after = _scrape(vllm)

    def grew(name):
        return after.get(name, 0) - before.get(name, 0)
    specs = [check_spec(u) for u in usages]
    assert grew("specserve_spec_verify_steps_total") == sum(s["verify_steps"] for s in specs)
    assert grew("specserve_spec_draft_tokens_total") == sum(s["proposed_draft_tokens"] for s in specs)
    assert grew("specserve_spec_accepted_tokens_total") == sum(s["accepted_draft_tokens"] for s in specs)
    for pos in range(STEPS):
        assert grew(f'specserve_spec_accepted_tokens_per_position_total{{position="{pos}"}}') == sum(
            (s["accepted_per_position"] + [0] * STEPS)[pos] for s in specs)
    assert grew("specserve_generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert grew("specserve_prompt_tokens_total") == sum(u.prompt_tokens for u in usages)


def test_a_client_that_disconnects_frees_its_request(vllm):
    """A client that leaves after a few deltas ends its request as `abort`, long before its 900 tokens;
    vLLM then runs nothing and decodes nothing more, and serves the next request. The test does not wait for
    the running gauge to show the request first: vLLM reports its scheduler's state late (900 tokens
    can finish before the gauge moves)."""
    aborted = 'specserve_requests_total{finish_reason="abort"}'
    before = _scrape(vllm)[aborted]
    body = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 900, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", vllm.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
    deadline = time.monotonic() + 30
    while _scrape(vllm)[aborted] != before + 1:
        assert time.monotonic() < deadline, "the request the client left did not end as abort"
        time.sleep(0.2)
    deadline = time.monotonic() + 30
    while _scrape(vllm)["specserve_num_requests_running"] != 0:
        assert time.monotonic() < deadline, "the request still runs in vLLM"
        time.sleep(0.2)
    generated = _scrape(vllm)["specserve_generation_tokens_total"]
    time.sleep(1)
    assert _scrape(vllm)["specserve_generation_tokens_total"] == generated  # nothing decodes it any more
    assert client(vllm).completions.create(model=MODEL, prompt="x = 1", max_tokens=4).usage.completion_tokens == 4


def test_a_dead_vllm_turns_health_503(vllm):
    core = [p for p in psutil.Process(vllm.proc.pid).children(recursive=True) if "EngineCor" in " ".join(
        [p.name()] + p.cmdline())]
    assert core, "no vLLM engine core process found"
    for p in core:
        p.kill()
    deadline = time.monotonic() + 60
    while (r := httpx.get(vllm.url + "/health")).status_code != 503:
        assert time.monotonic() < deadline, "/health still answers 200"
        time.sleep(0.5)
    assert r.json()["status"] == "dead"
    with pytest.raises(openai.APIStatusError) as e:
        client(vllm).completions.create(model=MODEL, prompt="x", max_tokens=4)
    assert e.value.status_code == 503
