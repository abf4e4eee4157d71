"""/metrics agrees with the responses: after traffic, the counters' deltas equal the sums of
the responses' usage, and the mean accept length from the counters (1 + accepted / verify
steps) equals the one from the responses' spec_decoding fields. Also: histograms, gauges,
the launch info metric, and no GPU series (and no error) without NVML."""
from __future__ import annotations

import json
import math
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server.gpu_metrics import GpuCollector
from server.metrics import GPU_METRICS
from tests import server_harness as h


def scrape(server) -> dict:
    r = httpx.get(server.url + "/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(m: dict, name: str, **labels) -> float:
    return m.get((name, tuple(sorted((k, str(v)) for k, v in labels.items()))), 0.0)


def total(m: dict, name: str) -> float:
    return sum(v for (n, _), v in m.items() if n == name)


def traffic(server) -> list[dict]:
    """Mixed requests: chat and completion, streaming and not; returns each usage."""
    usages = []
    for i, prompt in enumerate(h.COMPLETION_PROMPTS[:6]):
        stream = i % 2 == 1
        req = {"model": server.model, "prompt": prompt, "max_tokens": h.MAX_TOKENS - i, "temperature": 0,
               "stream": stream}
        if stream:
            req["stream_options"] = {"include_usage": True}
            with httpx.stream("POST", server.url + "/v1/completions", json=req, timeout=60) as r:
                chunks = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
            usages.append(chunks[-1]["usage"])
        else:
            usages.append(httpx.post(server.url + "/v1/completions", json=req, timeout=60).json()["usage"])
    for content in h.CHAT_PROMPTS[:2]:
        r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
            "model": server.model, "messages": [{"role": "user", "content": content}], "max_tokens": h.MAX_TOKENS,
            "temperature": 0.7, "seed": 3})
        usages.append(r.json()["usage"])
    return usages


