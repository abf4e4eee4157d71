"""Which speculative setting is fastest for a target + drafter pair on this machine?

Measures the same prompts with no speculation, chains of 1..N steps (topk 1) and a few
trees (steps/topk/draft tokens), side by side in one run, and records tok/s, accept length
and speedup over the baseline. The fastest row becomes the "best" record that
`launch/serve.sh --steps auto` reads back through `best_steps(profile)`.

Each reply ends at the target's EOS, as a server ends it (greedy decoding is lossless, so
every setting decodes the same tokens); --ignore-eos decodes max_tokens whatever the target
emits, which past its end-of-turn token measures text the drafter never trained on.
In-process (default) it reuses benchmarks/engine_speed.py (batch 1, greedy). With --http it
starts one server per setting from a command template and measures over the OpenAI API
with benchmarks/serving.py (concurrency 1), so the HTTP path is what gets chosen.

  python -m benchmarks.step_sweep --profile h200-native --model shipped/target --draft shipped/drafter
Writes benchmarks/results/step_sweep/<profile>.json, .md and .png.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.report import md_table, provenance, pyplot, save_figure, write_json

PROJECT_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = PROJECT_ROOT / "benchmarks" / "results" / "step_sweep"
HELDOUT = PROJECT_ROOT / "shipped" / "data" / "heldout_prompts.jsonl"
DEFAULT_TREES = "3:2:4,3:2:8,4:2:8,4:4:8,4:4:16,5:4:16"
SERVER_CMD = (f"{sys.executable} -m server --model {{model}} --draft {{draft}} --steps {{steps}} --topk {{topk}} "
              f"--draft-tokens {{draft_tokens}} --port {{port}}")
BASELINE_CMD = f"{sys.executable} -m server --model {{model}} --port {{port}}"


@dataclass(frozen=True)
class Setting:
    steps: int              # 0: no speculation
    topk: int = 1
    draft_tokens: int = 0   # chain: steps + 1

    @property
    def label(self) -> str:
        if self.steps == 0:
            return "baseline"
        return f"chain {self.steps}" if self.topk == 1 else f"tree {self.steps}/{self.topk}/{self.draft_tokens}"

    def record(self) -> dict:
        dt = self.draft_tokens or (self.steps + 1 if self.steps else 0)
        return {"steps": self.steps, "topk": self.topk if self.steps else 0, "draft_tokens": dt}


def settings(chain_steps: list[int], trees: str) -> list[Setting]:
    out = [Setting(0)] + [Setting(s) for s in chain_steps]
    for t in filter(None, trees.split(",")):
        s, k, n = (int(x) for x in t.split(":"))
        out.append(Setting(s, k, n))
    return out


# -- the choice, as launch reads it -----------------------------------------------------------
def best_steps(profile_name: str, results_dir: Path = RESULTS_DIR) -> dict | None:
    """The latest sweep's best setting for a profile, or None when there is no usable sweep.

    Returns {"steps", "topk", "draft_tokens", "tok_s", "speedup", "accept_length", "setting",
    "source"}; steps 0 means speculation did not beat the baseline on that machine.
    """
    path = Path(results_dir) / f"{profile_name}.json"
    try:
        best = json.loads(path.read_text())["best"]
        int(best["steps"]), int(best["topk"]), int(best["draft_tokens"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {**best, "source": str(path)}


def pick_best(rows: list[dict]) -> dict | None:
    ok = [r for r in rows if r.get("tok_s")]
    if not ok:
        return None
    b = max(ok, key=lambda r: r["tok_s"])
    return {k: b.get(k) for k in ("steps", "topk", "draft_tokens", "tok_s", "speedup", "accept_length", "setting")}


# -- measuring ------------------------------------------------------------------------------
def sweep_in_process(args, grid: list[Setting]) -> tuple[list[dict], dict]:
    from benchmarks import engine_speed
    from engine.decoder import SpecConfig
    from engine.loading import NativeEngineArgs, load_models, load_tokenizer

    spec_any = SpecConfig(max(s.steps for s in grid)) if any(s.steps for s in grid) else None
    target, drafter, device = load_models(NativeEngineArgs(model=args.model, draft=args.draft, spec=spec_any,
                                                           device=args.device, dtype=args.dtype))
    tok = load_tokenizer(args.model)
    prompts = engine_speed.load_prompts(args.prompts, tok, args.num_prompts)
    stop_ids = engine_speed.stop_ids_for(args, target, tok)
    rows = []
    for s in grid:
        spec = SpecConfig(s.steps, s.topk, s.draft_tokens if s.topk > 1 else 0) if s.steps else None
        r = engine_speed.measure(target, drafter, spec, prompts, args.max_tokens, args.repeats, args.max_context,
                                 compile=args.compile, overlap=args.overlap, stop_ids=stop_ids)
        acc, per_step = (r["accept_length"], r["tokens_per_step"]) if s.steps else (1.0, 1.0)
        rows.append({"setting": s.label, **s.record(), "tok_s": r["tok_per_s"], "accept_length": acc,
                     "tokens_per_step": per_step, "decode_tokens_per_reply": r["decode_tokens_per_reply"]})
        print(f"{s.label:>16} {r['tok_per_s']:9.1f} tok/s  accept {acc:.2f}", flush=True)
    env = {"device": str(device), "dtype": str(target.embed_tokens.weight.dtype).removeprefix("torch."),
           "compile": args.compile}
    return rows, env


def server_command(args, speculative: bool) -> str:
    """The server command template for a setting, with the context and compile setting the
    in-process measurement uses (compiled steps attend over the whole context)."""
    return ((args.server_cmd if speculative else args.baseline_cmd) + f" --max-context {args.max_context}"
            + (" --compile" if args.compile else ""))


def sweep_http(args, grid: list[Setting]) -> tuple[list[dict], dict]:
    from benchmarks import serving
    from benchmarks.server_proc import running_server

    prompts = serving.load_prompts(args.prompts, args.num_prompts + 1)
    log = Path(args.out_dir) / f"{args.name}-servers.log"
    rows = []
    for s in grid:
        template = server_command(args, speculative=s.steps > 0)
        try:
            with running_server(template, {"model": args.model, "draft": args.draft, **s.record()}, log,
                                args.server_timeout) as base:
                cfg = serving.BenchConfig(base_url=base, model=None, max_concurrency=1, request_rate=float("inf"),
                                          num_prompts=args.num_prompts, max_tokens=args.max_tokens,
                                          temperature=0.0, ignore_eos=args.ignore_eos, seed=0, timeout_s=600.0)
                res = asyncio.run(serving.run_benchmark(cfg, prompts[1:], warmup=prompts[:1]))["summary"]
        except (RuntimeError, TimeoutError) as e:
            rows.append({"setting": s.label, **s.record(), "tok_s": None, "accept_length": None, "error": str(e)})
            print(f"{s.label:>16} failed: {e} (see {log})", flush=True)
            continue
        dec = res["decode_tok_s"]
        acc = res["accept_length_responses"] if s.steps else 1.0
        rows.append({"setting": s.label, **s.record(), "tok_s": dec["median"] if dec else None,
                     "accept_length": acc, "tokens_per_step": None, "output_throughput": res["output_throughput"],
                     "failed": res["failed"]})
        print(f"{s.label:>16} {rows[-1]['tok_s'] or 0:9.1f} tok/s  accept {acc or 0:.2f}", flush=True)
    return rows, {"mode": "http"}


# -- output ---------------------------------------------------------------------------------
def with_speedup(rows: list[dict]) -> list[dict]:
    base = next((r["tok_s"] for r in rows if r["steps"] == 0 and r.get("tok_s")), None)
    for r in rows:
        r["speedup"] = r["tok_s"] / base if base and r.get("tok_s") else None
    return rows


def markdown(result: dict) -> str:
    rows = [[r["setting"], r["steps"], r["topk"], r["draft_tokens"], r.get("tok_s"), r.get("accept_length"),
             f"{r['speedup']:.2f}x" if r.get("speedup") else None] for r in result["rows"]]
    b = result["best"]
    best = (f"\nBest: **{b['setting']}** (steps {b['steps']}, topk {b['topk']}, draft tokens {b['draft_tokens']}) "
            f"at {b['tok_s']:.1f} tok/s.\n") if b else "\nNo setting succeeded.\n"
    return (f"# Step sweep: {result['name']}\n\n`{result['provenance']['command']}`\n\n"
            f"model {result['model']}, draft {result['draft']}, {result['env']}\n\n"
            + md_table(["setting", "steps", "topk", "draft tokens", "tok/s", "accept length", "speedup"], rows) + best)


def plot(result: dict, path: Path) -> Path:
    plt = pyplot()
    rows = [r for r in result["rows"] if r.get("tok_s")]
    chain = [r for r in rows if r["steps"] and r["topk"] == 1]
    trees = [r for r in rows if r["topk"] > 1]
    base = next((r for r in rows if r["steps"] == 0), None)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot([r["steps"] for r in chain], [r["tok_s"] for r in chain], "o-", label="chain (topk 1) tok/s")
    for r in trees:
        ax.plot(r["steps"], r["tok_s"], "s", color="tab:green")
        ax.annotate(f"k{r['topk']}/n{r['draft_tokens']}", (r["steps"], r["tok_s"]), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    if trees:
        ax.plot([], [], "s", color="tab:green", label="tree tok/s (topk/draft tokens)")
    if base:
        ax.axhline(base["tok_s"], ls="--", color="gray", label="no speculation")
    ax.set_xlabel("speculative steps")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("tok/s (batch 1)")
    ax2 = ax.twinx()
    ax2.plot([r["steps"] for r in chain], [r["accept_length"] for r in chain], "^:", color="tab:red",
             label="accept length (chain)")
    ax2.set_ylabel("accept length")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="lower right")
    ax.set_title(f"Step sweep: {result['name']} (best: {(result['best'] or {}).get('setting')})")
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", help="profile name the result is filed under (what --steps auto looks up)")
    ap.add_argument("--name", help="result name when not for a profile (default: the model directory name)")
    ap.add_argument("--model", default="shipped/target")
    ap.add_argument("--draft", default="shipped/drafter")
    ap.add_argument("--max-steps", type=int, default=10, help="chains of 1..N steps")
    ap.add_argument("--steps", help="chain step counts instead, e.g. 3,5 (compiled settings take minutes each)")
    ap.add_argument("--trees", default=DEFAULT_TREES, help="steps:topk:draft_tokens,... ('' for none)")
    from benchmarks import engine_speed  # torch only when measuring
    engine_speed.add_measure_args(ap)
    ap.add_argument("--http", action="store_true", help="measure over HTTP, one server per setting")
    ap.add_argument("--server-cmd", default=SERVER_CMD, help="template: {model} {draft} {steps} {topk} "
                    "{draft_tokens} {port}")
    ap.add_argument("--baseline-cmd", default=BASELINE_CMD)
    ap.add_argument("--server-timeout", type=float, default=300.0)
    ap.add_argument("--out-dir", default=str(RESULTS_DIR))
    args = ap.parse_args(argv)
    args.name = args.profile or args.name or Path(args.model).name
    if args.prompts is None and HELDOUT.is_file():
        args.prompts = str(HELDOUT)
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)

    chains = [int(n) for n in args.steps.split(",")] if args.steps else list(range(1, args.max_steps + 1))
    grid = settings(chains, args.trees)
    rows, env = (sweep_http if args.http else sweep_in_process)(args, grid)
    rows = with_speedup(rows)
    result = {"name": args.name, "profile": args.profile, "model": args.model, "draft": args.draft,
              "mode": "http" if args.http else "in-process", "env": env,
              "settings": {k: getattr(args, k) for k in ("num_prompts", "max_tokens", "repeats", "prompts", "compile",
                                                     "overlap", "ignore_eos")},
              "rows": rows, "best": pick_best(rows), "provenance": provenance(argv)}
    out = Path(args.out_dir)
    paths = [write_json(out / f"{args.name}.json", result)]
    (out / f"{args.name}.md").write_text(markdown(result))
    paths += [out / f"{args.name}.md", plot(result, out / f"{args.name}.png")]
    print(markdown(result))
    print("wrote " + ", ".join(str(p) for p in paths))
    return result


if __name__ == "__main__":
    main()
