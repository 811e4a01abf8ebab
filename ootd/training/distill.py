"""Latent consistency distillation of the try-on model into a LoRA (`ootd train distill`, docs/training.md).

The method is LCM's (Luo et al., arXiv 2310.04378, §4.2-4.3) as LCM-LoRA trains it (arXiv 2311.05556): a
consistency function f(x, t) = c_skip(t) x + c_out(t) x0(x, t) on the try-on UNet with the distillation's LoRA, the
boundary scalings of diffusers' LCMScheduler (`boundary_scalings`), so what is learned here is exactly what that
scheduler samples. One step of the objective, per sample (a prepared pair, ootd/training/cache.py):

- draw noise e and a point n of the grid (ConsistencyGrid: every k-th training timestep, k = 1000 / 50 = 20, the
  grid LCMScheduler's timesteps are taken from); t = t_n, s = t_n - k (0 at the first point); x_t = the target
  latents noised to t;
- the teacher (the model as loaded: the LoRA switched off) takes one DDIM step from x_t to s with its image guidance
  at scale w: eps = eps(x_t, no garment) + w (eps(x_t, garment) - eps(x_t, no garment)), the same two passes the
  pipeline's guidance runs (ootd/method/guidance.py);
- the target network (the student's EMA weights, swapped into the LoRA for the pass) gives f-(x_s, s), without
  gradient;
- the student gives f(x_t, t) with the garment only: it learns the guided solution, so sampling it needs no
  unconditional pass;
- the loss is the pseudo-Huber distance sqrt((f - f-)^2 + c^2) - c (LCM-LoRA's choice), averaged.

The UNets run through the inference pipeline's own fusion processors (as ootd/training/objective.py does): every
pass projects the garment's keys and values with the weights of its role, since the LoRA adapts those projections
too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from ootd.method.fusion import TryOnFusion, capture_block_inputs
from ootd.settings import CONSISTENCY_GRID
from ootd.training.objective import Draws, draw

SIGMA_DATA = 0.5  # LCMScheduler's boundary condition constants (diffusers: get_scalings_for_boundary_condition)
TIMESTEP_SCALING = 10.0


def boundary_scalings(t: torch.Tensor, timestep_scaling: float = TIMESTEP_SCALING) -> tuple[torch.Tensor,
                                                                                             torch.Tensor]:
    """(c_skip, c_out) at integer timesteps `t`: c_skip(0) = 1 and c_out(0) = 0, so f(x, 0) = x."""
    scaled = t.double() * timestep_scaling
    c_skip = SIGMA_DATA**2 / (scaled**2 + SIGMA_DATA**2)
    c_out = scaled / (scaled**2 + SIGMA_DATA**2) ** 0.5
    return c_skip, c_out


@dataclass(frozen=True)
class ConsistencyGrid:
    """The skipping-step grid: timesteps k*i - 1 for i = 1..points over the training schedule's alphas."""

    alphas_cumprod: torch.Tensor  # [num_train_timesteps], float64
    timesteps: torch.Tensor  # [points], long, ascending
    interval: int  # k
    prediction_type: str = "epsilon"

    @classmethod
    def from_config(cls, scheduler_config: Mapping, points: int = CONSISTENCY_GRID) -> ConsistencyGrid:
        """The grid of the released scheduler config (the betas LCMScheduler.from_config builds from it)."""
        from diffusers import LCMScheduler

        from ootd.weights.loading import quiet_loading

        with quiet_loading():
            scheduler = LCMScheduler.from_config(dict(scheduler_config))
        total = int(scheduler.config.num_train_timesteps)
        interval = total // points
        timesteps = torch.arange(1, points + 1, dtype=torch.long) * interval - 1
        return cls(scheduler.alphas_cumprod.double(), timesteps, interval, str(scheduler.config.prediction_type))

    def steps(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(t, s) of grid points `index`: the teacher steps from t to s = t - k (0 below the first point)."""
        t = self.timesteps[index.cpu()]
        return t, (t - self.interval).clamp(min=0)

    def alpha(self, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """alpha-bar at `t`, shaped to broadcast over `like`'s samples."""
        return self.alphas_cumprod[t.cpu()].to(like.device, like.dtype).view(-1, *([1] * (like.dim() - 1)))

    def x0_and_eps(self, output: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor,
                                                                                          torch.Tensor]:
        """The clean latents and the noise a UNet output implies at `t` (epsilon or v prediction)."""
        a = self.alpha(t, x)
        if self.prediction_type == "v_prediction":
            return a.sqrt() * x - (1 - a).sqrt() * output, a.sqrt() * output + (1 - a).sqrt() * x
        return (x - (1 - a).sqrt() * output) / a.sqrt(), output

    def consistency(self, output: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """f(x, t) = c_skip(t) x + c_out(t) x0, as LCMScheduler's `denoised`."""
        c_skip, c_out = (c.to(x.device, x.dtype).view(-1, *([1] * (x.dim() - 1))) for c in boundary_scalings(t))
        return c_skip * x + c_out * self.x0_and_eps(output, x, t)[0]

    def ddim_step(self, output: torch.Tensor, x: torch.Tensor, t: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """One DDIM step (eta 0) from `t` to `s` for a (guided) UNet output."""
        x0, eps = self.x0_and_eps(output, x, t)
        a = self.alpha(s, x)
        return a.sqrt() * x0 + (1 - a).sqrt() * eps

    def noised(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        a = self.alpha(t, x0)
        return a.sqrt() * x0 + (1 - a).sqrt() * noise


def pseudo_huber(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    """sqrt((a - b)^2 + c^2) - c, averaged: quadratic near 0, linear far out (LCM-LoRA's loss)."""
    return (torch.sqrt((a.float() - b.float()) ** 2 + c**2) - c).mean()


@contextlib.contextmanager
def adapters_off(*unets: torch.nn.Module) -> Iterator[None]:
    """The UNets without their LoRA layers (peft's switch; a UNet without any is left as it is): the teacher, the
    model as loaded."""
    adapted = [unet for unet in unets if getattr(unet, "peft_config", None)]
    for unet in adapted:
        unet.disable_adapters()
    try:
        yield
    finally:
        for unet in adapted:
            unet.enable_adapters()


@contextlib.contextmanager
def weights_swapped(params: Sequence[torch.nn.Parameter], values: Sequence[torch.Tensor]) -> Iterator[None]:
    """`values` in the parameters while active (the target network's pass), the parameters' own after."""
    with torch.no_grad():
        saved = [p.detach().clone() for p in params]
        for p, v in zip(params, values, strict=True):
            p.copy_(v)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, v in zip(params, saved, strict=True):
                p.copy_(v)


class ConsistencyObjective(torch.nn.Module):
    """Both UNets, the pipeline's fusion, the student's LoRA parameters and their EMA (the target network) as one
    module whose forward is the distillation loss of a micro-batch (what DDP wraps; the same forward signature as
    TryOnObjective, the training loop drives either). The student's garment keys and values stay set after the
    forward, for a backward that recomputes checkpointed blocks; `release` drops them."""

    def __init__(self, unet_garm: torch.nn.Module, unet_vton: torch.nn.Module, fusion: TryOnFusion,
                 scheduler_config: Mapping, params: Sequence[torch.nn.Parameter], *, guidance: float,
                 huber_c: float, garment_grad: bool = False) -> None:
        super().__init__()
        self.unet_garm, self.unet_vton, self.fusion = unet_garm, unet_vton, fusion
        self.grid = ConsistencyGrid.from_config(scheduler_config)
        self.guidance, self.huber_c, self.garment_grad = guidance, huber_c, garment_grad
        self.student = list(params)
        self.target = [p.detach().clone() for p in self.student]  # the EMA starts at the student
        self._garment = contextlib.ExitStack()

    @property
    def num_timesteps(self) -> int:
        """The grid points a draw picks from."""
        return len(self.grid.timesteps)

    def draw(self, indices: Sequence[int], latent_shape: Sequence[int], seed: int, step: int,
             dropout: float = 0.0) -> Draws:
        """Each sample's noise and grid point, from (seed, step, its index) as the fine-tune draws (no dropout)."""
        return draw(indices, latent_shape, self.num_timesteps, 0.0, seed, step)

    @torch.no_grad()
    def update_target(self, decay: float) -> None:
        """target <- decay * target + (1 - decay) * student, after each optimizer step."""
        for target, param in zip(self.target, self.student, strict=True):
            target.lerp_(param.detach(), 1.0 - decay)

    def _features(self, garment: torch.Tensor, prompt: torch.Tensor, grad: bool) -> dict[str, torch.Tensor]:
        dtype = self.unet_vton.conv_in.weight.dtype
        with torch.set_grad_enabled(grad), capture_block_inputs(self.unet_garm, stop_early=True) as features:
            self.unet_garm(garment.to(dtype), 0, encoder_hidden_states=prompt.to(dtype), return_dict=False)
        return dict(features)

    def _unet(self, x: torch.Tensor, t: torch.Tensor, masked: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        dtype = self.unet_vton.conv_in.weight.dtype
        model_in = torch.cat([x, masked], dim=1).to(dtype)
        return self.unet_vton(model_in, t.to(x.device), encoder_hidden_states=prompt.to(dtype),
                              return_dict=False)[0].to(x.dtype)

    def _both_halves(self, garment: torch.Tensor, prompt: torch.Tensor) -> dict[str, torch.Tensor]:
        """The garment UNet's features of [garment, no garment] (guidance's two halves), without gradient."""
        return self._features(torch.cat([garment, torch.zeros_like(garment)]), prompt.repeat(2, 1, 1), False)

    @torch.no_grad()
    def teacher_step(self, x: torch.Tensor, t: torch.Tensor, s: torch.Tensor, masked: torch.Tensor,
                     garment: torch.Tensor, prompt: torch.Tensor,
                     features: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The teacher's guided DDIM step from x_t to x_s: the LoRA off, both halves of image guidance
        (`features`: the garment UNet's of both halves, when it has no LoRA to switch off)."""
        n = x.shape[0]
        with adapters_off(self.unet_garm, self.unet_vton):
            features = features if features is not None else self._both_halves(garment, prompt)
            with self.fusion.garment(features, torch.arange(2 * n, device=x.device)):
                cond, uncond = self._unet(x.repeat(2, 1, 1, 1), t.repeat(2), masked.repeat(2, 1, 1, 1),
                                          prompt.repeat(2, 1, 1)).chunk(2)
        return self.grid.ddim_step(uncond + self.guidance * (cond - uncond), x, t, s)

    @torch.no_grad()
    def target_value(self, x_s: torch.Tensor, s: torch.Tensor, masked: torch.Tensor, garment: torch.Tensor,
                     prompt: torch.Tensor, features: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """f-(x_s, s): the target network (the EMA weights in the LoRA) on the teacher's step."""
        with weights_swapped(self.student, self.target):
            features = features if features is not None else self._features(garment, prompt, False)
            with self.fusion.garment(features, torch.arange(x_s.shape[0], device=x_s.device)):
                return self.grid.consistency(self._unet(x_s, s, masked, prompt), x_s, s)

    def forward(self, target: torch.Tensor, masked: torch.Tensor, garment: torch.Tensor, prompt: torch.Tensor,
                noise: torch.Tensor, timesteps: torch.Tensor, drop: torch.Tensor | None = None) -> torch.Tensor:
        """The distillation loss of a micro-batch (`timesteps`: grid points; `drop` is unused: no dropout).
        Without a LoRA on the garment UNet its features are the same for every role: computed once."""
        self.release()
        n = target.shape[0]
        t, s = self.grid.steps(timesteps)
        x_t = self.grid.noised(target, noise.to(target.device, target.dtype), t)
        shared = None if self.garment_grad else self._both_halves(garment, prompt)
        garment_only = {k: v[:n] for k, v in shared.items()} if shared is not None else None
        x_s = self.teacher_step(x_t, t, s, masked, garment, prompt, shared)
        wanted = self.target_value(x_s, s, masked, garment, prompt, garment_only)
        features = garment_only or self._features(garment, prompt, torch.is_grad_enabled())
        self._garment.enter_context(self.fusion.garment(features, torch.arange(n, device=x_t.device), grad=True))
        predicted = self.grid.consistency(self._unet(x_t, t, masked, prompt), x_t, t)
        return pseudo_huber(predicted, wanted, self.huber_c)

    def release(self) -> None:
        """Drop the garment keys and values of the latest forward."""
        self._garment.close()
        self._garment = contextlib.ExitStack()
