"""Build a NativeEngine from checkpoint paths: device and dtype choice, start-up validation."""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass as plain_dataclass
from pathlib import Path

import torch
from pydantic import StrictInt, StrictStr
from pydantic.dataclasses import dataclass

from engine.api import EngineInfo
from engine.background_compile import BackgroundCompiles
from engine.config import CONFIG, NativeConfig, SpecConfig
from engine.decoder import BatchDecoder
from engine.scheduler import NativeEngine
from engine.steps_by_cost import choose_steps, kept_costs, kept_costs_if_any, provisional_steps
from engine.tuning import Tuning
from models.cpu_forms import CpuForms
from models.cpu_products import kept_forms, kept_forms_if_any, measured_forms
from models.eagle3 import Eagle3Drafter
from models.eagle3_checkpoint import load_drafter
from models.kernel_plan import DEFAULT_PLAN, KernelPlan
from models.layers import fuse_projections, onednn_weights, set_kernel_plan
from models.llama import LlamaModel, load_target
from models.tokenizer import load_tokenizer

log = logging.getLogger("specserve.engine")


@dataclass(config=CONFIG, kw_only=True)
class NativeEngineArgs(NativeConfig):
    """What builds a native engine: the model pair, the speculative setting and the engine's own
    settings (engine/config.py, where each is declared once)."""
    model: StrictStr
    draft: StrictStr | None = None
    spec: SpecConfig | None = None
    served_model_name: StrictStr | None = None
    verify_width: StrictInt = 0   # deterministic without speculation: the verify width it would run with

    @property
    def speculation(self) -> SpecConfig | None:
        """The speculative setting in force: `spec` needs a drafter."""
        return self.spec if self.draft else None

    @property
    def step_width(self) -> int:
        """Tokens a row in every decode step of the deterministic mode (0: off): the verify step's
        width, with speculation or without, so both produce each token from the same shapes."""
        if not self.deterministic:
            return 0
        return max(1, self.speculation.draft_tokens if self.speculation else self.verify_width)


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def compiles(requested: bool, device: torch.device) -> bool:
    """Whether the decode steps compile: as asked, except on a CPU with no C++ compiler, where
    inductor cannot build its kernels (a fresh machine without g++): those serve eager steps
    with a warning instead of failing at the first compile, as the default profile compiles."""
    if requested and device.type == "cpu" and not shutil.which(cxx := os.environ.get("CXX", "g++")):
        log.warning("native.compile: no C++ compiler (%s) for torch.compile's CPU kernels, so the decode steps "
                    "run eager; install one (apt-get install g++) or set CXX to compile them", cxx)
        return False
    return requested


def cpu_threads(requested: int) -> int:
    """Intra-op threads for CPU decoding: every core (at most 8), unless a count was chosen;
    OMP_NUM_THREADS wins. On 2 cores SmolLM2's float32 decoding over HTTP runs at 1.5x its
    one-thread rate on two (the server's own work is light: it runs in another process)."""
    if requested > 0:
        return requested
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    return max(1, min(os.cpu_count() or 1, 8))


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise ValueError(f"dtype: {dtype!r} is not one of auto, float32, bfloat16, float16") from None


def check_pair(target: LlamaModel, drafter: Eagle3Drafter, draft_path: str) -> None:
    """Stop the launch when a drafter does not fit its target; name both values."""
    t, d = target.config, drafter.config
    where = f"{Path(draft_path) / 'config.json'}"
    if d.target_hidden_size != t.hidden_size:
        raise ValueError(f"{where}: target_hidden_size {d.target_hidden_size} != target hidden_size {t.hidden_size}")
    if d.vocab_size != t.vocab_size:
        raise ValueError(f"{where}: vocab_size {d.vocab_size} != target vocab_size {t.vocab_size}")
    if len(d.aux_layer_ids) != d.num_aux or not all(0 <= i < t.num_hidden_layers for i in d.aux_layer_ids):
        raise ValueError(f"{where}: eagle_aux_hidden_state_layer_ids {d.aux_layer_ids} do not name "
                         f"{d.num_aux} layers of a {t.num_hidden_layers}-layer target")


