"""`drafter inspect/compare`: parameter counts of the Kimi-K2 drafter shape (DESIGN §1) and the
aux-layer capture check across engines."""
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


def _ours(path: Path, engine: str) -> Path:
    cfg = Eagle3Config(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       vocab_size=512, draft_vocab_size=128, target_hidden_size=64, aux_layer_ids=[1, 1, 0])
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
    assert "WARNING kimi_k2_eagle3: sglang-deepseek captures outputs of layers [1, 29, 57]" in text
    assert "[3, 31, 59]" in text                                                  # the ids that would fit


def test_recorded_training_layers_drive_the_warning(tmp_path):
    # Exported for vLLM: config ids are trained outputs + 1, so only vLLM captures the trained layers.
    cfg, _ = read_config(_ours(tmp_path / "v", "vllm"))
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 2, 1]
    warns = capture_warnings(shape_from_config(cfg, "v"))
    # SGLang's DeepSeek rule uses ids not starting at 1 as given, so it agrees with vLLM here.
    assert len(warns) == 1 and warns[0].startswith("WARNING v: sglang-llama captures outputs of layers [2, 2, 1]")
    assert "training captured [1, 1, 0]" in warns[0]
