"""The models a fine-tune trains: the inference pipeline over the two UNets and the VAE (its fusion is the
objective's, its `generate` makes the validation try-ons), LoRA on the UNets, the objective module.

The CLIP encoders are not loaded: every prompt embedding is in the cache. Their places in the pipeline hold
`NotLoaded`, which says so if anything ever calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ootd.settings import AttentionName, ModelType, PrecisionName
from ootd.training.settings import MixedPrecision, TrainSettings


class NotLoaded(torch.nn.Module):
    """The place of a model a fine-tune does not load (the CLIP encoders: the cache has the prompt embeddings)."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"the {self.what} is not loaded for training: prompt embeddings come from the cache")


@dataclass
class TrainingModels:
    pipe: Any  # TryOnPipeline
    objective: Any  # TryOnObjective
    params: list[torch.nn.Parameter]
    unets: dict[str, torch.nn.Module]  # the adapted UNets by name (ootd/weights/lora.py UNET_NAMES)
    device: torch.device
    autocast: torch.dtype | None


def weight_dtype(mixed: MixedPrecision) -> torch.dtype:
    return {MixedPrecision.NO: torch.float32, MixedPrecision.BF16: torch.bfloat16,
            MixedPrecision.FP16: torch.float16}[mixed]


def check_mixed_precision(mixed: MixedPrecision, device: str | None) -> None:
    """bf16/fp16 only where the device profile allows them (the same check as --precision: exit 3 elsewhere)."""
    if mixed is MixedPrecision.NO:
        return
    from ootd.runtime import RuntimeRequest, choose_hardware

    choose_hardware(RuntimeRequest(device=device, precision=PrecisionName(mixed.value)))


def load_training_models(checkpoints: Path, model_type: ModelType, settings: TrainSettings, device: str | None,
                         attention: AttentionName = AttentionName.AUTO, components: Any = None,
                         before_adapters: Callable[[Any], None] | None = None) -> TrainingModels:
    """Load (or take `components`), build the pipeline, add the adapters. The pipeline comes first: it freezes
    every model it holds; the adapters' parameters are the only trainable ones after. `before_adapters` sees the
    loaded components first (a distillation merges its teacher's adapter into them)."""
    from ootd.hardware.dtypes import dtype_name
    from ootd.pipeline import TryOnPipeline
    from ootd.runtime import RuntimeRequest, resolve_runtime
    from ootd.training.adapters import add_lora, target_modules
    from ootd.training.objective import TryOnObjective
    from ootd.weights import loading
    from ootd.weights.layout import Layout

    dtype = weight_dtype(settings.mixed_precision)
    runtime = resolve_runtime(RuntimeRequest(device=device, precision=PrecisionName(dtype_name(dtype)),
                                             attention=attention))
    if components is None:
        layout = Layout(checkpoints)
        components = loading.Components(
            tokenizer=None, text_encoder=NotLoaded("text encoder"), image_encoder=NotLoaded("CLIP image encoder"),
            image_processor=None, vae=loading.load_vae(layout, runtime.precision.vae),
            unet_garm=loading.load_unet(layout.unet_garm(model_type), layout, dtype, "garment UNet"),
            unet_vton=loading.load_unet(layout.unet_vton(model_type), layout, dtype, "try-on UNet"),
            scheduler_config=loading.load_scheduler_config(layout))
    if before_adapters is not None:
        before_adapters(components)
    pipe = TryOnPipeline(components, model_type, runtime.device, runtime.precision, runtime.attention_fn(), checkpoints,
                         profile=runtime.profile)
    unets = {"unet_vton": components.unet_vton}
    if settings.train_garment:
        unets["unet_garm"] = components.unet_garm
    params: list[torch.nn.Parameter] = []
    for i, (name, unet) in enumerate(unets.items()):
        targets = target_modules(unet, skip_last_block=name == "unet_garm")
        params += add_lora(unet, targets, settings.rank, settings.alpha, settings.seed + i)
        if settings.gradient_checkpointing:
            unet.enable_gradient_checkpointing()
    objective = TryOnObjective(components.unet_garm, components.unet_vton, pipe.fusion, components.scheduler_config,
                               garment_grad=settings.train_garment)
    objective.train()
    autocast = None if settings.mixed_precision is MixedPrecision.NO else dtype
    return TrainingModels(pipe, objective, params, unets, runtime.device.torch_device, autocast)
