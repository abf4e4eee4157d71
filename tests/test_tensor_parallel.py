"""Tensor parallelism is exact: a target sharded over 2 ranks (gloo, CPU, fp32) gives the
single-process logits, for a cache-less forward and for cached decode steps through
BatchDecoder (plain and EAGLE-3 chain), with replicated and vocab-parallel lm_head."""
import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

from benchmarks.tensor_parallel import check_divisible, shard_model
from engine.decoder import BatchDecoder, SpecConfig
from engine.masks import block_inputs
from engine.sampling import BatchSampling
from models.layers import fuse_projections
from models.llama import LlamaConfig, LlamaModel
from tests.tiny import random_drafter

CONFIG = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
PROMPT = [5, 17, 200, 3, 99, 42, 7]
N_TOKENS = 12


def build_model() -> LlamaModel:
    torch.manual_seed(0)
    model = LlamaModel(CONFIG).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


def greedy() -> BatchSampling:
    return BatchSampling.all_greedy_rows(1, "cpu")


@torch.inference_mode()
def run_all(model: LlamaModel) -> dict:
    """Logits of a cache-less forward and of one cached decode step; greedy tokens plain and chain."""
    tokens = torch.tensor([PROMPT])
    out = {"forward": model(tokens).logits}
    dec = BatchDecoder(model, None, None, max_batch=1, max_context=64)
    first = dec.prefill(0, PROMPT, greedy())
    base = torch.tensor([len(PROMPT)])
    inputs = block_inputs(base, torch.ones(1, 1, 1, dtype=torch.bool), torch.zeros(1, 1, dtype=torch.long), 64)
    out["cached_step"] = model(torch.tensor([[first]]), inputs).logits
    for name, drafter, spec in (("plain", None, None), ("chain", random_drafter(model), SpecConfig(3))):
        dec = BatchDecoder(model, drafter, spec, max_batch=1, max_context=64)
        toks = [dec.prefill(0, PROMPT, greedy())]
        while len(toks) < N_TOKENS:
            toks += dec.step(1, greedy())[0].tokens
        out[name] = toks[:N_TOKENS]
    return out


def _rank(rank: int, world: int, init_file: str, results):
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for vocab_parallel in (False, True):
            # Projections fused after slicing, as the benchmarks serve it (unfused reference).
            out = run_all(fuse_projections(shard_model(build_model(), rank, world, vocab_parallel=vocab_parallel)))
            if rank == 0:
                # numpy pickles by value; tensors would be shared through the exiting child's memory
                results.put({k: v.numpy() if torch.is_tensor(v) else v for k, v in out.items()})
    finally:
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def reference():
    torch.set_num_threads(1)
    return run_all(build_model())


def test_tp2_matches_single_process(reference):
    """Replicated lm_head first, then vocab-parallel lm_head (all-gathered logits)."""
    results = mp.get_context("spawn").SimpleQueue()
    with tempfile.TemporaryDirectory() as d:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        mp.start_processes(_rank, args=(2, os.path.join(d, "pg"), results), nprocs=2, start_method="spawn")
        runs = [results.get(), results.get()]
    for got in runs:
        for key in ("forward", "cached_step"):
            torch.testing.assert_close(torch.from_numpy(got[key]), reference[key], atol=1e-5, rtol=1e-5)
        assert got["plain"] == reference["plain"]
        assert got["chain"] == reference["chain"]


def test_shard_shapes_and_cache():
    model = shard_model(build_model(), rank=1, world_size=2)  # no process group needed until forward
    attn = model.layers[0].self_attn
    assert (attn.heads, attn.kv_heads) == (2, 1)
    assert attn.q_proj.weight.shape == (32, 64) and attn.o_proj.weight.shape == (64, 32)
    assert model.layers[0].mlp.down_proj.weight.shape == (64, 64)
    model.setup_cache(1, 32)
    assert attn.kv_cache.k.shape == (1, 1, 32, 16)
    assert model.tp.full_config.num_attention_heads == 4


def test_indivisible_heads_named():
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        check_divisible(CONFIG, 4)
