"""benchmarks/startup: a cold and a warm start, each in a fresh process, serve at once and
report engine-ready seconds and the longest gap per concurrency (eager here: compiling on CPU
takes a minute). Timings are never checked."""
import json
import logging
from pathlib import Path

import pytest

from benchmarks import startup
from engine.background_compile import COMPILING, SWAPPED_IN
from server.main import LOG_FORMAT

ROOT = Path(__file__).resolve().parent.parent


def test_cold_and_warm_starts(tmp_path):
    out = tmp_path / "s.json"
    result = startup.main(["--model", str(ROOT / "shipped/target"), "--draft", str(ROOT / "shipped/drafter"),
                           "--steps", "2", "--max-batch", "2", "--concurrency", "1,2", "--max-tokens", "8",
                           "--device", "cpu", "--dtype", "float32", "--no-compile",
                           "--prompts", str(ROOT / "shipped/data/heldout_prompts.jsonl"),
                           "--cache-dir", str(tmp_path / "cache"), "--out", str(out)])
    assert set(result["starts"]) == {"cold", "warm"}
    for s in result["starts"].values():
        assert s["ready_s"] > 0 and [x["concurrency"] for x in s["loads"]] == [1, 2]
        assert all(x["throughput"] > 0 and x["accept_length"] > 1 for x in s["loads"])
    assert json.loads(out.read_text())["settings"]["no_compile"] is True
    assert "| cold |" in out.with_suffix(".md").read_text()
    assert f"loaded {ROOT / 'shipped/target'} on cpu" in out.with_suffix(".warm.log").read_text()   # the engine's log


@pytest.mark.slow
def test_server_cold_and_warm_first_answers(tmp_path):
    """The server as `make serve` starts it (eager steps here: nothing compiles), cold then warm: ready, the
    first answer and one client's streams, every prompt's text the same each time it was asked."""
    out = tmp_path / "first.json"
    result = startup.main(["--server-args", f"--no-profile --model {ROOT / 'shipped/target'} --draft "
                           f"{ROOT / 'shipped/drafter'} --device cpu --max-batch 2 --no-compile", "--clients", "1",
                           "--after", "1", "--max-tokens", "8", "--cache-dir", str(tmp_path / "cache"),
                           "--prompts", str(ROOT / "shipped/data/heldout_prompts.jsonl"), "--out", str(out)])
    for s in result["starts"].values():
        assert 0 < s["ready_s"] < s["first_token_s"] <= s["first_answer_s"] and s["first_answer"]
        assert s["compiled_s"] is not None and s["streams"] > 0 and s["errors"] == 0
        assert all(len(texts) == 1 for texts in s["texts_by_prompt"].values())
    assert "| cold |" in out.with_suffix(".md").read_text() and out.with_suffix(".warm.log").stat().st_size > 0
    assert json.loads((tmp_path / "manifest.json").read_text())["claim"].endswith("of the server")


def test_startup_reads_the_lines_the_engine_logs_at_a_swap():
    """The lines that time the phases of a start, as the engine logs them in the server's format."""
    def logged(msg: str, *args) -> str:
        return logging.Formatter(LOG_FORMAT).format(logging.LogRecord("specserve.engine", logging.INFO, "", 0, msg,
                                                                      args, None))
    swap = startup.SWAP.match(logged(SWAPPED_IN, "1 row x 3 draft steps", 78.2, 3.614, 0.04, 1, 2))
    assert swap.groups()[1:] == ("1 row x 3 draft steps", "78", "3.61", "0.0")
    assert startup.COMPILING.match(logged(COMPILING, "prefills, 1 row x 3 draft steps"))
