"""The drafter's training options beyond the EAGLE-3 recipe, and the flags they come from.

- EAGLE-3.1 (`fc_norm`, `norm_output`): greedy speculative decoding with such a drafter is still
  the target's own greedy output, token for token; the checkpoint carries SGLang's and vLLM's
  config keys and weight names and round-trips exactly.
- LK losses: the values on a hand-checked example.
- Feature noise: off by default, bounded, and the same for the same seed and micro-batch.
- `drafter train`'s flags are generated from TrainConfig: the existing ones stay, every default
  is TrainConfig's, and a short run with the new options trains, exports and loads.
"""
import argparse
import dataclasses
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from drafter.cli import main as drafter
from drafter.cli import parser
from drafter.train_config import TrainConfig, add_train_flags, from_args
from drafter.ttt import feature_noise, position_loss
from engine.decoder import SpecConfig
from engine.loading import NativeEngineArgs, build_engine
from models.eagle3 import Eagle3Config, Eagle3Drafter
from models.eagle3_checkpoint import WEIGHT_NAMES, config_to_hf, load_drafter, save_drafter, vllm_drafter_dir
from models.llama import load_target
from tests.engine_runs import decode as decode_batch
from tests.engine_runs import greedy_ids
from tests.tiny import fit_drafter, make_hf_llama_target, make_target_dir, random_drafter, stdlib_texts

FC_NORMS = {f"fc_norm.{i}.weight" for i in range(3)}


# -- EAGLE-3.1 served by the native engine ---------------------------------------------------------
def eagle31(drafter: Eagle3Drafter, seed: int = 3) -> Eagle3Drafter:
    """The same drafter with fc_norm and norm_output, fc_norm's weights random (not the identity)."""
    cfg = dataclasses.replace(drafter.config, fc_norm=True, norm_output=True)
    d = Eagle3Drafter(cfg)
    d.load_state_dict(drafter.state_dict(), strict=False)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for norm in d.fc_norm:
            norm.weight.copy_(0.5 + torch.rand(norm.weight.shape, generator=g))
    return d.eval()


def decode(target, drafter, steps, prompt, n=32, fast=True):
    """One prompt, greedy: (tokens, accepted per step)."""
    spec = SpecConfig(steps) if drafter is not None else None
    outs, accepted = decode_batch(target, drafter, spec, [prompt], n, fast)
    return outs[0], accepted[0]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle31")
    target_dir = make_target_dir(root / "target", init_std=0.2)
    target = load_target(target_dir)
    prompts = [[int(t) for t in torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(n))]
               for n in (1, 9)]
    baseline = [decode(target, None, 0, p)[0] for p in prompts]
    fitted = fit_drafter(target, eagle31(random_drafter(target)), [p + o for p, o in zip(prompts, baseline)],
                         steps=200, lr=1e-2)
    drafters = {}
    for name, d in (("random", eagle31(random_drafter(target, draft_vocab=256))), ("fitted", fitted)):
        save_drafter(d, root / name, dtype=torch.float32)   # served as loaded from disk
        drafters[name] = load_drafter(root / name, target.embed_tokens.weight)
    return target, prompts, baseline, drafters, root, target_dir


@pytest.mark.parametrize("fast", [True, False], ids=["device-step", "general-step"])
@pytest.mark.parametrize("steps", [1, 3, 4])
@pytest.mark.parametrize("kind", ["random", "fitted"])
def test_eagle31_drafter_is_lossless(pair, kind, steps, fast):
    target, prompts, baseline, drafters = pair[:4]
    d = drafters[kind]
    assert d.config.fc_norm and d.config.norm_output
    for prompt, expected in zip(prompts, baseline):
        out, accepted = decode(target, d, steps, prompt, fast=fast)
        assert out == expected
    if kind == "fitted" and steps >= 3:
        assert 1 + sum(accepted) / len(accepted) > 1.5   # drafts were accepted, not only rejected


def test_native_engine_serves_an_eagle31_drafter_losslessly(pair):
    """The engine loads the exported folder itself (engine/loading.py) and answers concurrent
    requests with the target's greedy tokens."""
    _, prompts, baseline, _, root, target_dir = pair
    engine = build_engine(NativeEngineArgs(model=str(target_dir), draft=str(root / "fitted"), spec=SpecConfig(3),
                                           device="cpu", max_context=256, max_batch=2))
    assert greedy_ids(engine, prompts, [len(b) for b in baseline]) == baseline


def test_norm_output_feeds_back_the_normed_state():
    d = eagle31(_small())
    tokens, aux = torch.tensor([[1, 2, 3]]), torch.randn(1, 3, 3 * 48)
    out = d(tokens, aux)
    assert torch.allclose(out.hidden, d.norm(d.midlayer(d.embed_tokens(tokens), d.fuse(aux),
                                                        *_rope(d, tokens), None)))
    parts = aux.chunk(3, dim=-1)
    assert torch.allclose(d.fuse(aux), d.fc(torch.cat([n(x) for n, x in zip(d.fc_norm, parts)], dim=-1)))


