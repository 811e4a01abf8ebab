"""What a fine-tune holds in memory, estimated before it starts (`ootd train run --explain`).

    weights      both UNets and the VAE in the weight dtype (the CLIP encoders are not loaded: the cache has
                 the prompt embeddings)
    adapter      the LoRA parameters, their gradients and AdamW's two moments, all fp32: 16 bytes a parameter
    activations  what the backward needs, per sample and latent token: ACTIVATION_BYTES (measured, below) in fp32,
                 scaled by the autocast dtype's size; gradient checkpointing keeps the blocks' inputs only

The per-token coefficients were measured on the CPU with the released architectures at random weights
(`ootd train bench`, docs/benchmarks.md): peak resident memory less the resident memory after loading, per sample
and latent token. They hold for the released architectures (smaller ones get an overestimate) and are estimates:
allocator slack, the attention kernel's workspace and the validation try-ons (which run the inference pipeline's
own plan) come on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from ootd.hardware.units import size_text

# bytes per sample and latent token at the peak of a step, fp32, keyed (gradient checkpointing, garment UNet
# adapted). Measured (`ootd train bench`, docs/benchmarks.md): peak resident memory less the resident memory after
# loading, per sample and token: 911k and 951k without checkpointing (384x512, batch 1 and 2), 530k, 505k and 459k
# with it (384x512 batch 1 and 2, 768x1024 batch 1). With the garment UNet adapted its graph is kept too: those two
# are the measured ones times 1.6 (its share of the work), derived, not measured.
ACTIVATION_BYTES = {(False, False): 950_000, (True, False): 530_000, (False, True): 1_520_000, (True, True): 850_000}
ADAPTER_BYTES_PER_PARAM = 16  # fp32 weight, gradient, and AdamW's exp_avg and exp_avg_sq


@dataclass(frozen=True)
class TrainingEstimate:
    weights: int
    adapter: int
    activations: int
    adapter_params: int
    target_network: bool = False

    @property
    def total(self) -> int:
        return self.weights + self.adapter + self.activations

    def explain(self, per_worker: bool = False) -> str:
        """The estimate as --explain prints it (`per_worker`: each of several workers holds this much)."""
        return "\n".join([
            f"memory estimate for training{', per worker' if per_worker else ''}: {size_text(self.total)} (an "
            "estimate: allocator slack and kernels' workspace come on top)",
            f"  weights      {size_text(self.weights)} (both UNets and the VAE)",
            f"  adapter      {size_text(self.adapter)} ({self.adapter_params:,} LoRA parameters with gradients and "
            f"AdamW state{' and the target network' if self.target_network else ''}, fp32)",
            f"  activations  {size_text(self.activations)} (kept for the backward)",
        ])


def estimate_training(unet_params: int, vae_params: int, adapter_params: int, weight_bytes: int,
                      latent_tokens: int, batch_size: int, checkpointing: bool, train_garment: bool,
                      autocast_bytes: int = 4, target_network: bool = False) -> TrainingEstimate:
    """The estimate of one worker (`unet_params`: both UNets; `latent_tokens`: (H/8) x (W/8); `target_network`: a
    distillation's fp32 EMA copy of the adapter, 4 bytes a parameter more)."""
    per_token = ACTIVATION_BYTES[(checkpointing, train_garment)] * autocast_bytes / 4
    per_param = ADAPTER_BYTES_PER_PARAM + (4 if target_network else 0)
    return TrainingEstimate(weights=(unet_params + vae_params) * weight_bytes, adapter=adapter_params * per_param,
                            activations=int(per_token * latent_tokens * batch_size), adapter_params=adapter_params,
                            target_network=target_network)
