"""Batched decoding over a static KV cache: prefill, plain steps and speculative steps.

BatchDecoder is the engine's one handle on decoding and holds its parts: the rows' DecodeState
(engine/decode_state.py), the ModelRunner (caches, graphs, compiles: engine/model_runner.py), the
SpecWorker (the decode cycle: engine/spec_worker.py) and Prefill (engine/prefill.py). It decides
which step runs: greedy batches without logits processing or logprobs run device-side
(`launch`/`collect`, a captured graph or a compiled step), so the next one can be launched before
the host has read the current one; other batches (BatchSampling.host_side, or sampled rows) take
the worker's host step.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

import torch

from engine.acceptance import GreedyAcceptance
from engine.config import SpecConfig
from engine.decode_state import BACKLOG_STEPS, EAGER_BACKLOG_STEPS, DecodeState
from engine.model_runner import ModelRunner
from engine.prefill import Prefill
from engine.sampling import BatchSampling
from engine.spec_worker import STEP_KINDS, SpecWorker, StepResult
from models.eagle3 import Eagle3Drafter
from models.llama import LlamaModel

log = logging.getLogger("specserve.engine")


@dataclass
class InFlight:
    """A launched device-side step: host copies of its outputs, valid once `done` completes."""
    rows: int
    tokens: torch.Tensor         # [rows, W] on the host
    counts: torch.Tensor         # [rows]
    proposed: torch.Tensor       # [rows] drafts along the deepest path verified (0 without speculation)
    done: torch.cuda.Event | None


class BatchDecoder:
    def __init__(self, target: LlamaModel, drafter: Eagle3Drafter | None, spec: SpecConfig | None,
                 max_batch: int, max_context: int, span_multiple: int = 64, cuda_graphs: bool = True,
                 fast_greedy: bool = True, compile: bool = False, prefill_graphs: bool = False,
                 compile_prefill: bool = True, compile_cache: str | None = None, backlog_steps: int | None = None,
                 step_width: int = 0, acceptance: GreedyAcceptance | None = None):
        spec = spec if drafter is not None else None
        # Deterministic mode (step_width > 0): every device-side step runs the target over all
        # max_batch rows and step_width tokens a row (engine/spec_worker.py), so no token's numbers
        # depend on the batch it shared or on how many drafts its step verified.
        if spec and step_width and step_width < spec.draft_tokens:
            raise ValueError(f"step_width {step_width} is narrower than the verify step ({spec.draft_tokens})")
        if spec and step_width and spec.topk != 1:
            raise ValueError("step_width pads chains: it needs topk = 1")
        self.target, self.drafter = target, drafter
        self.max_batch, self.max_context, self.step_width = max_batch, max_context, step_width
        self.cache_len = max_context + max(spec.headroom if spec else 2, step_width + 1)
        self.fast_greedy = fast_greedy
        self.device = target.embed_tokens.weight.device
        self.runner = ModelRunner(target, drafter if spec else None, max_batch, self.cache_len, STEP_KINDS,
                                  lambda: self.state.step_tensors(), span_multiple, cuda_graphs, compile,
                                  compile_cache, step_width)
        # backlog_steps: another backlog length (tests give the CPU the GPU's)
        backlog = backlog_steps or (BACKLOG_STEPS if self.runner.fixed_shapes else EAGER_BACKLOG_STEPS)
        self.state = DecodeState.new(max_batch, self.device, drafter if spec else None, backlog)
        self.worker = SpecWorker(target, drafter if spec else None, spec, self.state, step_width, acceptance)
        self.prefills = Prefill(self.runner, self.state, prefill_graphs, compile_prefill)
        self._in_flight = 0                                           # launched, not yet collected
        # Launch a step before reading the previous one? On GPU it keeps the device busy; on
        # CPU a launch computes synchronously, so it would only add latency.
        self.overlap = self.device.type == "cuda"

    # -- what callers read -------------------------------------------------------------------
    @property
    def spec(self) -> SpecConfig | None:
        return self.worker.spec

    @spec.setter
    def spec(self, spec: SpecConfig | None) -> None:
        self.worker.spec = spec

    @property
    def lens(self) -> list[int]:
        """Each row's committed target cache length (writable: tests and cost measurements set it)."""
        return self.state.lens

    @property
    def graphs(self):
        return self.runner.graphs

    @property
    def compiled(self) -> bool:
        return self.runner.compiled

    @property
    def fixed_shapes(self) -> bool:
        return self.runner.fixed_shapes

    @property
    def compiles_prefills(self) -> bool:
        return self.prefills.compiled

    def set_steps_table(self, steps_by_batch: tuple[tuple[int, int], ...]) -> None:
        """Draft steps per batch size from the next step on (SpecConfig.steps_by_batch, at most
        spec.steps; it replaces accept_rates). For sweeps and the steps chosen from measured costs
        (engine/steps_by_cost.py); call between steps, not with one in flight."""
        if self.spec is None or self._in_flight:
            raise RuntimeError("a steps table needs speculation and no step in flight")
        self.spec = dataclasses.replace(self.spec, steps_by_batch=tuple(steps_by_batch), accept_rates=())

    def set_acceptance(self, acceptance: GreedyAcceptance) -> None:
        """Device-side steps accept with `acceptance` from the next capture or compile on
        (engine/acceptance.py): set it before warming up."""
        self.worker.acceptance = acceptance

    def empty_rows(self) -> None:
        """Every row empty again, after warm-up or measuring steps (what they wrote is never read)."""
        self.state.empty()

    # -- decode steps ------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, rows: int, sampling: BatchSampling) -> list[StepResult]:
        if self.device_side(sampling):
            return self.collect(self.launch(rows))
        headroom = max(self.spec.headroom if self.spec else 1, self.step_width)
        return self.worker.host_step(rows, self._span(rows, headroom), sampling)

    def device_side(self, sampling: BatchSampling) -> bool:
        """Whether steps for this batch run device-side (launch/collect, no host decisions)."""
        return self.fast_greedy and sampling.all_greedy and not sampling.host_side

    def _step_reach(self) -> int:
        """Cache positions past the host's committed lengths the next device-side step may
        write: its own headroom plus up to steps + 1 tokens per step still in flight."""
        per_step, headroom = (self.spec.steps + 1, self.spec.headroom) if self.spec else (1, 1)
        per_step = max(per_step, self.step_width)
        return max(headroom, self.step_width) + self._in_flight * per_step

    def room_to_launch(self, rows: int) -> bool:
        """Whether one more step fits every row's cache, counting steps still in flight."""
        return max(self.lens[:rows]) + self._step_reach() <= self.cache_len

    @torch.inference_mode()
    def launch(self, rows: int) -> InFlight:
        """Enqueue one device-side greedy step (a CUDA graph on GPU) and the copy of its results to
        the host; returns at once on GPU.

        A step may be launched while the previous one is still in flight (nothing about the
        rows may change in between): it continues from the device state the previous step
        leaves, so the GPU never waits for the host to read a step before starting the next.
        """
        st = self.state
        steps = self.spec.steps_for(rows) if self.spec else 0
        kind = self.worker.kind(steps)
        span = self._span(rows, self._step_reach())
        padded = self.runner.padded(rows)
        if self._in_flight:  # the device lengths are ahead of the host's: keep them
            st.lens_dev[rows:padded].zero_()
        else:
            lens = st.lens[:rows] + [0] * (padded - rows)
            st.lens_dev[:padded].copy_(torch.tensor(lens), non_blocking=True)
        if self.spec and (behind := max(st.backlog[:rows])) and (steps or behind == st.backlog_capacity):
            self.read_backlog(rows, padded, span)
        self.worker.acceptance.prepare()
        tokens, counts, proposed = self.runner.run_step(kind, padded, span, steps, self.worker)
        if kind == "backlog":
            st.backlog[:rows] = [n + 1 for n in st.backlog[:rows]]
        self._in_flight += 1
        return InFlight(rows, *self.runner.start_copy(tokens[:rows], counts[:rows], proposed[:rows]))

    def collect(self, step: InFlight) -> list[StepResult]:
        """Wait for a launched step (releasing the GIL on GPU) and account its tokens."""
        if step.done is not None:
            step.done.synchronize()
        self._in_flight -= 1
        tokens, counts, proposed = step.tokens.tolist(), step.counts.tolist(), step.proposed.tolist()
        results = []
        for b in range(step.rows):
            self.lens[b] += counts[b]
            results.append(StepResult(tokens[b][:counts[b]], proposed=proposed[b], accepted=counts[b] - 1))
        return results

    def read_backlog(self, rows: int, padded: int, span: int) -> None:
        """The drafter over every row's backlog before a device-side step (when the backlog is
        full at 0 drafts, or when drafting resumes). With graphs or compile, at one shape: the
        backlog's capacity a row (a shorter backlog repeats its last) over the padded rows, so it
        replays as a captured graph per (rows, span); eager it cost 15-20 ms on the H200.
        Padding rows have no backlog: they write only their own free cache rows. Otherwise as wide
        as the longest backlog."""
        st = self.state
        st.backlog_dev[rows:padded].zero_()
        width = st.backlog_capacity if self.fixed_shapes else max(st.backlog[:rows])
        self.graphs.run(("backlog read", padded, span),
                        lambda: self.worker.read_backlog(padded, st.lens_dev[:padded], span, width))
        st.backlog[:rows] = [0] * rows

    def _span(self, rows: int, extra: int) -> int:
        """Attention width: enough for every row's committed length plus `extra`."""
        return self.runner.span(max(self.lens[:rows]) + extra)

    # -- rows ----------------------------------------------------------------------------------
    def move_row(self, src: int, dst: int) -> None:
        """Move request state from row src to row dst (keeps active rows contiguous)."""
        self.runner.move_row(src, dst)
        self.state.move_row(src, dst)

    @torch.inference_mode()
    def prefill(self, row: int, prompt: list[int], sampling: BatchSampling) -> int:
        """Fill row `row` with `prompt`; return the first generated token."""
        return self.prefill_rows(row, [prompt], sampling)[0].tokens[0]

    @torch.inference_mode()
    def prefill_batch(self, row: int, prompts: list[list[int]], sampling: BatchSampling) -> list[int]:
        return [r.tokens[0] for r in self.prefill_rows(row, prompts, sampling)]

    @torch.inference_mode()
    def prefill_rows(self, row: int, prompts: list[list[int]], sampling: BatchSampling) -> list[StepResult]:
        """Fill rows row .. row + len(prompts) - 1 with `prompts`; each row's first generated token."""
        return self.prefills.rows(row, prompts, sampling)

    @torch.inference_mode()
    def prefill_shared(self, row: int, sources: list[int], prompts: list[list[int]],
                       sampling: BatchSampling) -> list[StepResult]:
        """Rows row .. take prompts that rows `sources` hold already (engine/prefill.py Prefill.shared)."""
        return self.prefills.shared(row, sources, prompts, sampling)

    # -- warm-up -------------------------------------------------------------------------------
    @torch.inference_mode()
    def warm_up(self, max_rows: int) -> None:
        """Run one device-side greedy step of every shape the engine will run up to max_rows rows
        (padded batch size, and draft steps with a steps table), so that torch.compile and graph
        capture (a minute or more per shape on GPU with `compile`) happen before serving, not in
        a request's time; compiled, at the narrowest and the widest span. Leaves every row empty.
        Eager steps without graphs (CPU) have nothing to prepare: it returns at once. With
        `prefill_graphs`, the captured (and compiled) prefills too, one per width (every row shares them)."""
        if not self.fixed_shapes:
            return
        self.warm_up_prefills()
        shapes = self.decode_shapes(max_rows)
        for i, ((padded, steps), rows) in enumerate(shapes.items(), 1):
            t0 = time.perf_counter()
            self.warm_up_shape(padded, steps, rows)
            if (seconds := time.perf_counter() - t0) > 1:   # it compiled (a capture is quicker): show the progress
                log.info("decode shape %d of %d ready (%d rows, %d draft steps) in %.0f s", i, len(shapes), padded,
                         steps, seconds)

    def decode_shapes(self, max_rows: int) -> dict[tuple[int, int], int]:
        """{(padded rows, draft steps): the fewest rows that run it} for batches of up to max_rows rows."""
        shapes = {}
        for rows in range(1, min(max_rows, self.max_batch) + 1):
            shapes.setdefault((self.runner.padded(rows), self.spec.steps_for(rows) if self.spec else 0), rows)
        return shapes

    @torch.inference_mode()
    def warm_up_prefills(self) -> None:
        """With `prefill_graphs`, one prefill of every captured width (compiled with compile_prefill)."""
        self.prefills.warm_up()

    @torch.inference_mode()
    def warm_up_shape(self, padded: int, steps: int, rows: int) -> None:
        """One device-side greedy step of this shape at every span bucket (a backlog read after
        each where a table drafts 0 steps somewhere); leaves every row empty."""
        backlog_reads = self.spec is not None and any(s == 0 for _, s in self.spec.steps_by_batch)
        for row in range(rows):
            self.prefill(row, [0, 0], BatchSampling.all_greedy_rows(1, self.device))
        # Every span bucket, narrowest to widest: each is a graph of its own, and a capture
        # in serving (a device sync and two runs of the step) stalls every request in flight.
        # Compiled, the widest span's guard is checked too: one it fails recompiles now.
        for span in self.runner.span_buckets():
            self.lens[:rows] = [max(2, span - self._step_reach())] * rows
            self.step(rows, BatchSampling.all_greedy_rows(rows, self.device))
            if backlog_reads:
                self.read_backlog(rows, padded, span)
        self.empty_rows()

    # -- compiled steps made by another process ----------------------------------------------
    def saved_compiles(self) -> dict[str, dict[str, int]]:
        """engine/model_runner.py ModelRunner.saved_compiles."""
        return self.runner.saved_compiles()

    def serve_compiled_when_ready(self) -> None:
        """From now on a shape runs compiled only once marked ready (`mark_ready`), and a compiled
        step never compiles here: until then, and for a shape its saved compiles do not accept, it
        runs eager. Another process compiles into compile_cache (engine/background_compile.py)."""
        self.runner.ready_compiles = set()

    @torch.inference_mode()   # a loaded compile's global-state guard takes the grad mode it was loaded under
    def refresh_saved_compiles(self) -> int:
        """Loads the compiles saved in compile_cache since the last look; how many."""
        return self.runner.refresh_saved_compiles()

    @torch.inference_mode()   # as steps run: grad mode is global state the guards check, and thread-local
    def saved_compiles_accept(self, padded: int, steps: int) -> bool:
        """Whether a loaded compile accepts this decode shape at every span bucket (no compile)."""
        return self.runner.saved_compiles_accept(padded, steps, self.worker.kind(steps), self.worker)

    def saved_prefills_accept(self) -> bool:
        """Whether loaded compiles exist for the captured prefills (they are symbolic in width)."""
        return self.runner.saved_prefills_accept()

    def mark_ready(self, key: tuple) -> None:
        """(padded rows, draft steps) or ("prefill",): its compiled form serves from the next step on."""
        self.runner.ready_compiles = self.runner.ready_compiles | {key}   # replaced whole: the engine thread reads it
