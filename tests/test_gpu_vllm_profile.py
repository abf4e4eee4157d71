"""gpu-vllm resolves to the vLLM arguments its GPU runs used: bfloat16, EAGLE-3 with 4 speculative
tokens from the SmolLM2 drafter (through the copy with vLLM's aux ids when one is made), full CUDA
graphs for decode without torch.compile, and flashinfer's sampler off."""
from __future__ import annotations

from launch.cli import main
from launch.engine_args import vllm_cli, vllm_engine_args
from launch.profiles import PROJECT_ROOT, Overrides, resolve

HF = "/models/smollm2-hf"


def args(overrides: Overrides | None = None, environ: dict | None = None, draft_dir: str | None = None) -> dict:
    launch = resolve("gpu-vllm", overrides, environ={"SPECSERVE_SMOLLM2_HF": HF} if environ is None else environ)
    return vllm_engine_args(launch.profile, draft_dir)


def test_engine_arguments():
    kw = args(draft_dir="/tmp/drafter-for-vllm")
    assert kw["model"] == HF and kw["dtype"] == "bfloat16" and kw["tensor_parallel_size"] == 1
    assert kw["speculative_config"] == {"method": "eagle3", "model": "/tmp/drafter-for-vllm",
                                        "num_speculative_tokens": 4}
    assert kw["compilation_config"] == {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    assert "enforce_eager" not in kw   # graphs are captured: eager mode runs ~8x slower on this pair
    assert (kw["max_model_len"], kw["max_num_seqs"], kw["gpu_memory_utilization"]) == (2048, 32, 0.2)
    assert kw["served_model_name"] == "SmolLM2-135M-Instruct"


def test_drafter_and_target_paths():
    kw = args()   # the dry run's drafter: the profile's own folder
    assert kw["speculative_config"]["model"] == str(PROJECT_ROOT / "shipped" / "smollm2" / "drafter")
    default = args(environ={})   # without the variable: where shipped/smollm2/gpu_build.sh writes the folder
    assert default["model"] == str(PROJECT_ROOT / "runs" / "smollm2" / "target")


def test_plain_decoding_keeps_the_graph_mode():
    kw = args(Overrides(no_spec=True))
    assert "speculative_config" not in kw and "per_request_spec_decode_metrics" not in kw
    assert kw["compilation_config"] == {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}


def test_environment_and_command_line():
    launch = resolve("gpu-vllm", environ={"SPECSERVE_SMOLLM2_HF": HF})
    assert launch.env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    argv = vllm_cli(vllm_engine_args(launch.profile))
    i = argv.index("--compilation-config")
    assert argv[0] == HF and argv[i + 1] == '{"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}'


def test_dry_run(capsys, monkeypatch):
    monkeypatch.setenv("SPECSERVE_SMOLLM2_HF", HF)
    assert main(["--profile", "gpu-vllm", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "engine       vllm" in out and "EAGLE3 steps 4, topk 1, draft tokens 5" in out
    assert "--compilation-config" in out and "FULL_DECODE_ONLY" in out
