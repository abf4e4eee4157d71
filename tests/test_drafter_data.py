"""The data step: prompt formats, the endpoint client (bounded concurrency, retries, resume),
the loss mask on assistant tokens, exact generated ids, and shard resume."""
import asyncio
import json

import httpx
import pytest

from drafter.generate import EndpointBackend, GenParams, regenerate
from drafter.prompts import parse_record, read_prompts
from drafter.shards import TokenShards, tokenize_batch, write_shards
from models.tokenizer import build_tokenizer
from tests.tiny import stdlib_texts


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return build_tokenizer(stdlib_texts(4), 300, tmp_path_factory.mktemp("tok"))


def test_prompt_formats(tmp_path):
    share = {"id": "a", "conversations": [{"from": "gpt", "value": "orphan"}, {"from": "system", "value": "be brief"},
                                          {"from": "human", "value": "hi"}, {"from": "gpt", "value": "old"}]}
    msgs = {"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                         {"role": "user", "content": "q2"}]}
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps(share) + "\n\n" + json.dumps(msgs) + "\n" + json.dumps({"messages": []}) + "\n")
    convs = list(read_prompts(f))
    assert [c.id for c in convs] == ["a", "2"]            # explicit id, else the line number
    assert convs[0].messages[0] == {"role": "system", "content": "be brief"}   # leading answer dropped
    assert convs[0].first_prompt()[-1] == {"role": "user", "content": "hi"}
    assert convs[1].user_turns == 2
    with pytest.raises(ValueError):
        parse_record({"text": "no conversation"}, "0")


def _server(fail_first: set, reject: set, state: dict):
    """Fake OpenAI endpoint: 503 on the first try of `fail_first` prompts, 400 for `reject`."""
    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        prompt = body["messages"][-1]["content"]
        state["inflight"] += 1
        state["max_inflight"] = max(state["max_inflight"], state["inflight"])
        try:
            await asyncio.sleep(0.01)
            state["calls"] += 1
            if prompt in reject:
                return httpx.Response(400, json={"error": "bad"})
            if prompt in fail_first:
                fail_first.discard(prompt)
                return httpx.Response(503, json={"error": "busy"})
            assert body["temperature"] == 0.0 and body["max_tokens"] == 8
            return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": f"re:{prompt}"},
                                                          "finish_reason": "stop"}],
                                             "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
        finally:
            state["inflight"] -= 1
    return httpx.MockTransport(handler)


def test_endpoint_concurrency_retries_and_resume(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                               for i in range(12)))
    out = tmp_path / "generated.jsonl"
    state = {"inflight": 0, "max_inflight": 0, "calls": 0}

    async def run(fail_first, reject):
        b = EndpointBackend("http://fake/v1", "m", retries=3, backoff_s=0.001, concurrency=3,
                            transport=_server(fail_first, reject, state))
        await b.start()
        try:
            return await regenerate(read_prompts(prompts), b, out, GenParams(max_tokens=8), concurrency=3, total=12)
        finally:
            await b.close()

    stats = asyncio.run(run({"q1", "q5"}, {"q7"}))
    assert {k: stats[k] for k in ("skipped", "generated", "failed", "finished")} == {
        "skipped": 0, "generated": 11, "failed": 1, "finished": True}
    assert stats["generated_tokens"] == 11 * 2             # text only: counted from the responses' usage
    assert state["max_inflight"] <= 3
    assert state["calls"] == 12 + 2                       # two retried once, the rejected one not retried
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["id"] for r in recs} == {f"c{i}" for i in range(12)} - {"c7"}
    assert all(r["messages"][-1] == {"role": "assistant", "content": "re:" + r["messages"][0]["content"]} for r in recs)
    assert "c7" in (tmp_path / "generated.failed.jsonl").read_text()
    # A crash left half a line: resume repairs it, skips the done ids, retries only the failure.
    with open(out, "a") as f:
        f.write('{"id": "c9", "mess')
    state["calls"] = 0
    stats = asyncio.run(run(set(), set()))
    assert {k: stats[k] for k in ("skipped", "generated", "failed")} == {"skipped": 11, "generated": 1, "failed": 0}
    assert state["calls"] == 1
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(f"c{i}" for i in range(12))


