"""Greedy parity and accept length of our native engine against vLLM, on one target + EAGLE-3 drafter.

vLLM's CPU build lives in its own environment (`make vllm-venv`), so the vLLM side runs as a
subprocess under .venv-vllm (benchmarks/vllm_parity_vllm.py), the native side in this process
(benchmarks/vllm_parity_native.py), and benchmarks/vllm_parity_compare.py compares them.
Prompts (JSONL of {"messages": [...]}, rendered with the target's chat template, or
{"prompt": str}; one file or several, the first N of each) are tokenized once here and sent
to both engines as token ids.

vLLM reads the drafter's aux ids as INPUTS of layers (training-side output ids + 1, DESIGN §10)
and must not get d2t/t2d when the draft vocabulary is the target's, so it gets a copy of the
drafter made for it (vllm_drafter_dir); the native engine reads the drafter as given.

  python -m benchmarks.vllm_parity --target shipped/target --draft shipped/drafter \\
      --num-prompts 12 --num-speculative-tokens 3 --max-tokens 64 --name shipped

writes benchmarks/results/vllm_parity/<name>.json (both sides' outputs and the comparison) and
<name>.md (the command first).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from benchmarks.engine_speed import load_prompts
from benchmarks.report import provenance, write_json
from benchmarks.vllm_parity_compare import compare, markdown
from benchmarks.vllm_parity_native import run_native
from engine.loading import load_tokenizer
from models.eagle3_checkpoint import vllm_drafter_dir

PROJECT_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = PROJECT_ROOT / "benchmarks" / "results" / "vllm_parity"
VLLM_VENV = PROJECT_ROOT / ".venv-vllm"


def run_vllm(request: dict, work: Path, python: Path) -> dict:
    """The vLLM side in .venv-vllm, with the venv's Intel OpenMP preloaded as vLLM's CPU guide
    asks (without it vLLM warns of slow speculative decoding; on the shipped pair the difference
    was within run-to-run noise)."""
    req, out = work / "request.json", work / "vllm.json"
    req.write_text(json.dumps(request))
    env = dict(os.environ)
    iomp = python.parent.parent / "lib" / "libiomp5.so"
    if iomp.is_file():
        env["LD_PRELOAD"] = ":".join(p for p in (env.get("LD_PRELOAD"), str(iomp)) if p)
    subprocess.run([str(python), "-m", "benchmarks.vllm_parity_vllm", str(req), str(out)], cwd=PROJECT_ROOT,
                   env=env, check=True)
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="HF folder of the target")
    ap.add_argument("--draft", required=True, help="EAGLE-3 drafter folder (models/eagle3_checkpoint.py format)")
    ap.add_argument("--prompts", nargs="+", default=[str(PROJECT_ROOT / "shipped" / "data" / "heldout_prompts.jsonl")])
    ap.add_argument("--num-prompts", type=int, nargs="+", default=[12],
                    help="the first N prompts of each file (one N for all, or one per file)")
    ap.add_argument("--num-speculative-tokens", type=int, default=3, help="vLLM's k = native chain steps")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.2,
                    help="vLLM on CPU: the fraction of RAM it takes for the KV cache")
    ap.add_argument("--vllm-python", default=str(VLLM_VENV / "bin" / "python"))
    ap.add_argument("--name", help="result name (default: the target folder's name)")
    ap.add_argument("--out-dir", default=str(RESULTS_DIR))
    args = ap.parse_args(argv)
    name = args.name or Path(args.target).name
    counts = args.num_prompts * len(args.prompts) if len(args.num_prompts) == 1 else args.num_prompts
    if len(counts) != len(args.prompts):
        ap.error(f"--num-prompts: {len(args.num_prompts)} counts for {len(args.prompts)} prompt files")

    tok = load_tokenizer(args.target)
    prompts = [ids for path, n in zip(args.prompts, counts) for ids in load_prompts(path, tok, n)]
    with tempfile.TemporaryDirectory(prefix="vllm_parity_") as tmp:
        work = Path(tmp)
        draft = vllm_drafter_dir(args.draft, work / "draft")
        request = {"target": str(Path(args.target).resolve()), "draft": str(draft), "prompts": prompts,
                   "num_speculative_tokens": args.num_speculative_tokens, "max_tokens": args.max_tokens,
                   "dtype": args.dtype, "gpu_memory_utilization": args.gpu_memory_utilization}
        vllm = run_vllm(request, work, Path(args.vllm_python))
    native = run_native(args.target, args.draft, prompts, steps=args.num_speculative_tokens,
                        max_tokens=args.max_tokens, dtype=args.dtype)
    report = compare(vllm, native)
    prov = provenance(argv)
    settings = {k: getattr(args, k) for k in ("target", "draft", "prompts", "num_prompts", "num_speculative_tokens",
                                              "max_tokens", "dtype", "gpu_memory_utilization")}
    out = Path(args.out_dir)
    write_json(out / f"{name}.json", {"provenance": prov, "settings": settings, "comparison": report,
                                      "vllm": vllm, "native": native})
    page = markdown(report, vllm, native, prov["command"])
    (out / f"{name}.md").write_text(page)
    print(page)
    print(f"wrote {out / name}.json, .md")
    return report


if __name__ == "__main__":
    main()