def _rope(d, tokens):
    from models.layers import rope_cos_sin
    pos = torch.arange(tokens.shape[1]).expand_as(tokens)
    return rope_cos_sin(d.inv_freq, pos, torch.float32)


# -- the checkpoint: SGLang's and vLLM's keys and names ---------------------------------------------
def _small(seed=0, aux=(1, 3, 4)) -> Eagle3Drafter:
    torch.manual_seed(seed)
    cfg = Eagle3Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, vocab_size=10, draft_vocab_size=4, target_hidden_size=48,
                       aux_layer_ids=list(aux))
    d = Eagle3Drafter(cfg)
    for p in d.parameters():
        p.data.normal_()
    used = torch.tensor([1, 4, 5, 9])
    d.d2t.copy_(used - torch.arange(4))
    d.t2d.zero_()
    d.t2d[used] = True
    return d


def test_eagle31_checkpoint_round_trips_with_sglang_and_vllm_names(tmp_path):
    d = eagle31(_small())
    save_drafter(d, tmp_path / "d", dtype=torch.float32)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["fc_norm"] is True and cfg["norm_output"] is True     # the keys both engines read
    # SGLang loads each checkpoint name as model.<name>, vLLM as model.<name> (midlayer. -> layers.0.):
    # fc_norm.{i}.weight is the ModuleList both build
    assert set(load_file(str(tmp_path / "d" / "model.safetensors"))) == WEIGHT_NAMES | FC_NORMS
    loaded = load_drafter(tmp_path / "d", d.embed_tokens.weight.data)
    assert loaded.config.fc_norm and loaded.config.norm_output
    a, b = d.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    tokens, aux = torch.tensor([[1, 2, 3]]), torch.randn(1, 3, 3 * 48)
    assert torch.allclose(d(tokens, aux).logits, loaded(tokens, aux).logits)
    vllm = vllm_drafter_dir(tmp_path / "d", tmp_path / "vllm")
    vcfg = json.loads((vllm / "config.json").read_text())
    assert vcfg["fc_norm"] is True and vcfg["norm_output"] is True
    assert FC_NORMS <= set(load_file(str(vllm / "model.safetensors")))


def test_plain_drafter_config_has_no_eagle31_keys():
    cfg = config_to_hf(_small().config)
    assert "fc_norm" not in cfg and "norm_output" not in cfg


def test_fc_norms_follow_their_fc_blocks_into_ascending_layer_order(tmp_path):
    d = eagle31(_small(aux=(4, 1, 3)))
    save_drafter(d, tmp_path, dtype=torch.float32)
    loaded = load_drafter(tmp_path, d.embed_tokens.weight.data)
    assert loaded.config.aux_layer_ids == [1, 3, 4]
    aux = torch.randn(1, 3, 3 * 48)
    parts = aux.chunk(3, dim=-1)
    reordered = torch.cat([parts[1], parts[2], parts[0]], dim=-1)   # layers 1, 3, 4
    tokens = torch.tensor([[1, 2, 3]])
    assert torch.allclose(d(tokens, aux).logits, loaded(tokens, reordered).logits, atol=1e-5)


def test_older_names_load_and_norm_before_residual_is_refused(tmp_path):
    from models.safetensors_io import load_state_dict, save_state_dict
    d = eagle31(_small())
    save_drafter(d, tmp_path, dtype=torch.float32)
    state = load_state_dict(tmp_path)
    names = {"fc_norm.0.weight": "aux_norm_low.weight", "fc_norm.1.weight": "aux_norm_mid.weight",
             "fc_norm.2.weight": "aux_norm_high.weight"}
    save_state_dict({names.get(k, k): v for k, v in state.items()}, tmp_path / "model.safetensors")
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["fc_norm"]
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "use_aux_norm": True}))
    loaded = load_drafter(tmp_path, d.embed_tokens.weight.data)
    assert torch.equal(loaded.fc_norm[2].weight, d.fc_norm[2].weight)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "use_aux_norm": True, "norm_before_residual": True}))
    with pytest.raises(ValueError, match="norm_before_residual"):
        load_drafter(tmp_path, d.embed_tokens.weight.data)


