"""Feature sources for `drafter train` without vLLM (tests/test_drafter_features_vllm.py has vLLM):
transformers' features equal our engine's, the spool stays under its byte budget while training
consumes and deletes its shards (real files, a budget smaller than the data's features) and a
run through it resumes to the same weights as the native loop, and a non-Llama target
(DeepseekV3ForCausalLM, MLA + MoE) trains through transformers, from kept features too, into a
drafter that exports and loads."""
from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from drafter.batches import Batches
from drafter.capture import CaptureJob, run
from drafter.cli import main as drafter
from drafter.feature_shards import shard_bytes
from drafter.feature_store import FeatureStore, read_index
from drafter.shards import TokenShards
from drafter.spool import dir_bytes
from drafter.target_head import TargetHead, TargetSpec, load_head_tensors
from models.aux_layers import layer_outputs_for
from models.eagle3_checkpoint import load_drafter
from models.llama import load_target
from tests.tiny import make_hf_llama_target, stdlib_texts

AUX = "0,1,2"
TRAIN = ["--max-steps", "6", "--batch-size", "2", "--lr", "1e-3", "--ttt-length", "3", "--log-every", "2",
         "--aux-layers", AUX]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny random Llama target (4 layers) and 16 tokenized conversations with a 64-token draft vocab."""
    root = tmp_path_factory.mktemp("features")
    target = root / "target"
    make_hf_llama_target(target)
    lines = [s.strip() for t in stdlib_texts(4) for s in t.splitlines() if len(s.strip()) > 20][:32]
    convs = [[{"role": "user", "content": a}, {"role": "assistant", "content": b}]
             for a, b in zip(lines[::2], lines[1::2])]
    (root / "prompts.jsonl").write_text("".join(json.dumps({"messages": m}) + "\n" for m in convs))
    data = root / "data"
    assert drafter(["data", "--prompts", str(root / "prompts.jsonl"), "--out", str(data), "--keep-responses",
                    "--tokenizer", str(target)]) == 0
    assert drafter(["vocab", "--data", str(data), "--size", "64"]) == 0
    return root, target, data


def _train(setup, out: str, *extra) -> Path:
    root, target, data = setup
    assert drafter(["train", "--target", str(target), "--data", str(data), "--out", str(root / out), *TRAIN,
                    *extra]) == 0
    return root / out


def _weights(run: Path, step: int = 6) -> dict:
    return load_file(str(run / "checkpoints" / f"step-{step:08d}" / "drafter.safetensors"))


def _same(a: dict, b: dict, atol: float = 1e-5) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k].float(), b[k].float(), atol=atol) for k in a)


def test_transformers_features_equal_native(setup):
    """Layer outputs through transformers equal our engine's, the last layer's (before the final norm)
    included, and the target's logits recomputed from it by its norm and lm_head equal the target's."""
    root, target, data = setup
    layers = TargetSpec.from_dir(target).num_hidden_layers
    outputs = layer_outputs_for("vllm", [1, 2, 4], layers)     # inputs of 1, 2, 4 = outputs 0, 1, 3 (the last)
    assert outputs == [0, 1, 3]
    job = CaptureJob(engine="transformers", target=str(target), data=str(data), aux_layer_outputs=outputs,
                     out=str(root / "kept_hf"), mode="store", shard_size=5)
    run(job)
    index = read_index(root / "kept_hf")
    assert index["complete"] and len(index["shards"]) > 1 and index["engine"] == "transformers"
    store = FeatureStore(root / "kept_hf", outputs, index["samples"])
    native = load_target(target, aux_layer_ids=[*outputs, layers - 1])
    t = load_head_tensors(target)
    head = TargetHead(t["norm"], t["lm_head"], TargetSpec.from_dir(target).rms_norm_eps)
    for i in range(index["samples"]):
        f = store.get(i)
        with torch.no_grad():
            out = native(f.input_ids[None], capture_aux=True)
        ref = out.aux_hidden[0].view(f.input_ids.numel(), 4, -1)
        assert torch.allclose(f.aux, ref[:, :3], atol=1e-5) and torch.allclose(f.last, ref[:, 3], atol=1e-5)
        assert torch.allclose(head(f.last), out.logits[0], atol=1e-4)


def test_spool_stays_under_budget_and_resumes_to_the_native_weights(setup):
    """A budget of ~2 micro-batches' features, under the 6 the run streams: the spool never holds more
    (polled while training runs), consumed shards are gone at the end, and a run stopped at step 3
    and resumed ends with the weights of the native loop's straight run."""
    root, target, data = setup
    batches = Batches(TokenShards(data), 2, 2048, 0)
    per_mb = [shard_bytes(sum(batches.sequence(i)[0].numel() for i in batches.indices(g)[0]), 3, 32, torch.float32)
              for g in range(6)]
    budget = int(2.2 * max(per_mb))
    assert sum(per_mb) > budget   # the run's features do not fit at once
    spool = root / "spool"
    peak, done = [0], threading.Event()

    def poll():
        while not done.is_set():
            if spool.exists():
                peak[0] = max(peak[0], dir_bytes(spool))

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    flags = ["--features", "transformers", "--spool", str(spool), "--spool-budget-gb", str(budget / 1e9)]
    try:
        run = _train(setup, "spooled", *flags, "--stop-at", "3")
        assert dir_bytes(spool) <= budget   # whatever it wrote ahead for step 4 on, under the budget
        _train(setup, "spooled", *flags, "--resume")
    finally:
        done.set()
        poller.join()
    assert 0 < peak[0] <= budget
    status = json.loads((spool / "writer.json").read_text()) if (spool / "writer.json").exists() else {}
    assert status.get("peak_bytes", 0) <= budget
    assert not list(spool.glob("mb-*.safetensors"))   # every shard consumed and deleted
    assert [json.loads(line)["step"] for line in (run / "log.jsonl").read_text().splitlines()] == [2, 4, 6]
    assert _same(_weights(run), _weights(_train(setup, "native")))


