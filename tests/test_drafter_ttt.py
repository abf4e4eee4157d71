"""Training math of the drafter pipeline: the TTT mask, the unroll's equivalence with the
engine's chain drafting, the draft-vocab mapping and the loss against hand-computed values."""
import math
import types

import torch
import torch.nn as nn

from drafter.ttt import TTTModel, soft_cross_entropy, target_draft_probs, ttt_mask, unroll
from drafter.vocab import DraftVocab, select_vocab
from engine.masks import block_inputs, causal
from models.eagle3 import DraftOutput, Eagle3Config, Eagle3Drafter


def test_ttt_mask_is_causal_then_diagonal():
    # 3 positions, unroll step 2: step-0 keys causal, steps 1 and 2 only the own position.
    expected = torch.tensor([
        [1, 0, 0, 1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1, 0, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(ttt_mask(3, 2), expected)
    assert torch.equal(ttt_mask(3, 0), expected[:, :3])


def _tiny_drafter(seed=0, vocab=40, draft_vocab=40, hidden=32):
    torch.manual_seed(seed)
    cfg = Eagle3Config(hidden_size=hidden, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, vocab_size=vocab, draft_vocab_size=draft_vocab, target_hidden_size=hidden,
                       aux_layer_ids=[0, 1, 2])
    return Eagle3Drafter(cfg).eval()


@torch.no_grad()
def test_unroll_equals_chain_drafting_with_the_engine_cache():
    """Step k at position i of the unroll must compute what the engine computes when it drafts
    k tokens after extending the drafter cache over positions 0..i (teacher tokens as drafts)."""
    d = _tiny_drafter()
    t = 9
    tokens = torch.randint(0, 40, (1, t))
    aux = torch.randn(1, t, 3 * 32)
    unrolled = [o.logits for o in unroll(d, tokens, aux, 4)]
    d.setup_cache(1, 32)
    for i in (2, 4):
        # extend: positions 0..i read (h_j, x_{j+1})
        ext = d(tokens[:, 1:i + 2], aux[:, :i + 1],
                block_inputs(torch.zeros(1, dtype=torch.long), causal(1, i + 1, "cpu"),
                             torch.arange(i + 1).view(1, -1), 32))
        assert torch.allclose(ext.logits[0, -1], unrolled[0][0, i], atol=1e-5)
        hidden, base = ext.hidden[:, -1:], torch.tensor([i + 1])
        for j in range(1, 4):   # chain step j: draft token x_{i+1+j} at slot base + j - 1
            inputs = block_inputs(base, torch.ones(1, 1, j, dtype=torch.bool), torch.full((1, 1), j - 1), 32,
                                  query_offset=j - 1)
            out = d(tokens[:, i + 1 + j:i + 2 + j], hidden, inputs)
            assert torch.allclose(out.logits[0, 0], unrolled[j][0, i], atol=1e-5), (i, j)
            hidden = out.hidden


def test_d2t_t2d_on_a_hand_made_example():
    # Loss-masked counts over a vocab of 8: ids 5 (x4), 2 (x3), 7 (x1) were generated.
    masked = torch.tensor([0, 0, 3, 0, 0, 4, 0, 1])
    overall = torch.tensor([9, 0, 3, 6, 0, 4, 0, 1])
    used = select_vocab(masked, overall, 2)
    v = DraftVocab(used=used, counts=masked)
    assert used.tolist() == [2, 5]                       # top-2, ascending
    assert v.d2t.tolist() == [2, 4]                      # d2t[i] = used[i] - i
    assert v.t2d(8).tolist() == [False, False, True, False, False, True, False, False]
    draft_ids = torch.arange(2)
    assert (draft_ids + v.d2t[draft_ids]).tolist() == [2, 5]   # target = draft + d2t[draft]
    # Fewer generated ids than asked: fill with the most frequent ids overall (0, then 3).
    assert select_vocab(masked, overall, 5).tolist() == [0, 2, 3, 5, 7]


def test_soft_cross_entropy_against_hand_computed_value():
    # Target logits over 3 ids, draft vocab = ids {0, 2}: restricted and renormalised p = (3/4, 1/4).
    target_logits = torch.tensor([[[math.log(3), 5.0, 0.0], [math.log(3), 0.0, 0.0]]])
    used, t2d = torch.tensor([0, 2]), torch.tensor([True, False, True])
    p, in_vocab = target_draft_probs(target_logits, used, t2d)
    assert torch.allclose(p[0, 1], torch.tensor([0.75, 0.25]))
    assert in_vocab.tolist() == [[False, True]]          # position 0's argmax (id 1) is not draftable
    draft_logits = torch.tensor([[[0.0, 0.0], [0.0, math.log(3)]]])   # q = (1/4, 3/4) at position 1
    s, c = soft_cross_entropy(draft_logits, p, in_vocab)
    hand = -(0.75 * math.log(0.25) + 0.25 * math.log(0.75))
    assert c.item() == 1 and abs(s.item() - hand) < 1e-6


class _ScriptedDrafter(nn.Module):
    """Returns fixed logits per unroll step, so the TTT loss can be computed by hand."""

    def __init__(self, logits_per_step):
        super().__init__()
        self.midlayer = types.SimpleNamespace(self_attn=types.SimpleNamespace(kv_cache=None))
        self.logits = logits_per_step
        self.calls = 0
        self.w = nn.Parameter(torch.zeros(()))

    def forward(self, tokens, hidden, inputs):
        out = self.logits[self.calls] + self.w
        self.calls += 1
        return DraftOutput(logits=out, hidden=torch.zeros(*tokens.shape, 4))


def test_ttt_loss_weights_steps_and_aligns_targets():
    # T = 4 tokens -> drafter positions 0..2; step 0 predicts x_2, x_3 (positions 0, 1), step 1 predicts x_3.
    q = math.log(3)
    step0 = torch.tensor([[[0.0, 0.0], [q, 0.0], [0.0, 0.0]]])   # position 0: q=(1/2,1/2); position 1: (3/4,1/4)
    step1 = torch.tensor([[[0.0, q], [0.0, 0.0], [0.0, 0.0]]])   # position 0: q=(1/4,3/4)
    target_p = torch.tensor([[[0.5, 0.5], [1.0, 0.0], [0.25, 0.75], [0.5, 0.5]]])
    loss_mask = torch.tensor([[0, 1, 1, 1]])
    in_vocab = torch.ones(1, 4, dtype=torch.bool)
    model = TTTModel(_ScriptedDrafter([step0, step1]), length=2, step_weight=0.8)
    loss, stats = model(torch.zeros(1, 4, dtype=torch.long), loss_mask, torch.zeros(1, 4, 12), target_p, in_vocab)
    # step 0: position 0 vs p at 1 = (1, 0): -log(1/2); position 1 vs p at 2 = (1/4, 3/4): -(1/4 log 3/4 + 3/4 log 1/4)
    l0 = (-math.log(0.5) - (0.25 * math.log(0.75) + 0.75 * math.log(0.25))) / 2
    # step 1: position 0 vs p at 2 = (1/4, 3/4) with q = (1/4, 3/4)
    l1 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert abs(loss.item() - (l0 + 0.8 * l1)) < 1e-5
    # argmax hits: step 0 position 0 (0 vs 0: tie -> index 0 both) and position 1 (0 vs 1: miss); step 1 position 0 hit.
    assert stats.correct.tolist() == [1.0, 1.0] and stats.counted.tolist() == [2.0, 1.0]
    # chains: from position 0 two accepted, from position 1 none -> accepted@2 steps = 2, starts = 2.
    assert stats.accepted.tolist() == [1.0, 2.0] and stats.starts.item() == 2.0
