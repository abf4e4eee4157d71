"""benchmarks/results holds records, not a notebook: every folder has a manifest.json with the fields a
reader needs (claim, commit, hardware, versions, command, date), the index README.md is the one
`python -m benchmarks.results_index` generates, and the whole stays small."""
from __future__ import annotations

import json

from benchmarks import results_index
from benchmarks.manifest import REQUIRED, cpu_string, manifest

RESULTS = results_index.RESULTS
MAX_FILES = 300
MAX_BYTES = 15 * 1024 * 1024


def test_every_record_has_a_manifest_with_the_required_fields():
    folders = [p for p in RESULTS.iterdir() if p.is_dir()]
    assert folders
    for d in folders:
        m = d / "manifest.json"
        assert m.is_file(), f"{d.name}: no manifest.json (benchmarks/manifest.py write_manifest)"
        data = json.loads(m.read_text())
        missing = [k for k in REQUIRED if k not in data]
        assert not missing, f"{d.name}/manifest.json lacks {missing}"
        assert data["claim"] and data["command"] and data["date"], d.name
        hw = data["hardware"]
        assert (hw.get("string") if isinstance(hw, dict) else hw), f"{d.name}: no hardware string"
        assert (d / "README.md").is_file(), f"{d.name}: no README.md"


def test_the_index_is_current():
    assert (RESULTS / "README.md").read_text() == results_index.render(), \
        "benchmarks/results/README.md is stale: python -m benchmarks.results_index"


def test_results_stay_small():
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    assert len(files) <= MAX_FILES, f"{len(files)} files under benchmarks/results (at most {MAX_FILES})"
    assert size <= MAX_BYTES, f"{size / 2**20:.1f} MB under benchmarks/results (at most 15)"


def test_manifest_names_this_machine(tmp_path):
    m = manifest("a claim", command="python -m x", vllm="0.32")
    assert all(k in m for k in REQUIRED) and m["vllm"] == "0.32"
    assert m["hardware"]["string"]
    cpu = {"model_name": "AMD EPYC", "family": 25, "model": 17, "cores": 2, "virtual": True, "hypervisor": "KVM"}
    assert cpu_string(cpu) == "AMD EPYC (family 25, model 17), 2 vCPUs, KVM"
