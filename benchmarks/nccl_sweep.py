"""NCCL settings and draft steps for a large shape served through vLLM at tensor parallel N.

Every point is one vLLM start with dummy weights (benchmarks/tensor_parallel.py: the shapes, their
EAGLE-3 drafters, the acceptance curves, the measuring process). Its engine arguments are those of a
generated launch profile through launch.engine_args.vllm_engine_args, as our server passes them, plus
what only a benchmark sets: synthetic acceptance and graphs for the measured batches. Measured on
vLLM's offline API, not behind our HTTP front-end: what is swept lives in the engine's steps, the
front-end adds the same per-token work to every point, a profile cannot ask for synthetic acceptance,
and our engine's 8B synthetic record is an in-process engine loop too.
1. NCCL sweep (TP > 1; at TP 1 there is no all-reduce to tune: skipped): vLLM's default (custom
   all-reduce / symmetric memory), then NCCL alone (disable_custom_all_reduce, VLLM_ALLREDUCE_USE_SYMM_MEM=0,
   VLLM_ALLREDUCE_USE_FLASHINFER=0) at its defaults, at each NCCL_PROTO x NCCL_ALGO x NCCL_P2P_LEVEL and
   with NCCL_P2P_DISABLE=1 (PCIe GPUs without P2P); NCCL_NVLS_ENABLE=0 always. The lowest geometric-mean
   step time wins.
2. Step sweep: each --steps count (chain) at each --concurrency with the winner's environment; the
   step count with the most tok/s at each concurrency becomes [speculative] steps_by_batch.
Writes <out>/<name>.json / .md / .png as points finish (--resume keeps finished ones), vLLM's log of
each point under <name>-logs/, and <name>.toml: a profile serving the dummy shape with the winners;
with --claim, manifest.json (GPU, driver, torch, vLLM, mode, command) for a record.

One H100, tree slimmed (benchmarks/device_tree.sh slim), consecutive calls on one warm machine:
  carry .carry/vllm/vllm-bundle.tar.xz.00, .carry/vllm/SHA256SUMS:   bash benchmarks/gpu/vllm_bundle.sh stash
  carry .carry/vllm/vllm-bundle.tar.xz.01, .02:   bash benchmarks/gpu/vllm_bundle.sh install &&
    source /root/vllm-site/env.sh && python3 -m benchmarks nccl --shape 8b --accept 8b --steps 0,3,7
    --concurrency 1,2,4,8,16,32 --out-dir /root/w/nccl --resume; cp /root/w/nccl/*.* $OUT/
  source /root/vllm-site/env.sh && python3 -m benchmarks nccl --shape 70b --accept reference
    --out-dir /root/w/nccl --resume; cp /root/w/nccl/*.* $OUT/      (70b: 29 of 80 layers fit one H100)
A call cut at its limit loses only the point in flight: the same command again resumes. DeepSeek's
MLA on the bundle (unverified: its MLA kernels other than FlashMLA decide): --shape deepseek --steps 0,3.
Eight GPUs:  python3 -m benchmarks nccl --tp 8 --shape 70b --accept reference --name tp8-70b --resume
Every point's vLLM arguments and environment, nothing started: --dry-run. vLLM's CPU build (its
sampler has no synthetic acceptance, so drafts are verified for real; --tp 2 runs there too):
  python -m benchmarks nccl --device cpu --shape tiny --accept none --steps 0,2 --concurrency 1,2 \\
    --gpu-memory-utilization 0.2 --max-model-len 256 --python .venv-vllm/bin/python
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import tensor_parallel as tp_shapes
from benchmarks.manifest import write_manifest
from benchmarks.report import md_table, provenance, write_result

BASE_ENV = {"NCCL_NVLS_ENABLE": "0"}
NCCL_ONLY = {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0", "VLLM_ALLREDUCE_USE_FLASHINFER": "0"}
SWEPT = ("NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL", "NCCL_P2P_DISABLE", *NCCL_ONLY)
PROTOS, ALGOS, P2P_LEVELS = ("LL", "LL128", "Simple"), ("Ring", "Tree"), ("NVL", "SYS")


def all_combos() -> list[tuple[str, dict, bool]]:
    """(label, environment, custom all-reduce on) of every NCCL point."""
    out = [("vllm default", {}, True), ("NCCL default", dict(NCCL_ONLY), False)]
    for proto, algo, lvl in itertools.product(PROTOS, ALGOS, (*P2P_LEVELS, "off")):
        p2p = {"NCCL_P2P_DISABLE": "1"} if lvl == "off" else {"NCCL_P2P_LEVEL": lvl}
        out.append((f"{proto}/{algo}/P2P {lvl}", {**NCCL_ONLY, "NCCL_PROTO": proto, "NCCL_ALGO": algo, **p2p}, False))
    return out


def _toml(v) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return json.dumps(v) if not isinstance(v, bool) else str(v).lower()


def profile_text(a, pair: tuple[Path, Path], steps: int | dict, env: dict, custom_ar: bool,
                 header: str = "", graphs: list[int] | None = None) -> str:
    """A launch profile serving the dummy shape: `steps` a count or a {batch size: steps} table."""
    table = steps if isinstance(steps, dict) else {}
    most = max(table.values(), default=0) if table else steps
    cpu = a.device == "cpu"
    extra = {"load_format": "dummy", "skip_tokenizer_init": True, "enable_prefix_caching": False}
    if not custom_ar:
        extra["disable_custom_all_reduce"] = True
    if not cpu:
        extra["compilation_config"] = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY",
                                       **({"cudagraph_capture_sizes": graphs} if graphs else {})}
    # vLLM's CPU guide: KV cache GiB; one core per rank, bound (its automatic binding wants a NUMA node per rank)
    cpu_env = {"VLLM_CPU_KVCACHE_SPACE": "2", **({"VLLM_CPU_OMP_THREADS_BIND": "|".join(map(str, range(a.tp)))}
                                                 if a.tp > 1 else {})}
    env = {**(cpu_env if cpu else {**BASE_ENV, "VLLM_USE_FLASHINFER_SAMPLER": "0"}), **env}
    lines = [f"# {line}" for line in header.splitlines()] + [
        f'description = "vLLM, TP {a.tp}, {a.shape} shape with dummy weights, EAGLE-3 chain"', 'engine = "vllm"',
        "", "[model]", f"path = {_toml(str(pair[0]))}", f"draft = {_toml(str(pair[1]))}",
        "", "[parallel]", f"tp = {a.tp}",
        "", "[speculative]", f"enabled = {_toml(most > 0)}", f"steps = {max(most, 1)}", "topk = 1",
        *([f"steps_by_batch = {_toml(table)}"] if table and most > 0 else []),
        "", "[env]", *(f"{k} = {_toml(v)}" for k, v in sorted(env.items())),
        "", "[vllm]", f'dtype = "{"float32" if cpu else "bfloat16"}"', f"max_model_len = {a.max_model_len}",
        f"max_num_seqs = {max(a.concurrency)}", f"gpu_memory_utilization = {a.gpu_memory_utilization}",
        *(["enforce_eager = true"] if cpu else []),
        "", "[vllm.extra]", *(f"{k} = {_toml(v)}" for k, v in extra.items())]
    return "\n".join(lines) + "\n"


def engine_args(path: Path, a, steps: int) -> tuple[dict, dict]:
    """(vLLM keyword arguments, environment) of a profile file, as our server resolves them, with
    the benchmark's synthetic acceptance added."""
    from launch.engine_args import vllm_engine_args
    from launch.profiles import resolve

    launch = resolve(str(path), environ={})
    kw = vllm_engine_args(launch.profile)
    if steps and a.accept != "none":
        kw["speculative_config"].update(rejection_sample_method="synthetic",
                                        synthetic_acceptance_rates=tp_shapes.CURVES[a.accept][:steps])
    return kw, launch.env


