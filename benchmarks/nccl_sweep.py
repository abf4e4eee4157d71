"""All-reduce latency of decode-sized messages for NCCL protocol / algorithm / P2P settings.

Why graphs: timed from a host loop, decode-sized all-reduces on 2x H200 cost about the same for
every setting, because kernel launch overhead hides the differences (the host-loop columns of
its report). Decode runs captured in CUDA graphs, so the number that
matters is the per-all-reduce time of many all-reduces captured in ONE graph and replayed as the
engine replays its steps (benchmarks/timing.py time_ms: default 100 per graph, the median of 5
rounds of 20 back-to-back replays, so rank skew only delays a round's first replay). The CPU
dry run times the same all-reduces eagerly with gloo.

Each combination runs in fresh processes (one per GPU) with its environment set before
init_process_group: NCCL reads NCCL_* once per process. NCCL_NVLS_ENABLE=0 always (required
on the lent machines); NCCL_P2P_DISABLE=1 approximates PCIe GPUs without peer-to-peer.
Message sizes are hidden x tokens x 2 bytes (bf16): tokens in flight at batch 1 decode and
verify. The fastest P2P setting (and the fastest P2P-disabled one, for PCIe-like machines)
is written as a launch-profile fragment ([env] table).

  python -m benchmarks nccl --nproc 2                        # 2 GPUs, ~3 min for 19 combinations
  python -m benchmarks nccl --dry-run --only default         # CPU smoke test (gloo, no graphs)

`nccl decode` is batch-1 decode with the target tensor-parallel, NCCL end to end
(benchmarks/tensor_parallel.py; `torchrun --nproc-per-node 2 -m benchmarks nccl decode --help`).
"""
from __future__ import annotations

import argparse
import itertools
import math
import os
import queue as queue_mod
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.manifest import nvidia_gpus
from benchmarks.report import md_table, provenance, write_result
from benchmarks.server_proc import free_port
from benchmarks.timing import time_ms

BASE_ENV = {"NCCL_NVLS_ENABLE": "0", "NCCL_CUMEM_ENABLE": "0"}
SWEPT = ("NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL", "NCCL_P2P_DISABLE")
PROTOS, ALGOS, P2P_LEVELS = ("LL", "LL128", "Simple"), ("Ring", "Tree"), ("NVL", "SYS")


@dataclass(frozen=True)
class Combo:
    label: str
    env: tuple[tuple[str, str], ...]   # the swept variables only; BASE_ENV is added to all

    @property
    def p2p_disabled(self) -> bool:
        return dict(self.env).get("NCCL_P2P_DISABLE") == "1"


def all_combos(p2p_disable: bool = True) -> list[Combo]:
    out = [Combo("default", ())]
    for proto, algo, lvl in itertools.product(PROTOS, ALGOS, P2P_LEVELS):
        out.append(Combo(f"{proto}/{algo}/P2P {lvl}",
                         (("NCCL_PROTO", proto), ("NCCL_ALGO", algo), ("NCCL_P2P_LEVEL", lvl))))
    if p2p_disable:
        for proto, algo in itertools.product(PROTOS, ALGOS):
            out.append(Combo(f"{proto}/{algo}/P2P off",
                             (("NCCL_PROTO", proto), ("NCCL_ALGO", algo), ("NCCL_P2P_DISABLE", "1"))))
    return out


@dataclass
class SweepConfig:
    hidden: int = 7168
    tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    ops_per_graph: int = 100
    replays: int = 20
    dry_run: bool = False


@dataclass
class ComboResult:
    label: str
    env: dict
    rows: list[dict] = field(default_factory=list)   # per message size
    error: str = ""
    elapsed_s: float = 0.0
    nccl_version: str = ""

    @property
    def p2p_disabled(self) -> bool:
        return self.env.get("NCCL_P2P_DISABLE") == "1"


