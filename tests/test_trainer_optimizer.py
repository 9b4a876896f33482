"""``OptimConfig.optimizer_implementation``: PyTorch's AdamW kernels take the same step,
the trainer builds the one configured, and a fused kernel is refused where PyTorch has none."""

from __future__ import annotations

import pytest
import torch

from rlkit.trainer.config import OPTIMIZER_IMPLEMENTATIONS
from rlkit.trainer.optimizer import adamw, implementation_options
from rlkit.trainer.trainer import RLTrainer
from tests.experiment_factory import LENGTH_REWARD, small_experiment


def three_steps(implementation: str) -> list[torch.Tensor]:
    """A (4, 3) weight and a (3,) bias after three AdamW steps on fixed gradients."""
    gen = torch.Generator().manual_seed(0)
    params = [
        torch.nn.Parameter(torch.randn(4, 3, generator=gen)),
        torch.nn.Parameter(torch.randn(3, generator=gen)),
    ]
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    opt = adamw(
        [*params, frozen],
        lr=0.1,
        betas=(0.9, 0.99),
        weight_decay=0.01,
        implementation=implementation,
    )
    assert all(p is not frozen for group in opt.param_groups for p in group["params"])
    for step in range(3):
        for p in params:
            p.grad = torch.full_like(p, float(step + 1)) - p.detach()
        opt.step()
    return [p.detach() for p in params]


def test_every_implementation_takes_the_same_adamw_step():
    reference = three_steps("torch")
    for name in OPTIMIZER_IMPLEMENTATIONS:
        for got, want in zip(three_steps(name), reference):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_first_adamw_step_moves_each_weight_by_lr_times_sign_of_its_gradient():
    # Step 1 of Adam: m = (1-b1) g, v = (1-b2) g^2, bias-corrected m/sqrt(v) = sign(g);
    # with weight decay 0.01 at lr 0.1 the weight first shrinks by 1 - 0.1 * 0.01 = 0.999.
    for name in OPTIMIZER_IMPLEMENTATIONS:
        w = torch.nn.Parameter(torch.tensor([2.0, -1.0]))
        opt = adamw([w], lr=0.1, betas=(0.9, 0.99), weight_decay=0.01, implementation=name)
        w.grad = torch.tensor([0.5, -3.0])
        opt.step()
        # [2 * 0.999 - 0.1, -1 * 0.999 + 0.1] = [1.898, -0.899] (eps moves it by < 1e-7)
        torch.testing.assert_close(w.detach(), torch.tensor([1.898, -0.899]), atol=1e-6, rtol=0)


def test_implementations_map_to_pytorchs_keywords():
    p = [torch.zeros(2)]
    assert implementation_options(p, "torch") == {}
    assert implementation_options(p, "fused") == {"fused": True}
    assert implementation_options(p, "foreach") == {"foreach": True}
    assert implementation_options(p, "for_loop") == {"foreach": False}


def test_unknown_implementation_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="optimizer_implementation.*torch, fused.*'adam8bit'"):
        implementation_options([torch.zeros(2)], "adam8bit")


def test_fused_is_refused_for_parameters_without_a_fused_kernel():
    meta = torch.nn.Parameter(torch.zeros(2, device="meta"))
    with pytest.raises(ValueError, match="'fused' needs floating-point.*meta torch.float32"):
        adamw([meta], lr=0.1, betas=(0.9, 0.99), weight_decay=0.0, implementation="fused")


@pytest.mark.parametrize("implementation", ["torch", "fused"])
def test_trainer_steps_the_actor_with_the_configured_implementation(
    implementation, demo_model_dir, tmp_path
):
    cfg = small_experiment(
        demo_model_dir,
        tmp_path / "run",
        data=LENGTH_REWARD,  # nonzero advantages, so the step moves the weights
        optim={"optimizer_implementation": implementation},
        trainer={"total_steps": 1},
    )
    trainer = RLTrainer(cfg)
    trainer.setup()
    optimizer = getattr(trainer.actor_opt, "optimizer", trainer.actor_opt)  # Accelerate's wrapper
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.defaults["fused"] is (True if implementation == "fused" else None)
    before = [p.detach().clone() for p in trainer.actor.parameters()]
    metrics = trainer.step()
    after = list(trainer.actor.parameters())
    assert metrics["actor/lr"] == pytest.approx(1e-3)
    assert any(not torch.equal(a.detach(), b) for a, b in zip(after, before))


def test_a_run_saved_with_the_default_optimizer_resumes_with_the_fused_one(
    demo_model_dir, tmp_path
):
    def experiment(out, implementation, steps):
        return small_experiment(
            demo_model_dir,
            out,
            data=LENGTH_REWARD,
            optim={"optimizer_implementation": implementation},
            trainer={"total_steps": steps},
        )

    straight = RLTrainer(experiment(tmp_path / "straight", "torch", 2))
    straight.run()
    RLTrainer(experiment(tmp_path / "resumed", "torch", 1)).run()
    resumed = RLTrainer(experiment(tmp_path / "resumed", "fused", 2))
    resumed.run()
    assert resumed.resumed_from.endswith("global_step_1")
    assert "OptimConfig.optimizer_implementation: 'torch' -> 'fused'" in resumed.resume_changes
    # The moments saved by the loop continue under the fused kernel: the second step's
    # weights equal the straight run's to float rounding.
    for got, want in zip(resumed.actor.parameters(), straight.actor.parameters()):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=1e-6)
