"""The HTTP routes: OpenAI chat and text completions, models, health and metrics."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from server.body import read_request
from server.context import LOADING_RETRY_AFTER_S, ServerContext
from server.generation import ClientGone, Generation, cancel_on_disconnect
from server.prompts import chat_prompt_ids, completion_prompt_ids, sampling_params
from server.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from server.responses import (
    ChatFormat,
    CompletionFormat,
    EventStreamResponse,
    choice_formats,
    choice_generations,
    collect,
    log_fields,
    sse_events,
    start_all,
)
from server.tools import OutputParser, ToolPlan, apply_tool_plan, plan_tools

router = APIRouter()


def _ctx(request: Request) -> ServerContext:
    return request.app.state.ctx


async def _admit(request: Request, model):
    """(ctx, the request body as `model`) once the body is valid, names our model and the engine
    is ready: every refusal here is an OpenAI error before any prompt work."""
    ctx = _ctx(request)
    req = await read_request(request, model, ctx.max_body_bytes)
    ctx.check_model(req.model)
    ctx.check_ready()
    return ctx, req


def json_body(model) -> dict:
    """`openapi_extra` that documents a JSON body the handler reads by hand (server/body.py), so
    /openapi.json says what to send (clients, schemathesis). $defs are inlined: the schema must
    stand alone inside the OpenAPI document."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node):
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {k: inline(v) for k, v in node.items()}
        return [inline(v) for v in node] if isinstance(node, list) else node
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline(schema)}}}}


@router.post("/v1/chat/completions", openapi_extra=json_body(ChatCompletionRequest))
async def chat_completions(request: Request):
    ctx, req = await _admit(request, ChatCompletionRequest)
    plan = await run_in_threadpool(plan_tools, req, ctx.tool_call_parser, ctx.reasoning_parser)
    ids = await run_in_threadpool(chat_prompt_ids, ctx.engine.tokenizer, req, plan.template_tools)
    parser = None
    if ctx.reasoning_parser or plan.parses_calls:
        parser = OutputParser(ctx.tool_call_parser, None if plan.json_calls else ctx.reasoning_parser,
                              plan.parse_tools, plan.history_calls)
    fmt = ChatFormat(f"chatcmpl-{request.state.request_id}", ctx.model_name, parser, plan.json_calls)
    return await _generate(request, ctx, req, ids, fmt, plan)


@router.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
async def completions(request: Request):
    ctx, req = await _admit(request, CompletionRequest)
    ids = await run_in_threadpool(completion_prompt_ids, ctx.engine.tokenizer, req)
    echo = "" if not req.echo else req.prompt if isinstance(req.prompt, str) else ctx.engine.tokenizer.decode(ids)
    return await _generate(request, ctx, req, ids,
                           CompletionFormat(f"cmpl-{request.state.request_id}", ctx.model_name, echo))


async def _generate(request: Request, ctx: ServerContext, req, ids: list[int], fmt, plan: ToolPlan | None = None):
    params = sampling_params(req, len(ids), ctx.engine.info.max_context, vocab=len(ctx.engine.tokenizer))
    if plan is not None:
        apply_tool_plan(plan, params)
    rid = request.state.request_id
    # n > 1: one engine request per choice (the engine prefills their prompt once: decoder.prefill_shared).
    gens = choice_generations(lambda p: Generation(ctx.engine, ctx.metrics.request(), rid, ctx.engine_request_id(rid),
                                                   ids, p, ctx.request_timeout_s), params, req.n)
    fmts = choice_formats(fmt, req.n, params.logprobs, ctx.engine.tokenizer)
    try:
        # Engine errors become an HTTP status here, before any header is sent. A client that
        # leaves while its request still waits in the engine's queue frees its place now, not
        # when the request is admitted (start() closes the engine stream when cancelled).
        await cancel_on_disconnect(request, start_all(gens))
        if req.stream:
            return EventStreamResponse(sse_events(gens, fmts, req.include_usage, request.scope["state"]))
        body, final = await cancel_on_disconnect(request, collect(gens, fmts))
    except ClientGone:
        request.scope["state"]["usage"] = {"prompt_tokens": len(ids), "finish_reason": "abort",
                                           "completion_tokens": sum(g.rec.tokens for g in gens)}
        return Response(status_code=499)
    request.scope["state"]["usage"] = log_fields(final)
    return JSONResponse(body)


@router.get("/v1/models")
async def models(request: Request):
    ctx = _ctx(request)
    card = ModelCard(id=ctx.model_name, created=int(request.app.state.created),
                     max_model_len=ctx.engine.info.max_context)
    return ModelList(data=[card]).model_dump()


@router.get("/health")
async def health(request: Request):
    ctx = _ctx(request)
    status = ctx.status
    if status == "ok":
        # While decode steps compile in the background: which shapes run compiled, compiling, eager.
        compiled = getattr(ctx.engine, "compile_status", None)
        return {"status": "ok"} if compiled is None else {"status": "ok", "decode_steps": compiled}
    if status == "loading":
        return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": LOADING_RETRY_AFTER_S})
    return JSONResponse({"status": "dead", "error": ctx.dead_reason}, status_code=503)


@router.get("/metrics")
async def metrics(request: Request):
    body = await run_in_threadpool(_ctx(request).metrics.render)  # NVML reads may take milliseconds
    return Response(body, media_type=CONTENT_TYPE_LATEST)