def test_deepseek_target_trains_through_transformers_exports_and_loads(setup):
    """DeepseekV3ForCausalLM, which the native engine cannot run: features through transformers, kept;
    a rerun from the kept features (no capture) trains the same weights; the export records the
    capture engine and the layer outputs and loads with the target's embedding."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    root, llama, data = setup
    ds = root / "deepseek"
    torch.manual_seed(0)
    DeepseekV3ForCausalLM(DeepseekV3Config(
        vocab_size=TargetSpec.from_dir(llama).vocab_size, hidden_size=32, intermediate_size=64,
        moe_intermediate_size=16, num_hidden_layers=4, first_k_dense_replace=1, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
        v_head_dim=8, max_position_embeddings=256, tie_word_embeddings=False)).save_pretrained(ds)
    for f in llama.glob("tokenizer*"):
        shutil.copy(f, ds / f.name)
    common = ["train", "--target", str(ds), "--data", str(data), *TRAIN, "--max-steps", "3", "--aux-layers", "1,2,3"]
    assert drafter([*common, "--out", str(root / "ds_run"), "--features", "transformers",
                    "--keep-features", str(root / "ds_kept")]) == 0
    assert drafter([*common, "--out", str(root / "ds_rerun"), "--features", str(root / "ds_kept")]) == 0
    assert _same(_weights(root / "ds_run", 3), _weights(root / "ds_rerun", 3))
    for engine, ids in (("sglang-deepseek", [1, 2, 3]), ("vllm", [2, 3, 4])):   # both feed outputs 1, 2, 3
        out = root / f"ds_{engine}"
        assert drafter(["export", str(root / "ds_rerun"), str(out), "--serving-engine", engine]) == 0
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["specserve"]["capture_engine"] == "transformers"
        assert cfg["specserve"]["trained_aux_layer_outputs"] == [1, 2, 3]
        assert cfg["specserve"]["target_num_hidden_layers"] == 4
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids
        d = load_drafter(out, load_head_tensors(ds)["embed"])
        assert d.config.aux_layer_ids == [1, 2, 3] and d.config.hidden_size == 32
