"""What each part of a speculative cycle costs on this device (`measure`), and the speed those
costs predict (`model`): is a target worth speculating on?

`measure`: a greedy chain cycle with S steps (engine/greedy_cycle.py) is S-1 one-token drafter
steps, one target verify of S+1 tokens, one drafter extend over S+1 tokens, and glue (argmax,
acceptance, state updates, the host's read). At a fixed context this times
  verify_ms[n]   target forward of n tokens over the cache (n = 1..16), incl. its masks
  draft_step_ms  drafter forward of one token
  extend_ms[n]   drafter forward of n tokens from target aux states
  decode_ms      one plain engine step, host loop included: the baseline
  cycle_ms[S]    one whole engine chain step, host loop included (its shapes are fixed, so its
                 cost does not depend on acceptance: random drafters are fine)
  overhead_ms    cycle_ms[S0] minus its parts (S0 = --ref-steps), the model's constant
Engine steps run as the loop runs them, launched ahead of the host's read. On GPU each part is a
CUDA graph replay; on CPU it runs eagerly. Cache writes land beyond the committed length.

`model`:
  cycle(S) = c_verify(S+1) + (S-1) * c_draft_step + c_extend(S+1) + c_overhead
  tok/s(S) = a(S) / cycle(S)        speedup(S) = a(S) * c_decode / cycle(S)
where a(S) = decode tokens per verify step at S steps (the accept length without the prefill
token). Replies of T decode tokens (the sweep's decode_tokens_per_reply, or --reply-tokens) also
pay the step the engine launches ahead of each reply's end: speedup gains (T + 1) / (T + a(S)),
tok/s T / (T + a(S)). Two cost sources side by side: "parts" (the sum above) and "cycle" (the
engine's whole chain step timed at each S). --validate checks the model against a step sweep
(`python -m benchmarks sweep`, at its smallest concurrency) of the same pair on the same device;
--predict applies the pair's acceptance curve to another target's costs (e.g. the 8B shape) and
labels the result a PREDICTION: the cost side is what it estimates.

  python -m benchmarks costs measure --model shipped/target --draft shipped/drafter --name embedded
  python -m benchmarks costs measure --shape 8b --name llama8b     # random 8B target + matching drafter
  python -m benchmarks costs model --sweep runs/sweep.json --validate runs/costs/embedded.json \
      --predict runs/costs/llama8b.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.report import md_table, provenance, write_result
from benchmarks.shapes import random_pair
from benchmarks.timing import time_ms
from engine.decoder import BatchDecoder, SpecConfig
from engine.loading import NativeEngineArgs, load_models
from engine.masks import block_inputs, causal, one_token_inputs
from engine.sampling import BatchSampling
from models.layers import Attention, Linear

# Engine steps timed back to back in a round, as the loop runs them: timed one at a time with a
# sync each, a 5-step cycle on an H200 cost 7% more than in the loop.
PIPELINE = 8
WARM_ROUNDS = 3  # untimed rounds before loop_step_ms times its own


def engine_step_ms(target, drafter, spec, prompt: list[int], iters: int, max_context: int,
                   compile: bool = False) -> float:
    """One engine step as the decode loop pays it, on a one-row decoder of its own."""
    return loop_step_ms(BatchDecoder(target, drafter, spec, 1, max_context, compile=compile), prompt, iters)


def loop_step_ms(dec: BatchDecoder, prompt: list[int], iters: int) -> float:
    """One step of `dec` at one row as the decode loop pays it (graph replay + host read), at a fixed
    context: rounds of PIPELINE steps, each launched before the previous one is read, as the engine's
    loop does (engine/scheduler.py), so the host's read and launch of a step overlap the device's
    work on the next; a round's time over PIPELINE is a step. Row 0 is prefilled with `prompt`."""
    dec.prefill(0, prompt, BatchSampling.all_greedy_rows(1, dec.device))
    ctx = dec.lens[0]

    def round_():
        dec.lens[0] = ctx  # rewind: every round writes the same positions, its spans do not change
        current = dec.launch(1)
        for _ in range(PIPELINE - 1):
            after = dec.launch(1)
            dec.collect(current)
            current = after
        dec.collect(current)

    for _ in range(WARM_ROUNDS):
        round_()
    times = []
    for _ in range(iters):
        if dec.device.type == "cuda":
            torch.cuda.synchronize(dec.device)
        t0 = time.perf_counter()
        round_()
        times.append((time.perf_counter() - t0) * 1000.0 / PIPELINE)
    return statistics.median(times)


