"""`drafter inspect/compare`: parameter counts of the Kimi-K2 drafter shape and of the
Kimi-K2.5 MLA drafter shape, and the aux-layer capture check across engines: what training
captured is recorded, or follows from the recorded capture engine (a drafter whose features came
through SGLang itself fits SGLang as configured), or is flagged as an assumption."""
import re
import subprocess
import sys
from pathlib import Path

import torch

from drafter.params import breakdown, capture_warnings, read_config, shape_from_config
from models.eagle3 import Eagle3Config, Eagle3Drafter
from models.eagle3_checkpoint import save_drafter

ROOT = Path(__file__).resolve().parents[1]
KIMI = ROOT / "drafter" / "configs" / "kimi_k2_eagle3.json"
KIMI_MLA = ROOT / "drafter" / "configs" / "kimi_k25_eagle3_mla.json"


def _ours(path: Path, engine: str) -> Path:
    cfg = Eagle3Config(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       vocab_size=512, draft_vocab_size=128, target_hidden_size=64, aux_layer_ids=[1, 2, 3])
    save_drafter(Eagle3Drafter(cfg), path, dtype=torch.float32, serving_engine=engine,
                 extra={"target_num_hidden_layers": 4})
    return path


def test_kimi_k2_counts():
    cfg, _ = read_config(KIMI)
    p = breakdown(shape_from_config(cfg, "kimi"))
    assert p["embedding (frozen, the target's)"] == 163840 * 7168              # 1.17B
    assert p["fc"] == 3 * 7168 * 7168                                           # 154M
    assert p["attention"] == 2 * 7168 * 3 * 8192 + 8192 * 7168                  # 411M
    assert p["mlp"] == 3 * 7168 * 18432                                         # 396M
    assert p["lm_head"] == 7168 * 32000                                         # 229M
    assert round(p["trainable"] / 1e9, 2) == 1.19
    assert round(p["total (with embedding)"] / 1e9, 2) == 2.37


def compare(*args) -> str:
    out = subprocess.run([sys.executable, "-m", "drafter", "compare", *map(str, args)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_compare_cli_against_kimi(tmp_path):
    ours = _ours(tmp_path / "ours", "sglang-llama")
    out = subprocess.run([sys.executable, "-m", "drafter", "compare", str(ours), str(KIMI), "--target-layers", "61"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout

    def row(label):
        return next(line for line in text.splitlines() if line.startswith(label))
    assert row("trainable").endswith("1.19B (1,190,948,864)")
    assert row("embedding (frozen, the target's)").endswith("1.17B (1,174,405,120)")
    assert row("total (with embedding)").endswith("2.37B (2,365,353,984)")
    assert re.search(r'"1B".*"2\.6B"|"2\.6B".*"1B"', text) and "frozen" in text   # why cards differ
    # Kimi's ids [2, 30, 58]: the SGLang DeepSeek rule and vLLM capture outputs 1, 29, 57.
    assert row("  SGLang DeepSeek rule").endswith("[1, 29, 57]") and row("  SGLang Llama rule").endswith("[2, 30, 58]")
    assert row("target layers").split()[-2:] == ["4", "61"]          # ours records its 4-layer target
    # No capture engine recorded: the HF-outputs reading is flagged as an assumption, not a fact.
    assert "CHECK kimi_k2_eagle3: sglang-deepseek captures outputs of layers [1, 29, 57]" in text
    assert "[3, 31, 59]" in text and "--captured-by" in text and "WARNING kimi" not in text


def test_features_captured_through_sglang_fit_sglang_as_configured(tmp_path):
    """SpecForge's way: features from SGLang's DeepSeek model with ids [2, 30, 58] are the outputs of
    layers 1, 29, 57, which SGLang and vLLM feed as configured; no warning, no id suggestion."""
    text = compare(_ours(tmp_path / "ours", "sglang-llama"), KIMI, "--captured-by", "sglang-deepseek")
    kimi = [line for line in text.splitlines() if "kimi_k2_eagle3:" in line]
    assert kimi == [] and "[3, 31, 59]" not in text
    assert next(line for line in text.splitlines() if line.startswith("outputs captured: training")).endswith(
        "[1, 29, 57]")
    cfg, _ = read_config(KIMI)  # the same from a recorded capture engine
    cfg["specserve"] = {"capture_engine": "sglang-deepseek"}
    assert capture_warnings(shape_from_config(cfg, "k")) == []


def test_mla_drafter_counts_mla_attention():
    cfg, _ = read_config(KIMI_MLA)
    s = shape_from_config(cfg, "mla")
    p = breakdown(s)
    h, heads = 7168, 64
    assert p["attention"] == (2 * h * (1536 + 512 + 64) + 1536 * heads * 192 + 512 * heads * (128 + 128)
                              + 1536 + 512 + heads * 128 * h)                    # 116M, not MHA's 411M
    assert p["lm_head"] == h * 163840 and round(p["total (with embedding)"] / 1e9, 1) == 3.0
    text = compare(KIMI, KIMI_MLA, "--captured-by", "sglang-deepseek")
    assert "MLA (q_lora 1536, kv_lora 512)" in text and "WARNING" not in text


def test_recorded_training_layers_drive_the_warning(tmp_path):
    # Exported for vLLM: config ids are trained outputs + 1, so only vLLM captures the trained layers.
    cfg, _ = read_config(_ours(tmp_path / "v", "vllm"))
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    warns = capture_warnings(shape_from_config(cfg, "v"))
    # SGLang's DeepSeek rule uses ids not starting at 1 as given, so it agrees with vLLM here.
    assert len(warns) == 1 and warns[0].startswith("WARNING v: sglang-llama captures outputs of layers [2, 3, 4]")
    assert "training captured [1, 2, 3]" in warns[0]
