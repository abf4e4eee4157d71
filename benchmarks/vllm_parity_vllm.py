"""The vLLM side of benchmarks/vllm_parity.py: greedy EAGLE-3 decoding of pre-tokenized prompts.

Runs under .venv-vllm (`make vllm-venv`), so it imports nothing but the standard library and
vLLM:  .venv-vllm/bin/python -m benchmarks.vllm_parity_vllm REQUEST.json OUT.json

Prompts arrive as token ids (the driver renders them once, with the target's tokenizer), so a
difference in the outputs is the engines', not the tokenization's. They are decoded one at a
time (batch 1, as the native side does), after one warm-up request.

Per-request statistics come from `per_request_spec_decode_metrics="summary"`: a histogram of
accepted draft tokens per verify step (vllm/v1/metrics/stats.py RequestSpecDecodeMetrics). The
aggregate counters of `llm.get_metrics()` (`vllm:spec_decode_num_drafts`, `_num_draft_tokens`,
`_num_accepted_tokens`; vLLM's mean acceptance length is 1 + accepted / drafts,
vllm/v1/spec_decode/metrics.py) are kept as a cross-check of the per-request sums.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens")


def spec_counters(llm) -> dict[str, int]:
    """The aggregate spec-decode counters, summed over engines (label sets)."""
    totals = dict.fromkeys(COUNTERS, 0)
    for m in llm.get_metrics():
        if m.name in totals:
            totals[m.name] += int(m.value)
    return totals


def output_record(out) -> dict:
    """One finished completion in the side-result shape of benchmarks/vllm_parity_compare.py."""
    m = out.spec_decode_metrics
    hist = m.histogram if m is not None else []
    return {"token_ids": list(out.token_ids), "text": out.text, "finish_reason": out.finish_reason,
            "verify_steps": sum(hist), "proposed_draft_tokens": m.num_draft_tokens if m is not None else 0,
            "accepted_draft_tokens": sum(j * n for j, n in enumerate(hist))}


def run(req: dict) -> dict:
    import vllm
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=req["target"], dtype=req["dtype"], seed=0,
              gpu_memory_utilization=req["gpu_memory_utilization"],  # on CPU: the fraction of RAM for the KV cache
              speculative_config={"method": "eagle3", "model": req["draft"],
                                  "num_speculative_tokens": req["num_speculative_tokens"]},
              per_request_spec_decode_metrics="summary", disable_log_stats=False)
    load_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"])

    def generate(ids: list[int]):
        return llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].outputs[0]

    generate(req["prompts"][0])  # warm-up, not counted
    before = spec_counters(llm)
    t0 = time.perf_counter()
    outputs = [output_record(generate(ids)) for ids in req["prompts"]]
    generate_s = time.perf_counter() - t0
    after = spec_counters(llm)
    return {"engine": "vllm", "version": vllm.__version__, "load_s": load_s, "generate_s": generate_s,
            "outputs": outputs, "counters": {k: after[k] - before[k] for k in COUNTERS}}


def main(argv: list[str] | None = None) -> None:
    request, out = argv if argv is not None else sys.argv[1:]
    Path(out).write_text(json.dumps(run(json.loads(Path(request).read_text())), indent=2) + "\n")


if __name__ == "__main__":  # vLLM starts its engine core with spawn: the guard is required
    main()
