"""Measurements of this machine kept in a JSON file: taken by the first process, read by the rest.

What the engine times at load (the CPU product forms, models/cpu_products.py; its step costs per
batch size, engine/steps_by_cost.py) depends on the machine, not on the requests, and processes
that time it separately can choose differently (two servers started one after the other on one
VM ran different product forms for one row). So, as inductor and Triton keep their
autotuning, a measurement is kept in a file under a key naming what it depends on. Servers starting
together wait on the file's lock: the first measures, the others read its result. An unreadable
file is measured again; delete it to measure again on purpose.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import platform
from pathlib import Path
from typing import Callable

log = logging.getLogger("specserve.engine")  # the engine log, which the server shows


def processor() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def kept_entry_if_any(path: Path, key: str) -> dict | None:
    """The entry for `key` in the JSON file at `path`, if one is kept there (None: absent or unreadable),
    without measuring: a server that serves at once and measures later (engine/tuning.py) asks first."""
    try:
        return json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None


def kept_measurement(path: Path, key: str, measure: Callable[[], dict], what: str) -> dict:
    """The entry for `key` in the JSON file at `path` (one entry per key); absent or unreadable,
    `measure()` makes it, stamped with the time, and it is written for the next process."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            kept = json.loads(path.read_text()) if path.exists() else {}
            if key in kept:
                log.info("%s measured on %s, read from %s", what, kept[key]["measured"], path)
                return kept[key]
        except (ValueError, KeyError, TypeError) as e:
            log.warning("%s is unreadable (%r): measuring the %s again", path, e, what)
            kept = {}
        entry = {**measure(), "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        kept[key] = entry
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(kept, indent=1) + "\n")
        tmp.replace(path)
        log.info("%s measured now, kept in %s", what, path)
        return entry
