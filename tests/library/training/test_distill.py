"""The distillation's objective against a reference written here from the formulas (the LCM papers' consistency
function with diffusers' LCMScheduler boundary scalings, one guided DDIM step of the teacher, the pseudo-Huber
loss), with the student, the target network and the teacher all different, so a role wired to the wrong weights
or the wrong point changes the number; its grid is LCMScheduler's; stacked adapters change the weights by the sum
of their changes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ootd.app.train.distill import load_distill_models
from ootd.errors import OotdError
from ootd.models import Models
from ootd.runtime import RuntimeRequest
from ootd.settings import ModelType, PrecisionName
from ootd.training.distill import ConsistencyGrid, boundary_scalings
from ootd.training.objective import TryOnObjective
from ootd.training.settings import DistillSettings
from tests.helpers.training import SD15_BETAS


def _reference_alphas() -> torch.Tensor:
    """The released schedule: scaled-linear betas from 0.00085 to 0.012 over 1000 steps."""
    start, end, steps = SD15_BETAS
    betas = torch.linspace(start**0.5, end**0.5, steps, dtype=torch.float64) ** 2
    return torch.cumprod(1 - betas, dim=0)


def _f(x: torch.Tensor, eps: torch.Tensor, t: torch.Tensor, alphas: torch.Tensor) -> torch.Tensor:
    """The consistency function: c_skip x + c_out x0, with sigma_data 0.5 and timesteps scaled by 10."""
    a = alphas[t].float().view(-1, 1, 1, 1)
    scaled = 10.0 * t.double()
    c_skip = (0.25 / (scaled**2 + 0.25)).float().view(-1, 1, 1, 1)
    c_out = (scaled / (scaled**2 + 0.25).sqrt()).float().view(-1, 1, 1, 1)
    return c_skip * x + c_out * (x - (1 - a).sqrt() * eps) / a.sqrt()


def test_while_a_distillation_runs_its_models_are_not_handed_out_again(tiny_tree: Path) -> None:
    """A distillation trains a copy of the holder the owner keeps (its own objective): the run holds both, so the
    owner refuses to reset the adapter under it, and hands it out again once the run ends."""
    settings = DistillSettings.from_words(rank=4, alpha=4)
    owner = Models(tiny_tree, RuntimeRequest(device="cpu", precision=PrecisionName.FP32))
    models = load_distill_models(owner, ModelType.HD, settings)
    with models.in_run("RUN"), pytest.raises(OotdError, match="in use by the training run in RUN"):
        load_distill_models(owner, ModelType.HD, settings)
    assert load_distill_models(owner, ModelType.HD, settings).params is models.params


def test_one_step_of_the_consistency_loss_is_the_reference(tiny_tree: Path) -> None:
    settings = DistillSettings.from_words(rank=4, alpha=4, guidance=3.0, huber_c=0.01)
    owner = Models(tiny_tree, RuntimeRequest(device="cpu", precision=PrecisionName.FP32))
    models = load_distill_models(owner, ModelType.HD, settings)
    objective, unet = models.objective, models.pipe.components.unet_vton
    torch.manual_seed(0)
    with torch.no_grad():  # a trained student and a target network that lags it: three different networks
        for param, target in zip(objective.student, objective.target, strict=True):
            param.add_(torch.randn_like(param) * 0.2)
            target.add_(torch.randn_like(target) * 0.2)
    g = torch.Generator().manual_seed(1)
    z0, masked, garment = (torch.randn(2, 4, 8, 6, generator=g) for _ in range(3))
    prompt = torch.randn(2, 2, unet.config.cross_attention_dim, generator=g)
    noise, index = torch.randn(2, 4, 8, 6, generator=g), torch.tensor([0, 37])
    loss = objective(z0, masked, garment, prompt, noise, index)
    objective.release()

    alphas = _reference_alphas()
    t = 20 * (index + 1) - 1  # the grid: every 20th of 1000 timesteps, from 19
    s = (t - 20).clamp(min=0)
    a_t, a_s = (alphas[x].float().view(-1, 1, 1, 1) for x in (t, s))
    x_t = a_t.sqrt() * z0 + (1 - a_t).sqrt() * noise
    c = models.pipe.components
    predict = TryOnObjective(c.unet_garm, unet, models.pipe.fusion, c.scheduler_config).predict  # the fine-tune's
    keep, drop = torch.tensor([False, False]), torch.tensor([True, True])
    with torch.no_grad():
        unet.disable_adapters()  # the teacher: the model as loaded, with image guidance
        eps_c, eps_u = (predict(x_t, t, masked, garment, prompt, d) for d in (keep, drop))
        unet.enable_adapters()
        eps = eps_u + 3.0 * (eps_c - eps_u)
        x_s = a_s.sqrt() * (x_t - (1 - a_t).sqrt() * eps) / a_t.sqrt() + (1 - a_s).sqrt() * eps
        student = [p.detach().clone() for p in objective.student]
        for param, target in zip(objective.student, objective.target, strict=True):
            param.copy_(target)
        wanted = _f(x_s, predict(x_s, s, masked, garment, prompt, keep), s, alphas)
        for param, value in zip(objective.student, student, strict=True):
            param.copy_(value)
        predicted = _f(x_t, predict(x_t, t, masked, garment, prompt, keep), t, alphas)
    reference = (torch.sqrt((predicted - wanted) ** 2 + 0.01**2) - 0.01).mean()
    torch.testing.assert_close(loss.detach(), reference, rtol=1e-5, atol=1e-7)
    assert all(torch.equal(p, v) for p, v in zip(objective.student, student, strict=True))  # the student is back


def test_the_distillation_leaves_the_owners_models_as_they_were(tiny_tree: Path) -> None:
    """The owner's fine-tune models go to its next user (a `train run`, another distillation) as they were: the
    distillation's objective is in a copy of the holder, over the same networks (nothing copied)."""
    from ootd.training.distill import ConsistencyObjective

    settings = DistillSettings.from_words(rank=4, alpha=4)
    owner = Models(tiny_tree, RuntimeRequest(device="cpu", precision=PrecisionName.FP32))
    held = owner.trainable(ModelType.HD, settings)
    members = {name: id(value) for name, value in vars(held).items()}
    params, modes = list(held.params), [m.training for m in held.objective.modules()]
    flags = [p.requires_grad for p in held.objective.parameters()]
    models = load_distill_models(owner, ModelType.HD, settings)
    assert isinstance(models.objective, ConsistencyObjective) and models is not held
    assert models.pipe is held.pipe and models.params is held.params and models.unets is held.unets  # shared
    assert owner.trainable(ModelType.HD, settings) is held  # still the one held, not loaded again
    assert isinstance(held.objective, TryOnObjective)
    assert {name: id(value) for name, value in vars(held).items()} == members and held.params == params
    assert [m.training for m in held.objective.modules()] == modes
    assert [p.requires_grad for p in held.objective.parameters()] == flags