# -- one process per rank --------------------------------------------------------------------
def _worker(rank: int, world: int, env: dict, init: str, cfg: SweepConfig, out) -> None:
    for k in SWEPT:                     # what the parent had exported must not leak into a combination
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        import torch
        import torch.distributed as dist
        cuda = not cfg.dry_run
        if cuda:
            torch.cuda.set_device(rank)
        device = torch.device(f"cuda:{rank}" if cuda else "cpu")
        dist.init_process_group("nccl" if cuda else "gloo", init_method=init, rank=rank, world_size=world,
                                **({"device_id": device} if cuda else {}))
        dtype = torch.bfloat16  # decode activations; gloo reduces bf16 too
        rows = []
        for t in cfg.tokens:
            x = torch.zeros(cfg.hidden * t, dtype=dtype, device=device)

            def all_reduces():
                for _ in range(cfg.ops_per_graph):
                    dist.all_reduce(x)

            us = time_ms(all_reduces, device, iters=cfg.replays) * 1000.0 / cfg.ops_per_graph
            rows.append({"tokens": t, "bytes": x.numel() * x.element_size(), "us": us})
        version = ".".join(map(str, torch.cuda.nccl.version())) if cuda else "gloo"
        dist.barrier()
        dist.destroy_process_group()
        if rank == 0:
            out.put({"rows": rows, "nccl_version": version})
    except Exception:
        out.put({"error": f"rank {rank}: {traceback.format_exc(limit=4)}"})


# -- the parent: one fresh process group per combination ---------------------------------------
def run_combo(ctx, combo: Combo, world: int, cfg: SweepConfig, timeout_s: float) -> ComboResult:
    env = {**BASE_ENV, **dict(combo.env)}
    res = ComboResult(combo.label, env)
    out = ctx.Queue()
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_worker, args=(r, world, env, init, cfg, out), daemon=True) for r in range(world)]
    t0 = time.time()
    for p in procs:
        p.start()
    try:
        got = out.get(timeout=timeout_s)
        res.rows, res.nccl_version = got.get("rows", []), got.get("nccl_version", "")
        res.error = got.get("error", "")
    except queue_mod.Empty:
        res.error = f"timed out after {timeout_s:.0f} s"
    for p in procs:
        p.join(timeout=10 if not res.error else 2)
        if p.is_alive():
            p.terminate()
            p.join(5)
    res.elapsed_s = time.time() - t0
    return res


def score(res: ComboResult) -> float | None:
    """Geometric mean latency over message sizes (each size counts equally)."""
    vals = [r["us"] for r in res.rows if r["us"]]
    if res.error or not vals or len(vals) != len(res.rows):
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def pick(results: list[ComboResult], p2p_disabled: bool) -> ComboResult | None:
    cands = [r for r in results if score(r) is not None and r.p2p_disabled == p2p_disabled]
    return min(cands, key=score) if cands else None


def fragment(best: ComboResult, note: str, header: str) -> str:
    lines = [f"# {header}", f"# {note}",
             f"# geometric-mean all-reduce latency {score(best):.1f} us; setting: {best.label}", "[env]"]
    lines += [f'{k} = "{v}"' for k, v in sorted(best.env.items())]
    return "\n".join(lines) + "\n"


def markdown(result: dict, results: list[ComboResult]) -> str:
    sizes = [r["bytes"] for r in next((x.rows for x in results if x.rows), [])]
    default = next((r for r in results if r.label == "default"), None)
    base = score(default) if default else None
    rows = []
    for r in results:
        by = {x["bytes"]: x["us"] for x in r.rows}
        s = score(r)
        rows.append([r.label] + [by.get(b) for b in sizes]
                    + [s, f"{s / base:.2f}" if s and base else None, r.error.splitlines()[-1][:60] if r.error else ""])
    c = result["config"]
    if c["dry_run"]:
        how = "gloo on CPU, eager (dry run: timings meaningless)"
    else:
        how = (f"NCCL {result['nccl_version']}, captured in one CUDA graph ({c['ops_per_graph']} all-reduces per "
               f"graph, median of 5 rounds of {c['replays']} replays)")
    out = [f"# NCCL all-reduce sweep: {result['name']}\n\n", f"`{result['provenance']['command']}`\n\n",
           f"{result['world_size']} ranks, {how}, "
           f"messages hidden {c['hidden']} x tokens {list(c['tokens'])} x 2 bytes; base env {BASE_ENV}; "
           f"{result['total_s']:.0f} s total. Microseconds per all-reduce:\n\n",
           md_table(["setting"] + [_kb(b) for b in sizes] + ["geomean us", "vs default", "error"], rows)]
    for tag in ("best", "best_no_p2p"):
        b = result.get(tag)
        if b:
            out.append(f"\n**{tag}**: {b['label']}, geomean {b['score_us']:.1f} us"
                       + (f" ({b['score_us'] / base:.2f}x default)" if base else "") + f" -> `{b['fragment']}`\n")
    return "".join(out)


