"""Prompts the target writes itself (`drafter prompts`), and raw completion-style prompts through
the rest of the pipeline: the Magpie cut of a chat template, each filter, exact and near
deduplication, mixing, resume, raw records through regeneration and shards, and accept length
on raw prompts. Generation runs for real through tiny models on CPU."""
import asyncio
import copy
import json
import random
from pathlib import Path

import pytest
import torch

from drafter.cli import main as drafter
from drafter.evaluate import evaluate
from drafter.generate import EndpointBackend, GenParams, NativeBackend, regenerate_one
from drafter.prompt_filter import Deduplicator, FilterConfig, normalize, reject_reason, repeat_ratio
from drafter.prompts import Conversation, parse_record, raw_prompt_ids, read_prompts
from drafter.self_prompts import SYSTEM_PROMPTS, opening
from drafter.shards import tokenize_batch
from drafter.user_turn import PLACEHOLDER, end_of_turn_ids, template_markers, user_turn
from engine.config import SpecConfig
from tests import server_harness as h
from tests.tiny import make_target_dir, stdlib_texts

# SmolLM2-135M-Instruct's template, as its GGUF metadata carries it: ChatML with a default system prompt.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n'"
    " + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
FILTERS = FilterConfig()


@pytest.fixture(scope="module")
def tiny():
    """The shared tiny target (random weights) and its drafter fitted on its own greedy output."""
    return h.models()


def _with_template(tok, template: str):
    t = copy.deepcopy(tok)
    t.chat_template = template
    return t


