"""Training mechanics: resume continues bit for bit, the drafter starts from the target's
lm_head rows and never stores the embedding, the learning-rate schedule (by steps, or by training
seconds across resumed calls), and length-grouped batches."""
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from drafter.cli import main as drafter
from drafter.train import TrainConfig, lr_at, lr_at_time
from models.llama import load_target
from tests.tiny import make_hf_llama_target, stdlib_texts


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    target = root / "target"
    make_hf_llama_target(target)
    lines = [s.strip() for s in stdlib_texts(4)[1].splitlines() if len(s.strip()) > 10][:24]
    prompts = root / "prompts.jsonl"
    pairs = [[{"role": "user", "content": a}, {"role": "assistant", "content": b}]
             for a, b in zip(lines[::2], lines[1::2])]
    prompts.write_text("".join(json.dumps({"messages": m}) + "\n" for m in pairs))
    data = root / "data"
    assert drafter(["data", "--prompts", str(prompts), "--out", str(data), "--keep-responses",
                    "--tokenizer", str(target)]) == 0
    assert drafter(["vocab", "--data", str(data), "--size", "64"]) == 0
    return root, target, data


def _train(setup, out, *extra):
    root, target, data = setup
    args = ["train", "--target", str(target), "--data", str(data), "--out", str(root / out), "--max-steps", "6",
            "--batch-size", "2", "--lr", "1e-3", "--ttt-length", "3", "--log-every", "2", "--save-every", "100", *extra]
    assert drafter(args) == 0
    return root / out


