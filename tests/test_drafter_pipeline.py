"""End to end on CPU: a tiny random-weight target served by our OpenAI server -> `drafter data`
through the live endpoint -> `vocab` -> `train` (online TTT) -> `export` -> the native engine:
the trained drafter's accept length on the training prompts clearly beats the untrained one's
(same initialisation, zero updates)."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from benchmarks.server_proc import free_port, wait_healthy
from drafter.cli import main as drafter
from tests.tiny import make_target_dir, stdlib_texts

ROOT = Path(__file__).resolve().parents[1]
N_PROMPTS = 24
MAX_TOKENS = 40


def _prompts(path: Path) -> Path:
    rng = random.Random(0)
    lines = [s.strip() for t in stdlib_texts(40) for s in t.splitlines() if 20 < len(s.strip()) < 80]
    rng.shuffle(lines)
    with open(path, "w") as f:
        for i, line in enumerate(lines[:N_PROMPTS]):
            turns = [{"from": "human", "value": line}, {"from": "gpt", "value": "(original answer)"}]
            f.write(json.dumps({"id": f"p{i}", "conversations": turns}) + "\n")
    return path


class _Server:
    """`python -m server --model DIR` in a subprocess, ready when /health answers."""

    def __init__(self, model: Path, log: Path):
        self.port = free_port()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        self.log = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "server", "--model", str(model), "--host", "127.0.0.1",
                                      "--port", str(self.port), "--log-level", "warning"],
                                     cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}/v1"
        try:
            wait_healthy(self.url.removesuffix("/v1"), self.proc, 120, log.read_text)
        except BaseException:
            self.close()
            raise
        self.model = httpx.get(self.url + "/models", timeout=10).json()["data"][0]["id"]

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture
def one_thread():
    """2 shared cores: one intra-op thread per process avoids oversubscription."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.slow
def test_pipeline_end_to_end_through_our_server(tmp_path, one_thread):
    # init_std 0.05: outputs far from uniform noise, yet mostly valid text, so the text round
    # trip through the HTTP API (decode, then re-tokenize) keeps the target's contexts.
    target = make_target_dir(tmp_path / "target", init_std=0.05)
    prompts = _prompts(tmp_path / "prompts.jsonl")
    data, run = tmp_path / "data", tmp_path / "run"

    server = _Server(target, tmp_path / "server.log")
    try:
        assert drafter(["data", "--prompts", str(prompts), "--out", str(data), "--endpoint", server.url,
                        "--model", server.model, "--tokenizer", str(target), "--max-tokens", str(MAX_TOKENS),
                        "--concurrency", "8", "--shard-size", "10"]) == 0
    finally:
        server.close()
    generated = [json.loads(line) for line in (data / "generated.jsonl").read_text().splitlines()]
    assert len(generated) == N_PROMPTS
    assert all(g["messages"][-1]["role"] == "assistant" and g["messages"][-1]["content"] != "(original answer)"
               for g in generated)
    index = json.loads((data / "index.json").read_text())
    assert index["records"] == N_PROMPTS and len(index["shards"]) == 3 and index["loss_tokens"] > 0

    assert drafter(["vocab", "--data", str(data), "--size", "128", "--target", str(target)]) == 0
    assert drafter(["train", "--target", str(target), "--data", str(data), "--out", str(run), "--max-steps", "200",
                    "--lr", "3e-3", "--batch-size", "4", "--log-every", "50", "--save-every", "1000"]) == 0
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [50, 100, 150, 200] and len(log[-1]["acc"]) == 7
    assert log[-1]["acc"][0] > log[0]["acc"][0]

    trained, untrained = tmp_path / "trained", tmp_path / "untrained"
    assert drafter(["export", str(run), str(trained)]) == 0
    assert drafter(["export", str(run), str(untrained), "--step", "0"]) == 0
    cfg = json.loads((trained / "config.json").read_text())
    assert cfg["specserve"]["trained_aux_layer_outputs"] == [0, 1, 1] and cfg["specserve"]["trained_steps"] == 200

    results = tmp_path / "eval.json"
    assert drafter(["eval", "--target", str(target), "--draft", str(untrained), "--draft", str(trained),
                    "--prompts", str(prompts), "--steps", "3", "--trees", "3x2x6", "--max-tokens", str(MAX_TOKENS),
                    "--out", str(results)]) == 0
    before, before_tree, after, after_tree = json.loads(results.read_text())
    assert [r["setting"] for r in (before, before_tree, after, after_tree)] == ["3", "3x2x6"] * 2
    assert after_tree["accept_length"] >= after["accept_length"]   # the chain's path is one of the tree's
    print(f"accept length at 3 steps: untrained {before['accept_length']}, trained {after['accept_length']}; "
          f"trained per-position {after['per_position']}; training log {log[-1]}")
    assert after["accept_length"] >= before["accept_length"] + 0.3
    assert after["per_position"][0] > before["per_position"][0]


def test_eval_names_two_drafter_folders_of_one_name_apart():
    from drafter.evaluate import short_names
    assert short_names(["shipped/smollm2/drafter", "runs/lk-loss/drafter"]) == {
        "shipped/smollm2/drafter": "smollm2/drafter", "runs/lk-loss/drafter": "lk-loss/drafter"}
    assert short_names(["runs/a", "runs/b"]) == {"runs/a": "a", "runs/b": "b"}
