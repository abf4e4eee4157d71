"""`nccl decode` (benchmarks/tensor_parallel.py) runs without torchrun as TP 1 on CPU and writes its
JSON (the GPU run adds NCCL, graphs and bandwidth); timings are never checked."""
import json

from benchmarks import nccl_sweep


def test_single_process_cpu(tmp_path):
    r = nccl_sweep.main(["decode", "--shape", "tiny", "--device", "cpu", "--dtype", "float32", "--tokens", "8",
                         "--prompt-len", "4", "--repeats", "1", "--steps", "2",
                         "--name", "t", "--out-dir", str(tmp_path)])
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["world_size"] == 1 and saved["tok_s"] > 0 and saved["speculative"]["steps"] == 2
    assert saved["weight_bytes_per_rank"] == r["weight_bytes_per_rank"] > 0


def test_profile_environment_is_applied(tmp_path, monkeypatch):
    """--profile exports the launch profile's [env] (its NCCL settings) before NCCL starts."""
    for k in ("NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL", "NCCL_CUMEM_ENABLE"):
        monkeypatch.delenv(k, raising=False)
    r = nccl_sweep.main(["decode", "--shape", "tiny", "--device", "cpu", "--dtype", "float32", "--tokens", "4",
                         "--prompt-len", "4", "--repeats", "1", "--profile", "reference",
                         "--name", "p", "--out-dir", str(tmp_path)])
    assert r["profile"] == "reference"
    assert {k: r["nccl_env"][k] for k in ("NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL")} == \
        {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS"}
