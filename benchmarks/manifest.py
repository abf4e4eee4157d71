"""A result's manifest: what it claims, and the commit, machine, versions, command and date it came from.

A benchmark tool calls `write_manifest` beside the result it writes, so a record under benchmarks/results
says by itself what produced it. `python -m benchmarks.results_index` builds the results index from
these files.

    from benchmarks.manifest import write_manifest
    write_manifest(out_dir, "cpu-default is 2x compiled plain decoding at one request", vllm=vllm.__version__)

From a shell script: python -m benchmarks.manifest OUT_DIR --claim "..." --command "$0 $*" --set vllm=0.32.0
"""
from __future__ import annotations

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


def commit() -> tuple[str | None, bool | None]:
    """HEAD's hash and whether tracked files differ from it (None, None outside a git checkout)."""
    head = _run("git", "rev-parse", "HEAD")
    if head is None:
        return None, None
    status = _run("git", "status", "--porcelain", "--untracked-files=no")
    return head, bool(status) if status is not None else None


def nvidia_gpus() -> list[dict]:
    """Every GPU's name, driver and memory as nvidia-smi reports them (none without it)."""
    out = _run("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader") or ""
    return [dict(zip(("name", "driver", "memory"), (p.strip() for p in line.split(",", 2))))
            for line in out.splitlines()]


def _cpu() -> dict:
    info: dict = {"cores": os.cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for key, field in (("model name", "model_name"), ("cpu family", "family"), ("model", "model")):
        m = re.search(rf"^{key}\s*:\s*(.+)$", text, re.MULTILINE)
        if m:
            value = m.group(1).strip()
            info[field] = int(value) if value.isdigit() else value
    if "model_name" not in info:
        info["model_name"] = platform.processor() or platform.machine()
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.MULTILINE)
    info["virtual"] = bool(flags and "hypervisor" in flags.group(1).split())
    if m := re.search(r"^Hypervisor vendor:\s*(.+)$", _run("lscpu") or "", re.MULTILINE):
        info["hypervisor"] = m.group(1).strip()
    return info


def cpu_string(cpu: dict) -> str:
    """'AMD EPYC (family 25, model 17), 2 vCPUs, KVM' from _cpu()'s fields."""
    ident = ", ".join(f"{k} {cpu[k]}" for k in ("family", "model") if k in cpu)
    s = cpu.get("model_name", "CPU") + (f" ({ident})" if ident else "")
    if cpu.get("cores"):
        s += f", {cpu['cores']} {'vCPUs' if cpu.get('virtual') else 'cores'}"
    if cpu.get("hypervisor"):
        s += f", {cpu['hypervisor']}"
    return s


def hardware() -> dict:
    """The machine: every GPU's name, driver and memory when one is present, else the CPU."""
    gpus = nvidia_gpus()
    if not gpus:
        try:
            import torch
            if torch.cuda.is_available():
                gpus = [{"name": torch.cuda.get_device_name(i), "driver": None}
                        for i in range(torch.cuda.device_count())]
        except ImportError:
            pass
    cpu = _cpu()
    if gpus:
        first = gpus[0]
        count = f"{len(gpus)}x " if len(gpus) > 1 else ""
        text = count + first["name"] + (f", driver {first['driver']}" if first.get("driver") else "")
        return {"string": text, "gpus": gpus, "cpu": cpu}
    return {"string": cpu_string(cpu), "cpu": cpu}


def torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def typed_command(argv: list[str] | None = None) -> str:
    """The command that made a result: as typed when a benchmark runs from the command line; called
    from other code (a test) with `argv`, `python -m benchmarks` and those arguments."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if argv is None or (spec is not None and spec.name.startswith("benchmarks")):
        return " ".join(shlex.quote(a) for a in ["python", *sys.orig_argv[1:]])
    return " ".join(shlex.quote(a) for a in ["python", "-m", "benchmarks", *argv])


def manifest(claim: str, command: str | None = None, **extra) -> dict:
    """The manifest as a dict; `extra` adds fields (library versions such as vllm="0.32.0", a headline)."""
    head, dirty = commit()
    return {"claim": claim, "commit": head, "dirty": dirty, "hardware": hardware(),
            "torch": torch_version(), "python": platform.python_version(),
            "command": command if command is not None else typed_command(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}


def write_manifest(out_dir, claim: str, command: str | None = None, **extra) -> Path:
    """Write out_dir/manifest.json (see `manifest`); returns its path."""
    path = Path(out_dir) / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest(claim, command, **extra), indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    import argparse
    ap = argparse.ArgumentParser(description="Write OUT_DIR/manifest.json for a result a shell script produced.")
    ap.add_argument("out_dir")
    ap.add_argument("--claim", required=True, help="the one sentence the result backs")
    ap.add_argument("--command", help="the command that produced it (default: this one)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="another field, such as vllm=0.32.0 (repeatable)")
    a = ap.parse_args(argv)
    extra = dict(kv.split("=", 1) for kv in a.set)
    print(write_manifest(a.out_dir, a.claim, a.command, **extra))


if __name__ == "__main__":
    main()