def test_loss_mask_covers_assistant_turns_only(tok):
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "def f(x):"},
            {"role": "assistant", "content": "return x + 1"}, {"role": "user", "content": "again"},
            {"role": "assistant", "content": "import os"}]
    [(ids, mask)] = tokenize_batch(tok, [{"messages": msgs}])
    assert ids == tok(tok.apply_chat_template(msgs, tokenize=False), add_special_tokens=False)["input_ids"]
    runs, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    assert runs == ["return x + 1<|im_end|>", "import os<|im_end|>"]


def test_exact_completion_ids_are_kept(tok):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "return"}]
    # A non-canonical split of "return" (one token per character) plus the generated stop token.
    chars = [tok.convert_tokens_to_ids(c) for c in "return"]
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    [(ids, mask)] = tokenize_batch(tok, [{"messages": msgs, "completion_ids": [chars + [eos]]}])
    prefix = tok(tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True),
                 add_special_tokens=False)["input_ids"]
    assert ids[:len(prefix)] == prefix and sum(mask[:len(prefix)]) == 0
    assert ids[len(prefix):len(prefix) + 7] == chars + [eos]          # exact ids, one end marker
    assert mask[len(prefix):len(prefix) + 7] == [1] * 7 and sum(mask) == 7


def test_shards_resume_and_lazy_reads(tok, tmp_path):
    gen = tmp_path / "generated.jsonl"

    def rec(i):
        return json.dumps({"id": str(i), "messages": [{"role": "user", "content": f"q{i}"},
                                                      {"role": "assistant", "content": f"answer {i}"}]}) + "\n"
    gen.write_text(rec(0) + rec(1) + rec(2))
    infos = write_shards(gen, tok, tmp_path, shard_size=2)
    assert [i.records for i in infos] == [2, 1]
    first = (tmp_path / "shards" / "shard-00000.safetensors").stat().st_mtime_ns
    with open(gen, "a") as f:
        f.write(rec(3))
    infos = write_shards(gen, tok, tmp_path, shard_size=2)
    assert [i.records for i in infos] == [2, 2]
    assert (tmp_path / "shards" / "shard-00000.safetensors").stat().st_mtime_ns == first   # complete shard kept
    data = TokenShards(tmp_path)
    assert len(data) == 4
    ids, mask = data[3]
    expected, _ = tokenize_batch(tok, [json.loads(rec(3))])[0]
    assert ids.tolist() == expected and mask.dtype.is_floating_point is False
    assert json.loads((tmp_path / "index.json").read_text())["records"] == 4


def test_time_limited_regeneration_keeps_whole_records_and_resumes(tmp_path):
    """A time-boxed run (a device call) stops with whole records written and the rest aborted
    in the engine; a rerun answers only the conversations still missing."""
    from drafter.generate import NativeBackend
    from tests.tiny import make_target_dir
    target = make_target_dir(tmp_path / "target", init_std=0.2)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                               for i in range(6)))
    out = tmp_path / "generated.jsonl"

    async def run(limit):
        b = NativeBackend(str(target), device="cpu", max_batch=1)
        await b.start()
        try:
            return await regenerate(read_prompts(prompts), b, out, GenParams(max_tokens=400), concurrency=1,
                                    time_limit_s=limit)
        finally:
            await b.close()

    first = asyncio.run(run(0.5))
    assert not first["finished"] and first["generated"] < 6
    second = asyncio.run(run(0))
    assert second["finished"] and second["skipped"] == first["generated"]
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == [f"c{i}" for i in range(6)]
