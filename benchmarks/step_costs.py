"""What each part of a speculative cycle costs on this device: input for benchmarks/cost_model.py.

A greedy chain cycle with S steps (engine/greedy_cycle.py) is: S-1 one-token drafter steps,
one target verify of S+1 tokens, one drafter extend over S+1 tokens, and glue (argmax,
acceptance, state updates, the host's one read per step). This measures, at a fixed
context length:
  verify_ms[n]   target forward of n tokens over the cache (n = 1..16), incl. its masks
  draft_step_ms  drafter forward of one token
  extend_ms[n]   drafter forward of n tokens from target aux states
  decode_ms      one plain engine step (no speculation), host loop included: the baseline
  cycle_ms[S]    one whole engine chain step, host loop included (its shapes are fixed, so
                 its cost does not depend on acceptance: random drafters are fine)
                 Both engine steps run as the loop runs them: launched ahead of the host's read.
  overhead_ms    cycle_ms[S0] minus its parts (S0 = --ref-steps), the model's constant
On GPU each part is captured as a CUDA graph and replayed (as the engine runs it); on CPU it
runs eagerly. Cache writes land beyond the committed length, so repeated runs are harmless.

  python -m benchmarks.step_costs --model shipped/target --draft shipped/drafter --name embedded
  python -m benchmarks.step_costs --shape 8b --name llama8b     # random 8B target + matching drafter
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.report import md_table, provenance, pyplot, save_figure, write_result
from benchmarks.shapes import random_pair
from benchmarks.timing import time_ms
from engine.decoder import BatchDecoder, SpecConfig
from engine.loading import NativeEngineArgs, load_models
from engine.masks import block_inputs, causal, one_token_inputs
from engine.sampling import BatchSampling
from models.layers import Attention, Linear

PROJECT_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = PROJECT_ROOT / "benchmarks" / "results" / "costs"
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


def markdown(r: dict) -> str:
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


def plot(r: dict, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    n = list(r["verify_ms"])
    ax.plot(n, [r["verify_ms"][k] for k in n], "o-", label="target verify (n tokens)")
    ax.plot(n, [r["extend_ms"][k] for k in n], "s-", label="drafter extend (n tokens)")
    ax.axhline(r["decode_ms"], ls="--", color="gray", label="plain engine decode step")
    ax.axhline(r["draft_step_ms"], ls=":", color="tab:red", label="drafter one-token step")
    ax.set_xlabel("tokens in the forward")
    ax.set_ylabel("ms")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Step costs: {r['name']} ({r['device']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
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
    ap.add_argument("--out-dir", default=str(RESULTS_DIR))
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
    write_result(Path(args.out_dir) / f"{r['name']}.json", r, markdown(r), plot)
    return r


if __name__ == "__main__":
    main()
