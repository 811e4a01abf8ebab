"""Each kind of model the owner holds, built on the resolved runtime: from the checkpoints through
ootd/weights/loading.py (strict: every key matched, every weight finite) or from networks a source handed in.

Only ootd/models/owner.py calls these; everything else asks the owner. Beside each loader, the files and folders
it reads (`*_files`): what a failed load is remembered against (ootd/models/files.py), so a loader that comes to
read another file names it there too.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ootd.pipeline_types import Progress
from ootd.settings import ModelType, ParsingProvider, QuantizeName
from ootd.speedups.modes import SpeedModes
from ootd.training.encode import Encoders
from ootd.weights.layout import Layout

if TYPE_CHECKING:
    from ootd.evaluation.networks import Networks
    from ootd.evaluation.settings import MetricWeights
    from ootd.hardware.policy import Precision
    from ootd.method.classify import GarmentClassifier
    from ootd.pipeline import TryOnPipeline
    from ootd.preprocessing import Preprocessor
    from ootd.runtime import Runtime
    from ootd.weights.loading import Components
    from ootd.weights.lora import LoraChoice


def network_files(checkpoints: Path | None, model_type: ModelType) -> tuple[Path, ...]:
    """What `read_components` reads (ootd/weights/loading.py `load_components`), and a few-step adapter's check
    of its base weights (the UNets' weight files)."""
    if checkpoints is None:
        return ()
    layout = Layout(checkpoints)
    return (layout.tokenizer, layout.text_encoder, layout.clip, layout.vae, layout.unet_garm(model_type),
            layout.unet_vton(model_type), layout.scheduler, layout.model_index)


def read_components(checkpoints: Path, model_type: ModelType, precision: Precision,
                    progress: Progress | None) -> Components:
    """Every network of one model type from the released layout, on the CPU, in the precision's dtypes."""
    from ootd.weights.loading import load_components as load

    return load(checkpoints, model_type, precision.dtypes(), progress)


def build_pipeline(components: Callable[[], Components], model_type: ModelType, runtime: Runtime, *,
                   modes: SpeedModes, preprocessor: Preprocessor | Callable[[], Preprocessor] | None,
                   parsing_provider: ParsingProvider, max_memory: int | None,
                   lora: LoraChoice | None, checkpoints: Path | None) -> TryOnPipeline:
    """The try-on pipeline of `model_type`: what cannot run here fails first (a missing extra, a damaged adapter,
    an attention backend this machine lacks), then the networks load, the adapter is merged at its scale (before
    quantization: the merged weights are quantized) and the pipeline places them (its residency). A few-step
    adapter is checked against the base weights in `checkpoints` it was distilled from."""
    from ootd.pipeline import TryOnPipeline
    from ootd.speedups.quantize import quantize_unets, require_torchao
    from ootd.weights.lora import apply_lora, read_choice

    start = time.perf_counter()
    if runtime.quantize is not QuantizeName.NONE:
        require_torchao()  # a missing extra is said before minutes of loading
    adapter = read_choice(lora, checkpoints, model_type)  # a damaged or misfit file fails before loading
    attention = runtime.attention_fn()  # a backend that cannot run here fails before the loading too
    loaded = components()
    apply_lora(loaded, model_type, adapter, lora.scale if lora is not None else 1.0)
    quantized = quantize_unets(loaded, runtime.quantize, runtime.device)
    pipe = TryOnPipeline(loaded, model_type, runtime.device, runtime.precision, attention, preprocessor,
                         parsing_provider, max_memory, runtime.speed, runtime.profile,
                         replace(modes, quantize=quantized))
    pipe.load_seconds, pipe.lora = time.perf_counter() - start, lora
    return pipe


def preprocessor_files(checkpoints: Path | None) -> tuple[Path, ...]:
    """What `load_preprocessor` reads."""
    if checkpoints is None:
        return ()
    layout = Layout(checkpoints)
    return layout.body_pose, layout.parsing_atr, layout.parsing_lip


def load_preprocessor(checkpoints: Path, runtime: Runtime, provider: ParsingProvider) -> Preprocessor:
    """Pose + parsing on the device the pipelines use, ONNX Runtime with the runtime's thread count."""
    from ootd.preprocessing import Preprocessor

    return Preprocessor.from_checkpoints(checkpoints, runtime.device.torch_device, provider, runtime.threads)


def classifier_files(checkpoints: Path | None) -> tuple[Path, ...]:
    """What `load_classifier` reads: the CLIP folder."""
    return (Layout(checkpoints).clip,) if checkpoints is not None else ()


def load_classifier(checkpoints: Path) -> GarmentClassifier:
    """CLIP's text tower (its per-category features computed, then the tower dropped), image tower and image
    processor, on the CPU in fp32: one ViT-L/14 image embedding per garment (docs/benchmarks.md)."""
    from ootd.hardware.torch_builds import require_usable_torchvision
    from ootd.method.classify import GarmentClassifier, category_texts
    from ootd.weights.loading import load_image_encoder, load_image_processor, load_text_tower, load_tokenizer

    require_usable_torchvision()  # transformers imports it with CLIP: a mismatch is one line, not CLIP's error
    started = time.perf_counter()
    layout = Layout(Path(checkpoints))
    text_model, logit_scale = load_text_tower(layout, torch.float32)
    texts = category_texts(load_tokenizer(layout), text_model, logit_scale)
    del text_model
    gc.collect()
    encoder = load_image_encoder(layout, torch.float32).eval()
    return GarmentClassifier(texts, load_image_processor(layout), encoder, time.perf_counter() - started)


def encoder_files(checkpoints: Path | None) -> tuple[Path, ...]:
    """What `load_encoders` reads."""
    if checkpoints is None:
        return ()
    layout = Layout(checkpoints)
    return layout.vae, layout.tokenizer, layout.text_encoder, layout.clip


def load_encoders(checkpoints: Path, runtime: Runtime) -> Encoders:
    """The VAE and the CLIP encoders in the runtime's dtypes, on its device (no UNet)."""
    from ootd.weights import loading

    layout, dtypes, device = Layout(checkpoints), runtime.precision.dtypes(), runtime.device.torch_device
    return Encoders(
        vae=loading.load_vae(layout, dtypes["vae"]).to(device).eval(), tokenizer=loading.load_tokenizer(layout),
        text_encoder=loading.load_text_encoder(layout, dtypes["text_encoder"]).to(device).eval(),
        image_processor=loading.load_image_processor(layout),
        image_encoder=loading.load_image_encoder(layout, dtypes["image_encoder"]).to(device).eval(), device=device)


def training_files(checkpoints: Path | None, model_type: ModelType) -> tuple[Path, ...]:
    """What `load_training_components` reads."""
    if checkpoints is None:
        return ()
    layout = Layout(checkpoints)
    return (layout.vae, layout.unet_garm(model_type), layout.unet_vton(model_type), layout.scheduler,
            layout.model_index)


def load_training_components(checkpoints: Path, model_type: ModelType, runtime: Runtime) -> Components:
    """What a fine-tune runs: the two UNets in the trained dtype, the VAE in the runtime's, the scheduler config
    (no CLIP encoder: the prompt embeddings are in the cache)."""
    from ootd.weights import loading

    layout, dtype = Layout(checkpoints), runtime.precision.unet
    return loading.Components(
        tokenizer=None, text_encoder=None, image_encoder=None, image_processor=None,
        vae=loading.load_vae(layout, runtime.precision.vae),
        unet_garm=loading.load_unet(layout.unet_garm(model_type), layout, dtype, "garment UNet"),
        unet_vton=loading.load_unet(layout.unet_vton(model_type), layout, dtype, "try-on UNet"),
        scheduler_config=loading.load_scheduler_config(layout))


def load_metrics(weights: MetricWeights, device: torch.device,
                 source: Callable[[MetricWeights, Any], Networks] | None) -> Networks | None:
    """The evaluation's networks on `device` (or the source's); None without the eval extra."""
    if source is not None:
        return source(weights, device)
    from ootd.evaluation.networks import load_networks

    return load_networks(weights, device)
