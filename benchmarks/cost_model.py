"""Predict speculative decoding speed from measured parts: is a target worth speculating on?

For a greedy chain with S steps (engine/greedy_cycle.py):

  cycle(S) = c_verify(S+1) + (S-1) * c_draft_step + c_extend(S+1) + c_overhead
  tok/s(S) = a(S) / cycle(S)        speedup(S) = a(S) * c_decode / cycle(S)

where a(S) = decode tokens per verify step at S steps (the accept length without the prefill
token), c_decode = one plain decode step, and the costs come from benchmarks/step_costs.py.
Replies of T decode tokens (the sweep's decode_tokens_per_reply, or --reply-tokens) also pay
the one step the engine launches ahead of each reply's end, plain or speculative: T + 1 decode
steps against T / a(S) + 1 cycles, so both formulas above gain the factor (T + 1) / (T + a(S))
for speedup and T / (T + a(S)) for tok/s (1 as T grows).
Two cost sources are reported side by side: "parts" (the sum above, c_overhead fitted once at
a reference S) and "cycle" (the engine's whole chain step timed at each S; its shapes are
fixed, so it does not depend on acceptance and can be timed with any drafter).
--validate checks the model against a step sweep (benchmarks/batch_sweep.py, at its smallest
concurrency) of the same pair on the same device (predicted vs measured speedup per S);
--predict applies the pair's acceptance curve to another target's costs (e.g. the 8B shape)
and labels the result a PREDICTION: acceptance of a real 8B pair differs, the cost side is
what it estimates.

  python -m benchmarks.cost_model --sweep benchmarks/results/step_sweep/gpu-native.json \
      --validate benchmarks/results/costs/embedded.json --predict benchmarks/results/costs/llama8b.json
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from benchmarks.report import md_table, provenance, pyplot, save_figure, write_result

PROJECT_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = PROJECT_ROOT / "benchmarks" / "results" / "cost_model"
TOLERANCE = 0.10  # the bar: prediction within 10% of the measured speedup


@dataclass
class Costs:
    name: str
    verify_ms: dict[int, float]
    draft_step_ms: float
    extend_ms: dict[int, float]
    decode_ms: float
    overhead_ms: float
    measured_cycle_ms: dict[int, float] | None = None
    device: str = ""
    compiled: bool = False  # engine steps compiled; the parts (verify, drafter) were not: use the cycle

    @classmethod
    def load(cls, path: str | Path) -> "Costs":
        d = json.loads(Path(path).read_text())
        ints = lambda m: {int(k): float(v) for k, v in (m or {}).items()}  # noqa: E731 (JSON keys are strings)
        return cls(name=d.get("name", Path(path).stem), verify_ms=ints(d["verify_ms"]),
                   draft_step_ms=d["draft_step_ms"], extend_ms=ints(d["extend_ms"]), decode_ms=d["decode_ms"],
                   overhead_ms=d["overhead_ms"], measured_cycle_ms=ints(d.get("cycle_ms")) or None,
                   device=d.get("device", ""), compiled=d.get("compile", False))

    def sources(self) -> list[str]:
        """The cost sources that describe these costs: the parts only where they ran as the steps did."""
        return ([] if self.compiled else ["parts"]) + (["cycle"] if self.measured_cycle_ms else [])

    def cycle_ms(self, steps: int, source: str = "parts") -> float | None:
        if source == "cycle":
            return (self.measured_cycle_ms or {}).get(steps)
        n = steps + 1
        if n not in self.verify_ms or n not in self.extend_ms:
            return None
        return self.verify_ms[n] + (steps - 1) * self.draft_step_ms + self.extend_ms[n] + self.overhead_ms


def batch_one(sweep: dict) -> dict:
    """A step sweep in the model's terms (batch 1, a row per setting). benchmarks/batch_sweep.py
    rows (one per setting and concurrency) become those of its smallest concurrency, with the
    summed decode rate as tok_s (decode_tok_s: every reply's tokens after its first over its
    seconds after it, the rate a(S) / cycle(S) predicts, a(S) being such a sum too). A sweep
    with only the median reply's rate (no decode_tok_s) passes as it is; that rate is not the
    summed one where acceptance varies from reply to reply."""
    rows = sweep["rows"]
    if not rows or "concurrency" not in rows[0]:
        return sweep
    c = min(r["concurrency"] for r in rows)
    rate, ratio = ("decode_tok_s", "x_plain_decode") if "decode_tok_s" in rows[0] else \
        ("request_tok_s", "x_plain_request")
    return {**sweep, "rows": [{**r, "topk": r.get("topk", 1 if r["steps"] else 0), "tok_s": r[rate],
                               "speedup": r[ratio]} for r in rows if r["concurrency"] == c]}


def acceptance_curve(sweep: dict) -> dict[int, float]:
    """Decode tokens per verify step for each chain step count of a step sweep."""
    out = {}
    for r in sweep["rows"]:
        if r["steps"] and r["topk"] == 1:
            a = r.get("tokens_per_step") or r.get("accept_length")
            if a:
                out[r["steps"]] = float(a)
    return out


def reply_tokens(sweep: dict) -> float | None:
    """Decode tokens per reply of the sweep's baseline (the same for every setting: greedy is lossless)."""
    return next((r.get("decode_tokens_per_reply") for r in sweep["rows"] if r["steps"] == 0), None)


