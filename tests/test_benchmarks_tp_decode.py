"""benchmarks/tp_decode runs without torchrun as TP 1 on CPU and writes its JSON (the GPU
run adds NCCL, graphs and bandwidth); timings are never checked."""
import json

from benchmarks import tp_decode


def test_single_process_cpu(tmp_path):
    r = tp_decode.main(["--shape", "tiny", "--device", "cpu", "--dtype", "float32", "--tokens", "8",
                        "--prompt-len", "4", "--repeats", "1", "--random-draft", "--steps", "2",
                        "--name", "t", "--out-dir", str(tmp_path)])
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["world_size"] == 1 and saved["tok_s"] > 0 and saved["speculative"]["steps"] == 2
    assert saved["weight_bytes_per_rank"] == r["weight_bytes_per_rank"] > 0
