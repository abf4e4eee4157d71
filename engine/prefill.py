"""Prefill: prompts into their cache rows, each row's first token, and the drafter's first state.

Three forms. A group of prompts right-padded to the longest in one eager forward. With
`prefill_graphs`, a prompt of at most PREFILL_GRAPH_TOKENS tokens as a CUDA graph, its width padded
to a power of two (16 on), one graph per width: the cache row is read from a device buffer
(models.layers.AttnInputs.row_offset), so every row shares it. Eager, a prefill is about a thousand
small kernel launches (SmolLM2: 1,064), tens of milliseconds of host time on an H200 before the
first token; captured, a few. Longer prompts stay eager: there the products, not the launches, take
the time. A group of up to PREFILL_GRAPH_GROUP short prompts replays the graphs one prompt at a time,
and so do prompts other rows hold (`shared`): on the H200 an eager group took 36-53 ms of launches
and a replay ~4.3 ms of GPU time, so a larger group, the burst of a server's first requests, stays
one eager forward (32 replays in a row held the burst's first tokens back twice as long). And a
prompt another row holds already: its cache copied, one token's forward (`shared`).

The captured prefills compile too (compile_prefill), once each with a symbolic width: uncompiled, a
captured prefill of one short prompt is ~1,000 small kernels, ~4.3 ms of GPU time on an H200, what a
request that joins costs every row in flight. The two compiles are a large part of a compiled start
(SmolLM2 on CPU: 61 of 143 s cold): compile_prefill False trades the shorter first token for a
faster start. On CPU nothing is captured: the prompt is only padded, which is how tests check the
padded path.
"""
from __future__ import annotations

import contextlib

import torch

from engine.acceptance import RejectionSampler
from engine.decode_state import DecodeState
from engine.logits_processing import token_logprobs
from engine.masks import block_inputs, causal, one_token_inputs
from engine.model_runner import ModelRunner, pow2_bucket, unplanned_attention
from engine.sampling import BatchSampling
from engine.spec_worker import StepResult
from models.layers import AttnInputs

PREFILL_GRAPH_TOKENS = 256
PREFILL_GRAPH_GROUP = 8


