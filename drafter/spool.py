"""The bounded spool between a capture engine and training: feature shards on disk, one per
micro-batch, under a byte budget the user sets.

The capture process (drafter/capture.py) writes micro-batch g's features to `mb-<g>.safetensors`
in the order training consumes them; training takes a shard (loads it, then deletes it). Before
capturing, the writer waits until the spool's files (its shards and the engine's own temporary
files, which live in a subfolder) plus what it is about to write fit the budget, so a data set of
any size passes through a disk of bounded size. `writer.json` records what was written, the peak
size the writer saw and how often it waited; a writer that fails leaves `ERROR` with its
traceback, which every consumer (every rank) sees.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from drafter.feature_shards import SeqFeatures, read_meta, read_shard, write_shard

ERROR = "ERROR"
STATUS = "writer.json"
ENGINE_DIR = "engine"   # the capture engine's own files (vLLM's per-request safetensors)


class SpoolError(RuntimeError):
    pass


def dir_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            try:
                total += os.stat(os.path.join(dirpath, f)).st_size
            except FileNotFoundError:   # consumed meanwhile
                pass
    return total


class Spool:
    def __init__(self, root: str | Path, budget_bytes: int):
        self.root = Path(root)
        self.budget = int(budget_bytes)
        self.engine_dir = self.root / ENGINE_DIR
        self.status = {"written": 0, "peak_bytes": 0, "waits": 0, "budget_bytes": self.budget}

    def path(self, g: int) -> Path:
        return self.root / f"mb-{g:09d}.safetensors"

    def used(self) -> int:
        return dir_bytes(self.root)

    def shards(self) -> list[int]:
        return sorted(int(p.name[3:12]) for p in self.root.glob("mb-*.safetensors"))

    # -- writer side -------------------------------------------------------------------------
    def prepare(self, first: int, meta: dict) -> list[int]:
        """Keep the shards a previous writer left for micro-batches >= first with the same
        features (a resumed run reuses them); remove everything else. Returns the kept ones,
        which the new writer must not write again (training may consume them before it starts)."""
        self.root.mkdir(parents=True, exist_ok=True)
        kept = []
        for p in self.root.iterdir():
            if p.name.startswith("mb-") and p.name.endswith(".safetensors"):
                g = int(p.name[3:12])
                try:
                    same = {k: read_meta(p).get(k) for k in meta} == meta
                except Exception:  # noqa: BLE001 - unreadable: rewrite it
                    same = False
                if g >= first and same:
                    kept.append(g)
                    continue
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        return sorted(kept)

    def wait_room(self, nbytes: int, alive: Callable[[], bool] = lambda: True, poll_s: float = 0.02) -> None:
        """Block until `nbytes` more fit under the budget."""
        if nbytes > self.budget:
            raise SpoolError(f"--spool-budget-gb {self.budget / 1e9:g}: one micro-batch's features need "
                             f"{nbytes / 1e9:.3g} GB while captured; raise the budget or lower --batch-size or "
                             f"--max-length")
        waited = False
        while self.used() + nbytes > self.budget:
            if not alive():
                raise SpoolError("the consumer is gone")
            waited = True
            time.sleep(poll_s)
        self.status["waits"] += waited

    def note_peak(self) -> None:
        self.status["peak_bytes"] = max(self.status["peak_bytes"], self.used())

    def put(self, g: int, seqs: list[SeqFeatures], meta: dict) -> None:
        write_shard(self.path(g), seqs, {**meta, "micro_batch": g})
        self.status["written"] += 1
        self.note_peak()
        self.write_status()

    def write_status(self) -> None:
        tmp = self.root / (STATUS + ".tmp")
        tmp.write_text(json.dumps(self.status) + "\n")
        os.replace(tmp, self.root / STATUS)

    def fail(self, message: str) -> None:
        (self.root / ERROR).write_text(message)

    # -- consumer side -----------------------------------------------------------------------
    def take(self, g: int, alive: Callable[[], str | None] = lambda: None, poll_s: float = 0.01) -> list[SeqFeatures]:
        """Micro-batch g's features, removed from the spool. `alive` returns why the writer is gone
        (None while it runs)."""
        path = self.path(g)
        while not path.exists():
            err = self.root / ERROR
            if err.exists():
                raise SpoolError(f"feature capture failed ({err}):\n{err.read_text()}")
            if (why := alive()) is not None:
                if path.exists():
                    break
                raise SpoolError(f"{path}: not written and the capture process is gone ({why})")
            time.sleep(poll_s)
        seqs, _ = read_shard(path)
        path.unlink()
        return seqs
