"""A tiny model that really emits Kimi-K2 tool calls and thinking, and live servers for it.

The tokenizer is the tests' BPE one plus Kimi-K2's tool-call markers as special tokens (as in
Kimi's own tokenizer) and <think> / </think>; its chat template renders tools, assistant tool
calls and tool results the Kimi way. The target (a random tiny Llama) is fitted for a few
seconds to answer the EXAMPLES below with their Kimi-format text, so the engine generates that
text token by token (greedy); prompts are rendered with the server's own code, so what the
tests send is exactly what was fitted. An EAGLE-3 drafter is fitted on the same sequences.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Tokyo"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                                       "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]
KIMI_MARKERS = ["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                "<|tool_call_end|>", "<|tool_call_argument_begin|>"]
TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'tool' %}## Return of {{ m['tool_call_id'] }}\n{% endif %}{{ m['content'] }}"
    "{% if m.get('tool_calls') %}<|tool_calls_section_begin|>{% for tc in m['tool_calls'] %}<|tool_call_begin|>"
    "{{ tc['id'] }}<|tool_call_argument_begin|>{{ tc['function']['arguments'] | tojson }}<|tool_call_end|>"
    "{% endfor %}<|tool_calls_section_end|>{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def call(name: str, args: dict, n: int) -> str:
    return (f"<|tool_call_begin|>functions.{name}:{n}<|tool_call_argument_begin|>{json.dumps(args)}"
            "<|tool_call_end|>")


def section(*calls: str) -> str:
    return "<|tool_calls_section_begin|>" + "".join(calls) + "<|tool_calls_section_end|>"


PARIS = [{"role": "user", "content": "What is the weather in Paris?"}]
CALLED = PARIS + [
    {"role": "assistant", "content": None, "tool_calls": [{"id": "functions.get_weather:0", "type": "function",
                                                           "function": {"name": "get_weather",
                                                                        "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "22 C, sunny"}]
# (request body fields, the completion the model is fitted to write)
EXAMPLES = [
    ({"messages": PARIS, "tools": TOOLS},
     "<think>The user wants the weather, so I call the tool.</think>"
     + section(call("get_weather", {"city": "Paris"}, 0))),
    ({"messages": [{"role": "user", "content": "Weather in Rome, and the time in Tokyo?"}], "tools": TOOLS},
     "<think>Two calls.</think>Checking both." + section(call("get_weather", {"city": "Rome"}, 0),
                                                        call("get_time", {"zone": "Asia/Tokyo"}, 1))),
    ({"messages": [{"role": "user", "content": "Say hello."}], "tools": TOOLS},
     "<think>No tool is needed here.</think>Hello there!"),
    ({"messages": CALLED, "tools": TOOLS}, "<think>The tool answered.</think>It is 22 C and sunny in Paris."),
    ({"messages": [{"role": "user", "content": "Say hello."}]}, "<think>Greet the user.</think>Hello!"),
    ({"messages": PARIS, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
     "<think>Named.</think>" + section(call("get_weather", {"city": "Paris"}, 0))),
]


def prompt_ids(tokenizer, body: dict) -> list[int]:
    """The prompt exactly as the server renders it for `body` (the Kimi parser configured)."""
    from server.prompts import chat_prompt_ids
    from server.protocol import ChatCompletionRequest
    from server.tools import plan_tools

    req = ChatCompletionRequest.model_validate({"max_tokens": 8, **body})
    return chat_prompt_ids(tokenizer, req, plan_tools(req, "kimi_k2", "kimi_k2").template_tools)


def make_tool_model(path: Path, steps: int = 120) -> tuple[Path, Path, list[list[int]]]:
    """(target dir, drafter dir, fitted sequences): the fitted target and its drafter."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from models.llama import load_target
    from models.tokenizer import build_tokenizer
    from tests.tiny import export_drafter, fit_drafter, random_drafter, stdlib_texts

    target = path / "target"
    tok = build_tokenizer(stdlib_texts(20), 512, target)
    tok.add_special_tokens({"additional_special_tokens": KIMI_MARKERS})
    tok.add_tokens(["<think>", "</think>"])
    tok.chat_template = TEMPLATE
    tok.save_pretrained(str(target))
    seqs, starts = [], []
    for body, completion in EXAMPLES:
        ids = prompt_ids(tok, body)
        seqs.append(ids + tok.encode(completion, add_special_tokens=False) + [tok.eos_token_id])
        starts.append(len(ids))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    width = max(map(len, seqs))
    ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    labels = ids.clone()
    for row, (s, start) in enumerate(zip(seqs, starts)):
        labels[row, :start] = -100
        labels[row, len(s):] = -100
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(target)
    fitted = load_target(target)
    draft = export_drafter(fit_drafter(fitted, random_drafter(fitted), seqs, steps=150), path / "draft")
    return target, draft, seqs


@functools.cache
def tool_model() -> tuple[Path, Path, list[list[int]]]:
    import atexit
    import shutil
    import tempfile

    import torch
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="specserve-tool-tests-"))
    atexit.register(shutil.rmtree, root, True)
    return make_tool_model(root)


def tool_server(speculative: bool, parsers: bool = True):
    """A live server of the tool model (native engine in a thread), Kimi-K2 parsers on or off."""
    from engine.decoder import SpecConfig
    from engine.loading import NativeEngineArgs, build_engine
    from tests import server_harness as h

    target, draft, _ = tool_model()
    engine = build_engine(NativeEngineArgs(model=str(target), draft=str(draft) if speculative else None,
                                           spec=SpecConfig(3) if speculative else None, device="cpu"))
    names = {"tool_call_parser": "kimi_k2", "reasoning_parser": "kimi_k2"} if parsers else {}
    return h.start_server(engine, **names)