def predict(costs: Costs, accept: dict[int, float], source: str = "parts", reply: float | None = None) -> list[dict]:
    rows = []
    for s, a in sorted(accept.items()):
        cyc = costs.cycle_ms(s, source)
        if cyc is None or cyc <= 0:  # not measured (or noise made the parts sum meaningless)
            continue
        tail_tok, tail_speedup = (reply / (reply + a), (reply + 1) / (reply + a)) if reply else (1.0, 1.0)
        rows.append({"steps": s, "accept": a, "cycle_ms": cyc, "tok_s": 1000.0 * a / cyc * tail_tok,
                     "speedup": a * costs.decode_ms / cyc * tail_speedup})
    return rows


def validate(costs: Costs, sweep: dict, source: str = "parts", reply: float | None = None) -> dict:
    pred = {r["steps"]: r for r in predict(costs, acceptance_curve(sweep), source, reply)}
    rows = []
    for r in sweep["rows"]:
        if r["steps"] in pred and r["topk"] == 1 and r.get("speedup"):
            p = pred[r["steps"]]
            rows.append({"steps": r["steps"], "accept": p["accept"], "measured_speedup": r["speedup"],
                         "predicted_speedup": p["speedup"], "measured_tok_s": r["tok_s"],
                         "predicted_tok_s": p["tok_s"],
                         "error_pct": 100.0 * (p["speedup"] - r["speedup"]) / r["speedup"]})
    worst = max((abs(r["error_pct"]) for r in rows), default=None)
    return {"costs": costs.name, "source": source, "reply_tokens": reply, "rows": rows, "max_abs_error_pct": worst,
            "within_tolerance": worst is not None and worst <= 100 * TOLERANCE}


