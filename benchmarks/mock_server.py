"""A stand-in OpenAI streaming server with no model, for smoke-testing benchmark clients.

Streams `max_tokens` fake tokens in chunks of `--accept` tokens (as a speculative engine
emits an accepted draft run), sleeping `--step-ms` per chunk; returns usage with
spec_decoding and exposes specserve_* counters at /metrics. Timings mean nothing.

  python -m benchmarks.mock_server --port 8123 --accept 3 --step-ms 2
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

from aiohttp import web


class MockState:
    def __init__(self, accept: int, step_ms: float):
        self.accept, self.step_s = max(1, accept), step_ms / 1000.0
        self.counters = {"specserve_generation_tokens_total": 0, "specserve_prompt_tokens_total": 0,
                         "specserve_spec_verify_steps_total": 0, "specserve_spec_draft_tokens_total": 0,
                         "specserve_spec_accepted_tokens_total": 0, "specserve_requests_total": 0}


async def completions(request: web.Request) -> web.StreamResponse:
    st: MockState = request.app["state"]
    body = await request.json()
    n = int(body.get("max_tokens") or 16)
    chat = request.path.endswith("chat/completions")
    prompt = json.dumps(body.get("messages") or body.get("prompt"))
    prompt_tokens = max(1, len(prompt) // 4)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    rid, created = f"mock-{id(body)}", int(time.time())

    async def send(payload):
        await resp.write(f"data: {json.dumps(payload)}\n\n".encode())

    def chunk(text, finish=None):
        c = {"index": 0, "finish_reason": finish}
        c.update({"delta": {"content": text}} if chat else {"text": text})
        return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created, "model": "mock", "choices": [c]}

    await send(chunk("t0 "))            # first token comes from prefill
    done, steps = 1, 0
    while done < n:
        await asyncio.sleep(st.step_s)
        k = min(st.accept, n - done)
        steps, done = steps + 1, done + k
        await send(chunk("".join(f"t{done - k + i + 1} " for i in range(k))))
    proposed, accepted = steps * st.accept, done - 1 - steps
    await send(chunk("", finish="length"))
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": done, "total_tokens": prompt_tokens + done,
             "spec_decoding": {"verify_steps": steps, "proposed_draft_tokens": proposed,
                               "accepted_draft_tokens": accepted, "accepted_per_position": [],
                               "accept_length": done / steps if steps else 0.0,
                               "accept_rate": accepted / proposed if proposed else 0.0}}
    if (body.get("stream_options") or {}).get("include_usage"):
        await send({"id": rid, "object": "chat.completion.chunk", "created": created, "model": "mock",
                    "choices": [], "usage": usage})
    await resp.write(b"data: [DONE]\n\n")
    c = st.counters
    c["specserve_generation_tokens_total"] += done
    c["specserve_prompt_tokens_total"] += prompt_tokens
    c["specserve_spec_verify_steps_total"] += steps
    c["specserve_spec_draft_tokens_total"] += proposed
    c["specserve_spec_accepted_tokens_total"] += accepted
    c["specserve_requests_total"] += 1
    return resp


async def metrics(request: web.Request) -> web.Response:
    lines = []
    for name, v in request.app["state"].counters.items():
        lines += [f"# TYPE {name.removesuffix('_total')} counter", f'{name}{{model_name="mock"}} {float(v)}']
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "mock", "object": "model", "owned_by": "mock"}]})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def make_app(accept: int = 3, step_ms: float = 1.0) -> web.Application:
    app = web.Application()
    app["state"] = MockState(accept, step_ms)
    app.add_routes([web.post("/v1/chat/completions", completions), web.post("/v1/completions", completions),
                    web.get("/metrics", metrics), web.get("/v1/models", models), web.get("/health", health)])
    return app


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--accept", type=int, default=3, help="tokens per streamed chunk after the first")
    ap.add_argument("--step-ms", type=float, default=1.0)
    args, _ = ap.parse_known_args(argv)  # tolerate server flags (--model, --steps ...) in sweep templates
    web.run_app(make_app(args.accept, args.step_ms), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