def test_counters_agree_with_the_responses(spec):
    before = scrape(spec)
    usages = traffic(spec)
    after = scrape(spec)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    n = len(usages)
    completion = sum(u["completion_tokens"] for u in usages)
    assert delta("specserve_generation_tokens_total") == completion
    assert delta("specserve_prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert total(after, "specserve_requests_total") - total(before, "specserve_requests_total") == n
    finished = delta("specserve_requests_total", finish_reason="length") + delta("specserve_requests_total",
                                                                                 finish_reason="stop")
    assert finished == n

    spec_usage = [u["spec_decoding"] for u in usages]
    verify = sum(s["verify_steps"] for s in spec_usage)
    accepted = sum(s["accepted_draft_tokens"] for s in spec_usage)
    assert delta("specserve_spec_verify_steps_total") == verify
    assert delta("specserve_spec_draft_tokens_total") == sum(s["proposed_draft_tokens"] for s in spec_usage)
    assert delta("specserve_spec_accepted_tokens_total") == accepted
    per_pos = [sum(s["accepted_per_position"][i] for s in spec_usage if len(s["accepted_per_position"]) > i)
               for i in range(h.STEPS)]
    assert [delta("specserve_spec_accepted_tokens_per_position_total", position=i) for i in range(h.STEPS)] == per_pos

    from_counters = 1 + delta("specserve_spec_accepted_tokens_total") / delta("specserve_spec_verify_steps_total")
    from_responses = 1 + accepted / verify
    assert from_counters == pytest.approx(from_responses, rel=1e-12)
    assert from_counters > 1.3, "the fitted drafter should be accepted often"

    assert delta("specserve_time_to_first_token_seconds_count") == n
    assert delta("specserve_e2e_request_latency_seconds_count") == n
    assert delta("specserve_inter_token_latency_seconds_count") == completion - n
    assert delta("specserve_request_accept_length_count") == n
    assert delta("specserve_request_accept_length_sum") == pytest.approx(
        sum(s["accept_length"] for s in spec_usage), abs=1e-3 * n)
    assert delta("specserve_request_decode_tokens_per_second_count") == n


def test_histogram_buckets_resolve_milliseconds(spec):
    m = scrape(spec)
    for name in ("specserve_inter_token_latency_seconds", "specserve_time_to_first_token_seconds",
                 "specserve_e2e_request_latency_seconds"):
        les = sorted(float(dict(k[1])["le"]) for k in m if k[0] == name + "_bucket")
        assert les[0] == 0.001 and sum(1 for le in les if le < 0.01) >= 3 and math.isinf(les[-1])


def test_gauges_and_launch_info(spec):
    m = scrape(spec)
    assert value(m, "specserve_num_requests_running") == 0 and value(m, "specserve_num_requests_waiting") == 0
    info = next(dict(k[1]) for k in m if k[0] == "specserve_launch_info")
    keys = ("engine", "model", "steps", "topk", "draft_tokens", "tp", "device", "speculative")
    assert {k: info[k] for k in keys} == {
        "engine": "native", "model": spec.model, "steps": "3", "topk": "1", "draft_tokens": "4", "tp": "1",
        "device": "cpu", "speculative": "true"}
    assert info["max_context"] == "512"


def test_no_gpu_series_without_nvml(spec):
    try:
        import pynvml
        pynvml.nvmlInit()
        pytest.skip("NVML works here: GPU series are expected")
    except Exception:
        pass
    assert not [k for k in scrape(spec) if k[0].startswith("specserve_gpu_")]


class _FakeNVML:
    """Stands in for the NVML driver library, which cannot run on a machine without a GPU."""
    class NVMLError(Exception):
        pass

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        return type("U", (), {"gpu": 40 + h})()

    def nvmlDeviceGetMemoryInfo(self, h):
        return type("M", (), {"used": (h + 1) * 2**30})()

    def nvmlDeviceGetPowerUsage(self, h):
        if h == 1:
            raise self.NVMLError("not supported")
        return 312_500  # milliwatts


def test_gpu_collector_units_and_labels():
    fams = {f.name: f for f in GpuCollector(GPU_METRICS, nvml=_FakeNVML()).collect()}
    samples = {(s.name, s.labels["gpu"]): s.value for f in fams.values() for s in f.samples}
    assert samples == {
        ("specserve_gpu_utilization_percent", "0"): 40.0, ("specserve_gpu_utilization_percent", "1"): 41.0,
        ("specserve_gpu_memory_used_bytes", "0"): 2.0**30, ("specserve_gpu_memory_used_bytes", "1"): 2.0**31,
        ("specserve_gpu_power_watts", "0"): 312.5,  # gpu 1 cannot report power: no sample, no error
    }

    class NoDriver(_FakeNVML):
        def nvmlInit(self):
            raise self.NVMLError("NVML Shared Library Not Found")
    assert list(GpuCollector(GPU_METRICS, nvml=NoDriver()).collect()) == []


def test_an_aborted_requests_drafts_are_counted(spec):
    """Speculative counters are observed per engine step, not when a request ends: a client
    that leaves mid-stream still leaves its verify steps, drafts and accepted drafts counted."""
    before = scrape(spec)
    req = {"model": spec.model, "prompt": h.COMPLETION_PROMPTS[0], "max_tokens": 400, "temperature": 0,
           "ignore_eos": True, "stream": True}
    tokens = 0
    with httpx.stream("POST", spec.url + "/v1/completions", json=req, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                tokens += 1
                if tokens == 6:
                    break  # the client goes away; the server aborts the request
    aborts = value(before, "specserve_requests_total", finish_reason="abort")
    deadline = time.monotonic() + 5
    while (after := scrape(spec)) and value(after, "specserve_requests_total", finish_reason="abort") == aborts:
        assert time.monotonic() < deadline, "the server did not count the abort"
        time.sleep(0.05)
    steps = value(after, "specserve_spec_verify_steps_total") - value(before, "specserve_spec_verify_steps_total")
    drafts = value(after, "specserve_spec_draft_tokens_total") - value(before, "specserve_spec_draft_tokens_total")
    accepted = (value(after, "specserve_spec_accepted_tokens_total")
                - value(before, "specserve_spec_accepted_tokens_total"))
    assert steps >= 5 and drafts == steps * h.STEPS and accepted > 0   # at least the 5 streamed steps after the first