def test_resume_continues_exactly(setup):
    straight = _train(setup, "straight")
    _train(setup, "interrupted", "--stop-at", "3")
    ckpts = sorted(p.name for p in (setup[0] / "interrupted" / "checkpoints").iterdir())
    assert ckpts == ["step-00000000", "step-00000003"]
    assert drafter(["train", "--target", str(setup[1]), "--data", str(setup[2]), "--out",
                    str(setup[0] / "interrupted"), "--max-steps", "6"]) == 2     # refuses to overwrite
    resumed = _train(setup, "interrupted", "--resume")
    a = load_file(str(straight / "checkpoints" / "step-00000006" / "drafter.safetensors"))
    b = load_file(str(resumed / "checkpoints" / "step-00000006" / "drafter.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k].float(), b[k].float(), atol=1e-6) for k in a)
    log = [json.loads(line)["step"] for line in (resumed / "log.jsonl").read_text().splitlines()]
    assert log == [2, 4, 6]


def test_time_limit_ends_with_a_checkpoint_and_resumes(setup):
    """A limit already passed at the first step: that step is saved, --resume finishes the run."""
    out = _train(setup, "timed", "--time-limit", "0.001")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000000", "step-00000001"]
    _train(setup, "timed", "--resume")
    assert (out / "checkpoints" / "step-00000006").is_dir()


def test_initial_drafter_uses_target_rows_and_stores_no_embedding(setup):
    run = setup[0] / "straight"
    w = load_file(str(run / "checkpoints" / "step-00000000" / "drafter.safetensors"))
    assert "embed_tokens.weight" not in w
    used = torch.arange(w["d2t"].numel()) + w["d2t"]
    target = load_target(setup[1])
    assert torch.equal(w["lm_head.weight"], target.lm_head.weight[used])
    assert w["t2d"].sum() == 64 and bool(w["t2d"][used].all())


def test_bfloat16_on_cpu_runs_the_gpu_recipe(setup):
    """--dtype bfloat16 runs the target and the drafter's autocast in bf16 on CPU too (1.6x faster
    with AMX): the same steps as float32 give losses that differ by bf16 rounding only, and the
    weights the optimizer keeps stay float32."""
    def losses(name, *dtype):
        run = _train(setup, name, *dtype, "--max-steps", "2", "--log-every", "1")
        return run, [json.loads(line)["loss"] for line in (run / "log.jsonl").read_text().splitlines()]

    run, bf16 = losses("bf16", "--dtype", "bfloat16")
    _, fp32 = losses("fp32")
    assert json.loads((run / "train_config.json").read_text())["dtype"] == "bfloat16"
    assert bf16 != fp32 and bf16 == pytest.approx(fp32, rel=0.05)
    w = load_file(str(run / "checkpoints" / "step-00000002" / "drafter.safetensors"))
    assert w["fc.weight"].dtype == torch.float32


def test_warmup_then_cosine():
    assert lr_at(0, 100, 10, 1.0, 0.1) == pytest.approx(0.1)          # linear warm-up
    assert lr_at(9, 100, 10, 1.0, 0.1) == pytest.approx(1.0)
    assert lr_at(55, 100, 10, 1.0, 0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(100, 100, 10, 1.0, 0.1) == pytest.approx(0.1)


def test_aux_layers_are_trained_in_ascending_order(setup):
    """SGLang and vLLM concatenate aux layers ascending, so training does too, whatever the flag's order."""
    run = _train(setup, "unordered", "--aux-layers", "3,0,2", "--max-steps", "1")
    assert json.loads((run / "drafter_config.json").read_text())["aux_layer_ids"] == [0, 2, 3]


class _Conversations:
    """Conversations of given lengths, as TokenShards hands them out."""

    def __init__(self, lengths):
        self.lengths = lengths

    def __len__(self):
        return len(self.lengths)

    def length(self, i):
        return self.lengths[i]

    def __getitem__(self, i):
        return torch.full((self.lengths[i],), i), torch.ones(self.lengths[i], dtype=torch.bool)


def test_length_grouped_batches_cover_every_conversation_once_with_less_padding():
    """Each epoch still takes every conversation once, in a seeded order, and batches of alike
    lengths pad less than random ones."""
    from drafter.batches import Batches

    data = _Conversations([int(x) for x in torch.randint(5, 1000, (256,), generator=torch.Generator().manual_seed(0))])
    random, grouped = Batches(data, 8, 2048, 0), Batches(data, 8, 2048, 0, group=8)
    again = Batches(data, 8, 2048, 0, group=8)

    def padded(b: Batches, epoch: int) -> int:
        return sum(b.get(g)[0].numel() for g in range(epoch * b.per_epoch, (epoch + 1) * b.per_epoch))

    for epoch in (0, 1):
        batches = [grouped.indices(g)[0] for g in range(epoch * 32, (epoch + 1) * 32)]
        assert sorted(i for b in batches for i in b) == list(range(256))
        assert [again.indices(g)[0] for g in range(epoch * 32, (epoch + 1) * 32)] == batches
        assert padded(grouped, epoch) < 0.7 * padded(random, epoch)
    assert grouped.indices(0)[0] != grouped.indices(32)[0]      # epochs differ


def test_time_budget_spreads_the_schedule_over_seconds_across_resumed_calls(setup):
    """A --time-budget run ends when its training seconds reach the budget, over several
    --time-limit calls, with the learning rate decayed to its floor at the end."""
    root, target, data = setup
    args = ["train", "--target", str(target), "--data", str(data), "--out", str(root / "budget"), "--batch-size", "2",
            "--lr", "1e-3", "--ttt-length", "2", "--log-every", "1", "--time-budget", "4", "--time-limit", "2"]
    assert drafter(args) == 0
    first = [json.loads(line) for line in (root / "budget" / "log.jsonl").read_text().splitlines()]
    assert first[-1]["trained_s"] < 4
    def trained() -> float:
        return torch.load(sorted((root / "budget" / "checkpoints").iterdir())[-1] / "state.pt",
                          weights_only=True)["trained_s"]

    for _ in range(4):   # each call ends at its time limit (load included) until the budget is spent
        assert drafter(args + ["--resume"]) == 0
        if trained() >= 4:
            break
    rows = [json.loads(line) for line in (root / "budget" / "log.jsonl").read_text().splitlines()]
    assert trained() >= 4 >= rows[-2]["trained_s"]   # ends at the first step past the budget (logs round)
    assert rows[-1]["step"] > first[-1]["step"]
    assert [r["trained_s"] for r in rows] == sorted(r["trained_s"] for r in rows)   # resumed, not restarted
    # The last step's rate is the schedule's at the seconds trained before it, and the schedule reaches its floor (0)
    # at the budget. How near the floor that step starts depends on how long steps take on a loaded machine: a CI run
    # took 0.9 s for it, and its rate was 12% of the peak.
    before = rows[-2]["trained_s"]   # logged rounded to 0.01 s
    def schedule(seconds: float) -> float:
        # --time-budget 4, --lr 1e-3, the default warm-up and floor
        return lr_at_time(seconds, 4, TrainConfig.warmup_ratio, 1e-3, TrainConfig.min_lr_ratio)

    assert schedule(before + 0.005) <= rows[-1]["lr"] <= schedule(before - 0.005)
    assert schedule(4) == 0 < rows[-1]["lr"] < max(r["lr"] for r in rows)


def test_init_starts_from_an_exported_drafter_with_its_vocabulary(setup):
    """Fine-tuning: step 0 of an --init run holds the exported drafter's weights (float32 export:
    exact) and its draft vocabulary, whatever vocabulary the data has."""
    exported = setup[0] / "straight_export"
    assert drafter(["export", str(setup[0] / "straight"), str(exported), "--dtype", "float32"]) == 0
    run = _train(setup, "fine_tuned", "--init", str(exported), "--max-steps", "1")
    start = load_file(str(run / "checkpoints" / "step-00000000" / "drafter.safetensors"))
    end = load_file(str(setup[0] / "straight" / "checkpoints" / "step-00000006" / "drafter.safetensors"))
    assert start.keys() == end.keys() and all(torch.equal(start[k], end[k]) for k in end)
    assert drafter(["train", "--target", str(setup[1]), "--data", str(setup[2]), "--out", str(setup[0] / "other"),
                    "--init", str(exported), "--aux-layers", "0,1,2", "--max-steps", "1"]) == 2   # other layers


def test_a_shared_head_drafter_trains_exports_and_decodes_losslessly(setup):
    """--shared-head: the target's lm_head, frozen, is the drafter's; checkpoints and the export
    hold no head, the export's config no draft_vocab_size (what SGLang and vLLM need to borrow
    the target's), and the native engine serving it changes no greedy token."""
    import asyncio

    from drafter.evaluate import greedy_replies
    from engine.config import SpecConfig
    from engine.loading import NativeEngineArgs, build_engine

    root, target, _ = setup
    run = _train(setup, "shared", "--shared-head", "--max-steps", "3", "--log-every", "1")
    assert all(math.isfinite(json.loads(line)["loss"]) for line in (run / "log.jsonl").read_text().splitlines())
    assert not {"lm_head.weight", "embed_tokens.weight"} & set(load_file(str(run / "checkpoints" / "step-00000003"
                                                                               / "drafter.safetensors")))
    assert drafter(["train", "--target", str(target), "--data", str(setup[2]), "--out", str(run), "--max-steps", "4",
                    "--resume"]) == 2   # a run started with --shared-head resumes with it
    out = root / "shared_export"
    assert drafter(["export", str(run), str(out), "--dtype", "float32"]) == 0
    assert "draft_vocab_size" not in json.loads((out / "config.json").read_text())
    assert "lm_head.weight" not in load_file(str(out / "model.safetensors"))

    prompts = ["import os\n", "def main():\n", "class Config:\n"]

    async def replies(spec):
        engine = build_engine(NativeEngineArgs(model=str(target), draft=str(out) if spec else None, spec=spec,
                                               device="cpu", dtype="float32", max_batch=2, max_context=256))
        await engine.start()
        try:
            if spec:
                d = engine.decoder.drafter
                assert d.lm_head.weight.data_ptr() == engine.decoder.target.lm_head.weight.data_ptr()
            return [r.token_ids for r in await greedy_replies(engine, prompts, 24)]
        finally:
            await engine.shutdown()

    assert asyncio.run(replies(SpecConfig(3))) == asyncio.run(replies(None))