# -- LK losses ------------------------------------------------------------------------------------
def test_lk_losses_on_a_hand_checked_example():
    """p = (1/2, 1/2, 0), q = (1/4, 1/4, 1/2): acceptance alpha = sum min(p, q) = 1/2,
    KL(p || q) = log 2, soft cross-entropy = log 4."""
    p = torch.tensor([[[0.5, 0.5, 0.0]]])
    logits = torch.log(torch.tensor([[[0.25, 0.25, 0.5]]]))
    mask = torch.ones(1, 1, dtype=torch.bool)
    close = lambda got, want: math.isclose(float(got[0]), want, rel_tol=1e-5) and float(got[1]) == 1  # noqa: E731
    assert close(position_loss(logits, p, mask, "kl"), math.log(4))
    assert close(position_loss(logits, p, mask, "lk-alpha"), math.log(2))
    lam = math.exp(-3 * 0.5)
    assert close(position_loss(logits, p, mask, "lk-lambda", eta=3.0), lam * math.log(2) + (1 - lam) * 0.5)
    assert close(position_loss(logits, p, mask, "lk-lambda", eta=0.0), math.log(2))   # eta 0: KL alone
    masked = position_loss(logits, p, torch.zeros(1, 1, dtype=torch.bool), "lk-alpha")
    assert float(masked[0]) == 0 and float(masked[1]) == 0


def test_lk_alpha_gradient_is_the_acceptance_gradient_over_alpha():
    """-log alpha: its gradient is grad(alpha) / (-alpha), with alpha's weight kept out of lk-lambda's."""
    p = torch.tensor([[[0.6, 0.3, 0.1]]])
    logits = torch.tensor([[[0.2, -0.1, 0.4]]], requires_grad=True)
    mask = torch.ones(1, 1, dtype=torch.bool)
    position_loss(logits, p, mask, "lk-alpha")[0].backward()
    g = logits.grad.clone()
    logits.grad = None
    alpha = torch.minimum(p, logits.softmax(-1)).sum()
    alpha.backward()
    assert torch.allclose(g, -logits.grad / float(alpha.detach()), atol=1e-6)


# -- feature noise ---------------------------------------------------------------------------------
def test_feature_noise_is_off_by_default_bounded_and_seeded():
    assert TrainConfig.feature_noise == 0
    aux = torch.randn(2, 5, 12)
    assert feature_noise(aux, 0.0, seed=0, micro=3) is aux
    a = feature_noise(aux, 0.05, seed=0, micro=3)
    assert torch.equal(a, feature_noise(aux, 0.05, seed=0, micro=3))
    assert not torch.equal(a, feature_noise(aux, 0.05, seed=0, micro=4))
    assert not torch.equal(a, feature_noise(aux, 0.05, seed=1, micro=3))
    d = a - aux
    assert float(d.abs().max()) <= 0.05 + 1e-6 and float(d.abs().max()) > 0.04 and abs(float(d.mean())) < 0.01


# -- the generated flags ---------------------------------------------------------------------------
TRAIN_FLAGS = (
    "--target --data --out --vocab --aux-layers --aux-convention --features --spool --spool-budget-gb "
    "--keep-features --dtype --capture-dtype --capture-batch --capture-gpus --vllm-python --vllm-arg --vllm-args "
    "--trust-remote-code --intermediate-size --num-heads --num-kv-heads --head-dim --ttt-length --step-weight --lr "
    "--min-lr-ratio --warmup-steps --warmup-ratio --weight-decay --grad-clip --batch-size --length-group "
    "--grad-accum --max-length --epochs --limit-samples --max-steps --stop-at --time-limit --time-budget "
    "--save-every --keep --log-every --seed --device --no-init-lm-head --shared-head --init --resume").split()
NEW_FLAGS = "--fc-norm --norm-output --loss --lk-eta --feature-noise --on-policy".split()


def _train_parser():
    p = argparse.ArgumentParser()
    add_train_flags(p)
    return p


def test_train_flags_are_generated_from_train_config_with_its_defaults():
    p = _train_parser()
    flags = {s for a in p._actions for s in a.option_strings} - {"-h", "--help"}
    assert flags == set(TRAIN_FLAGS) | set(NEW_FLAGS)
    c = from_args(p.parse_args(["--target", "T", "--data", "D", "--out", "O"]))
    assert c == TrainConfig(target="T", data="D", out="O")   # every default is TrainConfig's
    assert parser().parse_args(["train", "--target", "T", "--data", "D", "--out", "O"]).fn.__name__ == "cmd_train"


