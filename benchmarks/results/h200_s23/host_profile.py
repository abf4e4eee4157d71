"""Where the engine thread's host time goes at one concurrency, for plain decoding, a chain and the
speculative engine at 0 steps, served as benchmarks/batch_sweep.py serves them (engine_load).

Session 22's sweep found the speculative engine below plain decoding at 16-32 requests on the H200
with the host as the bound, and session 23's call 3 split the loop into phases: at 16 requests a
chain spends 2.3 ms per step admitting requests (plain decoding 0.25), and 0 steps spends 3x plain's
time launching. This times and counts the decoder's host-side entry points during the same load
(each call's wall time on the engine thread: a device sync inside one counts to it), then serves
the load once more under cProfile and prints the engine thread's top functions.

  python benchmarks/results/h200_s23/host_profile.py --model runs/smollm2/target \\
      --draft shipped/smollm2/drafter --concurrency 16 --prefill-graphs --out $OUT/profile
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import dataclasses
import io
import json
import pstats
import time
from pathlib import Path

from benchmarks import batch_sweep
from benchmarks.engine_load import run_load
from engine.config import SpecConfig
from models.layers import own_cache_copy

TIMED = ("prefill_rows", "prefill_shared", "_catch_up", "launch", "collect", "move_row")


def time_decoder(dec, spent: collections.Counter, calls: collections.Counter) -> None:
    """Wrap the decoder's entry points on the instance: seconds and calls per name (prefills by size).
    A timed call made inside another (prefill_shared replaying through prefill_rows) counts to the
    outer one only, so no second is counted twice."""
    depth = [0]
    for name in TIMED:
        fn = getattr(dec, name)

        def timed(*a, _fn=fn, _name=name, **k):
            if depth[0]:
                return _fn(*a, **k)
            key = _name
            if _name == "prefill_rows":
                key += " n=1" if len(a[1]) == 1 else " n>1"
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                depth[0] -= 1
                spent[key] += time.perf_counter() - t0
                calls[key] += 1
        setattr(dec, name, timed)


def profile_loop(engine, prof: cProfile.Profile, on: list[bool]) -> None:
    """cProfile runs in the thread that enables it: switch it on and off from the engine thread's
    own calls (its loop calls _admit every iteration)."""
    admit = engine._admit

    def wrapped():
        if on[0] and not on[1]:
            prof.enable()
            on[1] = True
        elif not on[0] and on[1]:
            prof.disable()
            on[1] = False
        admit()
    engine._admit = wrapped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--prefill-graphs", action="store_true")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--out", required=True, help="folder for profile.json and cprofile.txt")
    a = ap.parse_args()
    c = a.concurrency
    out = Path(a.out)
    args = batch_sweep.parse_args(   # the sweep's own settings for this load (its --out is never written)
        ["--model", a.model, "--draft", a.draft, "--steps", str(a.steps), "--concurrency", str(c),
         "--num-prompts", str(c), "--rounds", str(a.rounds), "--max-tokens", str(a.max_tokens), "--device", a.device,
         "--dtype", a.dtype, "--out", str(out / "unused.json")]
        + ["--compile"] * a.compile + ["--prefill-graphs"] * a.prefill_graphs)
    loaded, prompts = batch_sweep.load(args)
    batch = [prompts[i % len(prompts)] for i in range(a.rounds * c)]
    out.mkdir(parents=True, exist_ok=True)
    report = {"command": vars(a), "settings": {}}
    profiles = []
    settings = [("plain", None), (f"chain {a.steps}", ((c, a.steps),)), ("0 steps", ((c, 0),))]
    for label, table in settings:
        spec = SpecConfig(a.steps, steps_by_batch=table) if table else None
        pair = dataclasses.replace(loaded, target=own_cache_copy(loaded.target),
                                   drafter=own_cache_copy(loaded.drafter) if spec else None)
        engine = batch_sweep.build(args, pair, spec)
        t0 = time.perf_counter()
        engine.decoder.warm_up(c)
        warm = time.perf_counter() - t0
        run_load(engine, batch[:c], c, a.max_tokens)            # graphs for every shape served
        spent, calls = collections.Counter(), collections.Counter()
        time_decoder(engine.decoder, spent, calls)
        r = run_load(engine, batch, c, a.max_tokens)
        prof, on = cProfile.Profile(), [True, False]
        profile_loop(engine, prof, on)
        run_load(engine, batch, c, a.max_tokens)
        on[0] = False
        run_load(engine, batch[:1], 1, 1)                         # an iteration that switches it off
        engine.stop_blocking()
        per_step = 1e3 / max(calls["collect"], 1)
        row = {"warm_up_s": warm, "throughput": r.throughput, "accept_length": r.accept_length,
               "wait_ms_per_step": r.wait_ms_per_step, "host_ms_per_step": r.host_ms_per_step,
               "steps": calls["collect"], "calls": dict(calls),
               "ms_per_step": {k: v * per_step for k, v in spent.items()},
               "ms_per_call": {k: 1e3 * v / calls[k] for k, v in spent.items()}}
        report["settings"][label] = row
        print(f"{label:>8} c={c}: {r.throughput:8.1f} tok/s  accept {r.accept_length:.2f}  steps {calls['collect']}"
              f"  wait {r.wait_ms_per_step:.3f} ms/step  phases "
              + " ".join(f"{k} {v:.3f}" for k, v in r.host_ms_per_step.items()), flush=True)
        for k in sorted(spent, key=spent.get, reverse=True):
            print(f"           {k:<22} {calls[k]:6d} calls  {1e3 * spent[k] / calls[k]:8.3f} ms/call"
                  f"  {spent[k] * per_step:7.3f} ms/step", flush=True)
        text = io.StringIO()
        text.write(f"==== {label} at concurrency {c}\n")
        stats = pstats.Stats(prof, stream=text).strip_dirs()
        stats.sort_stats("tottime").print_stats(40)
        stats.sort_stats("cumulative").print_stats(40)
        profiles.append(text.getvalue())
    (out / "cprofile.txt").write_text("\n".join(profiles))
    (out / "profile.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