@pytest.mark.parametrize("template,system,prefix", [
    (None, "Be brief.", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"),
    (None, "", "<|im_start|>user\n"),
    (SMOLLM2_TEMPLATE, "Be brief.", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"),
    (SMOLLM2_TEMPLATE, "", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                           "<|im_end|>\n<|im_start|>user\n"),
    (LLAMA3_TEMPLATE, "Be brief.", "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                                   "<|start_header_id|>user<|end_header_id|>\n\n"),
])
def test_user_turn_prefix_is_cut_from_the_template(tiny, template, system, prefix):
    tok = _with_template(tiny.tokenizer, template) if template else tiny.tokenizer
    turn = user_turn(tok, system)
    assert turn.prefix == prefix
    # prefix + message + end of turn is exactly what the template renders for that message
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": "Hi?"}]
    assert turn.prefix + "Hi?" + turn.end_of_turn == tok.apply_chat_template(msgs, tokenize=False)


def test_end_of_turn_ids_and_markers(tiny):
    tok = tiny.tokenizer
    turn = user_turn(tok, "")
    im_end, im_start = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|im_start|>")
    assert end_of_turn_ids(tok, turn) == [im_end]
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>", PLACEHOLDER} <= set(template_markers(tok, turn))
    assert im_start not in end_of_turn_ids(tok, turn)


@pytest.mark.parametrize("text,reason", [
    ("", "empty"),
    ("  \n ", "empty"),
    ("What is 2+2?<|im_start|>assistant\n4", "template_marker"),
    (f"Please answer {PLACEHOLDER}", "template_marker"),
    ("12345 + 67890 = ???", "no_letters"),
    ("Tell me about caf\ufffd culture in Paris", "non_text"),
    ("Why \x1b[31m is this red?", "non_text"),
    ("a {}[]()<>!@#$%^&*()_+=-{}[]|\\:;\"'<>,.?/~`", "non_text"),
    ("Hi there", "too_short"),
    ("Explain " + "photosynthesis " * 400, "too_long"),
    ("I like the cat. " * 12, "repetitive"),
    ("Can you explain how photosynthesis works, in simple terms?", None),
    ("Why does `for i in range(3): print(i)` print three numbers in Python?", None),
    ("Write a haiku about autumn leaves.", None),
])
def test_reject_reason(text, reason):
    assert reject_reason(text, len(text.split()) + 1, [PLACEHOLDER, "<|im_start|>", "<|im_end|>"], FILTERS) == reason


def test_token_bounds():
    text = "Summarize the plot of Hamlet."
    assert reject_reason(text, 3, [], FILTERS) == "too_short"
    assert reject_reason(text, FILTERS.max_tokens + 1, [], FILTERS) == "too_long"


def test_repeat_ratio():
    assert repeat_ratio("one two three four five six") == 0.0
    assert repeat_ratio("go go go go go go go go go go go") > 0.8
    assert repeat_ratio("two words") == 0.0


def test_exact_and_near_duplicates():
    d = Deduplicator(0.7)
    base = ("Can you explain the difference between a list and a tuple in Python, and tell me when I should "
            "prefer one over the other in everyday code?")
    assert d.add(base) is None
    assert normalize("  Hello,   WORLD!") == "hello world"
    assert d.add(base.upper().replace(",", "") + "  ") == "duplicate"               # case, punctuation, spaces
    assert d.add(base.replace("everyday", "daily")) == "near_duplicate"            # one word changed
    assert d.add(base.replace("Python", "Rust").replace("everyday", "production")) == "near_duplicate"
    assert d.add("Write a short story about a lighthouse keeper who finds a message in a bottle.") is None
    assert d.add("What are the main causes of inflation, and how do central banks respond?") is None


def test_opening():
    assert opening("Write a poem about the sea. Make it rhyme.", 16) == "Write a poem about the sea."
    assert opening("Hi! I need help planning a trip to Japan in spring.", 16) == \
        "Hi! I need help planning a trip to Japan in spring."                      # at least 4 words
    assert opening("one two three four five six seven eight nine ten", 5) == "one two three four five"


def test_raw_prompt_records(tmp_path):
    conv = parse_record({"id": "r1", "prompt": "def add(a, b):"}, "0")
    assert conv.raw_prompt == "def add(a, b):" and conv.messages == [] and conv.first_prompt() == []
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "Once upon a time"}) + "\n" + json.dumps({"prompt": ""}) + "\n"
                 + json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    convs = list(read_prompts(f))
    assert [(c.id, c.raw_prompt) for c in convs] == [("0", "Once upon a time"), ("2", None)]   # empty dropped
    with pytest.raises(ValueError):
        parse_record({"prompt": ["not", "text"]}, "0")


# --- raw records through regeneration, shards and eval --------------------------------------------

def _masked_runs(ids: list[int], mask: list[int]) -> tuple[list[int], list[int]]:
    return [t for t, m in zip(ids, mask) if not m], [t for t, m in zip(ids, mask) if m]


def test_raw_record_native_regeneration_to_shards(tiny):
    prompt = h.COMPLETION_PROMPTS[0]
    greedy = tiny.greedy[("completion", prompt)]

    async def go():
        b = NativeBackend(str(tiny.target), device="cpu", max_batch=2)
        await b.start()
        try:
            return await regenerate_one(Conversation("r", [], raw_prompt=prompt), b,
                                        GenParams(raw_max_tokens=len(greedy)))
        finally:
            await b.close()
    rec = asyncio.run(go())
    assert rec["prompt"] == prompt and rec["completion_ids"] == [greedy]        # continued WITHOUT the template
    assert rec["completion"] == tiny.tokenizer.decode(greedy, skip_special_tokens=True)
    [(ids, mask)] = tokenize_batch(tiny.tokenizer, [rec])
    assert _masked_runs(ids, mask) == (raw_prompt_ids(tiny.tokenizer, prompt), greedy)
    assert mask == sorted(mask)                                                   # prompt first, then completion


def test_raw_record_endpoint_regeneration_to_shards(tiny):
    """Through our live server's /v1/completions; it returns text only, so shards re-tokenize it."""
    server = h.plain_server()
    prompt = h.COMPLETION_PROMPTS[1]
    greedy = tiny.greedy[("completion", prompt)]

    async def go(p):
        b = EndpointBackend(server.url + "/v1", server.model)
        await b.start()
        try:
            by_text = await regenerate_one(Conversation("r", [], raw_prompt=p), b,
                                           GenParams(raw_max_tokens=len(greedy)))
            by_ids = await b.complete_raw(tiny.completion_ids(p), GenParams(max_tokens=len(greedy), seed=1))
            return by_text, by_ids
        finally:
            await b.close()
    rec, by_ids = asyncio.run(go(prompt))
    assert rec["completion"] == by_ids.text                      # a text prompt is tokenized as the ids were
    # the same greedy continuation (the server's text leaves out a trailing partial UTF-8 sequence)
    assert rec["completion"] and tiny.tokenizer.decode(greedy, skip_special_tokens=True).startswith(rec["completion"])
    assert "completion_ids" not in rec
    [(ids, mask)] = tokenize_batch(tiny.tokenizer, [rec])
    prompt_ids, completion = _masked_runs(ids, mask)
    assert prompt_ids == raw_prompt_ids(tiny.tokenizer, prompt)
    assert completion == tiny.tokenizer(rec["completion"], add_special_tokens=False)["input_ids"]


def test_eval_continues_raw_prompts_without_the_template(tiny, tmp_path):
    """The drafter was fitted on the target's raw continuations of these prompts: accepted as raw
    prompts, it predicts well; the same texts wrapped in the chat template are other contexts.
    Records with a "category" also get an accept length per category."""
    raw, chat = tmp_path / "raw.jsonl", tmp_path / "chat.jsonl"
    raw.write_text("".join(json.dumps({"prompt": p, "category": "ab"[i % 2]}) + "\n"
                           for i, p in enumerate(h.COMPLETION_PROMPTS)))
    chat.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n"
                            for p in h.COMPLETION_PROMPTS))
    kw = dict(max_tokens=h.MAX_TOKENS, device="cpu", max_batch=4)
    [as_raw] = evaluate(str(tiny.target), [str(tiny.draft)], str(raw), [SpecConfig(steps=3)], **kw)
    [as_chat] = evaluate(str(tiny.target), [str(tiny.draft)], str(chat), [SpecConfig(steps=3)], **kw)
    assert as_raw.prompts == len(h.COMPLETION_PROMPTS)
    assert as_raw.accept_length > 2.0 and as_raw.accept_length > as_chat.accept_length + 0.5
    # per category (records' "category"): the overall figure lies between the two groups'
    assert set(as_raw.by_category) == {"a", "b"} and as_chat.by_category == {}
    assert min(as_raw.by_category.values()) <= as_raw.accept_length <= max(as_raw.by_category.values())


