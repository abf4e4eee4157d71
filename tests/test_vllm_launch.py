"""The vLLM engine's launch side and translation, without vLLM: the profiles (reference machine and
CPU), the AsyncEngineArgs and command line they give, the dry run naming which layer outputs vLLM
feeds the drafter, the drafter copy made for vLLM, what vLLM is sent for our SamplingParams (and
what is refused), and vLLM's statistics read into SpecStats. tests/test_vllm_engine.py runs it."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.api import Constraint, SamplingParams
from launch import cli
from launch.engine_args import vllm_cli, vllm_engine_args
from launch.profiles import PROJECT_ROOT, Overrides, ProfileError, resolve
from launch.vllm_drafter import aux_plan, needs_copy, vllm_copy
from server.engines.vllm_engine import StepStats, finish, refusal, spec_stats, to_vllm_sampling
from tests.test_launch_cli import environ_restored, run_cli  # noqa: F401 - the fixture

SHIPPED_TARGET, SHIPPED_DRAFT = PROJECT_ROOT / "shipped" / "target", PROJECT_ROOT / "shipped" / "drafter"


def test_reference_vllm_profile_is_the_reference_machine_on_vllm():
    launch = resolve("reference-vllm", environ={})
    p = launch.profile
    assert p.engine == "vllm" and p.parallel.tp == 8 and p.speculative.steps == 3
    assert launch.env == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS"}
    assert launch.env == resolve("reference", environ={}).env  # the SGLang reference's NCCL settings
    assert (p.model.path, p.model.draft) == ("/models/Kimi-K2.5", "/models/Kimi-K2.5-eagle3")
    kw = vllm_engine_args(p)
    assert kw["tensor_parallel_size"] == 8 and kw["trust_remote_code"] and kw["gpu_memory_utilization"] == 0.85
    assert kw["speculative_config"] == {"method": "eagle3", "model": "/models/Kimi-K2.5-eagle3",
                                        "num_speculative_tokens": 3, "draft_tensor_parallel_size": 8}
    assert kw["per_request_spec_decode_metrics"] == "summary" and kw["disable_log_stats"] is False
    argv = vllm_cli(kw)
    assert argv[0] == "/models/Kimi-K2.5" and "--tensor-parallel-size" in argv
    assert json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"] == 3


def test_cpu_vllm_profile_serves_the_shipped_pair():
    p = resolve("cpu-vllm", environ={}).profile
    assert (p.model.path, p.model.draft) == (str(SHIPPED_TARGET), str(SHIPPED_DRAFT))
    kw = vllm_engine_args(p, "/tmp/copy")
    assert kw["speculative_config"]["model"] == "/tmp/copy" and kw["dtype"] == "float32"
    assert kw["max_model_len"] == 1024 and kw["enforce_eager"] and "nnodes" not in kw
    assert "speculative_config" not in vllm_engine_args(resolve("cpu-vllm", Overrides(no_spec=True), {}).profile)


def test_multi_node_pipeline_and_draft_tp_settings(tmp_path):
    f = tmp_path / "two.toml"
    f.write_text('engine = "vllm"\n[model]\npath = "/m"\ndraft = "/d"\n[parallel]\ntp = 8\npp = 2\nnnodes = 2\n'
                 'node_rank = 1\ndist_init_addr = "10.0.0.1:29500"\n[vllm]\ndraft_tensor_parallel_size = 1\n')
    kw = vllm_engine_args(resolve(str(f), environ={}).profile)
    assert (kw["pipeline_parallel_size"], kw["nnodes"], kw["node_rank"]) == (2, 2, 1)
    assert (kw["master_addr"], kw["master_port"]) == ("10.0.0.1", 29500)
    assert kw["speculative_config"]["draft_tensor_parallel_size"] == 1
    assert cli.make_plan(resolve(str(f), environ={})).kind == "vllm-follower"


@pytest.mark.parametrize("body, field", [
    ('engine = "vllm"\n[model]\npath = "/m"\ndraft = "/d"\n[speculative]\ntopk = 2\ndraft_tokens = 4\n',
     "speculative.topk"),
    ('engine = "sglang"\n[model]\npath = "/m"\ndraft = "/d"\n[parallel]\npp = 2\n', "parallel.pp"),
    ('engine = "vllm"\n[model]\npath = "/m"\ndraft = "/d"\n[parallel]\ntp = 4\n'
     '[vllm]\ndraft_tensor_parallel_size = 2\n',
     "vllm.draft_tensor_parallel_size"),
    ('engine = "vllm"\n[model]\npath = "/m"\ndraft = "/d"\n[vllm.extra]\ntensor_parallel_size = 2\n', "vllm.extra"),
    ('engine = "vllm"\n[model]\npath = "/m"\ndraft = "/d"\n[vllm]\ngpu_memory_utilization = 1.5\n',
     "vllm.gpu_memory_utilization"),
])
def test_bad_vllm_settings_name_the_field(tmp_path, body, field):
    f = tmp_path / "bad.toml"
    f.write_text(body)
    with pytest.raises(ProfileError, match=field.replace(".", r"\.")):
        resolve(str(f), environ={})


def test_dry_run_prints_vllm_arguments_and_the_layer_outputs_the_drafter_gets(capsys, environ_restored):  # noqa: F811
    rc, out, _ = run_cli(capsys, "--dry-run", "--profile", "cpu-vllm")
    assert rc == 0
    assert ("vllm drafter: eagle_aux_hidden_state_layer_ids [2, 16, 29] (inputs of layers): vLLM feeds the "
            "outputs of layers [1, 15, 28] of 32") in out
    assert "vLLM gets aux ids [2, 16, 29] (inputs of layers) and feeds the outputs of layers [1, 15, 28]" in out
    assert "vllm serve " + str(SHIPPED_TARGET) in out and "--enforce-eager" in out
    rc, out, _ = run_cli(capsys, "--dry-run", "--profile", "reference-vllm")
    assert rc == 0 and "NCCL_P2P_LEVEL=SYS" in out and "--tensor-parallel-size 8" in out
    assert "vllm drafter: not local here" in out


def test_missing_vllm_is_one_clear_error(capsys, environ_restored, monkeypatch):  # noqa: F811
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a))
    rc, _, err = run_cli(capsys, "--profile", "reference-vllm")
    assert rc == 2 and "vllm is not importable" in err and "make vllm-venv" in err


def test_the_drafter_copy_for_vllm_feeds_the_trained_layers(tmp_path):
    assert aux_plan(str(SHIPPED_DRAFT), 32) == ([2, 16, 29], [1, 15, 28], True)
    assert needs_copy(str(SHIPPED_DRAFT), 32)
    copy = vllm_copy(str(SHIPPED_DRAFT), 32)
    cfg = json.loads((Path(copy) / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 16, 29]
    assert cfg["specserve"]["trained_aux_layer_outputs"] == [1, 15, 28]
    assert not needs_copy(copy, 32) and vllm_copy(copy, 32) == copy  # vLLM's already: served as it is


def test_sampling_params_map_to_vllm_names():
    p = SamplingParams(max_tokens=9, temperature=0.5, top_p=0.8, top_k=-1, seed=3, stop=["x"], stop_token_ids=[7],
                       presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.1, min_tokens=2,
                       logprobs=3, skip_special_tokens=False, constraint=Constraint("choice", ("a", "b")))
    d = to_vllm_sampling(p)
    assert d["top_k"] == 0 and d["seed"] == 3 and d["stop"] == ["x"] and d["stop_token_ids"] == [7]
    assert (d["presence_penalty"], d["frequency_penalty"], d["repetition_penalty"], d["min_tokens"]) == (
        0.5, 0.25, 1.1, 2)
    assert d["logprobs"] == 3 and d["skip_special_tokens"] is False
    assert d["structured_outputs"] == {"choice": ["a", "b"]}
    assert to_vllm_sampling(SamplingParams(constraint=Constraint("json_object")))["structured_outputs"] == {
        "json_object": True}
    assert to_vllm_sampling(SamplingParams(constraint=Constraint("grammar", "root ::= \"a\"")))[
        "structured_outputs"] == {"grammar": "root ::= \"a\""}


def test_logit_bias_under_speculation_is_refused_naming_the_field():
    assert refusal(SamplingParams(logit_bias={5: 1.0}), speculative=True).startswith("logit_bias:")
    assert refusal(SamplingParams(logit_bias={5: 1.0}), speculative=False) is None
    assert refusal(SamplingParams(), speculative=True) is None


def test_vllm_statistics_become_spec_stats():
    s = spec_stats([2, 1, 0, 3], num_draft_tokens=18)  # steps accepting 0, 0, 1, 3, 3, 3 drafts
    assert (s.verify_steps, s.proposed_draft_tokens, s.accepted_draft_tokens) == (6, 18, 10)
    assert s.accepted_per_position == [4, 3, 3]
    assert spec_stats([5, 0, 0, 0], 15).accepted_per_position == []
    steps = StepStats()
    spec = SimpleNamespace(num_drafts=2, num_draft_tokens=6, num_accepted_tokens=3,
                           num_accepted_tokens_per_pos=[2, 1, 0])
    steps.record(SimpleNamespace(num_running_reqs=2, num_waiting_reqs=1, spec_decoding_stats=spec))
    steps.record(SimpleNamespace(num_running_reqs=1, num_waiting_reqs=0, spec_decoding_stats=spec))
    assert (steps.running, steps.waiting) == (1, 0)
    assert (steps.spec.verify_steps, steps.spec.accepted_draft_tokens, steps.spec.accepted_per_position) == (
        4, 6, [4, 2, 0])
    assert finish("stop") == ("stop", None) and finish("length") == ("length", None)
    assert finish("abort")[0] == "abort" and finish("abort")[1]


def test_reference_vllm_dry_run_names_the_layers_vllm_feeds_the_kimi_drafters(capsys, environ_restored,  # noqa: F811
                                                                               tmp_path):
    """SpecForge's Kimi-K2 drafter (features through SGLang's DeepSeek rule: ids [2, 30, 58] captured
    outputs 1, 29, 57) needs no new ids on vLLM; the MLA drafter serves there too."""
    from tests.test_launch_sglang_checks import kimi_k25_target, shipped_drafter

    t = kimi_k25_target(tmp_path / "kimi")
    for name in ("kimi_k2_eagle3.json", "kimi_k25_eagle3_mla.json"):
        d = shipped_drafter(tmp_path / name, name, specserve={"capture_engine": "sglang-deepseek"})
        rc, out, err = run_cli(capsys, "--dry-run", "--profile", "reference-vllm", "--model", str(t), "--draft", str(d))
        assert rc == 0, err
        assert ("vllm drafter: eagle_aux_hidden_state_layer_ids [2, 30, 58] (inputs of layers): vLLM feeds the "
                "outputs of layers [1, 29, 57] of 61") in out
        assert "vLLM gets aux ids [2, 30, 58]" in out and "target weights int4 compressed-tensors" in out
        assert name.endswith("mla.json") or not needs_copy(str(d), 61)  # (no weights here to look into)
