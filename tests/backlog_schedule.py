"""The row schedule both backlog tests run (tests/test_lossless.py on CPU, tests/test_gpu.py on
CUDA graphs and compiled): at 0 draft steps a device-side step leaves the drafter a backlog it
reads in one forward (engine/spec_worker.py), the host step extends it every step.

Rows join at different times (backlogs of different lengths), more 0-step steps run than a
backlog of 16 holds (graphs and compiled steps; on CPU a test sets it), a row moves away, then one
row drafts again. The spec must draft at 1 row and
not at 2 or 3 (e.g. steps_by_batch ((1, 3), (2, 0), (3, 0))).
"""
from __future__ import annotations

from engine.decoder import BatchDecoder
from engine.sampling import BatchSampling


def run_backlog_schedule(dec: BatchDecoder, prompts: list[list[int]]) -> dict:
    """outs: each request's tokens (the one that left first); accepted: per step, per row;
    backlogs: the device-side backlogs at two checkpoints; state: the drafter's state (logits,
    hidden, KV of both remaining rows) just before drafting resumes."""
    def greedy(n: int) -> BatchSampling:
        return BatchSampling.all_greedy_rows(n, dec.device)

    outs, accepted, backlogs = [[dec.prefill(0, prompts[0], greedy(1))], [], []], [], []

    def run(rows: int, n_steps: int) -> None:
        for _ in range(n_steps):
            results = dec.step(rows, greedy(rows))
            for i, r in enumerate(results):
                outs[i] += r.tokens
            accepted.append([r.accepted for r in results])

    outs[1] = [dec.prefill(1, prompts[1], greedy(1))]
    run(2, 5)
    outs[2] = [dec.prefill(2, prompts[2], greedy(1))]
    run(3, 19)   # backlogs 5 + 11 = 16 (row 2: 11): with 16 a full backlog, all caught up, then 8 more
    backlogs.append(dec.state.backlog[:3])
    dec.move_row(2, 0)      # row 0 leaves, row 2 takes its place
    done, outs[0], outs[2] = outs[0], outs[2], []
    run(2, 2)
    backlogs.append(dec.state.backlog[:2])
    if dec.fast_greedy:     # what a drafting step does first, for both rows
        dec.read_backlog(2, dec.runner.padded(2), dec._span(2, 0))
    cache, n = dec.drafter.midlayer.self_attn.kv_cache, min(dec.lens[:2])
    st = dec.state
    state = [t[:2].clone() for t in (st.draft_logits, st.draft_hidden, cache.k[:2, :, :n], cache.v[:2, :, :n])]
    run(1, 3)               # one row at 3 drafts
    return dict(state=state, accepted=accepted, backlogs=backlogs, outs=[done, outs[0], outs[1]])