def run_point(a, work: Path, key: str, steps: int, env: dict, custom_ar: bool, conc: list[int]) -> dict:
    path = work / f"{key.replace('/', '-').replace(' ', '_')}.toml"
    path.write_text(profile_text(a, a.pair, steps, env, custom_ar, graphs=tp_shapes.capture_sizes(conc, steps)))
    kw, penv = engine_args(path, a, steps)
    point = {"key": key, "steps": steps, "env": penv, "custom_all_reduce": custom_ar,
             "kwargs": kw, "concurrency": conc}
    print(f"== {key}: steps {steps}, concurrency {conc}\n   env {json.dumps(point['env'])}\n"
          f"   vLLM {json.dumps(kw)}", flush=True)
    if a.dry_run:
        return point
    job = {"kwargs": kw, "steps": steps, "concurrency": conc, "prompt_len": a.prompt_len,
           "max_tokens": a.max_tokens, "rounds": a.rounds, "vocab": tp_shapes.SHAPES[a.shape]["vocab_size"],
           "out": str(work / "result.json")}
    (work / "job.json").write_text(json.dumps(job))
    root = str(Path(__file__).resolve().parent.parent)
    child_env = {k: v for k, v in os.environ.items() if k not in SWEPT}  # exported settings must not leak
    child_env.update(point["env"], PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    iomp = Path(a.python).resolve().parent.parent / "lib" / "libiomp5.so"  # vLLM's CPU build wants its OpenMP
    if a.device == "cpu" and iomp.is_file():
        child_env["LD_PRELOAD"] = str(iomp)
    t0 = time.time()
    (work / "result.json").unlink(missing_ok=True)
    log = a.logs / f"{path.stem}.log"
    try:
        with log.open("w") as f:
            proc = subprocess.run([a.python, "-m", "benchmarks.tensor_parallel", str(work / "job.json")],
                                  env=child_env, cwd=root, stdout=f, stderr=subprocess.STDOUT, timeout=a.point_timeout)
        if proc.returncode:
            errors = [x for x in log.read_text().splitlines() if "Error: " in x] or [""]
            cause = next((x for x in errors if " ERROR " in x), errors[-1])  # vLLM logs the root cause first
            point["error"] = f"exit {proc.returncode}: {cause.strip()[-300:]} (log: {log})"
        else:
            point.update(json.loads((work / "result.json").read_text()))
    except subprocess.TimeoutExpired:
        point["error"] = f"timed out after {a.point_timeout:.0f} s (log: {log})"
    point["elapsed_s"] = time.time() - t0
    print(f"   {point['elapsed_s']:.0f} s " + (point["error"] if "error" in point else " ".join(
        f"c{r['concurrency']}: {r['step_ms']:.2f} ms {r['tok_s']:.0f} tok/s" for r in point["rows"])), flush=True)
    return point


def score(point: dict) -> float | None:
    """Geometric mean step time over the concurrencies (each counts equally)."""
    rows = point.get("rows")
    return math.exp(sum(math.log(r["step_ms"]) for r in rows) / len(rows)) if rows and "error" not in point else None


def steps_table(points: list[dict]) -> dict:
    """{concurrency: the step count with the most tok/s there}."""
    best: dict = {}
    for p in points:
        for r in p.get("rows", []):
            if r["concurrency"] not in best or r["tok_s"] > best[r["concurrency"]][1]:
                best[r["concurrency"]] = (p["steps"], r["tok_s"])
    return {str(c): best[c][0] for c in sorted(best)}


def markdown(result: dict) -> str:
    rows = []
    for p in result["points"]:
        for r in p.get("rows") or [{}]:
            rows.append([p["phase"], p["key"], p["steps"], r.get("concurrency"), r.get("step_ms"), r.get("tok_s"),
                         r.get("accept_length"),
                         tp_shapes.accept_length(tp_shapes.CURVES[result["accept"]], p["steps"])
                         if result["accept"] != "none" and p["steps"] else None,
                         p.get("error", "")[:90]])
    return (f"# vLLM at TP {result['tp']}: {result['shape']} ({result['layers']} layers), accept {result['accept']}\n\n"
            f"`{result['provenance']['command']}`\n\n{result['note']}\n\n"
            + md_table(["phase", "point", "steps", "concurrency", "step ms", "tok/s", "accept length", "curve's",
                        "error"], rows)
            + f"\n\nNCCL winner: {result.get('nccl_winner')}; steps table: {result.get('steps_by_batch')}; "
              f"profile: `{result.get('profile')}`\n")


def plot(result: dict, png: Path) -> None:
    """Step sweep: tok/s over the plain rate against draft steps, a line per concurrency; NCCL sweep:
    each point's score."""
    from benchmarks.report import pyplot, save_figure

    nccl = [p for p in result["points"] if p["phase"] == "nccl" and p.get("rows")]
    fig, axes = pyplot().subplots(1, 2 if nccl else 1, figsize=(13 if nccl else 6.5, 4.5), squeeze=False)
    steps = sorted((p for p in result["points"] if p["phase"] == "steps" and p.get("rows")), key=lambda p: p["steps"])
    plain = {r["concurrency"]: r["tok_s"] for p in steps if p["steps"] == 0 for r in p["rows"]}
    for c in sorted({r["concurrency"] for p in steps for r in p["rows"]}):
        xy = [(p["steps"], r["tok_s"] / plain.get(c, 1.0)) for p in steps for r in p["rows"] if r["concurrency"] == c]
        axes[0][0].plot(*zip(*xy), marker="o", label=f"{c} requests")
    axes[0][0].set(xlabel="draft steps (chain)", ylabel="tok/s / plain" if plain else "tok/s",
                   title=f"TP {result['tp']}, {result['shape']} ({result['layers']} layers), accept {result['accept']}")
    axes[0][0].legend()
    if nccl:
        axes[0][1].barh([p["key"] for p in nccl], [score(p) for p in nccl])
        axes[0][1].set(xlabel="step ms, geometric mean over concurrencies", title="NCCL settings")
    save_figure(fig, png)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, default=1, help="tensor parallel size (GPUs)")
    ap.add_argument("--shape", default="8b", choices=sorted(tp_shapes.SHAPES))
    ap.add_argument("--layers", type=int, help="target depth (default: the full depth where it fits on 80 GiB GPUs)")
    ap.add_argument("--accept", default="8b", choices=[*tp_shapes.CURVES, "none"],
                    help="synthetic acceptance curve (none: vLLM verifies for real, as on CPU)")
    ap.add_argument("--steps", default="0,1,2,3,4,5,6,7", help="draft steps of the step sweep")
    ap.add_argument("--concurrency", default="1,2,8,32")
    ap.add_argument("--nccl-steps", type=int, default=2, help="draft steps during the NCCL sweep")
    ap.add_argument("--nccl-concurrency", default="1,8")
    ap.add_argument("--only", help="comma list of NCCL points to run (labels of all_combos)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="timed generate calls per concurrency (median)")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--python", default=sys.executable, help="the interpreter vLLM is installed in")
    ap.add_argument("--point-timeout", type=float, default=420.0, help="seconds before a vLLM start is abandoned")
    ap.add_argument("--dry-run", action="store_true", help="print every point's vLLM arguments and environment")
    ap.add_argument("--resume", action="store_true", help="keep the points the JSON already holds")
    ap.add_argument("--name", help="output stem (default tp<N>-<shape>)")
    ap.add_argument("--claim", help="the sentence the record backs: writes manifest.json beside it")
    ap.add_argument("--out-dir", default="runs/nccl")
    a = ap.parse_args(argv)
    a.steps = [int(s) for s in a.steps.split(",")]
    a.concurrency = [int(c) for c in a.concurrency.split(",")]
    full = tp_shapes.SHAPES[a.shape]["num_hidden_layers"]
    layers = max(3, a.layers or tp_shapes.fit_layers(a.shape, a.tp))  # three aux layers
    name = a.name or f"tp{a.tp}-{a.shape}"
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    a.logs = out / f"{name}-logs"
    a.logs.mkdir(exist_ok=True)
    a.pair = tp_shapes.write_pair(a.shape, layers, (out / f"{name}-models").resolve())
    note = (f"{a.shape}: {layers} of {full} layers" + (" (cut to fit the GPUs)" if layers < full else "")
            + f"; synthetic acceptance {a.accept}" + (f" {tp_shapes.CURVES[a.accept]} (unconditional per position)"
                                                      if a.accept != "none" else " (none: verified for real)")
            + f"; prompts {a.prompt_len} tokens, {a.max_tokens} generated, greedy, median of {a.rounds}")
    path = out / f"{name}.json"
    done = {p["key"]: p for p in json.loads(path.read_text())["points"] if "error" not in p} \
        if a.resume and path.is_file() else {}
    result = {"name": name, "tp": a.tp, "shape": a.shape, "layers": layers, "full_layers": full,
              "accept": a.accept, "note": note, "points": [], "provenance": provenance(argv)}

    def point(phase, key, steps, env, custom_ar, conc):
        p = done.get(key) or run_point(a, work, key, steps, env, custom_ar, conc)
        p["phase"] = phase
        result["points"].append(p)
        if not a.dry_run:
            write_result(path, result, markdown(result))
        return p

    print(note, flush=True)
    winner = ("vllm default", {}, True)
    with tempfile.TemporaryDirectory(prefix="nccl-sweep-") as tmp:
        work = Path(tmp)
        if a.tp == 1:
            print("TP 1: no all-reduce, nothing for the NCCL sweep; step sweep only", flush=True)
        else:
            combos = all_combos()
            if a.only:
                combos = [c for c in combos if c[0] in a.only.split(",")]
            nccl_conc = [int(c) for c in a.nccl_concurrency.split(",")]
            points = [(point("nccl", label, a.nccl_steps, env, car, nccl_conc), (label, env, car))
                      for label, env, car in combos]
            ranked = [(score(p), c) for p, c in points if score(p) is not None]
            if ranked:
                winner = min(ranked, key=lambda x: x[0])[1]
            result["nccl_winner"] = winner[0]
        label, env, car = winner
        steps = [point("steps", f"steps {k}", k, env, car, a.concurrency) for k in a.steps]
    if a.dry_run:
        return result
    table = steps_table(steps)
    result["steps_by_batch"] = table
    header = (f"Written by benchmarks/nccl_sweep.py ({result['provenance']['created']}): {note}.\n"
              f"NCCL: {label}; steps per batch size from tok/s of each step count at each concurrency.")
    prof = out / f"{name}.toml"
    prof.write_text(profile_text(a, a.pair, table or 0, env, car, header))
    engine_args(prof, a, 0)  # the written profile resolves as our server resolves it
    result["profile"] = str(prof)
    write_result(path, result, markdown(result), plot)
    if a.claim:  # the record's manifest: machine, versions, how vLLM ran
        mode = "enforce_eager" if a.device == "cpu" else "full CUDA graphs, no torch.compile (mode 0, FULL_DECODE_ONLY)"
        write_manifest(out, a.claim, result["provenance"]["command"], mode=mode,
                       vllm=next((p["vllm"] for p in result["points"] if "vllm" in p), None))
    return result


if __name__ == "__main__":
    main()