def load_models(args: NativeEngineArgs, plan: KernelPlan | None = None) -> tuple[LlamaModel, Eagle3Drafter | None,
                                                                                 torch.device]:
    """The pair on its device, with `plan` (a compile worker takes the serving process's), else the
    default plan with, on a CPU in float32, the product forms measured (or kept in tuning_cache)."""
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads(args.cpu_threads))
    target = load_target(args.model, dtype=dtype, device=device, keep_gguf_q4=args.gguf_q4)
    drafter = None
    if args.speculation:
        drafter = load_drafter(args.draft, target.embed_tokens.weight, lm_head=target.lm_head.weight, dtype=dtype,
                               device=device)
        check_pair(target, drafter, args.draft)
        target.aux_layer_ids = list(drafter.config.aux_layer_ids)
        fuse_projections(drafter)
    fuse_projections(target)
    if plan is None and device.type == "cpu" and dtype == torch.float32:
        if forms := product_forms(args, torch.get_num_threads()):
            plan = KernelPlan(cpu_forms=forms)
            log.info("CPU float32 product forms by row count (measured here; longer prefills take the last): %s; "
                     "compiled steps: %s", ", ".join(f"{n}: {form}" for n, form in forms.measured), forms.compiled)
    set_kernel_plan(plan or DEFAULT_PLAN, target, drafter)
    if plan is not None and plan.cpu_forms.takes_onednn:   # now, not in the first request's prefill
        for _ in onednn_weights(target, drafter):
            pass
    return target, drafter, device


def product_forms(args: NativeEngineArgs, threads: int) -> CpuForms | None:
    """This CPU's product forms: kept in tuning_cache, else measured now; None (F.linear meanwhile)
    where an engine that serves at once measures them while serving (engine/tuning.py)."""
    if args.tuning_cache and (kept := kept_forms_if_any(threads, args.tuning_cache)):
        return kept
    if not args.compile_before_ready:
        return None
    return kept_forms(threads, args.tuning_cache) if args.tuning_cache else measured_forms(threads)


def engine_info(args: NativeEngineArgs) -> EngineInfo:
    """What the engine will be, before loading (loading fills in context, device, dtype)."""
    spec = args.speculation
    return EngineInfo(engine="native", model=args.served_model_name or Path(args.model).name,
                      max_context=args.max_context, speculative=spec is not None, steps=spec.steps if spec else 0,
                      topk=spec.topk if spec else 0, draft_tokens=spec.draft_tokens if spec else 0)


@plain_dataclass
class LoadedModels:
    """Models and tokenizer loaded once and reused by engines of several settings (evals, sweeps):
    one engine at a time, since a decoder keeps its KV cache in the model's modules (two alive
    at once: models.layers.own_cache_copy)."""
    target: LlamaModel
    drafter: Eagle3Drafter | None
    device: torch.device
    tokenizer: object

    @classmethod
    def load(cls, args: NativeEngineArgs) -> "LoadedModels":
        return cls(*load_models(args), load_tokenizer(args.model))


