"""vLLM's hidden-states KV connector, writing synchronously: what `extract_hidden_states` needs
to run on CPU. The stock ExampleHiddenStatesConnector copies through pinned memory on a CUDA
stream in `_submit_async_write` ("pin_memory=True requires a CUDA or other accelerator backend"
on CPU); this one reads the request's hidden states out of the cache, writes the file and
releases its lock before reporting the request done. Loaded by vLLM's workers by module path
(drafter/capture_vllm.py), so it imports vLLM at the top and nothing else of ours.
"""
from __future__ import annotations

import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)


class _Written:
    """Stands in for the stock connector's copy-done CUDA event: the write already happened."""

    def query(self) -> bool:
        return True


class SyncHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending) -> None:
        if not self._is_tp_rank_zero:
            return
        bs = self._block_size
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (torch.arange(bs).view(1, -1) + blocks.view(-1, 1) * bs).flatten()
        hidden = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device), pending.token_ids.shape[0])
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        tmp = pending.filename + ".tmp"
        save_file({"hidden_states": hidden.cpu().contiguous(), "token_ids": pending.token_ids.clone()}, tmp)
        os.replace(tmp, pending.filename)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is not None:
            os.close(lock_fd)   # releases the reader waiting in load_hidden_states
        self._req_copy_events[pending.req_id] = _Written()
