"""Speculative sampling keeps the target distribution exactly.

A 4-token-vocabulary target and a random drafter (so drafts are rejected often) generate
three tokens per sample; the observed joint distribution of (t1, t2, t3) is compared with
the exact target distribution, enumerated with the target alone, by a chi-square test at
alpha = 0.001. Seeds are fixed, so the test is deterministic; with fresh seeds a correct
implementation would fail it 0.1% of the time. Checked once by hand: an acceptance test
biased to accept drafts 25% too often failed it with p = 3e-8 on a third of the samples.
"""
import itertools

import pytest
import torch
from scipy.stats import chisquare

from engine.decoder import BatchDecoder, SpecConfig
from engine.sampling import BatchSampling, probs_from_logits
from models.eagle3 import Eagle3Config, Eagle3Drafter
from models.llama import LlamaConfig, LlamaModel

V, ROWS, BATCHES = 4, 200, 30
TEMPERATURE, TOP_P = 0.9, 0.95
PROMPT = [1, 3, 0, 2]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: extra threads only add synchronisation cost."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    target = LlamaModel(LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=4,
                                    num_attention_heads=2, num_key_value_heads=1, head_dim=8), [0, 1, 2]).eval()
    for p in target.parameters():
        p.data.normal_(0, 0.7)
    drafter = Eagle3Drafter(Eagle3Config(hidden_size=16, intermediate_size=32, num_attention_heads=2,
                                         num_key_value_heads=1, head_dim=8, vocab_size=V, draft_vocab_size=V,
                                         target_hidden_size=16, aux_layer_ids=[0, 1, 2])).eval()
    for p in drafter.parameters():
        p.data.normal_(0, 0.7)
    drafter.embed_tokens.weight.data.copy_(target.embed_tokens.weight.data)
    drafter.t2d.fill_(True)
    return target, drafter


def sampling(rows: int, seed: int) -> BatchSampling:
    gens = [torch.Generator().manual_seed(seed * 100_000 + r) for r in range(rows)]
    return BatchSampling(torch.full((rows,), TEMPERATURE), torch.full((rows,), TOP_P),
                         torch.zeros(rows, dtype=torch.long), gens)


def exact_distribution(target) -> dict[tuple, float]:
    s = sampling(1, 0)
    def next_probs(seq):
        with torch.no_grad():
            return probs_from_logits(target(torch.tensor([seq])).logits[:, -1:], s)[0, 0]
    probs = {}
    for t1, t2, t3 in itertools.product(range(V), repeat=3):
        probs[(t1, t2, t3)] = float(next_probs(PROMPT)[t1] * next_probs(PROMPT + [t1])[t2]
                                    * next_probs(PROMPT + [t1, t2])[t3])
    return probs


def observed(target, drafter, spec: SpecConfig) -> dict[tuple, int]:
    counts: dict[tuple, int] = {}
    for batch in range(BATCHES):
        s = sampling(ROWS, batch + 1)
        dec = BatchDecoder(target, drafter, spec, ROWS, 64, span_multiple=16)
        outs = [[dec.prefill(r, PROMPT, BatchSampling(s.temperature[:1], s.top_p[:1], s.top_k[:1],
                                                       [s.generators[r]]))] for r in range(ROWS)]
        while min(len(o) for o in outs) < 3:
            for r, res in enumerate(dec.step(ROWS, s)):
                outs[r] += res.tokens
        for o in outs:
            counts[tuple(o[:3])] = counts.get(tuple(o[:3]), 0) + 1
    return counts


@pytest.mark.parametrize("spec", [SpecConfig(2), SpecConfig(2, topk=2, draft_tokens=4)], ids=["chain", "tree"])
def test_speculative_sampling_matches_target(pair, spec):
    target, drafter = pair
    exact = exact_distribution(target)
    counts = observed(target, drafter, spec)
    n = ROWS * BATCHES
    impossible = [k for k, p in exact.items() if p == 0.0]
    assert all(counts.get(k, 0) == 0 for k in impossible)
    cells = [k for k, p in exact.items() if p > 0.0]
    obs = [counts.get(k, 0) for k in cells]
    exp = [exact[k] * n for k in cells]
    scale = sum(obs) / sum(exp)  # float rounding of the enumerated probabilities
    result = chisquare(obs, [e * scale for e in exp])
    assert result.pvalue > 1e-3, (result, sorted(zip(cells, obs, exp))[:10])


def test_sample_rows_draws_each_row_from_its_own_distribution():
    """Plain sampled steps draw a batch at once (engine.sampling.sample_rows): frequencies follow
    each row's probabilities, zero-probability tokens never appear, a one-hot row without a
    generator gives its token, and seeds repeat."""
    from engine.sampling import sample_rows
    probs = torch.tensor([[0.5, 0.0, 0.25, 0.25], [0.0, 0.0, 1.0, 0.0], [0.1, 0.2, 0.3, 0.4]])

    def draws(seed: int, n: int = 4000) -> torch.Tensor:
        gens = [torch.Generator().manual_seed(seed), None, torch.Generator().manual_seed(seed + 1)]
        return torch.stack([sample_rows(probs, gens) for _ in range(n)])
    got = draws(0)
    assert (got[:, 0] != 1).all() and (got[:, 1] == 2).all()
    for row in (0, 2):
        counts = torch.bincount(got[:, row], minlength=V).double()
        keep = probs[row] > 0
        expected = probs[row][keep].double() / probs[row].double().sum() * counts.sum()
        assert chisquare(counts[keep], expected).pvalue > 1e-3
    assert torch.equal(draws(7, 50), draws(7, 50))


def test_a_temperature_past_float32_range_over_masked_logits_is_a_distribution():
    """Found by the HTTP fuzzer (temperature 1.75e307 with min_tokens): the temperature is +inf
    in float32, and a masked logit (-inf) over it was NaN, which killed the engine thread in
    sampling. It now samples as the largest finite temperature does: near uniform, the masked
    token never."""
    from engine.sampling import BatchSampling, probs_from_logits
    logits = torch.randn(1, 1, 8)
    logits[0, 0, 3] = float("-inf")
    s = BatchSampling(temperature=torch.tensor([1.75e307]), top_p=torch.ones(1),
                      top_k=torch.zeros(1, dtype=torch.long), generators=[None])
    p = probs_from_logits(logits, s)[0, 0]
    assert torch.isfinite(p).all() and p[3] == 0 and torch.allclose(p.sum(), torch.tensor(1.0))