# --- `drafter prompts` end to end -------------------------------------------------------------------

@pytest.fixture(scope="module")
def writer_model(tmp_path_factory):
    """A tiny target taught, in a few seconds, to write one line of text as a user turn and end it
    with <|im_end|>: a random-weight model would write bytes that are not text and almost never
    end its turn, so every prompt would be dropped."""
    from transformers import AutoTokenizer, LlamaForCausalLM
    path = make_target_dir(tmp_path_factory.mktemp("writer"))
    tok = AutoTokenizer.from_pretrained(path)
    rng = random.Random(0)
    lines = sorted({s.strip() for t in stdlib_texts(40) for s in t.splitlines() if 20 < len(s.strip()) < 80})
    rng.shuffle(lines)

    def turn() -> str:
        system = rng.choice(SYSTEM_PROMPTS[:3])
        user = {"role": "user", "content": rng.choice(lines[:400])}
        return tok.apply_chat_template(([{"role": "system", "content": system}] if system else []) + [user],
                                       tokenize=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(path)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        enc = tok([turn() for _ in range(16)], add_special_tokens=False, padding=True, return_tensors="pt")
        loss = model(**enc, labels=enc.input_ids.masked_fill(enc.attention_mask == 0, -100)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(path)
    return path


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_prompts_end_to_end_mix_and_resume(writer_model, tmp_path):
    out, mix = tmp_path / "prompts.jsonl", tmp_path / "mix.jsonl"
    mix.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "conversations": [{"from": "human", "value": "How do tides work?"}, {"from": "gpt", "value": "."}]},
        {"id": "b", "messages": [{"role": "user", "content": "how do TIDES work"}]},      # a repeat of "a"
        {"id": "c", "prompt": "The old lighthouse stood"},
        {"id": "d", "prompt": "the old lighthouse stood!"},                             # a repeat of "c"
    ]) + "\n")
    args = ["prompts", "--target", str(writer_model), "--out", str(out), "--max-tokens", "48", "--device", "cpu",
            "--completion-share", "0.5", "--concurrency", "16"]
    assert drafter(args + ["--num", "12", "--mix", str(mix)]) == 0
    first = out.read_text()
    recs = _records(out)
    assert [r["id"] for r in recs[:2]] == ["mix-a", "mix-c"]                          # repeats dropped
    written = [r for r in recs if r["id"].startswith("self-")]
    assert len(written) == 12 and len(recs) == 14
    chats = [r for r in written if "messages" in r]
    raws = [r for r in written if "prompt" in r]
    assert chats and raws
    for r in chats:
        assert r["messages"][-1]["role"] == "user" and len(r["messages"]) <= 2
        assert r["messages"][0]["role"] == "user" or r["messages"][0]["content"] in SYSTEM_PROMPTS
        assert reject_reason(r["messages"][-1]["content"], FILTERS.min_tokens, [PLACEHOLDER, "<|im_start|>"],
                             FILTERS) is None
    assert all(1 <= len(r["prompt"].split()) <= 16 for r in raws)
    rejected = _records(tmp_path / "prompts.rejected.jsonl")
    assert rejected and {r["reason"] for r in rejected} <= {
        "empty", "template_marker", "no_letters", "non_text", "too_short", "too_long", "repetitive",
        "unfinished", "duplicate", "near_duplicate", "failed"}
    keys = [normalize(r["messages"][-1]["content"]) for r in chats]
    assert len(set(keys)) == len(keys)
    last_request = max(int(r["id"][len("self-"):]) for r in written + rejected)

    # Resume after a crash that cut the last line: the cut line is repaired, the rest kept as is,
    # new requests continue after the last one recorded, a mix prompt repeating a written one is dropped.
    with open(out, "a") as f:
        f.write('{"id": "self-999", "mess')
    repeat = chats[0]["messages"][-1]["content"]
    mix.write_text(json.dumps({"id": "e", "messages": [{"role": "user", "content": repeat}]}) + "\n"
                   + json.dumps({"id": "f", "prompt": "Dear Sir or Madam, I am writing"}) + "\n")
    assert drafter(args + ["--num", "20", "--mix", str(mix)]) == 0
    assert out.read_text().startswith(first)
    recs = _records(out)
    ids = [r["id"] for r in recs]
    assert len(ids) == len(set(ids)) and "mix-e" not in ids and "mix-f" in ids
    new = [i for i in ids[len(first.splitlines()):] if i.startswith("self-")]
    assert len(new) == 8 and all(int(i[len("self-"):]) > last_request for i in new)

    # A complete output: nothing left to do, no request sent.
    assert drafter(args + ["--num", "20"]) == 0
    assert len(_records(out)) == len(recs)

    # The output feeds `drafter data` as it is: chat prompts answered, raw prompts continued.
    data = tmp_path / "data"
    assert drafter(["data", "--prompts", str(out), "--out", str(data), "--target", str(writer_model),
                    "--max-tokens", "8", "--device", "cpu"]) == 0
    generated = {r["id"]: r for r in _records(data / "generated.jsonl")}
    assert len(generated) == len(recs)
    assert all("completion" in generated[r["id"]] for r in recs if "prompt" in r)
    assert all(generated[r["id"]]["messages"][-1]["role"] == "assistant" for r in recs if "messages" in r)


