"""Requests SGLang refuses are the client's errors: SGLang raises ValueError from its own
SamplingParams.verify (run here for real, as its TokenizerManager runs it before queueing), which
the adapter reports as INVALID_REQUEST, a 400 with an OpenAI error body, like SGLang's own server;
seeds outside int64 (SGLang's range, vLLM's too) stop at the HTTP boundary with a 400; a seed
SGLang will ignore (no deterministic inference) is said once in the log."""
from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from engine.api import ErrorCode, SamplingParams
from server.engines import sglang_engine as se
from server.errors import engine_failure
from tests import server_harness as h


class VerifyingSGLang:
    """Where sglang.Engine.async_generate meets SGLang's request validation: its SamplingParams."""

    def __init__(self, vocab_size=512):
        self.vocab_size = vocab_size
        self.tokenizer_manager = None

    async def async_generate(self, input_ids, sampling_params, stream, rid):
        from sglang.srt.sampling.sampling_params import SamplingParams as SGLangSamplingParams
        SGLangSamplingParams(**sampling_params).verify(self.vocab_size)

        async def gen():
            yield {"text": "ok", "output_ids": [7], "meta_info": {"finish_reason": {"type": "length"},
                                                                  "completion_tokens": 1, "prompt_tokens": 3}}
        return gen()

    def shutdown(self):
        pass


def run(params: SamplingParams, server_args=None):
    async def go():
        eng = se.SGLangEngine(server_args or {"model_path": "/models/t"}, engine_factory=lambda **kw: VerifyingSGLang(),
                              tokenizer_loader=lambda path, trust: object())
        await eng.start()
        return [o async for o in eng.generate("r1", [1, 2, 3], params)]
    return asyncio.run(go())


def test_sglang_value_error_is_a_400_with_an_openai_body():
    out = run(SamplingParams(max_tokens=4, seed=2**63))  # past SGLang's range, as if our check were absent
    assert len(out) == 1 and out[0].error_code == ErrorCode.INVALID_REQUEST
    assert "sampling_seed must be in [-2**63, 2**63 - 1]" in out[0].error
    err = engine_failure(out[0].error_code, out[0].error)
    assert err.status == 400
    assert err.body()["error"]["type"] == "invalid_request_error" and err.body()["error"]["code"] == "invalid_value"
    ok = run(SamplingParams(max_tokens=4, seed=2**63 - 1))
    assert ok[-1].error is None and ok[-1].text == "ok"


def test_a_seed_sglang_ignores_is_logged_once(caplog):
    with caplog.at_level(logging.WARNING, logger="specserve.sglang"):
        run(SamplingParams(max_tokens=4, seed=1))
    assert sum("enable_deterministic_inference" in r.message for r in caplog.records) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specserve.sglang"):
        run(SamplingParams(max_tokens=4, seed=1), {"model_path": "/m", "enable_deterministic_inference": True})
    assert not caplog.records


@pytest.fixture(scope="module")
def server():
    srv = h.start_server(h.native_engine(h.models(), speculative=False))
    yield srv
    srv.stop()


@pytest.mark.parametrize("seed,status", [(2**63, 400), (-(2**63) - 1, 400), (2**63 - 1, 200), (-(2**63), 200)])
def test_seed_range_is_int64_at_the_http_boundary(server, seed, status):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "def f():", "max_tokens": 2, "seed": seed,
                                                          "temperature": 1.0}, timeout=60)
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["param"] == "seed" and r.json()["error"]["code"] == "invalid_value"
