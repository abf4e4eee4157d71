"""From a validated request to what the engine takes: prompt token ids and SamplingParams.

Chat prompts are rendered with the tokenizer's own chat template, then tokenized without
adding special tokens (the template has them), as vLLM does. Text prompts are tokenized with
the tokenizer's special tokens (BOS where the model has one). Token-id prompts are checked
against the vocabulary here: an out-of-range id must never reach the engine.

max_tokens, as vLLM: if unset, the rest of the context (max_context - prompt tokens);
if prompt + max_tokens exceeds the context, a 400 naming both numbers, never a silent cut.
"""
from __future__ import annotations

import json

from engine.api import SamplingParams
from server.errors import APIError
from server.protocol import ChatCompletionRequest, CompletionRequest

# Roles that the common chat templates know; OpenAI's "developer" is a system message.
_TEMPLATE_ROLE = {"developer": "system"}
# top_k at or above the vocabulary size keeps every token; larger values are clamped so that
# they fit the engine's int64 tensors (2**70 once killed the engine thread).
MAX_TOP_K = 1 << 31


def chat_prompt_ids(tokenizer, req: ChatCompletionRequest, tools: list[dict] | None = None) -> list[int]:
    """`tools`: the tool definitions for the template (server/tools.py decides which)."""
    if not getattr(tokenizer, "chat_template", None):
        raise APIError(400, "this model's tokenizer has no chat template: use /v1/completions", param="messages",
                       code="no_chat_template")
    messages = [_template_message(m, i) for i, m in enumerate(req.messages)]
    kwargs = dict(req.chat_template_kwargs or {})
    for reserved in ("conversation", "messages", "tools", "tokenize", "add_generation_prompt"):
        kwargs.pop(reserved, None)
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=req.add_generation_prompt, **kwargs)
    except Exception as e:  # jinja raise_exception(...) in templates: "roles must alternate", ...
        raise APIError(400, f"the chat template rejected the messages: {e}", param="messages",
                       code="chat_template_error") from None
    return _encode(tokenizer, text, add_special_tokens=False, param="messages")


def _template_message(m, i: int) -> dict:
    """A message as chat templates take it: tool-call arguments as a dict (transformers' and
    SGLang's convention; a 400 if they are not a JSON object), tool_call_id, reasoning_content."""
    msg = {"role": _TEMPLATE_ROLE.get(m.role, m.role), "content": m.text()}
    if m.name:
        msg["name"] = m.name
    if m.tool_call_id:
        msg["tool_call_id"] = m.tool_call_id
    if m.reasoning_content is not None:
        msg["reasoning_content"] = m.reasoning_content
    if m.tool_calls:
        calls = []
        for j, c in enumerate(m.tool_calls):
            try:
                args = json.loads(c.function.arguments)
            except ValueError:
                args = None
            if not isinstance(args, dict):
                raise APIError(400, f"messages[{i}].tool_calls[{j}].function.arguments: must be a JSON object "
                               "(as text)", param=f"messages[{i}].tool_calls[{j}].function.arguments",
                               code="invalid_value")
            calls.append({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
        msg["tool_calls"] = calls
    return msg


def completion_prompt_ids(tokenizer, req: CompletionRequest) -> list[int]:
    if isinstance(req.prompt, str):
        return _encode(tokenizer, req.prompt, add_special_tokens=True, param="prompt")
    vocab = len(tokenizer)
    bad = next((t for t in req.prompt if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"prompt: token id {bad} is outside the vocabulary [0, {vocab})", param="prompt",
                       code="invalid_value")
    return list(req.prompt)


def _encode(tokenizer, text: str, add_special_tokens: bool, param: str) -> list[int]:
    try:
        return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    except Exception as e:  # e.g. lone surrogates ("\ud800") cannot be encoded
        raise APIError(400, f"{param}: cannot tokenize the text: {e}", param=param, code="invalid_value") from None


def sampling_params(req: ChatCompletionRequest | CompletionRequest, prompt_len: int,
                    max_context: int, vocab: int = 0) -> SamplingParams:
    """`vocab`: the tokenizer's size, which logit_bias and stop_token_ids ids must lie below (0: unchecked)."""
    param = "messages" if isinstance(req, ChatCompletionRequest) else "prompt"
    bias = req.token_logit_bias
    for field, ids in (("logit_bias", bias), ("stop_token_ids", req.stop_token_ids or [])):
        bad = next((t for t in ids if t < 0 or vocab and t >= vocab), None)
        if bad is not None:
            raise APIError(400, f"{field}: token id {bad} is outside the vocabulary [0, {vocab or 'vocab'})",
                           param=field, code="invalid_value")
    if prompt_len == 0:
        raise APIError(400, f"{param}: the prompt is empty", param=param, code="invalid_value")
    if max_context and prompt_len >= max_context:
        raise APIError(400, f"This model's maximum context length is {max_context} tokens, but the prompt has "
                       f"{prompt_len} tokens (at least one must be left for the completion).", param=param,
                       code="context_length_exceeded")
    requested = req.requested_max_tokens
    which = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    if requested is None:
        max_tokens = max_context - prompt_len if max_context else 16
    elif max_context and prompt_len + requested > max_context:
        raise APIError(400, f"This model's maximum context length is {max_context} tokens. However, you requested "
                       f"{prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} for the "
                       f"completion). Reduce the prompt or {which}.", param=which, code="context_length_exceeded")
    else:
        max_tokens = requested
    return SamplingParams(
        max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
        top_k=min(req.top_k, MAX_TOP_K) if req.top_k > 0 else -1, seed=req.seed,
        stop=[s for s in req.stop_list if s], stop_token_ids=list(req.stop_token_ids or []),
        ignore_eos=req.ignore_eos, presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty, min_tokens=req.min_tokens, logit_bias=bias,
        constraint=req.constraint, logprobs=req.logprobs_k)