class Prefill:
    def __init__(self, runner: ModelRunner, state: DecodeState, graphs: bool = False, compile_prefill: bool = True):
        self.runner, self.state = runner, state
        self.target, self.drafter, self.device = runner.target, runner.drafter, runner.device
        self.cache_len, self.span_multiple = runner.cache_len, runner.span_multiple
        self.graphs = graphs
        if graphs:   # the captured prefills read their prompt, last position and row from these
            self.graph_prompt = torch.zeros(1, PREFILL_GRAPH_TOKENS, dtype=torch.long, device=self.device)
            self.graph_last = torch.zeros(1, dtype=torch.long, device=self.device)
            self.graph_first = torch.zeros(1, dtype=torch.long, device=self.device)
            self.graph_row = torch.zeros(1, dtype=torch.long, device=self.device)
        self.compiled = runner.compiled and graphs and compile_prefill
        self.fns = (self.target_forward, self.drafter_forward)
        if self.compiled:   # called with this object, as the steps are with the worker
            self.fns = runner.compiled_prefills({"prefill_target": Prefill.target_forward,
                                                 "prefill_drafter": Prefill.drafter_forward}, self)

    def __getstate__(self) -> dict:
        """What a saved compiled prefill pickles (engine/saved_compile.py), less what no forward
        reads and cannot be pickled: the runner (graphs, compiled functions) and the compiled forwards."""
        return {k: v for k, v in self.__dict__.items() if k not in ("runner", "fns")}

    def rows(self, row: int, prompts: list[list[int]], sampling: BatchSampling) -> list[StepResult]:
        """Fill rows row .. row + len(prompts) - 1 with `prompts`; each row's first generated token."""
        n, lens = len(prompts), [len(p) for p in prompts]
        width = max(lens)
        tokens = torch.tensor([p + [0] * (width - len(p)) for p in prompts], device=self.device)
        if self.replays(prompts):
            samplings = [sampling.rows(i, i + 1) for i in range(n)]
            parts = [self._graphed(row + i, tokens[i, :lens[i]], s) for i, s in enumerate(samplings)]
        else:
            samplings = [sampling]
            parts = [self._eager(row, tokens, lens, sampling)]
        return self._first_results(parts, samplings)

    def shared(self, row: int, sources: list[int], prompts: list[list[int]],
               sampling: BatchSampling) -> list[StepResult]:
        """Rows row .. row + len(sources) - 1 take prompts that rows `sources` hold already: a source
        row's cache below its prompt length is still that prompt's, as its prefill wrote it, so those
        positions are copied, and one target forward of each prompt's last token (its KV rewritten
        with the same values) gives the first token, one drafter step the draft state. A small group
        of short prompts with captured prefills replays those instead: the eager one-token step is a
        thousand launches, a replay one."""
        if self.replays(prompts):
            return self.rows(row, prompts, sampling)
        for i, (src, prompt) in enumerate(zip(sources, prompts)):
            self.runner.copy_prefix(src, row + i, len(prompt))
        lens = [len(p) for p in prompts]
        span = min(self.cache_len, -(-max(lens) // self.span_multiple) * self.span_multiple)
        inputs = one_token_inputs(torch.tensor(lens, device=self.device) - 1, span, row_offset=row)
        last = torch.tensor([[p[-1]] for p in prompts], device=self.device)
        with unplanned_attention(self.device):
            out = self.target(last, inputs, capture_aux=self.state.drafting)
            first = self._first_tokens(row, lens, out.logits, sampling)
            if self.state.drafting:
                self.state.start_rows(row, len(lens), self.drafter(first.unsqueeze(1), out.aux_hidden, inputs))
        return self._first_results([(first, out.logits)], [sampling])

    def replays(self, prompts: list[list[int]]) -> bool:
        """Whether these prompts prefill through the captured graphs, one at a time."""
        return (self.graphs and len(prompts) <= PREFILL_GRAPH_GROUP
                and max(map(len, prompts)) <= min(PREFILL_GRAPH_TOKENS, self.cache_len))

    def warm_up(self) -> None:
        """One prefill of every captured width (compiled with compile_prefill)."""
        if self.graphs:
            limit = min(PREFILL_GRAPH_TOKENS, self.cache_len)
            for width in sorted({pow2_bucket(w, 16, self.cache_len) for w in range(1, limit + 1)}):
                self.rows(0, [[0] * min(width, limit)], BatchSampling.all_greedy_rows(1, self.device))

    def _first_results(self, parts: list[tuple[torch.Tensor, torch.Tensor]],
                       samplings: list[BatchSampling]) -> list[StepResult]:
        """Prefilled rows' first tokens, read from the device once: parts[i] = (first tokens,
        logits) of rows sampled by samplings[i]."""
        firsts = torch.cat([first for first, _ in parts]).tolist()
        logprobs, done = [], 0
        for (first, logits), s in zip(parts, samplings):
            logprobs += token_logprobs(logits, s.logprobs, [[(0, t)] for t in firsts[done:done + len(first)]])
            done += len(first)
        return [StepResult([t], logprobs=lp) for t, lp in zip(firsts, logprobs)]

    def _graphed(self, row: int, prompt: torch.Tensor, sampling: BatchSampling):
        """One prompt through the captured graphs of its width, which read prompt, row and last
        position from their input buffers. Returns (first token [1], logits [1, 1, V]), copied out
        of the graph's outputs."""
        length = prompt.shape[0]
        width = pow2_bucket(length, 16, self.cache_len)
        self.graph_prompt.zero_()
        self.graph_prompt[0, :length] = prompt
        self.graph_last.fill_(length - 1)
        self.graph_row.fill_(row)
        tokens, last, at = self.graph_prompt[:, :width], self.graph_last, self.graph_row
        ready = self.runner.ready_compiles
        compiled = self.compiled and (ready is None or ("prefill",) in ready)
        target, drafter = self.fns if compiled else (self.target_forward, self.drafter_forward)
        graphs = self.runner.graphs
        logits, aux = graphs.run(("prefill", width, compiled), lambda: target(at, tokens, last, None))
        first = self._first_tokens(row, [length], logits, sampling)
        if self.state.drafting:
            self.graph_first.copy_(first)
            d = graphs.run(("prefill draft", width, compiled),
                           lambda: drafter(at, tokens, last, self.graph_first, aux, None))
            self.state.start_rows(row, 1, d)
        return first, logits.clone()

    def _eager(self, row: int, tokens: torch.Tensor, lens: list[int], sampling: BatchSampling):
        """Prompts right-padded to the longest [n, width] in one forward: pad positions land past
        each row's committed length, where every later step masks them out and overwrites them,
        so the batch changes no row's result. Returns (first tokens [n], logits [n, 1, V])."""
        n, width = tokens.shape
        last = torch.tensor(lens, device=self.device) - 1
        inputs = self._inputs(row, n, width)
        # Never the compiled forwards: a compiled graph keeps the attention backend it was
        # traced with, and these run without cuDNN where the captured prefills run with it.
        with unplanned_attention(self.device) if width <= PREFILL_GRAPH_TOKENS else contextlib.nullcontext():
            logits, aux = self.target_forward(row, tokens, last, inputs)
            first = self._first_tokens(row, lens, logits, sampling)
            if self.state.drafting:
                self.state.start_rows(row, n, self.drafter_forward(row, tokens, last, first, aux, inputs))
        return first, logits

    def _first_tokens(self, row: int, lens: list[int], logits: torch.Tensor, sampling: BatchSampling) -> torch.Tensor:
        """Each prefilled row's first generated token (on the device), recorded as its pending token
        beside its prompt's length."""
        first = RejectionSampler(sampling).sample(logits)
        self.state.lens[row:row + len(lens)] = lens
        self.state.pending[row:row + len(lens)] = first
        return first

    def _inputs(self, row: int | torch.Tensor, n: int, width: int) -> AttnInputs:
        dev = self.device
        depth = torch.arange(width, device=dev).expand(n, width)
        span = min(self.cache_len, -(-width // self.span_multiple) * self.span_multiple)
        return block_inputs(torch.zeros(n, dtype=torch.long, device=dev), causal(n, width, dev), depth, span,
                            row_offset=row)

    def target_forward(self, row: int | torch.Tensor, tokens: torch.Tensor, last: torch.Tensor,
                       inputs: AttnInputs | None):
        """The target over right-padded prompts [n, width] from cache position 0: logits at each
        row's last prompt token, and the aux states the drafter reads."""
        n, width = tokens.shape
        inputs = self._inputs(row, n, width) if inputs is None else inputs
        out = self.target(tokens, inputs, capture_aux=self.state.drafting, logits_at=last.view(n, 1))
        return out.logits, out.aux_hidden

    def drafter_forward(self, row: int | torch.Tensor, tokens: torch.Tensor, last: torch.Tensor, first: torch.Tensor,
                        aux: torch.Tensor, inputs: AttnInputs | None):
        """The drafter reads token t + 1 beside the target's state at t: the prompts shifted left,
        each row's first generated token after its last prompt token."""
        n, width = tokens.shape
        inputs = self._inputs(row, n, width) if inputs is None else inputs
        ext = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)
        ext[torch.arange(n, device=self.device), last] = first
        return self.drafter(ext, aux, inputs, logits_at=last.view(n, 1))