def test_sharegpt_prompts_read_a_cut_file_and_keep_nothing_near_a_heldout_prompt(tmp_path):
    """shipped/smollm2/data/sharegpt_prompts.py: the package's file is cut mid-record; every whole
    record before the cut is read, and a prompt that repeats (or nearly repeats) a held-out one,
    a non-English one and a repeat are dropped."""
    import gzip

    from shipped.smollm2.data import prompt_file, sharegpt_prompts

    heldout = json.loads((prompt_file.HELDOUT / "chat.jsonl").read_text().splitlines()[0])
    held = heldout["messages"][0]["content"]
    sort = "How do I sort a list of dictionaries by a key in Python?"
    convs = [("a_0", [sort, "Now do it in reverse order, please."]),
             ("b_0", [held]), ("c_0", [held.replace(".", "!")]),
             ("d_0", ["Wie spät ist es? Erklären Sie Zeitzonen für mich."]),
             ("e_0", [sort]),
             ("f_0", ["What causes the seasons on Earth, and why is it not the distance from the Sun?"])]
    text = json.dumps([{"id": i, "conversations": [{"from": "human", "value": t} for t in turns]}
                       for i, turns in convs])
    src = tmp_path / "sharegpt.json"
    src.write_text(text[:-40])      # cut inside the last record
    out = tmp_path / "prompts.jsonl.gz"
    sharegpt_prompts.main(["--out", str(out), "--file", str(src)])
    kept = [json.loads(line)["messages"][0]["content"] for line in gzip.open(out, "rt")]
    assert kept == [sort, "Now do it in reverse order, please."]


def test_instruction_prompts_read_every_source_and_keep_nothing_near_a_heldout_prompt(tmp_path):
    """shipped/smollm2/data/instruction_prompts.py over a stand-in of the package's task folder:
    every source is read by its own prompt field, a near repeat of a held-out prompt and a
    non-English one are dropped."""
    import gzip

    from shipped.smollm2.data import instruction_prompts, prompt_file

    held = json.loads((prompt_file.HELDOUT / "mtbench.jsonl").read_text().split("\n")[0])["messages"][0]["content"]
    texts = {"arena_hard": "Write a haiku sequence about the four seasons in a mountain village.",
             "alpaca_eval": "Explain why the sky is blue to a curious eight-year-old.",
             "ifeval": "List three uses of baking soda. Answer in exactly three bullet points.",
             "ifbench": "Describe your ideal weekend\u2028in two short paragraphs.",
             "writingbench": "请写一篇关于人工智能在教育中应用的文章，要求结构清晰。"}
    for name, file, field in instruction_prompts.SOURCES:
        path = tmp_path / file
        path.parent.mkdir(parents=True, exist_ok=True)
        recs = [{field: texts[name]}] + ([{field: held.replace(".", "!")}] if name == "alpaca_eval" else [])
        path.write_text(json.dumps(recs) if path.suffix == ".json" else
                        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
    out = tmp_path / "prompts.jsonl.gz"
    instruction_prompts.main(["--out", str(out), "--tasks", str(tmp_path)])
    kept = [json.loads(line) for line in gzip.open(out, "rt", encoding="utf-8").read().split("\n") if line]
    assert [r["id"] for r in kept] == ["arena_hard-0", "alpaca_eval-0", "ifeval-0", "ifbench-0"]
    assert kept[3]["messages"][0]["content"] == texts["ifbench"]
