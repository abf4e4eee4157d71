"""Where training's target features come from (`drafter train --features`).

- native (default): our Llama-family engine in the loop, no features on disk (models/llama.py).
- transformers / vllm: a capture process (drafter/capture.py; vLLM's runs in vLLM's own
  Python) writes feature shards into the bounded spool (drafter/spool.py) ahead of training,
  which takes each micro-batch's shard and deletes it. Disk use stays under
  --spool-budget-gb, so any number of samples streams through.
- --keep-features DIR: capture every conversation once into DIR (drafter/feature_store.py),
  then train from it; a later `--features DIR` trains from DIR again without capturing.

Outside the native loop the trainer holds no target: the last layer's output is turned into
the target's logits by its final norm and lm_head (drafter/target_head.py). Every source hands
the loop the same micro-batch g (drafter/batches.py), so resume keeps the data order.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from drafter.batches import Batches
from drafter.capture import CaptureJob
from drafter.feature_shards import collate
from drafter.feature_store import FeatureStore, read_index
from drafter.spool import Spool, SpoolError
from drafter.target_head import TargetHead

ENGINES = ("native", "transformers", "vllm")
ROOT = Path(__file__).resolve().parent.parent
VLLM_VENV_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


def parse_features(features: str, keep: str | None) -> tuple[str, str | None, bool]:
    """(capture engine, kept-features directory or None, whether to capture into it)."""
    if features in ENGINES:
        return features, keep, keep is not None
    index = read_index(features)
    if index is None:
        raise ValueError(f"--features {features}: neither {' / '.join(ENGINES)} nor a directory of kept features "
                         f"(no {Path(features) / 'features.json'})")
    if keep is not None:
        raise ValueError(f"--features {features} reads kept features; --keep-features makes no sense with it")
    return index["engine"], features, False


def capture_python(engine: str, given: str | None) -> str:
    if engine != "vllm":
        return sys.executable
    if given:
        return given
    if VLLM_VENV_PYTHON.is_file():
        return str(VLLM_VENV_PYTHON)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise FileNotFoundError(f"--features vllm: no {VLLM_VENV_PYTHON} (`make vllm-venv`) and no vllm in this Python; "
                            f"pass --vllm-python")


def capture_env(engine: str, python: str, gpus: str | None) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    if engine == "vllm" and not torch.cuda.is_available():
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")   # GiB; vLLM's CPU build takes a share of RAM otherwise
        iomp = Path(python).resolve().parent.parent / "lib" / "libiomp5.so"   # vLLM's CPU guide preloads it
        if not iomp.is_file():
            iomp = Path(python).parent.parent / "lib" / "libiomp5.so"
        if iomp.is_file():
            env["LD_PRELOAD"] = ":".join(p for p in (env.get("LD_PRELOAD"), str(iomp)) if p)
    return env


def start_capture(job: CaptureJob, job_file: Path, python: str, env: dict, log: Path | None) -> subprocess.Popen:
    """The capture process in a new process group (vLLM's workers go with it at stop_capture)."""
    job.save(job_file)
    out = open(log, "ab") if log is not None else None
    try:
        return subprocess.Popen([python, "-m", "drafter.capture", str(job_file)], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT if out else None, start_new_session=True)
    finally:
        if out is not None:
            out.close()


def stop_capture(proc: subprocess.Popen, wait_s: float = 30.0) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)   # whatever vLLM process outlived it
    except ProcessLookupError:
        pass
    proc.wait()


def _tail(log: Path | None, n: int = 4000) -> str:
    if log is None or not log.is_file():
        return ""
    return log.read_bytes()[-n:].decode(errors="replace")


# -- sources -------------------------------------------------------------------------------
class InLoopSource:
    """The native target in the loop: features and logits computed per micro-batch.

    On GPU a micro-batch is padded (loss mask 0) to a multiple of PAD_MULTIPLE tokens, so a run
    sees at most a few dozen shapes instead of one per length. Unpadded H200 steps took 0.4-1.1 s
    where their kernels take ~0.1 s; with this padding and expandable CUDA segments
    (shipped/smollm2/gpu_build.sh) they took 0.092 s, with no allocator retry. Which of the two
    mattered was not separated."""

    PAD_MULTIPLE = 64

    def __init__(self, target, batches: Batches, device: torch.device):
        self.target, self.batches, self.device = target, batches, device

    def get(self, g: int):
        ids, mask, epoch = self.batches.get(g)
        if self.device.type == "cuda" and (short := -ids.shape[1] % self.PAD_MULTIPLE):
            ids, mask = torch.nn.functional.pad(ids, (0, short)), torch.nn.functional.pad(mask, (0, short))
        ids, mask = ids.to(self.device, non_blocking=True), mask.to(self.device, non_blocking=True)
        out = self.target(ids, capture_aux=True)
        return ids, mask, out.aux_hidden, out.logits, epoch

    def close(self):
        pass


class _HeadSource:
    def __init__(self, head: TargetHead, batches: Batches, device: torch.device, dtype: torch.dtype):
        self.head, self.batches, self.device, self.dtype = head, batches, device, dtype

    def _batch(self, seqs, epoch: int):
        ids, mask, aux, last = collate(seqs, self.dtype)
        ids, mask = ids.to(self.device), mask.to(self.device)
        return ids, mask, aux.to(self.device), self.head(last.to(self.device)), epoch