def measure(target, drafter, context: int, max_verify: int, cycle_steps: list[int], ref_steps: int,
            iters: int, max_context: int, compile: bool = False) -> dict:
    dev = target.embed_tokens.weight.device
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.config.vocab_size, (context,), generator=gen).tolist()
    # Component timings over the cache of a spec decoder (its span, as the engine uses it).
    top = max(max(cycle_steps), ref_steps, max_verify)
    dec = BatchDecoder(target, drafter, SpecConfig(top), 1, max_context)
    dec.prefill(0, prompt, BatchSampling.all_greedy_rows(1, dev))
    base = torch.tensor([context], device=dev)
    span = dec._span(1, dec.spec.headroom)
    h = drafter.config.hidden_size
    aux_w = drafter.config.num_aux * drafter.config.target_hidden_size
    dtype = drafter.fc.weight.dtype
    tokens = torch.randint(0, target.config.vocab_size, (1, max_verify + 1), generator=gen).to(dev)
    hidden1 = torch.randn(1, 1, h, generator=gen).to(dev, dtype)
    aux = torch.randn(1, max_verify + 1, aux_w, generator=gen).to(dev, dtype) * 0.1

    def depth(n):
        return torch.arange(n, device=dev).unsqueeze(0)

    verify = {n: time_ms(lambda n=n: target(tokens[:, :n], block_inputs(base, causal(1, n, dev), depth(n), span),
                                            capture_aux=True).logits.argmax(-1), dev, iters)
              for n in range(1, max_verify + 1)}
    draft_step = time_ms(lambda: drafter(tokens[:, :1], hidden1, one_token_inputs(base, span)).logits.argmax(-1),
                         dev, iters)
    extend = {n: time_ms(lambda n=n: drafter(tokens[:, :n], aux[:, :n], block_inputs(
        base, causal(1, n, dev), depth(n), span)).logits, dev, iters) for n in range(1, max_verify + 1)}
    del dec
    decode = engine_step_ms(target, None, None, prompt, iters, max_context, compile)
    cycle = {s: engine_step_ms(target, drafter, SpecConfig(s), prompt, iters, max_context, compile)
             for s in sorted(set(cycle_steps) | {ref_steps}) if s + 1 <= max_verify}
    parts = {s: verify[s + 1] + (s - 1) * draft_step + extend[s + 1] for s in cycle}
    overhead = {s: cycle[s] - parts[s] for s in cycle}
    return {"context": context, "span": span, "verify_ms": verify, "draft_step_ms": draft_step,
            "extend_ms": extend, "decode_ms": decode, "cycle_ms": cycle, "overhead_ms_by_steps": overhead,
            "overhead_ms": overhead[ref_steps], "overhead_ref_steps": ref_steps,
            "verify_vs_decode": {n: v / decode for n, v in verify.items()}}


def load_pair(args):
    if not args.model:
        target, drafter, _ = random_pair(args.shape, args.device, args.dtype)
        return target, drafter, {"shape": args.shape}
    if not args.draft:
        raise SystemExit("--model needs --draft (the drafter whose costs the cycle includes)")
    target, drafter, _ = load_models(NativeEngineArgs(model=args.model, draft=args.draft, spec=SpecConfig(1),
                                                      device=args.device, dtype=args.dtype, gguf_q4=args.gguf_q4))
    return target, drafter, {"model": args.model, "draft": args.draft, **({"gguf_q4": True} if args.gguf_q4 else {})}


def costs_markdown(r: dict) -> str:
    rows = [[n, r["verify_ms"][n], r["verify_vs_decode"][n], r["extend_ms"][n]] for n in r["verify_ms"]]
    cyc = [[s, r["cycle_ms"][s], r["overhead_ms_by_steps"][s]] for s in r["cycle_ms"]]
    return (f"# Step costs: {r['name']}\n\n`{r['provenance']['command']}`\n\n{r['what']}, {r['device']}, "
            f"{r['dtype']}, context {r['context']} (attention span {r['span']}, form {r.get('attention', 'auto')})\n\n"
            + (f"CPU float32 product forms measured in this process: {dict(f['measured'])}; compiled steps: "
               f"{f['compiled']}\n\n" if (f := r.get("cpu_forms")) else "")
            + f"plain decode step (engine, host loop included): **{r['decode_ms']:.3f} ms**; drafter one-token "
            f"step: **{r['draft_step_ms']:.3f} ms**; overhead constant (S={r['overhead_ref_steps']}): "
            f"{r['overhead_ms']:.3f} ms\n\n"
            + md_table(["tokens", "verify ms", "verify / decode step", "drafter extend ms"], rows) + "\n"
            + md_table(["steps", "engine chain step ms", "overhead ms"], cyc))


