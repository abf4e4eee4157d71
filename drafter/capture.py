"""The feature-capture process: runs the target in a capture engine over the tokenized
conversations and writes feature shards (drafter/feature_shards.py), either into the bounded
spool training consumes (mode "spool", micro-batches in training's order, drafter/spool.py) or
into a kept feature store (mode "store", by conversation, drafter/feature_store.py).

    python -m drafter.capture JOB.json        (`drafter train` writes the job and starts this)

Engines: "native" (models/llama.py), "transformers" (any HF architecture, `output_hidden_states`),
"vllm" (drafter/capture_vllm.py; run this module with vLLM's Python). Every engine is given the
aux layers as OUTPUTS (the training convention) and returns them with the last layer's output
before the final norm; translating ids for an engine is models/aux_layers.py's job.
A spool writer stops when training (its parent) is gone; a store capture resumes shard by shard.
"""
from __future__ import annotations

import json
import math
import os
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from drafter.batches import Batches
from drafter.feature_shards import SeqFeatures, shard_bytes, write_shard
from drafter.feature_store import read_index, shard_path, write_index
from drafter.shards import TokenShards
from drafter.spool import Spool, SpoolError
from drafter.target_head import TargetSpec
from models.aux_layers import last_layer_output

ENGINES = ("native", "transformers", "vllm")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class CaptureJob:
    engine: str                          # native | transformers | vllm
    target: str
    data: str
    aux_layer_outputs: list[int]         # layer OUTPUTS (training convention), ascending
    out: str                             # spool or feature-store directory
    mode: str = "spool"                  # spool | store
    budget_bytes: int = 10 * 10**9
    batch_size: int = 4                  # training's data order (spool mode)
    length_group: int = 1
    max_length: int = 2048
    seed: int = 0
    limit: int = 0
    first: int = 0                       # spool: micro-batches [first, end)
    end: int | None = None               # None: until the trainer stops it (a time-budgeted run)
    skip: list[int] = field(default_factory=list)   # spool: micro-batches already there (Spool.prepare)
    shard_size: int = 256                # store: conversations per shard
    dtype: str = "float32"
    device: str = "cpu"
    chunk: int = 64                      # sequences per engine call
    trust_remote_code: bool = False
    engine_args: dict = field(default_factory=dict)   # vLLM LLM(...) keyword arguments over ours
    parent_pid: int = 0

    def identity(self) -> dict:
        """What shards must share to be reused: same engine, target, layers, cut and dtype."""
        return {"engine": self.engine, "target": str(Path(self.target).resolve()),
                "aux_layer_outputs": list(self.aux_layer_outputs), "max_length": self.max_length, "dtype": self.dtype}

    def order(self) -> dict:
        return {"batch_size": self.batch_size, "seed": self.seed, "limit": self.limit,
                "length_group": self.length_group}

    def save(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "CaptureJob":
        return cls(**json.loads(Path(path).read_text()))


# -- engines -------------------------------------------------------------------------------
class _InProcess:
    """A capture engine in this process: no temporary files, no token limit per call, nothing to stop."""
    max_tokens = None

    def temp_bytes(self, tokens: int) -> int:
        return 0

    def close(self):
        pass


class NativeCapture(_InProcess):
    """Our Llama-family engine: layer outputs through LlamaModel's aux capture."""

    def __init__(self, job: CaptureJob, spec: TargetSpec):
        from models.llama import load_target
        self.n = len(job.aux_layer_outputs)
        self.ids = [*job.aux_layer_outputs, last_layer_output(spec.num_hidden_layers)]   # outputs, as we capture
        self.model = load_target(job.target, dtype=DTYPES[job.dtype], device=job.device, aux_layer_ids=self.ids)

    @torch.no_grad()
    def capture(self, seqs: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        for s in seqs:
            aux = self.model(s[None].to(self.model.embed_tokens.weight.device), capture_aux=True).aux_hidden[0]
            aux = aux.view(s.numel(), self.n + 1, -1).cpu()
            out.append((aux[:, :self.n], aux[:, self.n]))
        return out


def _decoder_layers(decoder) -> torch.nn.ModuleList:
    layers = getattr(decoder, "layers", None)
    if isinstance(layers, torch.nn.ModuleList):
        return layers
    found = [m for m in decoder.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1]
    if not found:
        raise ValueError(f"{type(decoder).__name__}: no list of decoder layers found")
    return found[0]


class TransformersCapture(_InProcess):
    """Any HF architecture: `hidden_states[k + 1]` of the decoder is the output of layer k; the
    last layer's own output (HF's last entry is after the final norm) comes from a hook on it."""

    def __init__(self, job: CaptureJob, spec: TargetSpec):
        from transformers import AutoModelForCausalLM
        lm = AutoModelForCausalLM.from_pretrained(job.target, dtype=DTYPES[job.dtype],
                                                  trust_remote_code=job.trust_remote_code)
        self.decoder = lm.get_decoder().to(job.device).eval()
        self.device = job.device
        self.outputs, self.last = list(job.aux_layer_outputs), last_layer_output(spec.num_hidden_layers)
        self.ids = [*self.outputs, self.last]   # layer outputs: hidden_states[k + 1], the last from its hook
        self._last: list[torch.Tensor] = []
        layer = _decoder_layers(self.decoder)[self.last]
        layer.register_forward_hook(lambda mod, args, out: self._last.append(out[0] if isinstance(out, tuple) else out))

    @torch.no_grad()
    def capture(self, seqs: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        for s in seqs:
            self._last.clear()
            hs = self.decoder(input_ids=s[None].to(self.device), output_hidden_states=True,
                              use_cache=False).hidden_states
            last = self._last[-1][0]
            aux = torch.stack([last if o == self.last else hs[o + 1][0] for o in self.outputs], dim=1)
            out.append((aux.cpu(), last.cpu()))
        return out


def make_engine(job: CaptureJob, spec: TargetSpec):
    if job.engine == "native":
        return NativeCapture(job, spec)
    if job.engine == "transformers":
        return TransformersCapture(job, spec)
    if job.engine == "vllm":
        from drafter.capture_vllm import VLLMCapture
        return VLLMCapture(job, spec)
    raise ValueError(f"capture engine {job.engine!r}: one of {', '.join(ENGINES)}")


# -- the loops -----------------------------------------------------------------------------
def _parent_alive(job: CaptureJob):
    return lambda: not job.parent_pid or os.getppid() == job.parent_pid


def _features(engine, batches: Batches, idx: list[int]) -> list[SeqFeatures]:
    items = [batches.sequence(i) for i in idx]
    if engine.max_tokens:
        items = [(ids[:engine.max_tokens], m[:engine.max_tokens]) for ids, m in items]
    caps = engine.capture([ids for ids, _ in items])
    return [SeqFeatures(i, ids, m, aux, last) for i, (ids, m), (aux, last) in zip(idx, items, caps)]


def _tokens(batches: Batches, idx: list[int], engine) -> int:
    cut = engine.max_tokens or batches.max_length
    return sum(min(cut, batches.length(i)) for i in idx)


def run_spool(job: CaptureJob, engine, spec: TargetSpec, batches: Batches) -> None:
    """Micro-batches first..end-1 in order, each chunk captured once room is free."""
    spool = Spool(job.out, job.budget_bytes)
    spool.status["engine_aux_ids"] = engine.ids   # the ids as the engine was configured
    meta = {**job.identity(), **job.order()}
    alive = _parent_alive(job)
    dtype, n = DTYPES[job.dtype], len(job.aux_layer_outputs)
    g, skip = job.first, set(job.skip)
    end = math.inf if job.end is None else job.end
    bar = tqdm(total=None if job.end is None else job.end - job.first, desc="capture", unit="mb", file=sys.stderr)
    while g < end:
        units, need, nseq = [], 0, 0
        while g < end:
            if g in skip:   # left by a previous writer for this run (Spool.prepare kept it)
                g += 1
                bar.update(1)
                continue
            idx, _ = batches.indices(g)
            tok = _tokens(batches, idx, engine)
            cost = shard_bytes(tok, n, spec.hidden_size, dtype) + engine.temp_bytes(tok)
            if units and (nseq + len(idx) > job.chunk or need + cost > job.budget_bytes):
                break
            units.append((g, idx))
            need, nseq, g = need + cost, nseq + len(idx), g + 1
        if not units:
            break
        spool.wait_room(need, alive)
        feats = _features(engine, batches, [i for _, idx in units for i in idx])
        spool.note_peak()
        for u, idx in units:
            spool.put(u, feats[:len(idx)], meta)
            feats = feats[len(idx):]
            bar.update(1)
    bar.close()
    spool.write_status()


def run_store(job: CaptureJob, engine, spec: TargetSpec, batches: Batches) -> None:
    """Conversations 0..n-1 into shards of shard_size; complete shards of the same features stay."""
    root = Path(job.out)
    root.mkdir(parents=True, exist_ok=True)
    n, size = batches.n, job.shard_size
    dtype, n_aux = DTYPES[job.dtype], len(job.aux_layer_outputs)
    total = shard_bytes(_tokens(batches, list(range(n)), engine), n_aux, spec.hidden_size, dtype)
    if total > job.budget_bytes:
        raise SpoolError(f"{root}: keeping features of {n} conversations needs about {total / 1e9:.3g} GB, over "
                         f"--spool-budget-gb {job.budget_bytes / 1e9:g}; raise it, or train without --keep-features "
                         f"(the spool holds only what training has not consumed yet)")
    old = read_index(root) or {}
    ident = job.identity()
    same = {k: old.get(k) for k in ident} == ident and old.get("shard_size") == size
    shards = {s["file"]: s for s in old.get("shards", [])} if same else {}
    index = {**ident, "engine_aux_ids": engine.ids, "num_layers": spec.num_hidden_layers,
             "hidden_size": spec.hidden_size, "samples": n, "shard_size": size, "complete": False, "shards": []}
    bar = tqdm(total=n, desc="capture", unit="conv", file=sys.stderr)
    for k in range(math.ceil(n / size)):
        idx = list(range(k * size, min(n, (k + 1) * size)))
        path = shard_path(root, k)
        rec = shards.get(path.name)
        if not (rec and rec["samples"] == len(idx) and path.exists()):
            feats = []
            for a in range(0, len(idx), job.chunk):
                feats += _features(engine, batches, idx[a:a + job.chunk])
            rec = {"file": path.name, "samples": len(idx), "first": idx[0],
                   "bytes": write_shard(path, feats, {**ident, "first": idx[0]})}
        index["shards"].append(rec)
        write_index(root, index)
        bar.update(len(idx))
    bar.close()
    for stale in sorted(root.glob("feat-*.safetensors"))[len(index["shards"]):]:
        stale.unlink()
    write_index(root, {**index, "complete": True})


def run(job: CaptureJob) -> None:
    spec = TargetSpec.from_dir(job.target)
    batches = Batches(TokenShards(job.data), job.batch_size, job.max_length, job.seed, job.limit, job.length_group)
    engine = make_engine(job, spec)
    try:
        (run_spool if job.mode == "spool" else run_store)(job, engine, spec, batches)
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m drafter.capture JOB.json", file=sys.stderr)
        return 2
    job = CaptureJob.load(args[0])
    try:
        run(job)
    except BaseException as e:   # noqa: BLE001 - the consumer must hear of any failure
        if job.mode == "spool" and not isinstance(e, SystemExit):
            Path(job.out).mkdir(parents=True, exist_ok=True)
            Spool(job.out, job.budget_bytes).fail(str(e) if isinstance(e, SpoolError) else traceback.format_exc())
        if isinstance(e, SpoolError):
            print(f"error: {e}", file=sys.stderr)
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
