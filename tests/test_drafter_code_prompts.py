"""Code prompts from Python source, and answering prompts without their system messages."""
from __future__ import annotations

import json
import textwrap

import pytest

from drafter.cli import main as drafter
from drafter.code_prompts import CodePromptsConfig, collect
from drafter.data import DataConfig, run_data, system_dropped
from drafter.generate import GenParams
from drafter.prompts import read_prompts

DOC = "Return the words of text that appear more than once, in the order they first repeat."
SOURCE = textwrap.dedent(f'''
    def repeated_words(text: str) -> list[str]:
        """{DOC}"""
        seen, out = set(), []
        for w in text.split():
            if w in seen and w not in out:
                out.append(w)
            seen.add(w)
        return out


    def _private(x):
        """{DOC}"""
        y = x
        return y


    def short_doc(x):
        """Too short."""
        y = x
        return y


    def no_body(x):
        """{DOC}"""
        return x


    class Stack:
        def push_all(self, items):
            """{DOC}"""
            for i in items:
                self.push(i)
            return self
''')


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "words.py").write_text(SOURCE)
    (tmp_path / "pkg" / "broken.py").write_text("def oops(:\n")
    (tmp_path / "pkg" / "test_words.py").write_text(SOURCE)            # tests are skipped
    (tmp_path / "human_eval").mkdir()
    (tmp_path / "human_eval" / "problems.py").write_text(SOURCE.replace("repeated_words", "held_out"))
    return tmp_path


def test_stubs_are_documented_public_functions_with_a_body(tree):
    stubs = collect(CodePromptsConfig(src=[str(tree)], out="", num=10))
    assert [s.split("(")[0] for s in stubs] == ["def repeated_words", "def push_all"]
    assert stubs[0] == f'def repeated_words(text: str) -> list[str]:\n    """{DOC}"""\n'
    assert stubs[1].startswith("def push_all(self, items):\n    \"\"\"")   # a method, dedented


def test_code_prompts_command_is_seeded_and_mixes_raw_prompts(tree, tmp_path, capsys):
    outs = []
    for name in ("a.jsonl", "b.jsonl"):
        out = tmp_path / name
        assert drafter(["code-prompts", "--src", str(tree), "--out", str(out), "--num", "5",
                        "--completion-share", "0.5", "--seed", "3"]) == 0
        outs.append(out.read_text())
    stats = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert outs[0] == outs[1] and stats["written"] == 2 == stats["chat"] + stats["raw"]
    convs = list(read_prompts(tmp_path / "a.jsonl"))
    assert all(c.id.startswith("code-") for c in convs)
    assert {c.raw_prompt or c.messages[0]["content"] for c in convs} == set(collect(
        CodePromptsConfig(src=[str(tree)], out="", num=10)))
    # a folder named like a held-out set is skipped by default: nothing left, a clear error
    assert drafter(["code-prompts", "--src", str(tree / "human_eval"), "--out", str(tmp_path / "c.jsonl"),
                    "--num", "1"]) == 2
    assert "no documented Python functions under" in capsys.readouterr().err


def test_system_messages_are_dropped_by_a_hash_of_the_id(tmp_path):
    ids = [f"self-{i}" for i in range(2000)]
    dropped = [i for i in ids if system_dropped(i, 0.7)]
    assert dropped == [i for i in ids if system_dropped(i, 0.7)]          # the same on every run
    assert 0.65 < len(dropped) / len(ids) < 0.75
    assert not any(system_dropped(i, 0.0) for i in ids) and all(system_dropped(i, 1.0) for i in ids)
    with pytest.raises(ValueError, match="--keep-responses"):
        run_data(DataConfig(prompts=str(tmp_path / "p.jsonl"), out=str(tmp_path / "d"), keep_responses=True,
                            drop_system=0.5))


def test_dropped_system_messages_are_not_sent(tmp_path):
    """Regenerated through the native engine: a dropped conversation is answered (and stored)
    without its system message, a kept one with it."""
    from tests.tiny import make_target_dir
    target = make_target_dir(tmp_path / "target")
    prompts = tmp_path / "p.jsonl"
    ids = ["self-1", "self-2", "self-3", "self-4"]
    prompts.write_text("".join(json.dumps({"id": i, "messages": [{"role": "system", "content": "Be brief."},
                                                                 {"role": "user", "content": "Hi there."}]}) + "\n"
                               for i in ids))
    run_data(DataConfig(prompts=str(prompts), out=str(tmp_path / "d"), target=str(target), device="cpu",
                        drop_system=0.5, max_batch=4, gen=GenParams(max_tokens=4)))
    stored = {r["id"]: r for r in map(json.loads, (tmp_path / "d" / "generated.jsonl").read_text().splitlines())}
    assert 0 < sum(system_dropped(i, 0.5) for i in ids) < len(ids)
    for i in ids:
        assert (stored[i]["messages"][0]["role"] == "system") is not system_dropped(i, 0.5)


def test_prompt_files_interleave_in_proportion(tmp_path):
    from drafter.prompts import read_prompt_files
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps({"id": f"a{i}", "prompt": f"text {i}"}) + "\n" for i in range(6)))
    b.write_text("".join(json.dumps({"id": f"b{i}", "prompt": f"code {i}"}) + "\n" for i in range(3)))
    ids = [c.id for c in read_prompt_files([a, b])]
    assert ids == ["a0", "b0", "a1", "a2", "b1", "a3", "a4", "b2", "a5"]   # 2:1 in every prefix
    assert [c.id for c in read_prompt_files([a, b], limit=3)] == ids[:3]
    with pytest.raises(ValueError, match="also in another prompt file"):
        list(read_prompt_files([a, a]))