TOLERANCE = 0.10  # a prediction within 10% of the measured speedup counts as validated


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


def model_markdown(result: dict) -> str:
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


def measure_main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="target checkpoint (with --draft)")
    ap.add_argument("--draft")
    ap.add_argument("--shape", default="8b", choices=["8b", "tiny"], help="random pair when no --model")
    ap.add_argument("--context", type=int, default=160, help="committed tokens in the cache while timing")
    ap.add_argument("--max-verify", type=int, default=16)
    ap.add_argument("--max-context", type=int, default=1024,
                    help="the decoders' context (as batch_sweep uses it: compiled steps attend over all of it)")
    ap.add_argument("--cycle-steps", default="1,2,3,4,5,6,8,10", help="engine chain steps to time whole")
    ap.add_argument("--ref-steps", type=int, default=3, help="the cycle the overhead constant comes from")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--compile", action="store_true",
                    help="engine steps (decode_ms, cycle_ms) with torch.compile, as the engine runs them; "
                         "the parts stay graph-captured eager")
    ap.add_argument("--attention", default=Attention.form, choices=Attention.FORMS,
                    help="the attention form of every step (models.layers.Attention.form), to time them side by "
                         "side: auto writes it out in compiled CUDA steps, sdpa never, written_out always")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--gguf-q4", action="store_true",
                    help="keep a GGUF's 4-bit projections 4-bit (CPU; as the cpu-fast profile serves)")
    ap.add_argument("--name", help="output stem (default: model directory name or shape)")
    ap.add_argument("--out-dir", default="runs/costs")
    args = ap.parse_args(argv)
    if args.ref_steps + 1 > args.max_verify:  # the overhead constant needs the verify of S + 1 tokens
        ap.error(f"--ref-steps {args.ref_steps} needs --max-verify >= {args.ref_steps + 1}")
    Attention.form = args.attention
    target, drafter, what = load_pair(args)
    with torch.inference_mode():
        r = measure(target, drafter, args.context, args.max_verify,
                    [int(s) for s in args.cycle_steps.split(",")], args.ref_steps, args.iters,
                    args.max_context, args.compile)
    dev = target.embed_tokens.weight.device
    r = {"name": args.name or (Path(args.model).name if args.model else args.shape),
         "what": ", ".join(f"{k} {v}" for k, v in what.items()), **what,
         "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
         "dtype": str(target.embed_tokens.weight.dtype).removeprefix("torch."),
         "graphs": dev.type == "cuda", "compile": args.compile, "attention": args.attention, **r,
         "provenance": provenance(argv)}
    if dev.type == "cpu" and target.embed_tokens.weight.dtype == torch.float32:  # measured here; they move CPU times
        r["cpu_forms"] = {"measured": Linear.cpu_forms.measured, "compiled": Linear.cpu_forms.compiled}
    write_result(Path(args.out_dir) / f"{r['name']}.json", r, costs_markdown(r))
    return r



def model_main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", required=True, help="batch_sweep JSON: the acceptance curve (and measured speedups)")
    ap.add_argument("--validate", metavar="COSTS", help="step_costs JSON of the SAME pair and device as --sweep")
    ap.add_argument("--predict", metavar="COSTS", action="append", default=[],
                    help="step_costs JSON of another target (repeatable)")
    ap.add_argument("--reply-tokens", type=float,
                    help="decode tokens per reply when the sweep does not record them (0: endless replies)")
    ap.add_argument("--name", help="output stem (default: the sweep's name)")
    ap.add_argument("--out-dir", default="runs/cost_model")
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
    write_result(Path(args.out_dir) / f"{result['name']}.json", result, model_markdown(result))
    return result


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("measure", "model"):
        raise SystemExit("usage: python -m benchmarks costs measure|model ARGS (--help after either)")
    return (measure_main if argv[0] == "measure" else model_main)(argv[1:])
