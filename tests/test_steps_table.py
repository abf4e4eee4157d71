"""A profile's steps-per-batch-size table means the same steps at every batch size in all three
engines: ours (SpecConfig.steps_for), SGLang's adaptive slots (its own AdaptiveSpeculativeParams
reading the config file we write) and vLLM's dynamic schedule (its own lookup builder, run in
.venv-vllm); a bad table stops the launch naming the field."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from engine.config import SpecConfig
from launch.engine_args import native_engine_args, sglang_server_args, vllm_engine_args
from launch.profiles import PROJECT_ROOT, ProfileError, resolve

VLLM_PYTHON = PROJECT_ROOT / ".venv-vllm" / "bin" / "python"
TABLE = {"1": 5, "2": 4, "8": 3, "16": 1, "32": 0}
SIZES = range(1, 41)


def profile(tmp_path: Path, engine: str, spec: str) -> Path:
    p = tmp_path / f"{engine}.toml"
    p.write_text(f'engine = "{engine}"\n[model]\npath = "/models/t"\ndraft = "/models/d"\n[speculative]\n{spec}\n')
    return p


def table_profile(tmp_path: Path, engine: str):
    body = "steps = 5\nsteps_by_batch = { " + ", ".join(f'"{k}" = {v}' for k, v in TABLE.items()) + " }"
    return resolve(str(profile(tmp_path, engine, body)), environ={}).profile


def test_native_steps_follow_the_table(tmp_path):
    spec = native_engine_args(table_profile(tmp_path, "native")).spec
    assert [spec.steps_for(b) for b in (1, 2, 3, 8, 9, 16, 17, 32, 40)] == [5, 4, 3, 3, 1, 1, 0, 0, 0]
    assert spec.steps == 5 and spec.headroom == 8


def test_sglang_adaptive_slots_give_the_same_steps(tmp_path):
    from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

    kw = sglang_server_args(table_profile(tmp_path, "sglang"))
    assert kw["speculative_adaptive"] is True and kw["speculative_num_steps"] == 5
    ours = native_engine_args(table_profile(tmp_path, "native")).spec
    theirs = AdaptiveSpeculativeParams(initial_steps=5, cfg_path=kw["speculative_adaptive_config"])
    assert [theirs.get_steps_for_batch(b) for b in SIZES] == [ours.steps_for(b) for b in SIZES]


def test_vllm_schedule_gives_the_same_steps(tmp_path):
    schedule = vllm_engine_args(table_profile(tmp_path, "vllm"))["speculative_config"][
        "num_speculative_tokens_per_batch_size"]
    code = ("import json, sys; from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup as f; "
            f"print(json.dumps(f(json.loads(sys.argv[1]), {max(SIZES)}, 5)[1:]))")
    out = subprocess.run([str(VLLM_PYTHON), "-c", code, json.dumps(schedule)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    ours = native_engine_args(table_profile(tmp_path, "native")).spec
    assert json.loads(out.strip().splitlines()[-1]) == [ours.steps_for(b) for b in SIZES]


@pytest.mark.parametrize("spec,error", [
    ('steps = 3\nsteps_by_batch = { "1" = 5 }', r"speculative\.steps: must be >= the most steps_by_batch drafts \(5\)"),
    ('steps_by_batch = { "one" = 2 }', r"speculative\.steps_by_batch: batch size 'one' is not an integer"),
    ('steps_by_batch = { "0" = 2 }', r"speculative\.steps_by_batch: batch size 0 must be >= 1"),
    ('steps_by_batch = { "1" = -1 }', r"speculative\.steps_by_batch: steps for batch size 1 must be an integer >= 0"),
    ('steps_by_batch = { "1" = 0 }', r"speculative\.steps_by_batch: drafts at no batch size"),
    ('steps = 3\ntopk = 2\ndraft_tokens = 4\nsteps_by_batch = { "1" = 3 }', r"are for chains \(topk = 1\)"),
    ('steps_by_batch = [1, 2]', r"speculative\.steps_by_batch: expected dict"),
    ('steps = 2\naccept_rates = [0.6]', r"speculative\.accept_rates: needs one rate per step \(2\), got 1"),
    ('steps = 2\naccept_rates = [0.4, 0.6]', r"speculative\.accept_rates: can only fall from one step to the next"),
    ('steps = 1\naccept_rates = [1.5]', r"speculative\.accept_rates\.0: Input should be less than or equal to 1"),
    ('steps = 1\naccept_rates = ["0.5"]', r"speculative\.accept_rates\.0: expected float, got '0\.5'"),
    ('steps = 1\naccept_rates = [0.5]\nsteps_by_batch = { "1" = 1 }', r"give either them or steps_by_batch"),
])
def test_a_bad_table_names_the_field(tmp_path, spec, error):
    with pytest.raises(ProfileError, match=error):
        resolve(str(profile(tmp_path, "native", spec)), environ={})


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_steps_from_measured_costs_are_the_native_engines(tmp_path, engine):
    with pytest.raises(ProfileError, match=rf"speculative\.accept_rates: .*native engine's; {engine} takes steps_by"):
        resolve(str(profile(tmp_path, engine, "steps = 1\naccept_rates = [0.5]")), environ={})


def test_spec_config_refuses_a_table_it_cannot_run():
    with pytest.raises(ValueError, match="ascending"):
        SpecConfig(3, steps_by_batch=((4, 2), (2, 3)))
    with pytest.raises(ValueError, match=r"steps: must be >= the most steps_by_batch drafts \(4\), got 3"):
        SpecConfig(3, steps_by_batch=((1, 4),))


def test_steps_flag_replaces_the_table_and_says_so(tmp_path):
    from launch.profiles import Overrides
    body = 'steps = 5\nsteps_by_batch = { "1" = 5, "8" = 2 }'
    launch = resolve(str(profile(tmp_path, "native", body)), Overrides(steps=2), environ={})
    assert launch.profile.speculative.steps_by_batch == () and launch.profile.speculative.steps == 2
    assert any("steps_by_batch" in n for n in launch.notes)
