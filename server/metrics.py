"""Every Prometheus metric the server exports is defined here, with the formulas to read it.

Recorded in the HTTP layer from the engine's GenerationOutput stream, so every engine (native,
SGLang, vLLM) produces the same metrics. Each app owns its CollectorRegistry.

Throughput and speculation (counters; use rate() over a window):
  output tok/s            = rate(specserve_generation_tokens_total)
  mean accept length      = 1 + rate(specserve_spec_accepted_tokens_total)
                                / rate(specserve_spec_verify_steps_total)
                            (tokens per verify step, bonus token included)
  accept rate             = rate(specserve_spec_accepted_tokens_total)
                                / rate(specserve_spec_draft_tokens_total)
  acceptance at position i = rate(specserve_spec_accepted_tokens_per_position_total{position="i"})
                                / rate(specserve_spec_verify_steps_total)     (i from 0)
Per request (histograms):
  specserve_request_accept_length = completion_tokens / verify_steps of one request, as
      usage.spec_decoding.accept_length reports it (includes the first, prefill-made token,
      so it reads slightly above the window formula for short requests).
  specserve_request_decode_tokens_per_second = (completion_tokens - 1) / (last token time -
      first token time), for requests with at least two tokens.
  specserve_inter_token_latency_seconds: a delta of n tokens arriving `gap` seconds after
      the previous one is observed n times as gap / n (SGLang's convention), so a speculative
      step that yields 3 tokens counts 3 tokens at a third of the step time. A first delta of
      n tokens (a slow consumer merged the first steps) observes its n - 1 later tokens at 0 s:
      they arrived with the first, and every token after the first is counted once.
Counters cover requests that reached the engine. Speculative counters are observed per
engine step (each delta carries the verify steps that made it, as vLLM's
SpecDecodingStats.observe_draft), so dashboards do not wait for requests to end and an
aborted request's drafts are counted; the SGLang engine reports its totals on the last chunk.
An engine that counts verify steps itself per engine step (vLLM: its stat loggers'
SpecDecodingStats, the `step_spec` property) has these four counters read from it at scrape time
instead; its deltas carry no spec_step.
Running/waiting gauges and GPU gauges are read at scrape time.
"""
from __future__ import annotations

import re
import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from engine.api import Engine, GenerationOutput, SpecStats
from server.gpu_metrics import GpuCollector

FINISH_REASONS = ("stop", "length", "abort", "error")

# Latency buckets start at 1 ms so sub-10 ms decode steps are resolved.
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
               0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
E2E_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
               40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)
ACCEPT_LENGTH_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75, 4.0, 4.5, 5.0, 6.0,
                         7.0, 8.0, 10.0, 12.0, 16.0)
TOKENS_PER_SECOND_BUCKETS = (1, 2, 5, 10, 20, 30, 40, 50, 75, 100, 150, 200, 250, 300, 400, 500, 750, 1000,
                             1500, 2000, 3000, 5000)

# (name, help) of the speculative counters: verify steps, proposed, accepted, accepted per position.
SPEC_COUNTERS = (
    ("specserve_spec_verify_steps", "Speculative verify steps (target forwards over a draft)."),
    ("specserve_spec_draft_tokens", "Draft tokens proposed for verification."),
    ("specserve_spec_accepted_tokens", "Draft tokens accepted (bonus token excluded)."),
    ("specserve_spec_accepted_tokens_per_position", "Verify steps whose draft token at `position` (from 0) was "
                                                    "accepted."),
)

GPU_METRICS = {
    "utilization": ("specserve_gpu_utilization_percent", "GPU utilization (NVML), percent."),
    "memory": ("specserve_gpu_memory_used_bytes", "GPU memory used (NVML), bytes."),
    "power": ("specserve_gpu_power_watts", "GPU power draw (NVML), watts."),
}


