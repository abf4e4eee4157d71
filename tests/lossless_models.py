"""The models the lossless tests share (tests/test_lossless.py, tests/test_compiled_steps.py): a random
target, three prompts with its greedy continuations, a random drafter and one fitted to those continuations."""
import torch

from models.kernel_plan import KernelPlan
from models.llama import load_target
from tests.engine_runs import decode
from tests.tiny import fit_drafter, make_target_dir, random_drafter

N_TOKENS = 40


def lossless_models(root) -> dict:
    target_dir = make_target_dir(root / "target", init_std=0.2)
    target = load_target(target_dir)
    prompts = [[int(t) for t in torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(n))]
               for n in (1, 7, 33)]
    baseline = [decode(target, None, None, [p], fast=False)[0][0] for p in prompts]
    assert baseline == [decode(target, None, None, [p])[0][0] for p in prompts]
    fitted = fit_drafter(target, random_drafter(target), [p + o for p, o in zip(prompts, baseline)],
                         steps=300, lr=1e-2)
    return dict(root=root, target_dir=target_dir, target=target, prompts=prompts, baseline=baseline,
                drafters={"random": random_drafter(target, draft_vocab=256), "fitted": fitted})


def use_plan(monkeypatch, models: dict, plan: KernelPlan) -> None:
    """`plan` in the models' target and drafters, as models.layers.set_kernel_plan sets it, for one test."""
    for model in (models["target"], *models["drafters"].values()):
        monkeypatch.setattr(model, "kernel_plan", plan)
        for m in model.modules():
            if hasattr(m, "plan"):
                monkeypatch.setattr(m, "plan", plan)
