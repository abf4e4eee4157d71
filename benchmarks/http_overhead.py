"""Does the HTTP front-end keep the engine's speed? (target: >= 95% of the engine's own tok/s)

The same prompts, setting and token count, measured twice at batch 1, greedy: behind the
OpenAI API (a server started from a command template, streamed by benchmarks/serving.py,
decode tok/s = (tokens - 1) / (e2e - TTFT) per request, EOS ignored) and in-process
(benchmarks/engine_speed.py). The server runs first and is stopped before the in-process
run, so the two never share the device. `--rounds N` alternates the two N times and reports
the median ratio: on a shared 2-core machine single runs swing by +-15%.

  python -m benchmarks.http_overhead --model shipped/target --draft shipped/drafter --steps 3 --name cpu-steps3
"""
from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from benchmarks.report import md_table, provenance, write_json
from benchmarks.step_sweep import BASELINE_CMD, HELDOUT, SERVER_CMD, server_command

PROJECT_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = PROJECT_ROOT / "benchmarks" / "results" / "http_overhead"
TARGET_RATIO = 0.95


def measure_http(args) -> dict:
    from benchmarks import serving
    from benchmarks.server_proc import running_server

    prompts = serving.load_prompts(args.prompts, args.num_prompts + 1)
    dt = args.draft_tokens or args.steps + 1
    fields = {"model": args.model, "draft": args.draft, "steps": args.steps, "topk": args.topk, "draft_tokens": dt}
    template = server_command(args, speculative=args.steps > 0)
    with running_server(template, fields, Path(args.out_dir) / f"{args.name}-server.log", args.server_timeout) as base:
        cfg = serving.BenchConfig(base_url=base, model=None, max_concurrency=1, request_rate=float("inf"),
                                  num_prompts=args.num_prompts, max_tokens=args.max_tokens, temperature=0.0,
                                  ignore_eos=args.ignore_eos, seed=0, timeout_s=600.0)
        s = asyncio.run(serving.run_benchmark(cfg, prompts[1:], warmup=prompts[:1]))["summary"]
    if not s["decode_tok_s"]:
        raise RuntimeError(f"no successful streamed requests: {s['errors']}")
    return {"tok_s": s["decode_tok_s"]["median"], "accept_length": s["accept_length_responses"],
            "ttft_ms_median": s["ttft_ms"]["median"], "failed": s["failed"]}


def measure_engine(args) -> dict:
    from benchmarks import engine_speed
    from engine.decoder import SpecConfig
    from engine.loading import NativeEngineArgs, load_models, load_tokenizer

    spec = SpecConfig(args.steps, args.topk, args.draft_tokens if args.topk > 1 else 0) if args.steps else None
    target, drafter, device = load_models(NativeEngineArgs(model=args.model, draft=args.draft, spec=spec,
                                                           device=args.device, dtype=args.dtype))
    # The HTTP run used prompt 0 as its warm-up and measured 1..N: measure the same ones here.
    tok = load_tokenizer(args.model)
    prompts = engine_speed.load_prompts(args.prompts, tok, args.num_prompts + 1)[1:]
    r = engine_speed.measure(target, drafter, spec, prompts, args.max_tokens, 1, args.max_context,
                             compile=args.compile, overlap=args.overlap,
                             stop_ids=engine_speed.stop_ids_for(args, target, tok))
    return {"tok_s": r["tok_per_s"], "accept_length": r["accept_length"] if spec else None, "device": str(device)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="shipped/target")
    ap.add_argument("--draft", default="shipped/drafter")
    ap.add_argument("--steps", type=int, default=3, help="0: no speculation")
    ap.add_argument("--topk", type=int, default=1)
    ap.add_argument("--draft-tokens", type=int, default=0)
    from benchmarks import engine_speed  # torch only when measuring
    engine_speed.add_measure_args(ap)
    ap.add_argument("--server-cmd", default=SERVER_CMD)
    ap.add_argument("--baseline-cmd", default=BASELINE_CMD)
    ap.add_argument("--server-timeout", type=float, default=300.0)
    ap.add_argument("--rounds", type=int, default=1, help="alternate HTTP and in-process runs; median ratio")
    ap.add_argument("--name", help="output stem (default http-overhead-steps<S>)")
    ap.add_argument("--out-dir", default=str(RESULTS_DIR))
    args = ap.parse_args(argv)
    args.name = args.name or f"http-overhead-steps{args.steps}"
    if args.prompts is None and HELDOUT.is_file():
        args.prompts = str(HELDOUT)

    rounds = []
    for _ in range(args.rounds):
        http, engine = measure_http(args), measure_engine(args)
        rounds.append({"http": http, "engine": engine, "ratio": http["tok_s"] / engine["tok_s"]})
    mid = sorted(rounds, key=lambda r: r["ratio"])[len(rounds) // 2]  # the median round
    http, engine, ratio = mid["http"], mid["engine"], mid["ratio"]
    result = {"name": args.name, "model": args.model, "draft": args.draft if args.steps else None,
              "steps": args.steps, "topk": args.topk, "num_prompts": args.num_prompts, "max_tokens": args.max_tokens,
              "http": http, "engine": engine, "ratio": ratio, "rounds": rounds, "target_ratio": TARGET_RATIO,
              "meets_target": ratio >= TARGET_RATIO, "provenance": provenance(argv)}
    out = Path(args.out_dir)
    write_json(out / f"{args.name}.json", result)
    md = (f"# HTTP front-end overhead: {args.name}\n\n`{result['provenance']['command']}`\n\n"
          + md_table(["round", "engine in-process tok/s", "HTTP streaming tok/s", "HTTP / engine",
                      "accept length (engine / HTTP)"],
                     [[i + 1, r["engine"]["tok_s"], r["http"]["tok_s"], r["ratio"],
                       " / ".join(f"{a:.2f}" if a else "-" for a in (r["engine"]["accept_length"],
                                                                      r["http"]["accept_length"]))]
                      for i, r in enumerate(rounds)])
          + f"\nHTTP / engine = **{ratio:.3f}** (median of {len(rounds)} alternating rounds; target >= "
            f"{TARGET_RATIO}: {'met' if result['meets_target'] else 'NOT met'}).\n")
    (out / f"{args.name}.md").write_text(md)
    print(md)
    return result


if __name__ == "__main__":
    main()
