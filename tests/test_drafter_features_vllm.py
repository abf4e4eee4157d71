"""Target features from vLLM, for real: the capture process (`python -m drafter.capture`, vLLM's CPU
build in .venv-vllm, `extract_hidden_states` with our synchronous connector) runs the shipped
32-layer target in float32 once for the module, then every check reads what it kept.

vLLM is asked for the layer outputs that two id lists name in two conventions: training ids
[1, 15, 28] (outputs 1, 15, 28) and vLLM ids [1, 15, 28] (inputs of those layers = outputs
0, 14, 27). Features for each equal our native engine's capture of those outputs, so an
off-by-one anywhere between the conventions fails here. Training from the kept features equals
training with the target in the loop, and the exported drafter records vLLM as its capture engine.

`make test-slow` runs it (a whole vLLM start); `make test` creates .venv-vllm, without which it is skipped.
"""
from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

import pytest
import torch

from drafter.capture import CaptureJob
from drafter.cli import main as drafter
from drafter.feature_store import FeatureStore, read_index
from drafter.features import capture_env
from drafter.target_head import TargetHead, TargetSpec, load_head_tensors
from models.aux_layers import layer_outputs_for, vllm_extract_ids
from models.eagle3_checkpoint import load_drafter
from models.llama import load_target

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
TARGET = ROOT / "shipped" / "target"
LAYERS = 32
IDS = {"training": [1, 15, 28], "vllm": [1, 15, 28]}
ATOL = 1e-4   # float32 through two engines; the two conventions' tensors differ by far more

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(600),
              pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason="no .venv-vllm (make vllm-venv)")]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A few held-out prompts with short code answers, tokenized with the shipped target's tokenizer."""
    root = tmp_path_factory.mktemp("features_vllm")
    lines = (ROOT / "shipped" / "data" / "heldout_prompts.jsonl").read_text().splitlines()[:8]
    answers = ["def f(x):\n    return x + 1\n", "class A:\n    pass\n", "import os\nprint(os.getcwd())\n",
               "return None", "for i in range(3):\n    print(i)\n", "x = [1, 2, 3]", "raise ValueError('bad')",
               "with open(p) as f:\n    data = f.read()\n"]
    convs = [{"messages": [json.loads(line)["messages"][0], {"role": "assistant", "content": a}]}
             for line, a in zip(lines, answers)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(c) + "\n" for c in convs))
    assert drafter(["data", "--prompts", str(root / "prompts.jsonl"), "--out", str(root / "data"),
                    "--keep-responses", "--tokenizer", str(TARGET)]) == 0
    assert drafter(["vocab", "--data", str(root / "data"), "--size", "256"]) == 0
    return root / "data"


@pytest.fixture(scope="module")
def kept(data) -> Path:
    """vLLM's features of every conversation, for the outputs both id lists name (one vLLM start)."""
    outputs = sorted({o for conv, ids in IDS.items() for o in layer_outputs_for(conv, ids, LAYERS)})
    out = data.parent / "kept"
    job = CaptureJob(engine="vllm", target=str(TARGET), data=str(data), aux_layer_outputs=outputs, out=str(out),
                     mode="store", dtype="float32")
    job_file = job.save(data.parent / "job.json")
    run = subprocess.run([str(VLLM_PYTHON), "-m", "drafter.capture", str(job_file)], cwd=ROOT,
                         env=capture_env("vllm", str(VLLM_PYTHON), None), capture_output=True, text=True, timeout=480)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    return out


@functools.lru_cache(maxsize=None)
def _native(outputs: tuple[int, ...]):
    return load_target(TARGET, dtype=torch.float32, aux_layer_ids=[*outputs, LAYERS - 1])


def native_capture(outputs: list[int], ids: torch.Tensor):
    """Our engine's capture of `outputs` and the last layer's output [T, len + 1, H], and its logits."""
    target = _native(tuple(outputs))
    with torch.no_grad():
        out = target(ids[None], capture_aux=True)
    return out.aux_hidden[0].view(ids.numel(), len(outputs) + 1, -1), out.logits[0]


def test_vllm_is_configured_with_input_ids(kept):
    """The outputs 0, 1, 14, 15, 27, 28 and the last layer's (31) are vLLM's inputs 1, 2, 15, 16, 28, 29 and id 32."""
    index = read_index(kept)
    assert index["engine"] == "vllm" and index["complete"]
    assert index["aux_layer_outputs"] == [0, 1, 14, 15, 27, 28]
    assert index["engine_aux_ids"] == vllm_extract_ids(index["aux_layer_outputs"], LAYERS) == [1, 2, 15, 16, 28, 29, 32]
    assert not (kept / "engine").exists() or not any((kept / "engine").iterdir())   # vLLM's files read and removed


@pytest.mark.parametrize("convention", ["training", "vllm"])
def test_vllm_features_equal_native_capture(kept, convention):
    want = layer_outputs_for(convention, IDS[convention], LAYERS)
    assert want == ([1, 15, 28] if convention == "training" else [0, 14, 27])
    index = read_index(kept)
    store = FeatureStore(kept, want, index["samples"])
    head = load_head_tensors(TARGET)
    lm = TargetHead(head["norm"].float(), head["lm_head"].float(), TargetSpec.from_dir(TARGET).rms_norm_eps)
    for i in range(index["samples"]):
        f = store.get(i)
        ref, logits = native_capture(want, f.input_ids)
        assert f.aux.dtype == torch.float32 and f.aux.shape == ref[:, :3].shape
        assert torch.allclose(f.aux, ref[:, :3], atol=ATOL), (convention, i, (f.aux - ref[:, :3]).abs().max())
        assert torch.allclose(f.last, ref[:, 3], atol=ATOL)
        # the next-token distribution recomputed from the last output is the target's own
        assert torch.allclose(lm(f.last), logits, atol=1e-3)
    # the other convention's reading of the same ids names other tensors: the check above tells them apart
    other = "vllm" if convention == "training" else "training"
    wrong, _ = native_capture(layer_outputs_for(other, IDS[convention], LAYERS), f.input_ids)
    assert (wrong[:, :3] - f.aux).abs().max() > 100 * ATOL


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "log.jsonl").read_text().splitlines()]


def test_training_on_vllm_features_matches_the_native_loop_and_records_vllm(kept, data):
    common = ["--target", str(TARGET), "--data", str(data), "--max-steps", "2", "--batch-size", "2",
              "--ttt-length", "2", "--log-every", "1", "--aux-layers", "2,16,29", "--aux-convention", "vllm"]
    runs = data.parent
    assert drafter(["train", *common, "--out", str(runs / "from_vllm"), "--features", str(kept)]) == 0
    assert drafter(["train", *common, "--out", str(runs / "in_loop")]) == 0
    assert _losses(runs / "from_vllm") == pytest.approx(_losses(runs / "in_loop"), abs=1e-3)
    assert drafter(["export", str(runs / "from_vllm"), str(runs / "exported"), "--serving-engine", "vllm"]) == 0
    cfg = json.loads((runs / "exported" / "config.json").read_text())
    assert cfg["specserve"]["capture_engine"] == "vllm"
    assert cfg["specserve"]["trained_aux_layer_outputs"] == [1, 15, 28]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 16, 29]
    d = load_drafter(runs / "exported", load_head_tensors(TARGET)["embed"].float())
    assert d.config.aux_layer_ids == [1, 15, 28]
