"""The training-time accept length that `drafter train` logs (`walked_accept_length`) is the one
the engine measures: on the shipped pair (fp32, greedy), the TTT unroll over the engine's own
replies takes exactly as many verify steps as the engine did, at every chain length.
`sim_accept_length`, the average over every start position, reads higher
(benchmarks/results/smollm2_build/s19_train_vs_engine/)."""
from pathlib import Path

import pytest
import torch

from drafter.ttt import TTTModel, target_draft_probs, walked_cycles
from engine.decoder import BatchDecoder, SpecConfig
from engine.sampling import BatchSampling
from models.eagle3_checkpoint import load_drafter
from models.llama import load_target

ROOT = Path(__file__).resolve().parent.parent
TARGET, DRAFT = ROOT / "shipped" / "target", ROOT / "shipped" / "drafter"
N_TOKENS = 40
PROMPTS = ["def fibonacci(n):\n", "class Stack:\n    def __init__(self):\n", "import os\n\ndef list_files(path):\n"]


def load_pair():
    aux = sorted(load_drafter(DRAFT, None).config.aux_layer_ids)
    target = load_target(TARGET, aux_layer_ids=aux).eval()
    return target, load_drafter(DRAFT, target.embed_tokens.weight).eval()


@pytest.fixture(scope="module")
def pairs():
    """The tokenizer, the pair the engine decodes with (its KV cache goes into the modules) and
    the same pair again for the unroll, which brings its own cache."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(TARGET), load_pair(), load_pair()


def engine_replies(target, drafter, steps: int, prompts: list[list[int]]) -> list[tuple[list[int], int]]:
    """(reply ids, verify steps) of each prompt decoded alone until it has N_TOKENS tokens."""
    out = []
    for p in prompts:
        dec = BatchDecoder(target, drafter, SpecConfig(steps), max_batch=1, max_context=256)
        reply, cycles = [dec.prefill(0, p, BatchSampling.all_greedy_rows(1, "cpu"))], 0
        while len(reply) < N_TOKENS:
            reply += dec.step(1, BatchSampling.all_greedy_rows(1, "cpu"))[0].tokens
            cycles += 1
        out.append((reply[:N_TOKENS], cycles))
    return out


@pytest.mark.parametrize("steps", [1, 3, 5])
@torch.inference_mode()
def test_walked_cycles_equal_the_engines_verify_steps(pairs, steps):
    tok, engine_pair, (target, drafter) = pairs
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    used = torch.arange(drafter.d2t.numel()) + drafter.d2t
    model = TTTModel(drafter, length=7)
    for p, (reply, cycles) in zip(prompts, engine_replies(*engine_pair, steps, prompts)):
        ids = torch.tensor([p + reply])
        mask = torch.tensor([[0] * len(p) + [1] * len(reply)])
        out = target(ids, capture_aux=True)
        probs, in_vocab = target_draft_probs(out.logits, used, drafter.t2d)
        _, stats = model(ids, mask, out.aux_hidden, probs, in_vocab)
        assert int(stats.walk_cycles[steps - 1]) == cycles
        assert int(stats.walk_tokens) == len(reply) - 1
        assert cycles < len(reply) - 1   # the drafter gets some drafts accepted: the test means something


def test_walked_cycles_on_a_hand_made_run():
    # One answer of 9 tokens, x_2 .. x_10 (x_2 from the prefill); a chain drafted at i (after
    # x_{i+1}) keeps min(run[i], cap) drafts. Cycles may sit at i = 1 .. 8 and start at i = 1.
    n = 11
    run = torch.zeros(1, n, dtype=torch.long)
    run[0, 1], run[0, 5] = 2, 3
    mask = torch.zeros(1, n + 1, dtype=torch.long)
    mask[0, 2:11] = 1
    # cap 3: 1 (2 drafts) -> 4 (none) -> 5 (3 drafts) -> 9, past the last answer token
    # cap 1: 1 -> 3 -> 4 -> 5 -> 7 -> 8 -> 9
    assert walked_cycles(run, mask, [3, 1]).tolist() == [3, 6]
