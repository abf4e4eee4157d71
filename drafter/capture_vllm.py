"""vLLM as a capture engine: its `extract_hidden_states` speculative method with a hidden-states
KV connector (drafter/vllm_connector.py) runs each conversation as a prompt with max_tokens=1
and writes one safetensors file per request, `hidden_states` [T, layers, H] in the model dtype.
Any architecture vLLM serves works, tensor-parallel over many GPUs (`--vllm-arg
tensor_parallel_size=8`). Runs in vLLM's own environment (.venv-vllm), started by drafter/capture.py.

vLLM's ids are INPUTS of layers (id k = output of layer k - 1; id num_layers = the last layer's
output before the final norm); models.aux_layers.vllm_extract_ids/vllm_extract_rows translate
the training-convention outputs we are given. vLLM's per-request files live in the spool's
engine folder, counted against its budget, and are removed as soon as they are read.
"""
from __future__ import annotations

from pathlib import Path

import torch

from drafter.spool import ENGINE_DIR
from models.aux_layers import vllm_extract_ids, vllm_extract_rows

CONNECTOR = "SyncHiddenStatesConnector"
CONNECTOR_MODULE = "drafter.vllm_connector"
OURS = ("model", "speculative_config", "kv_transfer_config")   # the capture sets these itself


def engine_kwargs(job, spec, storage: Path) -> dict:
    """vLLM LLM(...) keyword arguments: ours, then the user's (`--vllm-arg`) over them."""
    bad = [k for k in OURS if k in job.engine_args]
    if bad:
        raise ValueError(f"--vllm-arg {', '.join(bad)}: set by the feature capture itself")
    on_gpu = torch.cuda.is_available()
    kw = {
        "model": job.target, "dtype": job.dtype, "seed": 0,
        "max_model_len": min(job.max_length + 1, spec.max_position_embeddings),
        "enable_prefix_caching": False,
        "speculative_config": {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                               "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids":
                                                                    vllm_extract_ids(job.aux_layer_outputs,
                                                                                     spec.num_hidden_layers)}}},
        "kv_transfer_config": {"kv_connector": CONNECTOR, "kv_connector_module_path": CONNECTOR_MODULE,
                               "kv_role": "kv_producer",
                               "kv_connector_extra_config": {"shared_storage_path": str(storage)}},
    }
    if not on_gpu:   # vLLM's CPU build: no compile at start-up (minutes on few cores), a small memory share
        kw.update(enforce_eager=True, gpu_memory_utilization=0.2)
        if str(job.dtype) in ("float32", "float"):
            # On a CPU with AMX tiles vLLM picks its AMX MLA backend for an MLA target (DeepSeek, Kimi),
            # which takes 16-bit or quantized weights only; float32 needs the reference CPU MLA backend.
            # Other targets take vLLM's CPU attention whatever is asked here.
            kw["attention_backend"] = "CPU_MLA"
    if job.trust_remote_code:
        kw["trust_remote_code"] = True
    kw.update(job.engine_args)
    return kw


class VLLMCapture:
    def __init__(self, job, spec):
        try:
            from vllm import LLM
        except ImportError as e:
            raise RuntimeError(f"--features vllm: vllm is not importable in this Python ({e}); `make vllm-venv` "
                               f"builds .venv-vllm, or pass --vllm-python") from e
        self.storage = Path(job.out) / ENGINE_DIR
        self.storage.mkdir(parents=True, exist_ok=True)
        self.ids = vllm_extract_ids(job.aux_layer_outputs, spec.num_hidden_layers)
        self.rows, self.last_row = vllm_extract_rows(job.aux_layer_outputs, spec.num_hidden_layers)
        self.kwargs = engine_kwargs(job, spec, self.storage)
        self.max_tokens = self.kwargs["max_model_len"] - 1   # the prompt, then the one token asked for
        self.itemsize = 4 if str(self.kwargs["dtype"]) in ("float32", "float") else 2
        self.hidden = spec.hidden_size
        self.llm = LLM(**self.kwargs)

    def temp_bytes(self, tokens: int) -> int:
        """vLLM's files for `tokens` prompt positions, on disk until read."""
        return tokens * (len(self.ids) * self.hidden * self.itemsize + 8) + 4096

    def capture(self, seqs: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        from vllm import SamplingParams, TokensPrompt
        from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
            cleanup_hidden_states,
            load_hidden_states,
        )
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=s.tolist()) for s in seqs],
                                 SamplingParams(max_tokens=1), use_tqdm=False)
        result = []
        for s, o in zip(seqs, outs):
            path = (o.kv_transfer_params or {}).get("hidden_states_path")
            if path is None:
                raise RuntimeError(f"vLLM returned no hidden_states_path for request {o.request_id}")
            t = load_hidden_states(path)   # waits on the file's lock until the connector wrote it
            cleanup_hidden_states(path)
            if not torch.equal(t["token_ids"].long(), s.long()):
                raise RuntimeError(f"{path}: token ids differ from the prompt sent")
            hs = t["hidden_states"]   # [T, len(self.ids), H], ids ascending
            result.append((hs[:, self.rows], hs[:, self.last_row]))
        return result

    def close(self):
        self.llm = None
