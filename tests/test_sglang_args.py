"""For every SGLang profile, SGLang 0.5.23's OWN argument parser accepts the arguments the
launcher generates and reads back the intended steps, topk, draft tokens and tp — as a
command line (what --dry-run prints and follower nodes run) and as ServerArgs(**kwargs)
(what the in-process sglang.Engine gets). Never skipped: CI installs sglang --no-deps."""
from __future__ import annotations

import pytest

from launch.engine_args import sglang_cli, sglang_server_args
from launch.profiles import Overrides, available_profiles, find_profile, read_toml, resolve

SGLANG_VERSION = "0.5.23"
ENV = {"NODE_RANK": "0", "DIST_INIT_ADDR": "node0:50000"}  # read by reference-2node.toml


@pytest.fixture(scope="module")
def sglang_args():
    try:
        import sglang
        from sglang.srt.server_args import ServerArgs, prepare_server_args
    except ImportError as e:
        pytest.fail(f"sglang {SGLANG_VERSION} is not importable ({e}). CI installs its argument parser with "
                    f"`pip install --no-deps sglang=={SGLANG_VERSION}` plus its parser's dependencies "
                    f"(see the CI install script); this test must not be skipped.", pytrace=False)
    assert sglang.__version__ == SGLANG_VERSION, \
        f"sglang {sglang.__version__} installed, profiles target {SGLANG_VERSION}"
    return ServerArgs, prepare_server_args


def sglang_profiles() -> list[str]:
    names = [n for n in available_profiles() if read_toml(find_profile(n)).get("engine") == "sglang"]
    assert {"reference", "reference-2node"} <= set(names)
    return names


CASES = [(n, o) for n in sglang_profiles()
         for o in (Overrides(), Overrides(steps=3), Overrides(steps=4, topk=4, draft_tokens=8))]


@pytest.mark.parametrize("name,overrides", CASES, ids=[f"{n}-{i % 3}" for i, (n, _) in enumerate(CASES)])
def test_sglang_parser_reads_back_profile(sglang_args, name, overrides):
    ServerArgs, prepare_server_args = sglang_args
    p = resolve(name, overrides, environ=ENV).profile
    kwargs = sglang_server_args(p)
    argv = sglang_cli(kwargs)
    assert "--cuda-graph-max-bs" not in argv  # gone in 0.5.23; the decode variant replaces it
    from_cli = prepare_server_args(argv)
    from_kwargs = ServerArgs(**kwargs)
    s = p.speculative
    for a in (from_cli, from_kwargs):
        assert a.speculative_algorithm == "EAGLE3"
        assert (a.speculative_num_steps, a.speculative_eagle_topk, a.speculative_num_draft_tokens) == \
            (s.steps, s.topk, s.draft_tokens)
        assert a.tp_size == p.parallel.tp
        assert (a.nnodes, a.node_rank) == (p.parallel.nnodes, p.parallel.node_rank)
        assert a.model_path == p.model.path and a.speculative_draft_model_path == p.model.draft
        assert a.mem_fraction_static == p.sglang.mem_fraction_static
        assert a.cuda_graph_max_bs_decode == p.sglang.cuda_graph_max_bs_decode
        if p.parallel.nnodes > 1:
            assert a.dist_init_addr == p.parallel.dist_init_addr


def test_reference_is_the_measured_configuration(sglang_args):
    _, prepare_server_args = sglang_args
    p = resolve("reference", environ={}).profile
    a = prepare_server_args(sglang_cli(sglang_server_args(p)))
    assert (a.speculative_num_steps, a.speculative_eagle_topk, a.speculative_num_draft_tokens, a.tp_size) == \
        (2, 1, 3, 8)


def test_no_spec_leaves_speculation_unset(sglang_args):
    _, prepare_server_args = sglang_args
    p = resolve("reference", Overrides(no_spec=True), environ={}).profile
    a = prepare_server_args(sglang_cli(sglang_server_args(p)))
    assert a.speculative_algorithm is None and a.speculative_num_steps is None and a.tp_size == 8