def test_the_grid_and_the_boundary_are_lcm_schedulers(tiny_tree: Path) -> None:
    """What the student learns is what LCMScheduler samples: its timesteps lie on the grid, its scalings are the
    objective's."""
    from diffusers import LCMScheduler

    from ootd.method.schedulers import set_timesteps
    from ootd.weights.layout import Layout
    from ootd.weights.loading import load_scheduler_config

    config = load_scheduler_config(Layout(tiny_tree))
    grid = ConsistencyGrid.from_config(config)
    torch.testing.assert_close(grid.alphas_cumprod.float(), _reference_alphas().float())
    scheduler = LCMScheduler.from_config(config)
    for steps in (1, 2, 4, 8):
        set_timesteps(scheduler, steps)
        assert set(scheduler.timesteps.tolist()) <= set(grid.timesteps.tolist())
    for t in (0, 19, 259, 999):
        c_skip, c_out = scheduler.get_scalings_for_boundary_condition_discrete(t)
        ours = boundary_scalings(torch.tensor([t]))
        assert (float(ours[0]), float(ours[1])) == pytest.approx((c_skip, c_out), rel=1e-12)


def test_stacked_adapters_change_the_weights_by_the_sum_of_their_changes() -> None:
    from ootd.training.adapters import stack

    g = torch.Generator().manual_seed(0)
    module = "blocks.0.attn1.to_q"
    first = {"unet_vton": {f"{module}.lora_A.weight": torch.randn(2, 6, generator=g),
                           f"{module}.lora_B.weight": torch.randn(5, 2, generator=g)},
             "unet_garm": {f"{module}.lora_A.weight": torch.randn(2, 6, generator=g),
                           f"{module}.lora_B.weight": torch.randn(5, 2, generator=g)}}
    second = {"unet_vton": {f"{module}.lora_A.weight": torch.randn(3, 6, generator=g),
                            f"{module}.lora_B.weight": torch.randn(5, 3, generator=g)}}
    tensors, rank = stack([(first, 2, 4.0, 0.5), (second, 3, 3.0, 1.0)])
    assert rank == 5

    def change(state: dict, r: int, alpha: float, scale: float) -> torch.Tensor:
        return state[f"{module}.lora_B.weight"] @ state[f"{module}.lora_A.weight"] * alpha / r * scale

    torch.testing.assert_close(change(tensors["unet_vton"], 5, 5.0, 1.0),
                               change(first["unet_vton"], 2, 4.0, 0.5) + change(second["unet_vton"], 3, 3.0, 1.0))
    torch.testing.assert_close(change(tensors["unet_garm"], 5, 5.0, 1.0), change(first["unet_garm"], 2, 4.0, 0.5))
