"""`ootd train run --explain`: the device, precision and attention a fine-tune runs with and its memory estimate
(ootd/training/memory.py).

The local engine explains from the models it has loaded anyway; the Ray engine explains on the driver, before any
worker starts, from the checkpoints' configs alone: the UNets and the VAE are built on the meta device (shapes, no
memory), so the estimate costs no weight load on a GPU or anywhere, and it is the same estimate the local engine
prints for the same settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ootd.settings import ModelType, Resolution
from ootd.training.memory import TrainingEstimate, estimate_training
from ootd.training.settings import TrainSettings

if TYPE_CHECKING:
    from ootd.models.training import TrainingModels


def _params(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())


def _latent_tokens(resolution: Resolution) -> int:
    return (resolution.width // 8) * (resolution.height // 8)


def training_estimate(models: TrainingModels, resolution: Resolution, settings: TrainSettings) -> TrainingEstimate:
    """The estimate of one worker from loaded models (ootd/models/training.py), adapters added."""
    c = models.pipe.components
    adapter = sum(p.numel() for p in models.params)
    weight_bytes = c.unet_vton.conv_in.weight.element_size()
    autocast = models.autocast.itemsize if models.autocast is not None else 4
    return estimate_training(_params(c.unet_vton) + _params(c.unet_garm) - adapter, _params(c.vae), adapter,
                             weight_bytes, _latent_tokens(resolution), settings.batch_size,
                             settings.gradient_checkpointing, settings.train_garment, autocast,
                             settings.target_network)


def _adapter_params(unet: Any, rank: int, skip_last_block: bool) -> int:
    """What `add_lora` adds to `unet`: per adapted Linear, A (rank x in) and B (out x rank)."""
    from ootd.training.adapters import target_modules

    modules = dict(unet.named_modules())
    return sum(rank * (modules[name].in_features + modules[name].out_features)
               for name in target_modules(unet, skip_last_block=skip_last_block))


def config_estimate(checkpoints: Path, model_type: ModelType, resolution: Resolution,
                    settings: TrainSettings) -> TrainingEstimate:
    """The estimate of one worker from the checkpoints' configs, the models built on the meta device: for a driver
    that loads no weights itself (the Ray engine)."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel

    from ootd.models.training import weight_dtype
    from ootd.weights.layout import Layout, require_file
    from ootd.weights.loading import quiet_loading

    layout = Layout(checkpoints)
    folders = {"unet_garm": layout.unet_garm(model_type), "unet_vton": layout.unet_vton(model_type)}
    for folder in (*folders.values(), layout.vae):
        require_file(folder / "config.json", layout)
    with quiet_loading(), torch.device("meta"):
        unets = {name: UNet2DConditionModel.from_config(UNet2DConditionModel.load_config(folder))
                 for name, folder in folders.items()}
        vae = AutoencoderKL.from_config(AutoencoderKL.load_config(layout.vae))
    adapter = _adapter_params(unets["unet_vton"], settings.rank, False)
    if settings.train_garment:
        adapter += _adapter_params(unets["unet_garm"], settings.rank, True)
    size = weight_dtype(settings.mixed_precision).itemsize  # the weights' dtype, and autocast's when mixed
    return estimate_training(sum(_params(u) for u in unets.values()), _params(vae), adapter, size,
                             _latent_tokens(resolution), settings.batch_size, settings.gradient_checkpointing,
                             settings.train_garment, size, settings.target_network)


def batch_line(settings: TrainSettings, workers: int) -> str:
    """How the global batch of one optimizer step is made."""
    return (f"global batch: {settings.batch_size} x {settings.accumulation} accumulation x {workers} worker(s) = "
            f"{settings.batch_size * settings.accumulation * workers} pairs per step")


def explain_lines(models: TrainingModels, resolution: Resolution, settings: TrainSettings,
                  workers: int = 1) -> list[str]:
    """--explain on the local engine: what was chosen for the loaded models, the batch, the estimate."""
    ran = models.pipe.describe()
    shown = {"device": ran.device, "precision": ran.precision_word, "attention": ran.attention}
    lines = [f"{label}: {value}" for label, value in shown.items() if value]
    lines.append(batch_line(settings, workers))
    lines.append(training_estimate(models, resolution, settings).explain(per_worker=workers > 1))
    return lines


def ray_explain_lines(checkpoints: Path, model_type: ModelType, resolution: Resolution, settings: TrainSettings,
                      workers: int, gpus: bool) -> list[str]:
    """--explain on the Ray engine: the workers, the batch and one worker's estimate, before any worker starts
    (each worker chooses its own device, precision and attention when it loads the models)."""
    return [f"engine: ray, {workers} worker(s), {'a GPU' if gpus else 'CPUs'} each",
            batch_line(settings, workers),
            config_estimate(checkpoints, model_type, resolution, settings).explain(per_worker=True)]