class SpoolSource(_HeadSource):
    """Micro-batches from the spool a capture process fills (rank 0 starts and stops it)."""

    def __init__(self, spool: Spool, proc: subprocess.Popen | None, log: Path | None, **kw):
        super().__init__(**kw)
        self.spool, self.proc, self.log = spool, proc, log

    def _alive(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            return f"exit status {self.proc.returncode}; its log {self.log}:\n{_tail(self.log)}"
        return None

    def get(self, g: int):
        idx, epoch = self.batches.indices(g)
        seqs = self.spool.take(g, self._alive)
        got = [s.sample for s in seqs]
        if got != idx:
            raise SpoolError(f"{self.spool.path(g)}: holds conversations {got}, micro-batch {g} is {idx} "
                             f"(a writer with another data order)")
        return self._batch(seqs, epoch)

    def close(self):
        if self.proc is not None:
            stop_capture(self.proc)


class StoreSource(_HeadSource):
    """Micro-batches read from kept features, in training's order."""

    def __init__(self, store: FeatureStore, **kw):
        super().__init__(**kw)
        self.store = store

    def get(self, g: int):
        idx, epoch = self.batches.indices(g)
        seqs = [self.store.get(i) for i in idx]
        for s in seqs:   # a store captured with a longer cut serves a shorter one
            cut = self.batches.max_length
            s.input_ids, s.loss_mask, s.aux, s.last = s.input_ids[:cut], s.loss_mask[:cut], s.aux[:cut], s.last[:cut]
        return self._batch(seqs, epoch)

    def close(self):
        pass


def run_store_capture(job: CaptureJob, job_file: Path, python: str, env: dict) -> None:
    """Capture into a kept-features directory in the foreground (its progress on this terminal)."""
    proc = start_capture(job, job_file, python, env, None)
    try:
        rc = proc.wait()
    finally:
        stop_capture(proc, wait_s=5)
    if rc != 0:
        raise RuntimeError(f"feature capture into {job.out} failed (exit status {rc}; its error is above)")


def wait_store(root: str, poll_s: float = 1.0) -> None:
    """Ranks other than 0 wait for rank 0's capture to finish."""
    while not (read_index(root) or {}).get("complete"):
        time.sleep(poll_s)



def open_source(c, *, main: bool, world: int, device: torch.device, dtype: torch.dtype, batches: Batches, target,
                head: TargetHead | None, aux: list[int], spec, engine: str, store_dir: str | None,
                capture_store: bool, first: int, end: int | None, out: Path):
    """The feature source for `drafter train` (c: its TrainConfig), serving micro-batches first..end-1
    (end None: until training stops)."""
    if target is not None:
        return InLoopSource(target, batches, device)
    cap_dtype = c.capture_dtype if c.capture_dtype != "auto" else ("bfloat16" if torch.cuda.is_available()
                                                                   else "float32")
    job = CaptureJob(engine=engine, target=str(c.target), data=str(c.data), aux_layer_outputs=list(aux), out="",
                     budget_bytes=int(c.spool_budget_gb * 1e9), batch_size=c.batch_size, length_group=c.length_group,
                     max_length=c.max_length,
                     seed=c.seed, limit=c.limit_samples, first=first, end=end, dtype=cap_dtype,
                     device="cuda" if torch.cuda.is_available() else "cpu", chunk=c.capture_batch,
                     trust_remote_code=c.trust_remote_code, engine_args=dict(c.vllm_args), parent_pid=os.getpid())
    kw = {"head": head, "batches": batches, "device": device, "dtype": dtype}
    if store_dir is not None:
        have = read_index(store_dir) or {}
        ident = job.identity()
        if capture_store and have.get("complete") and have.get("samples", 0) >= batches.n and \
                {k: have.get(k) for k in ident} == ident:
            capture_store = False   # captured before with the same engine, target, layers and cut
        if capture_store and main:
            job = replace(job, mode="store", out=str(store_dir))
            python = capture_python(engine, c.vllm_python)
            run_store_capture(job, out / "capture_job.json", python, capture_env(engine, python, c.capture_gpus))
        elif capture_store:
            wait_store(store_dir)
        index = read_index(store_dir)
        if (index["hidden_size"], index["num_layers"]) != (spec.hidden_size, spec.num_hidden_layers):
            raise ValueError(f"{store_dir}: features of a target with hidden size {index['hidden_size']} and "
                             f"{index['num_layers']} layers, but --target {c.target} has {spec.hidden_size} and "
                             f"{spec.num_hidden_layers}")
        if index["max_length"] < c.max_length:
            raise ValueError(f"{store_dir}: conversations were cut at {index['max_length']} tokens, --max-length is "
                             f"{c.max_length}; capture again or lower --max-length")
        return StoreSource(FeatureStore(store_dir, aux, batches.n), **kw)
    spool = Spool(c.spool or out / "spool", job.budget_bytes)
    job = replace(job, out=str(spool.root))
    proc = log = None
    if main:
        job = replace(job, skip=spool.prepare(first, {**job.identity(), **job.order()}))
        log = out / "capture.log"
        python = capture_python(engine, c.vllm_python)
        proc = start_capture(job, out / "capture_job.json", python, capture_env(engine, python, c.capture_gpus), log)
        print(f"drafter train: {engine} captures features into {spool.root} (budget {c.spool_budget_gb:g} GB; "
              f"its log: {log})", file=sys.stderr)
    if world > 1:
        torch.distributed.barrier()   # no rank reads before rank 0 has cleared what is stale
    return SpoolSource(spool, proc, log, **kw)