def _kb(b: int) -> str:
    return f"{b / 1024:.0f} KB" if b < 1 << 20 else f"{b / (1 << 20):.2f} MB"


def main(argv: list[str] | None = None) -> dict | None:
    if (sys.argv[1:] if argv is None else argv)[:1] == ["decode"]:
        from benchmarks.tensor_parallel import main as decode
        return decode((sys.argv[1:] if argv is None else argv)[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2, help="ranks (one per GPU)")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64")
    ap.add_argument("--ops-per-graph", type=int, default=100)
    ap.add_argument("--replays", type=int, default=20, help="back-to-back replays per timed round (5 rounds)")
    ap.add_argument("--no-p2p-disable", action="store_true", help="skip the NCCL_P2P_DISABLE=1 combinations")
    ap.add_argument("--only", help="comma list of combination labels to run (e.g. 'default,LL/Ring/P2P SYS')")
    ap.add_argument("--combo-timeout", type=float, default=45.0, help="seconds before a hung combination is killed")
    ap.add_argument("--dry-run", action="store_true", help="CPU smoke mode: gloo, no CUDA graphs")
    ap.add_argument("--name", help="output stem (default <nproc>x<gpu>)")
    ap.add_argument("--out-dir", default="runs/nccl")
    args = ap.parse_args(argv)

    cfg = SweepConfig(hidden=args.hidden, tokens=tuple(int(t) for t in args.tokens.split(",")),
                      ops_per_graph=args.ops_per_graph, replays=args.replays, dry_run=args.dry_run)
    combos = all_combos(not args.no_p2p_disable)
    if args.only:
        want = [w.strip() for w in args.only.split(",")]
        combos = [c for c in combos if c.label in want]
    import multiprocessing as mp
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed"])  # import once; CUDA starts in each child
    gpus = [] if args.dry_run else nvidia_gpus()
    name = args.name or f"{args.nproc}x" + (gpus[0]["name"].replace("NVIDIA ", "").replace(" ", "-") if gpus
                                            else "cpu-dry-run" if args.dry_run else "gpu")

    t0, results = time.time(), []
    for i, combo in enumerate(combos):
        r = run_combo(ctx, combo, args.nproc, cfg, args.combo_timeout)
        results.append(r)
        s = score(r)
        print(f"[{i + 1}/{len(combos)}] {combo.label:<22} {r.elapsed_s:5.1f} s  "
              + (f"geomean {s:.1f} us" if s else f"ERROR {r.error.strip().splitlines()[-1] if r.error else ''}"),
              flush=True)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = {"name": name, "world_size": args.nproc, "config": asdict(cfg), "base_env": BASE_ENV,
              "nccl_version": next((r.nccl_version for r in results if r.nccl_version), ""),
              "total_s": time.time() - t0, "score": "geometric mean of us over message sizes",
              "results": [asdict(r) for r in results], "provenance": provenance(argv)}
    header = f"written by benchmarks/nccl_sweep.py ({result['provenance']['created']}, {name})"
    for tag, p2p_off, note in (
            ("best", False, "fastest setting with peer-to-peer on this machine"),
            ("best_no_p2p", True, "fastest with NCCL_P2P_DISABLE=1: an approximation of PCIe GPUs without P2P")):
        b = pick(results, p2p_off)
        if b:
            frag = out / f"{name}-{tag.replace('_', '-')}.toml"
            frag.write_text(fragment(b, note, header))
            result[tag] = {"label": b.label, "env": b.env, "score_us": score(b), "fragment": str(frag)}
    write_result(out / f"{name}.json", result, markdown(result, results))
    return result


if __name__ == "__main__":
    main()
