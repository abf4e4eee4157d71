"""The NCCL sweep covers every PROTO x ALGO x P2P_LEVEL combination plus P2P-disabled ones,
always with NVLS off, runs each in fresh processes, and writes JSON, markdown, PNG and the
best setting as a profile [env] fragment. Smoke-tested in --dry-run (gloo on CPU)."""
import json

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from benchmarks import nccl_sweep


def test_combinations():
    combos = nccl_sweep.all_combos()
    assert len(combos) == 1 + 3 * 2 * 2 + 3 * 2
    assert len({c.env for c in combos}) == len(combos)
    assert sum(c.p2p_disabled for c in combos) == 6
    assert nccl_sweep.BASE_ENV["NCCL_NVLS_ENABLE"] == "0"


def test_dry_run_writes_table_and_fragments(tmp_path):
    nccl_sweep.main(["--dry-run", "--only", "default,LL/Ring/P2P SYS,Simple/Tree/P2P off", "--tokens", "1,2",
                     "--ops-per-graph", "4", "--replays", "4", "--name", "smoke", "--out-dir", str(tmp_path)])
    data = json.loads((tmp_path / "smoke.json").read_text())
    assert [r["label"] for r in data["results"]] == ["default", "LL/Ring/P2P SYS", "Simple/Tree/P2P off"]
    for r in data["results"]:
        assert not r["error"]
        assert r["env"]["NCCL_NVLS_ENABLE"] == "0"
        assert [x["bytes"] for x in r["rows"]] == [7168 * 2, 7168 * 4]
        assert all(x["us"] > 0 for x in r["rows"])
    assert "| setting |" in (tmp_path / "smoke.md").read_text()
    best = tomllib.loads((tmp_path / "smoke-best.toml").read_text())["env"]
    assert best["NCCL_NVLS_ENABLE"] == "0" and "NCCL_P2P_DISABLE" not in best
    no_p2p = tomllib.loads((tmp_path / "smoke-best-no-p2p.toml").read_text())["env"]
    assert no_p2p == {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Tree", "NCCL_P2P_DISABLE": "1",
                      "NCCL_NVLS_ENABLE": "0", "NCCL_CUMEM_ENABLE": "0"}