def build_engine(args: NativeEngineArgs, loaded: LoadedModels | None = None) -> NativeEngine:
    """The native engine in this process (a thread): for tools, benchmarks and tests. With
    `loaded` (from the same model paths), it reuses those models instead of loading them."""
    info = engine_info(args)
    background: list[BackgroundCompiles] = []
    tuning: list[Tuning] = []

    def load():
        models = loaded or LoadedModels.load(args)
        target, drafter, device = models.target, models.drafter, models.device
        max_context = args.max_context or target.config.max_position_embeddings
        compiled = compiles(args.compile, device)
        # Compiles made by a worker process while eager steps serve reach this one through a folder.
        elsewhere = compiled and not args.compile_before_ready and args.compile_max_batch > 0
        compile_cache = args.compile_cache or (tempfile.mkdtemp(prefix="specserve-compiles-") if elsewhere else None)
        decoder = BatchDecoder(target, drafter, args.speculation, args.max_batch, max_context, compile=compiled,
                               prefill_graphs=args.prefill_graphs, compile_prefill=args.compile_prefill,
                               compile_cache=compile_cache, step_width=args.step_width)
        spec = args.speculation
        costs_later = False
        if spec is not None and spec.accept_rates:
            t0 = time.perf_counter()
            costs = kept_costs_if_any(decoder, args.model, args.draft, args.tuning_cache) if args.tuning_cache else None
            if costs is None and not args.compile_before_ready:   # measured while serving (engine/tuning.py)
                costs_later = True
                decoder.set_steps_table(provisional_steps(spec.steps, args.max_batch))
            else:
                costs = costs or kept_costs(decoder, args.model, args.draft, args.tuning_cache)
                decoder.set_steps_table(choose_steps(costs, spec.accept_rates))
                log.info("steps per batch size %s from step costs (ms at 0..%d steps: %s) and accept rates %s "
                         "(%.1f s)", dict(decoder.spec.steps_by_batch), spec.steps,
                         "; ".join(f"{rows} rows " + " / ".join(f"{c:.1f}" for c in ms) for rows, ms in costs.items()),
                         list(spec.accept_rates), time.perf_counter() - t0)
        forms_later = device.type == "cpu" and target.embed_tokens.weight.dtype == torch.float32 \
            and not target.kernel_plan.cpu_forms.measured
        if forms_later or costs_later:
            tuning.append(Tuning(decoder, args, forms=forms_later, costs=costs_later))
        # A capture in serving would stall every request in flight, so shapes are prepared now.
        # Compiling takes minutes: compile_max_batch bounds it. Capturing CUDA graphs alone takes
        # seconds: every batch size. compile_max_batch 0 prepares nothing (benchmarks that change
        # the step first, as synthetic acceptance does, warm up themselves).
        if elsewhere:
            rows = min(args.compile_max_batch, args.max_batch)
            background.append(BackgroundCompiles(decoder, dataclasses.replace(args, compile_cache=compile_cache), rows,
                                                 after=tuning[0] if tuning else None))
            if decoder.graphs.enabled:   # the eager steps' CUDA graphs, captured before serving
                decoder.warm_up(args.max_batch)
        elif args.compile_max_batch and (compiled or decoder.graphs.enabled):
            rows = min(args.compile_max_batch, args.max_batch) if compiled else args.max_batch
            if compiled:
                log.info("compiling decode steps for batch sizes up to %d before serving", rows)
            t0 = time.perf_counter()
            decoder.warm_up(rows)
            log.info("%s decode steps for batch sizes up to %d in %.0f s", "compiled" if compiled else "captured",
                     rows, time.perf_counter() - t0)
            if saved := decoder.saved_compiles():
                log.info("compiles in %s: %d loaded, %d compiled and saved (%s)", args.compile_cache,
                         sum(c["loaded"] for c in saved.values()), sum(c["compiled"] for c in saved.values()),
                         ", ".join(f"{k} {c['loaded']}/{c['compiled']}" for k, c in saved.items()))
        info.max_context, info.device = max_context, str(device)
        info.extra = {"dtype": str(target.embed_tokens.weight.dtype).removeprefix("torch."), "model_path": args.model,
                      "draft_path": args.draft or ""}
        log.info("loaded %s on %s (speculative=%s)", args.model, device, info.speculative)
        return decoder, models.tokenizer, info

    return NativeEngine(load, info, max_waiting=args.max_waiting, prefill_tokens=args.prefill_tokens,
                        prefill_min_rows=args.prefill_min_rows, grammar_timeout_s=args.grammar_timeout_s,
                        background_compiles=lambda: background[0] if background else None,
                        tuning=lambda: tuning[0] if tuning else None)