def markdown(result: dict) -> str:
    out = [f"# Cost model: {result['name']}\n\n`{result['provenance']['command']}`\n\n",
           "parts: cycle(S) = c_verify(S+1) + (S-1)·c_draft_step + c_extend(S+1) + c_overhead; "
           "cycle: the engine's whole chain step timed at S. speedup(S) = a(S)·c_decode / cycle(S)"
           + (f" · (T+1)/(T+a(S)), replies of T = {result['reply_tokens']:.1f} decode tokens (each also pays the "
              "step launched ahead of its end)" if result.get("reply_tokens") else "")
           + f"\n\nAcceptance curve a(S) from `{result['sweep']}`.\n"]
    for v in result.get("validations", []):
        tail = f", replies of {v['reply_tokens']:.1f} decode tokens" if v.get("reply_tokens") else ""
        out.append(f"\n## Validation against measured end-to-end speedup ({v['costs']}, cost source: "
                   f"{v['source']}{tail})\n\n")
        out.append(md_table(["steps", "a(S)", "measured speedup", "predicted speedup", "error %",
                             "measured tok/s", "predicted tok/s"],
                            [[r["steps"], r["accept"], r["measured_speedup"], r["predicted_speedup"], r["error_pct"],
                              r["measured_tok_s"], r["predicted_tok_s"]] for r in v["rows"]]))
        if v["max_abs_error_pct"] is not None:
            out.append(f"\nMax |error| {v['max_abs_error_pct']:.1f}% "
                       f"({'within' if v['within_tolerance'] else 'NOT within'} {100 * TOLERANCE:.0f}%).\n")
    for p in result.get("predictions", []):
        best = max(p["rows"], key=lambda r: r["speedup"]) if p["rows"] else None
        out.append(f"\n## PREDICTION for {p['costs']} ({p['device']}, cost source: {p['source']}): costs "
                   f"measured, acceptance borrowed from the embedded pair\n\n")
        out.append(md_table(["steps", "a(S) (borrowed)", "cycle ms", "predicted tok/s", "predicted speedup"],
                            [[r["steps"], r["accept"], r["cycle_ms"], r["tok_s"], r["speedup"]] for r in p["rows"]]))
        if best:
            out.append(f"\nPREDICTED best: {best['steps']} steps, {best['speedup']:.2f}x over plain decode "
                       f"({p['decode_ms']:.2f} ms/token). A prediction, not a measurement.\n")
    return "".join(out)


def plot(result: dict, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    measured_done = False
    for v in result.get("validations", []):
        if not v["rows"]:
            continue
        s = [r["steps"] for r in v["rows"]]
        if not measured_done:
            ax.plot(s, [r["measured_speedup"] for r in v["rows"]], "o-", color="black",
                    label=f"measured ({v['costs']})")
            measured_done = True
        ax.plot(s, [r["predicted_speedup"] for r in v["rows"]], "x--",
                label=f"model, {v['source']} ({v['costs']}), max err {v['max_abs_error_pct']:.0f}%")
    for p in result.get("predictions", []):
        ax.plot([r["steps"] for r in p["rows"]], [r["speedup"] for r in p["rows"]], "d:",
                label=f"PREDICTION: {p['costs']} ({p['source']})")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("speculative steps (chain)")
    ax.set_ylabel("speedup over plain decode")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title("Cost model: measured vs predicted speedup")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", required=True, help="batch_sweep JSON: the acceptance curve (and measured speedups)")
    ap.add_argument("--validate", metavar="COSTS", help="step_costs JSON of the SAME pair and device as --sweep")
    ap.add_argument("--predict", metavar="COSTS", action="append", default=[],
                    help="step_costs JSON of another target (repeatable)")
    ap.add_argument("--reply-tokens", type=float,
                    help="decode tokens per reply when the sweep does not record them (0: endless replies)")
    ap.add_argument("--name", help="output stem (default: the sweep's name)")
    ap.add_argument("--out-dir", default=str(RESULTS_DIR))
    args = ap.parse_args(argv)
    if not args.validate and not args.predict:
        ap.error("give --validate COSTS and/or --predict COSTS")
    sweep = batch_one(json.loads(Path(args.sweep).read_text()))
    accept = acceptance_curve(sweep)
    reply = reply_tokens(sweep) if args.reply_tokens is None else args.reply_tokens or None
    result = {"name": args.name or sweep.get("name", Path(args.sweep).stem), "sweep": args.sweep,
              "acceptance": accept, "reply_tokens": reply, "tolerance_pct": 100 * TOLERANCE}
    result["validations"], result["predictions"] = [], []
    if args.validate:
        c = Costs.load(args.validate)
        result["validations"] = [validate(c, sweep, src, reply) for src in c.sources()]
    for path in args.predict:
        c = Costs.load(path)
        for src in c.sources():
            rows = predict(c, accept, src, reply)
            if rows:
                result["predictions"].append({"label": "PREDICTION", "costs": c.name, "device": c.device,
                                              "source": src, "decode_ms": c.decode_ms, "rows": rows})
    result["provenance"] = provenance(argv)
    write_result(Path(args.out_dir) / f"{result['name']}.json", result, markdown(result), plot)
    return result


if __name__ == "__main__":
    main()