def test_train_flags_read_back_into_train_config():
    c = from_args(_train_parser().parse_args([
        "--target", "T", "--data", "D", "--out", "O", "--aux-layers", "1,15,28", "--num-heads", "4",
        "--num-kv-heads", "2", "--keep", "5", "--time-limit", "30", "--time-budget", "60", "--no-init-lm-head",
        "--shared-head", "--vllm-args", '{"a": 1}', "--vllm-arg", "b=[2]", "--vllm-arg", "c=x", "--fc-norm",
        "--norm-output", "--loss", "lk-lambda", "--lk-eta", "2", "--feature-noise", "0.05", "--resume"]))
    assert (c.aux_layers, c.num_attention_heads, c.num_key_value_heads, c.keep_checkpoints) == ([1, 15, 28], 4, 2, 5)
    assert (c.time_limit_s, c.time_budget_s, c.init_lm_head, c.shared_head, c.resume) == (30, 60, False, True, True)
    assert c.vllm_args == {"a": 1, "b": [2], "c": "x"}
    assert (c.fc_norm, c.norm_output, c.loss, c.lk_eta, c.feature_noise) == (True, True, "lk-lambda", 2.0, 0.05)


def test_a_run_with_the_new_options_trains_exports_and_loads(tmp_path):
    target = tmp_path / "target"
    make_hf_llama_target(target)
    lines = [s.strip() for s in stdlib_texts(4)[1].splitlines() if len(s.strip()) > 10][:12]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": a},
                                                        {"role": "assistant", "content": b}]}) + "\n"
                               for a, b in zip(lines[::2], lines[1::2])))
    data = tmp_path / "data"
    assert drafter(["data", "--prompts", str(prompts), "--out", str(data), "--keep-responses",
                    "--tokenizer", str(target)]) == 0
    assert drafter(["vocab", "--data", str(data), "--size", "64"]) == 0
    run = tmp_path / "run"
    assert drafter(["train", "--target", str(target), "--data", str(data), "--out", str(run), "--max-steps", "2",
                    "--batch-size", "2", "--ttt-length", "2", "--log-every", "1", "--fc-norm", "--norm-output",
                    "--loss", "lk-lambda", "--feature-noise", "0.05"]) == 0
    recorded = json.loads((run / "train_config.json").read_text())
    assert (recorded["loss"], recorded["feature_noise"], recorded["fc_norm"]) == ("lk-lambda", 0.05, True)
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert len(log) == 2 and all(math.isfinite(r["loss"]) for r in log)
    assert FC_NORMS <= set(load_file(str(run / "checkpoints" / "step-00000002" / "drafter.safetensors")))
    assert drafter(["export", str(run), str(tmp_path / "out"), "--dtype", "float32"]) == 0
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["fc_norm"] is True and cfg["norm_output"] is True
    d = load_drafter(tmp_path / "out", None)
    assert d.config.fc_norm and d.config.norm_output
    assert drafter(["train", "--target", str(target), "--data", str(data), "--out", str(run), "--max-steps", "3",
                    "--resume"]) == 2   # resumed without --fc-norm: refused


# -- on-policy -------------------------------------------------------------------------------------
def test_on_policy_loss_counts_only_the_states_a_greedy_chain_reaches(monkeypatch):
    """Weight 1: step 1's loss is taken where step 0 drafted the target's token, nowhere else;
    weight 0 is the teacher-forced loss."""
    import drafter.ttt as ttt
    from drafter.ttt import TTTModel
    b, t, v = 1, 6, 5
    target_p = torch.full((b, t, v), 0.01)
    target_p[..., 0] = 0.96                       # the target's argmax is token 0 everywhere
    step0 = torch.zeros(b, t - 1, v)
    step0[0, :, 0] = 5.0                          # step 0 right at positions 0, 2 and wrong at 1, 3
    step0[0, 1, :] = torch.tensor([0.0, 5.0, 0, 0, 0])
    step0[0, 3, :] = torch.tensor([0.0, 5.0, 0, 0, 0])
    step1 = torch.randn(b, t - 1, v, generator=torch.Generator().manual_seed(0))

    class Out:
        def __init__(self, logits):
            self.logits, self.hidden = logits, None

    def fake_unroll(drafter, input_ids, aux_hidden, length):
        yield Out(step0)
        yield Out(step1)
    monkeypatch.setattr(ttt, "unroll", fake_unroll)
    ids, mask = torch.zeros(b, t, dtype=torch.long), torch.ones(b, t, dtype=torch.long)
    in_vocab = torch.ones(b, t, dtype=torch.bool)

    def step1_loss(w):
        _, stats = TTTModel(torch.nn.Identity(), length=2, step_weight=1.0, on_policy=w)(
            ids, mask, None, target_p, in_vocab)
        return float(stats.loss[1])
    p1 = target_p[:, 2:2 + 3]
    every = position_loss(step1[:, :3], p1, torch.ones(1, 3, dtype=torch.bool))
    reached = position_loss(step1[:, :3], p1, torch.tensor([[True, False, True]]))
    assert math.isclose(step1_loss(0.0), float(every[0] / every[1]), rel_tol=1e-5)
    assert math.isclose(step1_loss(1.0), float(reached[0] / reached[1]), rel_tol=1e-5)
