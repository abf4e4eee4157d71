"""Each cache row's decode state: what the speculative worker reads and writes at every step.

Active requests occupy rows 0..B-1 (kept contiguous by `move_row`). For each row: the committed
target cache length (on the host, and its device copy, ahead of the host's while device-side
steps are in flight), the pending token (produced, not yet in the target cache) and, with a
drafter, the drafter's prediction after that token (logits and hidden state) and its backlog.

The backlog: at 0 draft steps a device-side step does not run the drafter; it keeps what the
drafter would have read (the new token, the target's aux states at the pending one), and the
drafter reads the whole backlog in one forward when drafting resumes or the backlog is full
(engine/spec_worker.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# Device-side steps at 0 draft steps the drafter may fall behind before it reads its backlog in
# one forward: reading its weights once per this many tokens, not once a token, leaves a step at 0
# drafts about a plain step (0.94-1.01x on the H200 not compiled, with the backlog read eager; it
# replays a captured graph since); the backlog's memory is max_batch * its steps * (3 * target
# hidden) values.
BACKLOG_STEPS = 16
# Without graphs or compile (CPU) the backlog read has no fixed shape, so it is as wide as the
# longest backlog, and the backlog holds this many steps. A request that ends before drafting
# resumes or its backlog fills never pays for reading it. On 2 cores a step costs the same with
# either backlog, and over HTTP the saving was below the noise.
EAGER_BACKLOG_STEPS = 128


@dataclass
class DecodeState:
    lens: list[int]                             # committed target cache length per row
    lens_dev: torch.Tensor                      # [max_batch] its device copy
    pending: torch.Tensor                       # [max_batch] the token each row produced last
    draft_logits: torch.Tensor | None = None    # [max_batch, draft vocab] the drafter's next prediction
    draft_hidden: torch.Tensor | None = None    # [max_batch, H]
    backlog: list[int] | None = None            # backlog entries per row
    backlog_dev: torch.Tensor | None = None     # [max_batch] its device copy
    backlog_tokens: torch.Tensor | None = None  # [max_batch, capacity] tokens the drafter has not read
    backlog_aux: torch.Tensor | None = None     # [max_batch, capacity, aux] the target's states beside them

    @classmethod
    def new(cls, max_batch: int, device, drafter=None, backlog_steps: int = 0) -> "DecodeState":
        zeros = torch.zeros(max_batch, dtype=torch.long, device=device)
        state = cls([0] * max_batch, zeros, zeros.clone())
        if drafter is not None:
            dtype, cfg = drafter.fc.weight.dtype, drafter.config
            state.draft_logits = torch.zeros(max_batch, cfg.draft_vocab_size, dtype=dtype, device=device)
            state.draft_hidden = torch.zeros(max_batch, cfg.hidden_size, dtype=dtype, device=device)
            state.backlog = [0] * max_batch
            state.backlog_dev = zeros.clone()
            state.backlog_tokens = torch.zeros(max_batch, backlog_steps, dtype=torch.long, device=device)
            aux = cfg.num_aux * cfg.target_hidden_size
            state.backlog_aux = torch.zeros(max_batch, backlog_steps, aux, dtype=dtype, device=device)
        return state

    @property
    def drafting(self) -> bool:
        return self.draft_logits is not None

    @property
    def backlog_capacity(self) -> int:
        return self.backlog_tokens.shape[1]

    def step_tensors(self) -> list[torch.Tensor]:
        """The small tensors a device-side step updates (restored after a capture's warm-up run)."""
        extra = [self.draft_logits, self.draft_hidden, self.backlog_dev] if self.drafting else []
        return [self.lens_dev, self.pending, *extra]

    def start_rows(self, row: int, n: int, drafted) -> None:
        """Rows row .. row + n - 1 start from the drafter's output `drafted` (one position each) and no backlog."""
        self.draft_logits[row:row + n] = drafted.logits[:, 0]
        self.draft_hidden[row:row + n] = drafted.hidden[:, 0]
        self.backlog[row:row + n] = [0] * n
        self.backlog_dev[row:row + n] = 0

    def move_row(self, src: int, dst: int) -> None:
        self.lens[dst] = self.lens[src]
        self.pending[dst] = self.pending[src]
        if self.drafting:
            self.backlog[dst] = self.backlog[src]
            for t in (self.draft_logits, self.draft_hidden, self.backlog_dev, self.backlog_tokens, self.backlog_aux):
                t[dst] = t[src]

    def empty(self) -> None:
        """Every row empty again (what earlier steps wrote is never read)."""
        self.lens[:] = [0] * len(self.lens)
        if self.drafting:
            self.backlog[:] = [0] * len(self.backlog)
            self.backlog_dev.zero_()
