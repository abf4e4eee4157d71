"""Batched decoding over a static KV cache: prefill, plain steps and speculative steps.

Active requests occupy cache rows 0..B-1 (kept contiguous by `move_row`). For each row the
decoder keeps the committed cache length, the pending token (produced, not yet in the
target cache) and, with a drafter, the drafter's prediction after that token. One
speculative step = draft (chain or tree) -> verify in one target forward -> accept ->
compact the accepted path in the target cache -> drafter extend over the accepted tokens.
Rejected positions need no rollback: they lie beyond the committed length and are masked
out, then overwritten. Greedy steps (plain, chain or tree) run device-side (`launch`/`collect`), so
the next one can be launched before the host has read the current one.

Rows with logits processing or logprobs (BatchSampling.host_side) take the host path: each
row's LogitsProcessor turns the target's logits into the distribution tokens are chosen (and
drafts verified) from, at every node (engine/logits_processing.py); logprobs come from the same
forward, at the node that chose each emitted token, so they do not depend on speculation.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.api import TokenLogprob
from engine.config import SpecConfig
from engine.cuda_graphs import GraphRunner
from engine.draft_tree import DraftState, draft_chain, draft_tree
from engine.greedy_cycle import chain_greedy, deferred_greedy, drafter_catch_up, plain_greedy, tree_greedy
from engine.masks import block_inputs, causal, one_token_inputs
from engine.sampling import BatchSampling, probs_from_logits, sample_rows
from engine.saved_compile import SavedCompile, marked
from engine.torch_fixes import keep_tuned_configs
from engine.verify import accept
from models.eagle3 import Eagle3Drafter
from models.layers import AttnInputs
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


# Inductor options for `compile=True`: coordinate descent tunes the block sizes of the
# one-token GEMV reductions (as gpt-fast does), which then read an 8B layer's weights faster
# than cuBLAS. Benchmarked fusion keeps inductor from fusing the RMSNorm/SiLU that feeds a
# GEMV into it when that is slower (it can be).
COMPILE_OPTIONS = {"coordinate_descent_tuning": True, "benchmark_fusion": True}
# Except for trees: their products all have several rows (cuBLAS GEMMs, nothing to tune), and
# with the options above a SmolLM2-shaped tree step did not finish compiling on an H200 within a
# device call (untuned it compiles in about a minute).
TUNED_KINDS = ("plain", "chain", "deferred")

# Device-side steps at 0 draft steps the drafter may fall behind before it catches up over them
# in one forward (engine/greedy_cycle.py): reading its weights once per this many tokens, not
# once a token, leaves a step at 0 drafts about a plain step (0.94-1.01x on the H200 not compiled,
# with the catch-up eager; it replays a captured graph since); the
# backlog's memory is max_batch * its steps * (3 * target hidden) values.
LAG_STEPS = 16
# Without graphs or compile (CPU) the catch-up has no fixed shape, so it is as wide as the longest
# backlog, and the backlog holds this many steps. A request that ends before drafting resumes or its
# backlog fills never pays for its catch-up. On 2 cores a step costs the same with either backlog,
# and over HTTP the saving was below the noise.
EAGER_LAG_STEPS = 128

# With `prefill_graphs`, a prompt of at most this many tokens prefills as a CUDA graph, its
# width padded to a power of two (16 on), one graph per width: the cache row is read from a
# device buffer (models.layers.AttnInputs.row_offset), so every row shares it. Eager, a prefill
# is about a thousand small kernel launches (SmolLM2: 1,064), tens of milliseconds of host time
# on an H200 before the first token; captured, a few. Longer
# prompts stay eager: there the products, not the launches, take the time. A group of up to
# PREFILL_GRAPH_GROUP short prompts replays the graphs one prompt at a time, and so do prompts
# other rows hold (prefill_shared): on the H200 an eager group took 36-53 ms of launches and a
# replay ~4.3 ms of GPU time, so a larger group, the burst of a
# server's first requests, stays one eager forward (32 replays in a row held the burst's first
# tokens back twice as long).
PREFILL_GRAPH_TOKENS = 256
PREFILL_GRAPH_GROUP = 8


def pow2_bucket(n: int, floor: int, cap: int) -> int:
    """n rounded up to a power of two, at least floor, at most cap: the few shapes that graphs
    are captured (and steps compiled) for."""
    return min(cap, max(floor, 1 << (n - 1).bit_length()))


@dataclass
class SyntheticAcceptance:
    """Per-position acceptance rates [S] and the uniforms [max_batch, S] a step compares them
    with, drawn before each launch (outside any captured graph or compiled function)."""
    rates: torch.Tensor
    uniforms: torch.Tensor
    generator: torch.Generator


@dataclass
class StepResult:
    tokens: list[int]            # new tokens of this row, in order
    proposed: int = 0            # draft tokens verified (0 without speculation)
    accepted: int = 0            # of which accepted
    logprobs: list[TokenLogprob] | None = None  # one per token, for rows that asked


class BatchDecoder:
    def __init__(self, target: LlamaModel, drafter: Eagle3Drafter | None, spec: SpecConfig | None,
                 max_batch: int, max_context: int, span_multiple: int = 64, cuda_graphs: bool = True,
                 fast_greedy: bool = True, compile: bool = False, prefill_graphs: bool = False,
                 compile_prefill: bool = True, compile_cache: str | None = None, lag_steps: int | None = None, step_width: int = 0):
        self.target, self.drafter, self.spec = target, drafter, spec if drafter is not None else None
        self.max_batch, self.max_context = max_batch, max_context
        # Deterministic mode (step_width > 0): every device-side step runs the target over all
        # max_batch rows and step_width tokens a row (engine/greedy_cycle.py), so no token's numbers
        # depend on the batch it shared or on how many drafts its step verified.
        if self.spec and step_width and step_width < self.spec.draft_tokens:
            raise ValueError(f"step_width {step_width} is narrower than the verify step ({self.spec.draft_tokens})")
        if self.spec and step_width and self.spec.topk != 1:
            raise ValueError("step_width pads chains: it needs topk = 1")
        self.step_width = step_width
        self.cache_len = max_context + max(self.spec.headroom if self.spec else 2, step_width + 1)
        self.span_multiple = span_multiple
        self.fast_greedy = fast_greedy
        self.device = target.embed_tokens.weight.device
        # Compiled steps take a symbolic span (_span_from_ref); a span equal to the cache's length
        # would be specialized (the cache slice is then the whole cache): one spare position.
        alloc = self.cache_len + (1 if compile else 0)
        target.setup_cache(max_batch, alloc)
        if self.spec:
            drafter.setup_cache(max_batch, alloc)
        self.lens = [0] * max_batch                                   # committed target cache length
        self._in_flight = 0                                           # launched, not yet collected
        # Device-side steps collected, and the host's time waiting for them in `collect`: near
        # zero per step, the GPU is the one waiting (the host loop is the bound; benchmarks read it).
        self.collected, self.collect_wait_s = 0, 0.0
        # Launch a step before reading the previous one? On GPU it keeps the device busy; on
        # CPU a launch computes synchronously, so it would only add latency.
        self.overlap = self.device.type == "cuda"
        self.lens_dev = torch.zeros(max_batch, dtype=torch.long, device=self.device)  # its device copy
        self.pending = torch.zeros(max_batch, dtype=torch.long, device=self.device)
        if self.spec:
            h = drafter.config.hidden_size
            dtype = drafter.fc.weight.dtype
            self.draft_logits = torch.zeros(max_batch, drafter.config.draft_vocab_size, dtype=dtype, device=self.device)
            self.draft_hidden = torch.zeros(max_batch, h, dtype=dtype, device=self.device)
            # The drafter's backlog at 0 draft steps: entries per row (host and device copies),
            # the tokens and the target's aux states it has not read yet.
            self.lag = [0] * max_batch
            self.lag_dev = torch.zeros(max_batch, dtype=torch.long, device=self.device)
        self.synthetic: SyntheticAcceptance | None = None             # benchmarks only, see below
        self.graphs = GraphRunner(self.device, self._graph_state, enabled=cuda_graphs)
        # Captured graphs and compiles want few shapes: spans in power-of-two buckets, catch-ups at one width.
        self.fixed_shapes = self.graphs.enabled or compile
        if self.spec:
            # lag_steps: another backlog length (tests give the CPU the GPU's)
            self.lag_capacity = lag_steps or (LAG_STEPS if self.fixed_shapes else EAGER_LAG_STEPS)
            self.lag_tokens = torch.zeros(max_batch, self.lag_capacity, dtype=torch.long, device=self.device)
            aux = drafter.config.num_aux * drafter.config.target_hidden_size
            self.lag_aux = torch.zeros(max_batch, self.lag_capacity, aux, dtype=dtype, device=self.device)
        # Captured prefills read their prompt from these (on CPU nothing is captured: the prompt
        # is only padded, which is how tests check the padded path).
        self.prefill_graphs = prefill_graphs
        if prefill_graphs:
            self.graph_prompt = torch.zeros(1, PREFILL_GRAPH_TOKENS, dtype=torch.long, device=self.device)
            self.graph_last = torch.zeros(1, dtype=torch.long, device=self.device)
            self.graph_first = torch.zeros(1, dtype=torch.long, device=self.device)
            self.graph_row = torch.zeros(1, dtype=torch.long, device=self.device)
        # torch.compile fuses the many small kernels (norms, RoPE, masks) of a decode step and,
        # at one token, turns each weight GEMV into a reduction kernel (models.layers.Linear)
        # that COMPILE_OPTIONS tune. Batch 1 compiles with static shapes; larger (padded) batches
        # share one compile with a dynamic batch dimension (their products are GEMMs, nothing to
        # tune). The attention span is symbolic in both (`_span_from_ref`), so spans bucketed to
        # the context in use share the compile: the engine compiles two graphs per step count,
        # not one per batch size or span. Off by default: each compile takes a minute or more on
        # GPU (`--compile` turns it on; warm_up does it before serving, and inductor's cache,
        # TORCHINDUCTOR_CACHE_DIR, makes a restart's compiles faster). With compile_cache the
        # steps are compiled ahead of time and saved there, and a restart loads them without
        # tracing (engine/saved_compile.py).
        self.compiled = compile
        self._eager_fns = {"plain": plain_greedy, "chain": chain_greedy, "tree": tree_greedy,
                           "deferred": deferred_greedy}
        self._fns = self._fns_rows = self._eager_fns
        # None: every compiled shape serves, compiling on first use. A set: only those another process
        # compiled and this one loaded (serve_compiled_when_ready); the others run eager.
        self.ready_compiles: set[tuple] | None = None
        if self.compiled:
            import torch._dynamo as dynamo
            if self.device.type == "cuda":   # the bug is in the Triton kernels' tuning
                keep_tuned_configs()
            dynamo.config.cache_size_limit = max(dynamo.config.cache_size_limit, 64)
            self._fns = {k: _compiled(_span_from_ref(f), compile_cache, k, False,
                                      dict(COMPILE_OPTIONS) if k in TUNED_KINDS else {})
                         for k, f in self._fns.items()}
            self._fns_rows = {k: _compiled(_span_from_ref(f), compile_cache, k, True, {})
                              for k, f in self._fns_rows.items()}
            self._span_base = torch.empty(self.cache_len, dtype=torch.uint8, device=self.device)
        # The captured prefills compile too, once each with a symbolic width (every power-of-two
        # width shares the compile; the graphs are still one per width): uncompiled, a captured
        # prefill of one short prompt is ~1,000 small kernels, ~4.3 ms of GPU time on an H200,
        # what a request that joins costs every row in flight. The two compiles are a large part
        # of a compiled start (SmolLM2 on CPU: 61 of 143 s cold): compile_prefill False trades the
        # shorter first token for a faster start.
        self._prefill_fns = (self._prefill_target, self._prefill_drafter)
        self.compiles_prefills = self.compiled and prefill_graphs and compile_prefill
        if self.compiles_prefills:  # as the steps are, called with this decoder
            self._prefill_fns = tuple(functools.partial(_compiled(f, compile_cache, f.__name__.strip("_"), True, {}),
                                                        self)
                                      for f in (BatchDecoder._prefill_target, BatchDecoder._prefill_drafter))

    def saved_compiles(self) -> dict[str, dict[str, int]]:
        """For each step and prefill compiled ahead of time (compile_cache) and called so far: how
        many compiles it loaded from disk and how many it compiled and saved here. A warm start that
        compiled none traced nothing."""
        return {f.name: {"loaded": f.loaded, "compiled": f.compiled} for f in self._saved_compile_fns()
                if f.loaded + f.compiled}

    def __getstate__(self) -> dict:
        """The decoder as a saved compiled step pickles it (engine/saved_compile.py: its guards'
        view of the step's argument, tensors as shapes only), less what no step reads: the
        compiled steps themselves and the captured graphs, which cannot be pickled."""
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_fns", "_fns_rows", "_eager_fns", "_prefill_fns", "graphs")}

    def set_steps_table(self, steps_by_batch: tuple[tuple[int, int], ...]) -> None:
        """Draft steps per batch size from the next step on (SpecConfig.steps_by_batch, at most
        spec.steps; it replaces accept_rates). For sweeps and the steps chosen from measured costs
        (engine/steps_by_cost.py); call between steps, not with one in flight."""
        if self.spec is None or self._in_flight:
            raise RuntimeError("a steps table needs speculation and no step in flight")
        self.spec = dataclasses.replace(self.spec, steps_by_batch=tuple(steps_by_batch), accept_rates=())

    def use_synthetic_acceptance(self, rates: list[float], seed: int = 0) -> None:
        """BENCHMARKS ONLY: device-side chain steps accept draft j with probability rates[j-1]
        (given drafts 1..j-1 were accepted) instead of comparing it with the target's argmax,
        so a random-weight target of a real shape runs its real cycle (draft, verify, accept,
        extend) at a chosen accept length. The tokens are then meaningless. No engine argument,
        profile or CLI flag of the server reaches this (as vLLM's synthetic rejection sampler
        and SGLANG_SIMULATE_ACC_LEN, it is a measuring device)."""
        if self.spec is not None and self.spec.topk != 1:
            raise ValueError("synthetic acceptance is per chain position: it needs topk = 1")
        if self.spec is None or len(rates) < self.spec.steps or not all(0 <= r <= 1 for r in rates):
            steps = self.spec.steps if self.spec else 0
            raise ValueError(f"synthetic acceptance needs one rate in [0, 1] per draft step ({steps})")
        self.synthetic = SyntheticAcceptance(
            torch.tensor(rates[:self.spec.steps], device=self.device),
            torch.zeros(self.max_batch, self.spec.steps, device=self.device),
            torch.Generator(self.device).manual_seed(seed))

    def _graph_state(self) -> list[torch.Tensor]:
        extra = [self.draft_logits, self.draft_hidden, self.lag_dev] if self.spec else []
        return [self.lens_dev, self.pending, *extra]

    # -- helpers ---------------------------------------------------------------------------
    def _span(self, rows: int, extra: int) -> int:
        """Attention width: enough for every row, rounded (powers of two when graphs are captured
        or steps compiled: few buckets, each captured once)."""
        need = max(self.lens[:rows]) + extra
        if self.fixed_shapes:
            return pow2_bucket(need, 256, self.cache_len)
        m = self.span_multiple
        return min(self.cache_len, -(-need // m) * m)

    def _span_buckets(self) -> list[int]:
        """Every span a captured or compiled step can attend over (_span's buckets)."""
        spans, n = [], 256
        while n < self.cache_len:
            spans.append(n)
            n *= 2
        return spans + [self.cache_len]

    def _padded(self, rows: int) -> int:
        """Rows a device-side step runs: graphs run a power of two (the extra rows are free
        cache rows at length 0), so each is captured (and compiled) once."""
        if self.step_width:
            return self.max_batch
        return pow2_bucket(rows, 1, self.max_batch) if self.graphs.enabled else rows

    def _lens(self, rows: int, offset: int = 0) -> torch.Tensor:
        return torch.tensor(self.lens[offset:offset + rows], device=self.device)

    def _start_copy(self, *tensors: torch.Tensor):
        """Copies of small step outputs on the host (pinned, asynchronous on GPU) and the event
        that marks them complete; a later replay may then overwrite the graph's outputs."""
        if self.device.type != "cuda":
            return (*(t.clone() for t in tensors), None)
        host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
        for h, t in zip(host, tensors):
            h.copy_(t, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return (*host, done)

    # -- prefill -----------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, row: int, prompt: list[int], sampling: BatchSampling) -> int:
        """Fill row `row` with `prompt`; return the first generated token."""
        return self.prefill_batch(row, [prompt], sampling)[0]

    @torch.inference_mode()
    def prefill_batch(self, row: int, prompts: list[list[int]], sampling: BatchSampling) -> list[int]:
        return [r.tokens[0] for r in self.prefill_rows(row, prompts, sampling)]

    @torch.inference_mode()
    def prefill_rows(self, row: int, prompts: list[list[int]], sampling: BatchSampling) -> list[StepResult]:
        """Fill rows row .. row + len(prompts) - 1 with `prompts`; return each row's first
        generated token. With `prefill_graphs`, up to PREFILL_GRAPH_GROUP prompts no longer than a
        graph's each replay their width's captured graph, queued one after another and read once
        at the end. Otherwise one eager forward fills the group."""
        n, lens = len(prompts), [len(p) for p in prompts]
        width = max(lens)
        tokens = torch.tensor([p + [0] * (width - len(p)) for p in prompts], device=self.device)
        if self._replays_prefill(prompts):
            samplings = [sampling.rows(i, i + 1) for i in range(n)]
            parts = [self._prefill_graphed(row + i, tokens[i, :lens[i]], s) for i, s in enumerate(samplings)]
        else:
            samplings = [sampling]
            parts = [self._prefill_eager(row, tokens, lens, sampling)]
        return self._first_results(parts, samplings)

    def _first_results(self, parts: list[tuple[torch.Tensor, torch.Tensor]],
                       samplings: list[BatchSampling]) -> list[StepResult]:
        """Prefilled rows' first tokens, read from the device once: parts[i] = (first tokens,
        logits) of rows sampled by samplings[i]."""
        firsts = torch.cat([first for first, _ in parts]).tolist()
        logprobs, done = [], 0
        for (first, logits), s in zip(parts, samplings):
            logprobs += self._logprobs(logits, s, [[(0, t)] for t in firsts[done:done + len(first)]])
            done += len(first)
        return [StepResult([t], logprobs=lp) for t, lp in zip(firsts, logprobs)]

    def _replays_prefill(self, prompts: list[list[int]]) -> bool:
        """Whether these prompts prefill through the captured graphs, one at a time (see PREFILL_GRAPH_GROUP)."""
        return (self.prefill_graphs and len(prompts) <= PREFILL_GRAPH_GROUP
                and max(map(len, prompts)) <= min(PREFILL_GRAPH_TOKENS, self.cache_len))

    def _prefill_graphed(self, row: int, prompt: torch.Tensor, sampling: BatchSampling):
        """One prompt through the captured graphs of its width (padded to a power of two, 16 on),
        which read prompt, row and last position from their input buffers: every row shares
        them. Returns (first token [1], logits [1, 1, V]), copied out of the graph's outputs."""
        length = prompt.shape[0]
        width = pow2_bucket(length, 16, self.cache_len)
        self.graph_prompt.zero_()
        self.graph_prompt[0, :length] = prompt
        self.graph_last.fill_(length - 1)
        self.graph_row.fill_(row)
        tokens, last, at = self.graph_prompt[:, :width], self.graph_last, self.graph_row
        eager = (self._prefill_target, self._prefill_drafter)
        compiled = self.compiles_prefills and (self.ready_compiles is None or ("prefill",) in self.ready_compiles)
        target, drafter = self._prefill_fns if compiled else eager
        logits, aux = self.graphs.run(("prefill", width, compiled), lambda: target(at, tokens, last, None))
        first = self._first_tokens(row, [length], logits, sampling)
        if self.spec:
            self.graph_first.copy_(first)
            d = self.graphs.run(("prefill draft", width, compiled),
                                lambda: drafter(at, tokens, last, self.graph_first, aux, None))
            self._set_draft_state(row, 1, d)
        return first, logits.clone()

    def _prefill_eager(self, row: int, tokens: torch.Tensor, lens: list[int], sampling: BatchSampling):
        """Prompts right-padded to the longest [n, width] in one forward: pad positions land past
        each row's committed length, where every later step masks them out and overwrites them,
        so the batch changes no row's result. Returns (first tokens [n], logits [n, 1, V])."""
        n, width = tokens.shape
        last = torch.tensor(lens, device=self.device) - 1
        inputs = self._prefill_inputs(row, n, width)
        # Never the compiled _prefill_fns: a compiled graph keeps the attention backend it was
        # traced with, and these run without cuDNN where the captured prefills run with it.
        with self._unplanned_attention() if width <= PREFILL_GRAPH_TOKENS else contextlib.nullcontext():
            logits, aux = self._prefill_target(row, tokens, last, inputs)
            first = self._first_tokens(row, lens, logits, sampling)
            if self.spec:
                self._set_draft_state(row, n, self._prefill_drafter(row, tokens, last, first, aux, inputs))
        return first, logits

    def _first_tokens(self, row: int, lens: list[int], logits: torch.Tensor, sampling: BatchSampling) -> torch.Tensor:
        """Each prefilled row's first generated token (on the device), recorded as its pending token
        beside its prompt's length."""
        probs = probs_from_logits(self._process(logits, sampling, [[[]]] * len(lens)), sampling)[:, 0]
        first = probs.argmax(-1) if sampling.all_greedy else sample_rows(probs, sampling.generators)
        self.lens[row:row + len(lens)] = lens
        self.pending[row:row + len(lens)] = first
        return first

    def _unplanned_attention(self):
        """For a short eager forward on GPU (a group of short prompts, a shared prompt's token, the
        drafter's catch-up in a host-side step), attention without cuDNN: torch sends masked
        attention to cuDNN first on Hopper, and cuDNN plans each shape the first time it meets
        it, 36 ms against 0.24 ms a call without; these shapes are
        new most times. Captured and compiled steps keep cuDNN (planned once, at capture), and so
        do a long prompt and the host-side steps: the only other kernel that takes a mask with
        fewer KV heads than query heads (math) expands K and V to every query head and holds
        every score."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    def _prefill_inputs(self, row: int | torch.Tensor, n: int, width: int) -> AttnInputs:
        dev = self.device
        depth = torch.arange(width, device=dev).expand(n, width)
        span = min(self.cache_len, -(-width // self.span_multiple) * self.span_multiple)
        return block_inputs(torch.zeros(n, dtype=torch.long, device=dev), causal(n, width, dev), depth, span,
                            row_offset=row)

    def _prefill_target(self, row: int | torch.Tensor, tokens: torch.Tensor, last: torch.Tensor,
                        inputs: AttnInputs | None):
        """The target over right-padded prompts [n, width] from cache position 0: logits at each
        row's last prompt token, and the aux states the drafter reads."""
        n, width = tokens.shape
        inputs = self._prefill_inputs(row, n, width) if inputs is None else inputs
        out = self.target(tokens, inputs, capture_aux=self.spec is not None, logits_at=last.view(n, 1))
        return out.logits, out.aux_hidden

    def _prefill_drafter(self, row: int | torch.Tensor, tokens: torch.Tensor, last: torch.Tensor, first: torch.Tensor,
                         aux: torch.Tensor, inputs: AttnInputs | None):
        """The drafter reads token t + 1 beside the target's state at t: the prompts shifted left,
        each row's first generated token after its last prompt token."""
        n, width = tokens.shape
        inputs = self._prefill_inputs(row, n, width) if inputs is None else inputs
        ext = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)
        ext[torch.arange(n, device=self.device), last] = first
        return self.drafter(ext, aux, inputs, logits_at=last.view(n, 1))

    @torch.inference_mode()
    def prefill_shared(self, row: int, sources: list[int], prompts: list[list[int]],
                       sampling: BatchSampling) -> list[StepResult]:
        """Rows row .. row + len(sources) - 1 take prompts that rows `sources` hold already (n > 1
        choices, or clients sending one prompt): a source row's cache below its prompt length is
        still that prompt's, as its prefill wrote it, so those positions are copied, and one target forward
        of each prompt's last token (its KV rewritten with the same values) gives the first token,
        one drafter step the draft state. Costs a copied row and a one-token step, not a prefill.
        With `prefill_graphs` a small group of short prompts replays the captured prefill instead
        (_replays_prefill): the eager one-token step is a thousand launches, a replay one."""
        if self._replays_prefill(prompts):
            return self.prefill_rows(row, prompts, sampling)
        kv = self._kv()
        for i, (src, prompt) in enumerate(zip(sources, prompts)):
            held = len(prompt)
            torch._foreach_copy_([t[row + i, :, :held] for t in kv], [t[src, :, :held] for t in kv])
        lens = [len(p) for p in prompts]
        span = min(self.cache_len, -(-max(lens) // self.span_multiple) * self.span_multiple)
        inputs = one_token_inputs(torch.tensor(lens, device=self.device) - 1, span, row_offset=row)
        last = torch.tensor([[p[-1]] for p in prompts], device=self.device)
        with self._unplanned_attention():
            out = self.target(last, inputs, capture_aux=self.spec is not None)
            first = self._first_tokens(row, lens, out.logits, sampling)
            if self.spec:
                self._set_draft_state(row, len(lens), self.drafter(first.unsqueeze(1), out.aux_hidden, inputs))
        return self._first_results([(first, out.logits)], [sampling])

    def _set_draft_state(self, row: int, n: int, d) -> None:
        """Rows row .. row + n - 1 start with the drafter's output d (one position each) and no backlog."""
        self.draft_logits[row:row + n] = d.logits[:, 0]
        self.draft_hidden[row:row + n] = d.hidden[:, 0]
        self.lag[row:row + n] = [0] * n
        self.lag_dev[row:row + n] = 0

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
            shapes.setdefault((self._padded(rows), self.spec.steps_for(rows) if self.spec else 0), rows)
        return shapes

    @torch.inference_mode()
    def warm_up_prefills(self) -> None:
        """With `prefill_graphs`, one prefill of every captured width (compiled with compile_prefill)."""
        if self.prefill_graphs:
            limit = min(PREFILL_GRAPH_TOKENS, self.cache_len)
            for width in sorted({pow2_bucket(w, 16, self.cache_len) for w in range(1, limit + 1)}):
                self.prefill(0, [0] * min(width, limit), BatchSampling.all_greedy_rows(1, self.device))

    @torch.inference_mode()
    def warm_up_shape(self, padded: int, steps: int, rows: int) -> None:
        """One device-side greedy step of this shape at every span bucket (a drafter catch-up after
        each where a table drafts 0 steps somewhere); leaves every row empty."""
        catch_ups = self.spec is not None and any(s == 0 for _, s in self.spec.steps_by_batch)
        for row in range(rows):
            self.prefill(row, [0, 0], BatchSampling.all_greedy_rows(1, self.device))
        # Every span bucket, narrowest to widest: each is a graph of its own, and a capture
        # in serving (a device sync and two runs of the step) stalls every request in flight.
        # Compiled, the widest span's guard is checked too: one it fails recompiles now.
        for span in self._span_buckets():
            self.lens[:rows] = [max(2, span - self._step_reach())] * rows
            self.step(rows, BatchSampling.all_greedy_rows(rows, self.device))
            if catch_ups:
                self._catch_up(rows, padded, span)
        self.empty_rows()

    # -- compiled steps made by another process ----------------------------------------------
    def serve_compiled_when_ready(self) -> None:
        """From now on a shape runs compiled only once marked ready (`mark_ready`), and a compiled
        step never compiles here: until then, and for a shape its saved compiles do not accept, it
        runs eager. Another process compiles into compile_cache (engine/background_compile.py)."""
        self.ready_compiles = set()

    @torch.inference_mode()   # a loaded compile's global-state guard takes the grad mode it was loaded under
    def refresh_saved_compiles(self) -> int:
        """Loads the compiles saved in compile_cache since the last look; how many."""
        return sum(f.refresh() for f in self._saved_compile_fns())

    @torch.inference_mode()   # as steps run: grad mode is global state the guards check, and thread-local
    def saved_compiles_accept(self, padded: int, steps: int) -> bool:
        """Whether a loaded compile accepts this decode shape at every span bucket (no compile)."""
        fn = (self._fns if padded == 1 else self._fns_rows)[self._kind(steps)]
        return isinstance(fn, SavedCompile) and all(
            fn.saved_step(self, padded, self._span_base[:span], steps) is not None for span in self._span_buckets())

    def saved_prefills_accept(self) -> bool:
        """Whether loaded compiles exist for the captured prefills (they are symbolic in width)."""
        fns = [getattr(f, "func", f) for f in self._prefill_fns]
        return all(isinstance(f, SavedCompile) and f.saved for f in fns)

    def mark_ready(self, key: tuple) -> None:
        """(padded rows, draft steps) or ("prefill",): its compiled form serves from the next step on."""
        self.ready_compiles = self.ready_compiles | {key}   # replaced whole: the engine thread reads it

    def _saved_compile_fns(self) -> list[SavedCompile]:
        fns = [*self._fns.values(), *self._fns_rows.values(), *(getattr(f, "func", f) for f in self._prefill_fns)]
        return [f for f in fns if isinstance(f, SavedCompile)]

    def _kind(self, steps: int) -> str:
        return ("tree" if self.spec.topk > 1 else "chain" if steps else "deferred") if self.spec else "plain"

    def empty_rows(self) -> None:
        """Every row empty again, after warm-up or measuring steps (what they wrote is never read)."""
        self.lens = [0] * self.max_batch
        if self.spec:
            self.lag = [0] * self.max_batch
            self.lag_dev.zero_()

    # -- decode steps ------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, rows: int, sampling: BatchSampling) -> list[StepResult]:
        if self.device_side(sampling):
            return self.collect(self.launch(rows))
        return self._spec_step(rows, sampling) if self.spec else self._plain_step(rows, sampling)

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
    def launch(self, rows: int) -> "InFlight":
        """Enqueue one device-side greedy step (engine/greedy_cycle.py; a CUDA graph on GPU) and
        the copy of its results to the host; returns at once on GPU.

        A step may be launched while the previous one is still in flight (nothing about the
        rows may change in between): it continues from the device state the previous step
        leaves, so the GPU never waits for the host to read a step before starting the next.
        """
        steps = self.spec.steps_for(rows) if self.spec else 0
        kind = self._kind(steps)
        span = self._span(rows, self._step_reach())
        padded = self._padded(rows)
        fn, compiled = self._eager_fns[kind], False
        if self.compiled and (self.ready_compiles is None or (padded, steps) in self.ready_compiles):
            fn, compiled = (self._fns if padded == 1 else self._fns_rows)[kind], True
        if self._in_flight:  # the device lengths are ahead of the host's: keep them
            self.lens_dev[rows:padded].zero_()
        else:
            lens = self.lens[:rows] + [0] * (padded - rows)
            self.lens_dev[:padded].copy_(torch.tensor(lens), non_blocking=True)
        if self.spec and (behind := max(self.lag[:rows])) and (steps or behind == self.lag_capacity):
            self._catch_up(rows, padded, span)
        if self.synthetic is not None:
            self.synthetic.uniforms.uniform_(generator=self.synthetic.generator)
        span_arg = self._span_base[:span] if compiled else span   # symbolic in the compile (_compiled)
        if compiled and self.ready_compiles is not None:   # made elsewhere: never compile here
            fn = fn.saved_step(self, padded, span_arg, steps) or _eager_by_span_ref(self._eager_fns[kind])
        tokens, counts, proposed = self.graphs.run((kind, padded, span, steps, compiled),
                                                   lambda: fn(self, padded, span_arg, steps))
        if kind == "deferred":
            self.lag[:rows] = [n + 1 for n in self.lag[:rows]]
        self._in_flight += 1
        return InFlight(rows, *self._start_copy(tokens[:rows], counts[:rows], proposed[:rows]))

    def collect(self, step: "InFlight") -> list[StepResult]:
        """Wait for a launched step (releasing the GIL on GPU) and account its tokens."""
        if step.done is not None:
            t0 = time.perf_counter()
            step.done.synchronize()
            self.collect_wait_s += time.perf_counter() - t0
        self.collected += 1
        self._in_flight -= 1
        tokens, counts, proposed = step.tokens.tolist(), step.counts.tolist(), step.proposed.tolist()
        results = []
        for b in range(step.rows):
            self.lens[b] += counts[b]
            results.append(StepResult(tokens[b][:counts[b]], proposed=proposed[b], accepted=counts[b] - 1))
        return results

    def _plain_step(self, rows: int, sampling: BatchSampling) -> list[StepResult]:
        out = self.target(self.pending[:rows].unsqueeze(1), one_token_inputs(self._lens(rows), self._span(rows, 1)))
        p = probs_from_logits(self._process(out.logits, sampling, [[[]]] * rows), sampling)[:, 0]
        new = p.argmax(-1) if sampling.all_greedy else sample_rows(p, sampling.generators)
        self.pending[:rows] = new
        for b in range(rows):
            self.lens[b] += 1
        tokens = new.tolist()
        logprobs = self._logprobs(out.logits, sampling, [[(0, t)] for t in tokens])
        return [StepResult([t], logprobs=lp) for t, lp in zip(tokens, logprobs)]

    def _spec_step(self, rows: int, sampling: BatchSampling) -> list[StepResult]:
        spec, dev = self.spec, self.device
        base = self._lens(rows)
        span = self._span(rows, spec.headroom)
        if behind := max(self.lag[:rows]):  # eager, as this whole step is: the longest backlog wide
            with self._unplanned_attention():
                drafter_catch_up(self, rows, base, span, behind)
            self.lag[:rows] = [0] * rows
        state = DraftState(self.draft_logits[:rows], self.draft_hidden[:rows])
        root = self.pending[:rows]
        if spec.topk == 1:
            tree = draft_chain(self.drafter, state, root, base, spec.steps_for(rows), sampling, span,
                               self._draft_masks(sampling))
        else:
            tree = draft_tree(self.drafter, state, root, base, spec.steps, spec.topk, spec.draft_tokens, span)
        out = self.target(tree.tokens, block_inputs(base, tree.ancestors, tree.depth, span), capture_aux=True)
        logits = self._process(out.logits, sampling, _node_paths(tree) if sampling.processors else None)
        results = accept(tree, probs_from_logits(logits, sampling), sampling)
        logprobs = self._logprobs(out.logits, sampling, [list(zip([0] + r.path, r.tokens)) for r in results])

        # Accepted nodes, root first; the target cache must hold them at base .. base + a.
        paths = [[0] + r.path for r in results]
        self._compact_target(paths, base)
        width = max(len(p) for p in paths)
        node_idx = torch.tensor([p + [p[-1]] * (width - len(p)) for p in paths], device=dev)
        ext_tok = torch.tensor([r.tokens + [r.tokens[-1]] * (width - len(r.tokens)) for r in results], device=dev)
        aux = torch.gather(out.aux_hidden, 1, node_idx.unsqueeze(-1).expand(-1, -1, out.aux_hidden.shape[-1]))
        depth = torch.arange(width, device=dev).expand(rows, width)
        last = torch.tensor([[len(p) - 1] for p in paths], device=dev)
        d = self.drafter(ext_tok, aux, block_inputs(base, causal(rows, width, dev), depth, span), logits_at=last)
        self.draft_logits[:rows] = d.logits[:, 0]
        self.draft_hidden[:rows] = d.hidden[:, 0]
        self.pending[:rows] = torch.tensor([r.tokens[-1] for r in results], device=dev)
        for b, p in enumerate(paths):
            self.lens[b] += len(p)
        # "Proposed" = draft tokens along the deepest path: steps for a chain, tree depth otherwise.
        proposed = tree.depth.max(-1).values.tolist()
        return [StepResult(r.tokens, proposed=proposed[b], accepted=len(r.path), logprobs=logprobs[b])
                for b, r in enumerate(results)]

    def _catch_up(self, rows: int, padded: int, span: int) -> None:
        """The drafter over every row's backlog before a device-side step (when the backlog is
        full at 0 drafts, or when drafting resumes). With graphs or compile, at one shape: LAG_STEPS
        entries a row (a shorter backlog repeats its last) over the padded rows, so it replays as a
        captured graph per (rows, span); eager it cost 15-20 ms on the H200.
        Padding rows have no backlog: they write only their own free cache rows. Otherwise as wide
        as the longest backlog."""
        self.lag_dev[rows:padded].zero_()
        width = self.lag_capacity if self.fixed_shapes else max(self.lag[:rows])
        self.graphs.run(("catch up", padded, span),
                        lambda: drafter_catch_up(self, padded, self.lens_dev[:padded], span, width))
        self.lag[:rows] = [0] * rows

    # -- logits processing and logprobs (host-side rows) -------------------------------------
    def _process(self, logits: torch.Tensor, sampling: BatchSampling, paths) -> torch.Tensor:
        """logits [B, N, V] -> each row's processed logits; paths[b][i]: the drafts on node i's path."""
        if sampling.processors is None:
            return logits
        return torch.stack([logits[b].float() if proc is None else proc.apply(logits[b], paths[b])
                            for b, proc in enumerate(sampling.processors)])

    def _draft_masks(self, sampling: BatchSampling):
        """`allowed` for draft_chain: each grammar row's mask over the draft vocabulary."""
        procs = sampling.processors
        if procs is None or all(p is None or p.matcher is None for p in procs):
            return None
        ids = self.drafter.draft_to_target(torch.arange(self.drafter.config.draft_vocab_size, device=self.device))
        free = torch.ones(ids.shape[0], dtype=torch.bool, device=self.device)

        def allowed(drafts: list[torch.Tensor]) -> torch.Tensor:
            paths = torch.stack(drafts, 1).tolist() if drafts else [[] for _ in procs]
            rows = [free if p is None or p.matcher is None else p.draft_mask(path)[ids]
                    for p, path in zip(procs, paths)]
            mask = torch.stack(rows)
            mask[~mask.any(-1)] = True  # the grammar allows nothing in the draft vocabulary: draft freely
            return mask
        return allowed

    def _logprobs(self, logits: torch.Tensor, sampling: BatchSampling,
                  picks: list[list[tuple[int, int]]]) -> list[list[TokenLogprob] | None]:
        """picks[b]: (node, token) of each token row b emitted; the raw target logits [B, N, V] at
        that node give its logprob and the top k."""
        ks = sampling.logprobs
        if ks is None:
            return [None] * len(picks)
        want = [(b, node, tok) for b, k in enumerate(ks) if k is not None for node, tok in picks[b]]
        b_idx, n_idx, t_idx = (torch.tensor(c, device=self.device) for c in zip(*want))
        lp = logits[b_idx, n_idx].float().log_softmax(-1)
        chosen = lp.gather(1, t_idx.unsqueeze(1))[:, 0].tolist()
        kmax = max(k for k in ks if k is not None)
        top_v, top_i = lp.topk(kmax, dim=-1) if kmax else (lp[:, :0], lp[:, :0].long())
        top_v, top_i = top_v.tolist(), top_i.tolist()
        out: list[list[TokenLogprob] | None] = [None if k is None else [] for k in ks]
        for j, (b, _, _) in enumerate(want):
            k = ks[b]
            out[b].append(TokenLogprob(chosen[j], tuple(zip(top_i[j][:k], top_v[j][:k]))))
        return out

    def _compact_target(self, paths: list[list[int]], base: torch.Tensor) -> None:
        moves = [(b, i, node) for b, p in enumerate(paths) for i, node in enumerate(p) if node != i]
        if not moves:
            return
        rows = torch.tensor([m[0] for m in moves], device=self.device)
        src = base[rows] + torch.tensor([m[2] for m in moves], device=self.device)
        dst = base[rows] + torch.tensor([m[1] for m in moves], device=self.device)
        for layer in self.target.layers:
            layer.self_attn.kv_cache.copy_positions(rows, src.unsqueeze(1), dst.unsqueeze(1))

    # -- row management ----------------------------------------------------------------------
    def move_row(self, src: int, dst: int) -> None:
        """Move request state from row src to row dst (keeps active rows contiguous). The caches
        move in one foreach copy: two copies a layer took 1.5 ms of launches a move on the H200."""
        kv = self._kv()
        torch._foreach_copy_([t[dst] for t in kv], [t[src] for t in kv])
        self.lens[dst] = self.lens[src]
        self.pending[dst] = self.pending[src]
        if self.spec:
            self.lag[dst] = self.lag[src]
            for t in (self.draft_logits, self.draft_hidden, self.lag_dev, self.lag_tokens, self.lag_aux):
                t[dst] = t[src]

    def _kv(self) -> list[torch.Tensor]:
        """Every K and V cache tensor [rows, heads, positions, dim]: the target's layers, then the drafter's."""
        caches = [layer.self_attn.kv_cache for layer in self.target.layers]
        if self.spec:
            caches.append(self.drafter.midlayer.self_attn.kv_cache)
        return [t for c in caches for t in (c.k, c.v)]


def _compiled(step, cache: str | None, name: str, dynamic: bool, options: dict):
    """The step compiled: ahead of time and saved in `cache`, or lazily by torch.compile. The
    batch-1 compile makes its span (argument 2) symbolic by marking it; the batched one is dynamic
    in every size."""
    marks = () if dynamic else ((2, 0),)
    if cache:
        return SavedCompile(step, cache, f"{name}-{'rows' if dynamic else 'b1'}", dynamic, options, marks)
    compiled = torch.compile(step, dynamic=dynamic or None, options=options)
    return functools.wraps(step)(lambda *args: compiled(*marked(args, marks)))


def _eager_by_span_ref(step):
    """An eager step called as a compiled one is (span as a tensor's length)."""
    return lambda dec, rows, span_ref, steps: step(dec, rows, span_ref.shape[0], steps)


def _span_from_ref(step):
    """A device-side step that takes its attention span as the length of a tensor (made
    symbolic by `_compiled`), not as an int, which torch.compile would specialize on: one compile
    then serves every span bucket, and compiled steps attend over the context in use instead of
    the whole cache (which cost a 3-step cycle 43% of its time in attention on an H200)."""
    def step_by_span_ref(dec, rows: int, span_ref: torch.Tensor, steps: int):
        return step(dec, rows, span_ref.shape[0], steps)
    return step_by_span_ref


def _node_paths(tree) -> list[list[list[int]]]:
    """[b][i]: the draft tokens from the root's child down to node i (node 0: [])."""
    out = []
    for toks, parents in zip(tree.tokens.tolist(), tree.parents.tolist()):
        paths = [[]]
        for i in range(1, len(toks)):
            paths.append(paths[parents[i]] + [toks[i]])
        out.append(paths)
    return out