class ServerMetrics:
    def __init__(self, engine: Engine, launch_info: dict[str, str] | None = None, nvml=None):
        r = self.registry = CollectorRegistry()
        self.prompt_tokens = Counter("specserve_prompt_tokens", "Prompt tokens of requests that reached the engine.",
                                     registry=r)
        self.generation_tokens = Counter("specserve_generation_tokens", "Generated (completion) tokens.", registry=r)
        self.requests = Counter("specserve_requests", "Finished requests by finish reason (stop, length, "
                                "abort = client gone or timed out, error = engine error).", ["finish_reason"],
                                registry=r)
        for reason in FINISH_REASONS:
            self.requests.labels(reason)
        if hasattr(engine, "step_spec"):  # the engine counts them per engine step (vLLM)
            r.register(_EngineSpecCollector(engine))
        else:
            self.verify_steps = Counter(SPEC_COUNTERS[0][0], SPEC_COUNTERS[0][1], registry=r)
            self.draft_tokens = Counter(SPEC_COUNTERS[1][0], SPEC_COUNTERS[1][1], registry=r)
            self.accepted_tokens = Counter(SPEC_COUNTERS[2][0], SPEC_COUNTERS[2][1], registry=r)
            self.accepted_per_position = Counter(SPEC_COUNTERS[3][0], SPEC_COUNTERS[3][1], ["position"], registry=r)
        self.ttft = Histogram("specserve_time_to_first_token_seconds", "Arrival to first token.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("specserve_inter_token_latency_seconds", "Time per output token after the first.",
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("specserve_e2e_request_latency_seconds", "Arrival to last token.",
                             buckets=E2E_BUCKETS, registry=r)
        self.accept_length = Histogram("specserve_request_accept_length", "Per-request accept length "
                                       "(completion tokens / verify steps).", buckets=ACCEPT_LENGTH_BUCKETS,
                                       registry=r)
        self.decode_tps = Histogram("specserve_request_decode_tokens_per_second", "Per-request decode speed "
                                    "after the first token.", buckets=TOKENS_PER_SECOND_BUCKETS, registry=r)
        r.register(_EngineLoadCollector(engine))
        r.register(_LaunchInfoCollector(engine, launch_info or {}))
        r.register(GpuCollector(GPU_METRICS, nvml=nvml))

    def request(self) -> "RequestMetrics":
        return RequestMetrics(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestMetrics:
    """One request's timings and counts, fed from its output stream."""

    def __init__(self, m: ServerMetrics):
        self.m = m
        self.arrival = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None
        self.tokens = 0
        self.done = False

    def on_output(self, out: GenerationOutput) -> None:
        if out.spec_step is not None and out.spec_step.verify_steps:
            self._count_verify_steps(out.spec_step)
        n = len(out.token_ids)
        if not n:
            return
        now = time.perf_counter()
        if self.first is None:
            self.first = now
            self.m.ttft.observe(now - self.arrival)
            for _ in range(n - 1):
                self.m.itl.observe(0.0)
        else:
            per_token = (now - self.last) / n
            for _ in range(n):
                self.m.itl.observe(per_token)
        self.last = now
        self.tokens += n
        self.m.generation_tokens.inc(n)

    def _count_verify_steps(self, step: SpecStats) -> None:
        m = self.m
        m.verify_steps.inc(step.verify_steps)
        m.draft_tokens.inc(step.proposed_draft_tokens)
        m.accepted_tokens.inc(step.accepted_draft_tokens)
        for pos, count in enumerate(step.accepted_per_position):
            m.accepted_per_position.labels(str(pos)).inc(count)

    def discard(self) -> None:
        """The engine refused the request (overloaded, not ready): it is not counted."""
        self.done = True

    def finish(self, reason: str, final: GenerationOutput | None = None, prompt_tokens: int = 0) -> None:
        """Once per request: stop | length from a final output, abort or error otherwise."""
        if self.done:
            return
        self.done = True
        m = self.m
        m.requests.labels(reason if reason in FINISH_REASONS else "error").inc()
        m.prompt_tokens.inc(final.prompt_tokens if final is not None and final.prompt_tokens else prompt_tokens)
        completion = self.tokens
        if final is not None and final.completion_tokens > self.tokens:  # an engine that sends counts only
            m.generation_tokens.inc(final.completion_tokens - self.tokens)
            completion = final.completion_tokens
        m.e2e.observe((self.last or time.perf_counter()) - self.arrival)
        if completion >= 2 and self.first is not None and self.last > self.first:
            m.decode_tps.observe((completion - 1) / (self.last - self.first))
        spec = final.spec if final is not None else None
        if spec is not None and spec.verify_steps:
            m.accept_length.observe(spec.accept_length(completion))


class _EngineLoadCollector:
    """Running and waiting requests, read from `engine.load` at scrape time."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def describe(self):
        return []

    def collect(self):
        try:
            running, waiting = self.engine.load
        except Exception:
            running = waiting = 0
        yield GaugeMetricFamily("specserve_num_requests_running", "Requests in the engine's running batch.",
                                value=running)
        yield GaugeMetricFamily("specserve_num_requests_waiting", "Requests waiting for a batch slot.",
                                value=waiting)


class _EngineSpecCollector:
    """The speculative counters from the engine's own per-step totals (`engine.step_spec`)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def describe(self):
        return []

    def collect(self):
        s = self.engine.step_spec or SpecStats()
        for (name, doc), value in zip(SPEC_COUNTERS, (s.verify_steps, s.proposed_draft_tokens,
                                                      s.accepted_draft_tokens)):
            yield CounterMetricFamily(name, doc, value=value)
        per_position = CounterMetricFamily(SPEC_COUNTERS[3][0], SPEC_COUNTERS[3][1], labels=["position"])
        for pos, count in enumerate(s.accepted_per_position):
            per_position.add_metric([str(pos)], count)
        yield per_position


class _LaunchInfoCollector:
    """specserve_launch_info{engine,model,steps,topk,draft_tokens,tp,device,...} 1: the effective
    configuration. EngineInfo is read at scrape time (the engine fills in device and context
    when it has loaded); the launcher's `launch_info` (profile, NCCL env) wins on conflicts."""

    def __init__(self, engine: Engine, launch_info: dict[str, str]):
        self.engine, self.launch_info = engine, launch_info

    def describe(self):
        return []

    def collect(self):
        i = self.engine.info
        labels = {"engine": i.engine, "model": i.model, "max_context": i.max_context, "speculative": i.speculative,
                  "steps": i.steps, "topk": i.topk, "draft_tokens": i.draft_tokens, "tp": i.tp, "device": i.device}
        labels.update(i.extra or {})
        labels.update(self.launch_info)
        clean = {}
        for k, v in labels.items():
            k = re.sub(r"[^a-zA-Z0-9_]", "_", str(k))
            if not k or k[0].isdigit() or k.startswith("__"):
                k = "l_" + k.lstrip("_")
            clean[k] = str(v).lower() if isinstance(v, bool) else str(v)
        yield InfoMetricFamily("specserve_launch", "The effective launch configuration.", value=clean)
