"""The method's training objective (arXiv 2403.01779 §3; docs/upstream.md §4-§5 for the numbers inference uses).

A training sample is a prepared pair (ootd/training/cache.py): the target latents z0 (the person photo wearing the
garment, times the VAE scaling factor), the masked-person latents, the garment latents and the prompt embedding.
One step of the objective, per sample:

- draw noise e, a timestep t uniform over the scheduler's training timesteps, and whether the garment is dropped
  (outfitting dropout: with the configured probability the garment latents are all zeros, exactly the input of
  the unconditional half of image guidance at inference, which is what makes that guidance work);
- the garment UNet runs once at timestep 0 on the garment latents with the prompt embedding, and the input of
  every transformer block is kept (the same `capture_block_inputs` inference uses);
- the try-on UNet runs at t on [noised z0, masked-person latents] (8 channels), its self-attention fused with the
  garment features through the inference pipeline's own `TryOnFusion` processors;
- the loss is the mean squared error between its prediction and e (or the velocity, if the scheduler config says
  v-prediction), with the noise schedule of the released scheduler config (DDPM over its betas).

Nothing here re-implements the fusion: `TryOnObjective` drives the processors a `TryOnPipeline` installed, so
training and inference run the same attention code (tests/library/training check the two predictions are equal).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ootd.method.fusion import TryOnFusion, capture_block_inputs
from ootd.weights.loading import quiet_loading


def noise_scheduler(scheduler_config: dict):  # noqa: ANN201
    """The training noise schedule of the released scheduler config (DDPM over the same betas and timesteps)."""
    from diffusers import DDPMScheduler

    with quiet_loading():
        return DDPMScheduler.from_config(scheduler_config)


def _sample_seed(seed: int, step: int, index: int) -> int:
    return (seed * 1_000_003 + step * 65_537 + index * 8_191 + 1) % (2**63 - 1)


@dataclass(frozen=True)
class Draws:
    """The random part of one micro-batch: noise, timesteps and which samples train without the garment."""

    noise: torch.Tensor
    timesteps: torch.Tensor
    drop: torch.Tensor


def draw(indices: Sequence[int], latent_shape: Sequence[int], timesteps: int, dropout: float, seed: int,
         step: int) -> Draws:
    """Each sample's draws from its own generator, seeded by (seed, optimizer step, its index in the step's
    global batch): the same numbers whichever worker, micro-batch or resumed run computes them."""
    noises, ts, drops = [], [], []
    for index in indices:
        generator = torch.Generator().manual_seed(_sample_seed(seed, step, index))
        noises.append(torch.randn(tuple(latent_shape), generator=generator))
        ts.append(torch.randint(0, timesteps, (1,), generator=generator))
        drops.append(torch.rand(1, generator=generator) < dropout)
    return Draws(torch.stack(noises), torch.cat(ts), torch.cat(drops))


class TryOnObjective(torch.nn.Module):
    """Both UNets and the pipeline's fusion as one module whose forward is the loss of a micro-batch (what DDP
    wraps). The garment keys and values stay set after the forward, for a backward that recomputes checkpointed
    blocks; `release` drops them once the backward is done."""

    def __init__(self, unet_garm: torch.nn.Module, unet_vton: torch.nn.Module, fusion: TryOnFusion,
                 scheduler_config: dict, garment_grad: bool = True) -> None:
        super().__init__()
        self.garment_grad = garment_grad  # False: the garment UNet is not adapted, its run keeps no activations
        self.unet_garm = unet_garm
        self.unet_vton = unet_vton
        self.fusion = fusion
        self.scheduler = noise_scheduler(scheduler_config)
        self._garment = contextlib.ExitStack()

    @property
    def num_timesteps(self) -> int:
        return int(self.scheduler.config.num_train_timesteps)

    def draw(self, indices: Sequence[int], latent_shape: Sequence[int], seed: int, step: int,
             dropout: float) -> Draws:
        """A micro-batch's draws (`draw` below): the loop asks the objective, whose timesteps they are."""
        return draw(indices, latent_shape, self.num_timesteps, dropout, seed, step)

    def predict(self, noisy: torch.Tensor, timesteps: torch.Tensor, masked: torch.Tensor, garment: torch.Tensor,
                prompt: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
        """The try-on UNet's noise prediction for noised latents at `timesteps` (garments dropped where `drop`)."""
        self.release()
        dtype = self.unet_vton.conv_in.weight.dtype
        garment = torch.where(drop.view(-1, 1, 1, 1).to(garment.device), torch.zeros_like(garment), garment)
        prompt = prompt.to(dtype)
        with (torch.set_grad_enabled(self.garment_grad and torch.is_grad_enabled()),
              capture_block_inputs(self.unet_garm, stop_early=True) as features):
            self.unet_garm(garment.to(dtype), 0, encoder_hidden_states=prompt, return_dict=False)
        index = torch.arange(noisy.shape[0], device=noisy.device)  # sample i attends to garment item i
        self._garment.enter_context(self.fusion.garment(dict(features), index, grad=True))
        model_in = torch.cat([noisy, masked], dim=1).to(dtype)
        return self.unet_vton(model_in, timesteps, encoder_hidden_states=prompt, return_dict=False)[0]

    def forward(self, target: torch.Tensor, masked: torch.Tensor, garment: torch.Tensor, prompt: torch.Tensor,
                noise: torch.Tensor, timesteps: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
        """The mean squared error of the prediction against the scheduler's target, over the micro-batch."""
        timesteps = timesteps.to(target.device)
        noise = noise.to(target.device, target.dtype)
        noisy = self.scheduler.add_noise(target, noise, timesteps)
        pred = self.predict(noisy, timesteps, masked, garment, prompt, drop)
        if self.scheduler.config.prediction_type == "v_prediction":
            wanted = self.scheduler.get_velocity(target, noise, timesteps)
        else:
            wanted = noise
        return F.mse_loss(pred.float(), wanted.float(), reduction="mean")

    def release(self) -> None:
        """Drop the garment keys and values of the latest forward."""
        self._garment.close()
        self._garment = contextlib.ExitStack()
