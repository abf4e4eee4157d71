"""A result's manifest.json: what it claims, and the commit, machine, versions, command and date it came from.

A tool calls `write_manifest(out_dir, claim, **extra)` beside the result it writes, so a record under
benchmarks/results says by itself what produced it (results_index.py builds the index from these). From a
shell script: python -m benchmarks.manifest OUT_DIR --claim "..." --command "$0 $*" --set vllm=0.32.0
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = ("claim", "commit", "dirty", "hardware", "torch", "python", "command", "date")


def _run(*cmd: str) -> str | None:
    """A command's output, or None where it is missing, fails or hangs."""
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def nvidia_gpus() -> list[dict]:
    """Every GPU's name, driver and memory as nvidia-smi reports them (none without it)."""
    out = _run("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader") or ""
    return [dict(zip(("name", "driver", "memory"), (p.strip() for p in line.split(",", 2))))
            for line in out.splitlines()]


def _cpu() -> dict:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    info: dict = {"cores": os.cpu_count(), "model_name": platform.processor() or platform.machine()}
    for key, field in (("model name", "model_name"), ("cpu family", "family"), ("model", "model")):
        if m := re.search(rf"^{key}\s*:\s*(.+)$", text, re.MULTILINE):
            info[field] = int(m[1]) if m[1].strip().isdigit() else m[1].strip()
    info["virtual"] = bool(re.search(r"^flags\s*:.*\bhypervisor\b", text, re.MULTILINE))
    if m := re.search(r"^Hypervisor vendor:\s*(.+)$", _run("lscpu") or "", re.MULTILINE):
        info["hypervisor"] = m[1].strip()
    return info


def cpu_string(cpu: dict) -> str:
    """'AMD EPYC (family 25, model 17), 2 vCPUs, KVM' from _cpu()'s fields."""
    ident = ", ".join(f"{k} {cpu[k]}" for k in ("family", "model") if k in cpu)
    s = cpu.get("model_name", "CPU") + (f" ({ident})" if ident else "")
    s += f", {cpu['cores']} {'vCPUs' if cpu.get('virtual') else 'cores'}" if cpu.get("cores") else ""
    return s + (f", {cpu['hypervisor']}" if cpu.get("hypervisor") else "")


def hardware() -> dict:
    """The machine: every GPU's name, driver and memory when one is present, else the CPU."""
    gpus, cpu = nvidia_gpus(), _cpu()
    if not gpus:
        return {"string": cpu_string(cpu), "cpu": cpu}
    count = f"{len(gpus)}x " if len(gpus) > 1 else ""
    return {"string": count + gpus[0]["name"] + f", driver {gpus[0]['driver']}", "gpus": gpus, "cpu": cpu}


def typed_command(argv: list[str] | None = None) -> str:
    """The command that made a result: as typed when a benchmark runs from the command line; called from
    other code (a test) with `argv`, `python -m benchmarks` and those arguments."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if argv is None or (spec is not None and spec.name.startswith("benchmarks")):
        return shlex.join(["python", *sys.orig_argv[1:]])
    return shlex.join(["python", "-m", "benchmarks", *argv])


def manifest(claim: str, command: str | None = None, **extra) -> dict:
    """The manifest as a dict; `extra` adds fields (library versions such as vllm="0.32.0", a headline)."""
    head = _run("git", "rev-parse", "HEAD")
    status = _run("git", "status", "--porcelain", "--untracked-files=no") if head else None
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {"claim": claim, "commit": head, "dirty": None if status is None else bool(status),
            "hardware": hardware(), "torch": torch_version, "python": platform.python_version(),
            "command": command if command is not None else typed_command(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}


def write_manifest(out_dir, claim: str, command: str | None = None, **extra) -> Path:
    path = Path(out_dir) / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest(claim, command, **extra), indent=2) + "\n")
    return path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Write OUT_DIR/manifest.json for a result a shell script produced.")
    ap.add_argument("out_dir")
    ap.add_argument("--claim", required=True, help="the one sentence the result backs")
    ap.add_argument("--command", help="the command that produced it (default: this one)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="another field, such as vllm=0.32.0 (repeatable)")
    a = ap.parse_args()
    print(write_manifest(a.out_dir, a.claim, a.command, **dict(kv.split("=", 1) for kv in a.set)))
