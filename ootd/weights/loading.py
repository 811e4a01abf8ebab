"""Build each component from its own subfolder of the released tree with stock classes.

The released `model_index.json` names the original's own Python modules for the UNets, so the
folder is never handed to `DiffusionPipeline.from_pretrained`; every component is loaded on its
own, and every failure becomes a CheckpointError that names the file and how to get it. Loading is strict:
the libraries' own loading report must show every key matched and the weights must be finite
(ootd/weights/integrity.py), so a file from another model or a damaged one never runs on random or NaN weights.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ootd.errors import CheckpointError, printable
from ootd.settings import ModelType
from ootd.weights.integrity import check_finite_weights, check_loading_info
from ootd.weights.layout import Layout, find_weights, read_json, require_file

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("vocab.json", "merges.txt")
# The CLIP checkpoint is the whole CLIP model; the image encoder leaves its text tower unused ...
CLIP_TEXT_TOWER = r"text_model\.|text_projection\.|logit_scale$"
# ... and the text tower (loaded for `--category auto` only) its image tower; logit_scale is read on its own
CLIP_IMAGE_TOWER = r"vision_model\.|visual_projection\.|logit_scale$"
TEXT_TOWER_KEYS = ("text_model.", "text_projection.weight", "logit_scale")


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Keep load reports, per-key notices and deprecation warnings out of the terminal unless -v."""
    if logging.getLogger("ootd").isEnabledFor(logging.DEBUG):
        yield
        return
    import diffusers.utils.logging as dlog
    import transformers.utils.logging as tlog

    saved = (dlog.get_verbosity(), tlog.get_verbosity())
    dlog.set_verbosity_error()
    tlog.set_verbosity_error()
    dlog.disable_progress_bar()
    tlog.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        dlog.set_verbosity(saved[0])
        tlog.set_verbosity(saved[1])
        dlog.enable_progress_bar()
        tlog.enable_progress_bar()


def _variant(weights: Path) -> str | None:
    return "fp16" if ".fp16." in weights.name else None


def _format_kwargs(weights: Path) -> dict:
    """Point the loader at the file we found, so it does not go looking for other formats."""
    return {"variant": _variant(weights), "use_safetensors": weights.suffix == ".safetensors"}


def _load(what: str, weights: Path, layout: Layout, fn):  # noqa: ANN001, ANN202
    try:
        with quiet_loading():
            return fn()
    except CheckpointError:
        raise
    except Exception as exc:  # any loader failure is a bad checkpoint file from the user's point of view
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"cannot load the {what} from {printable(weights)}: {reason[:300]}; the file may be truncated or corrupt, "
            f"re-download it ({layout.how_to_get()})"
        ) from exc


def _load_strict(  # noqa: ANN202
    what: str, weights: Path, layout: Layout, fn, allowed_unexpected: str | None = None  # noqa: ANN001
):
    """`fn` loads with output_loading_info=True; the model is returned only if every key matched and every
    weight is finite."""
    model, info = _load(what, weights, layout, fn)
    check_loading_info(what, weights, info, layout.how_to_get(), allowed_unexpected)
    check_finite_weights(what, weights, model, layout.how_to_get())
    return model


def load_tokenizer(layout: Layout):  # noqa: ANN201
    from transformers import CLIPTokenizer

    for name in TOKENIZER_FILES:
        require_file(layout.tokenizer / name, layout)
    return _load("tokenizer", layout.tokenizer, layout, lambda: CLIPTokenizer.from_pretrained(layout.tokenizer))


def load_text_encoder(layout: Layout, dtype: torch.dtype):  # noqa: ANN201
    from transformers import CLIPTextModel

    weights = find_weights(layout.text_encoder, "transformers", layout)
    return _load_strict(
        "text encoder", weights, layout,
        lambda: CLIPTextModel.from_pretrained(layout.text_encoder, dtype=dtype, output_loading_info=True,
                                              **_format_kwargs(weights)),
    )


def load_image_encoder(layout: Layout, dtype: torch.dtype):  # noqa: ANN201
    from transformers import CLIPVisionModelWithProjection

    weights = find_weights(layout.clip, "transformers", layout)
    return _load_strict(
        "CLIP image encoder", weights, layout,
        lambda: CLIPVisionModelWithProjection.from_pretrained(layout.clip, dtype=dtype, output_loading_info=True,
                                                              **_format_kwargs(weights)),
        allowed_unexpected=CLIP_TEXT_TOWER,
    )


def check_text_tower(layout: Layout) -> Path:
    """The CLIP weights file, if it holds the text tower and logit scale `--category auto` needs (read from the
    file's index, nothing loaded); else one CheckpointError saying so and what to do."""
    from safetensors import safe_open

    weights = find_weights(layout.clip, "transformers", layout)
    config = read_json(layout.clip / "config.json", layout)
    # the category `auto` asks for the text tower: the error is about that setting, and each front end names it
    fix = ("{@category} auto needs the whole CLIP model (text tower included, as openai/clip-vit-large-patch14 "
           "ships it): re-download it ({how}), or give the category with {@category}")
    how = layout.how_to_get()
    if not isinstance(config, dict) or not isinstance(config.get("text_config"), dict):
        raise CheckpointError.about("category", "{file} describes no CLIP text tower; " + fix, value="auto",
                                    file=printable(layout.clip / "config.json"), how=how)
    if weights.suffix != ".safetensors":
        return weights  # a pickled file has no index: the strict load below names what is missing
    try:
        with safe_open(str(weights), framework="pt") as handle:
            keys = list(handle.keys())
    except Exception as exc:  # noqa: BLE001 - an unreadable index is a damaged file
        raise CheckpointError(f"cannot read {printable(weights)}: {exc}; {layout.how_to_get()}") from exc
    absent = [key for key in TEXT_TOWER_KEYS if not any(k.startswith(key) for k in keys)]
    if absent:
        raise CheckpointError.about("category", "{file} has no CLIP text tower ({absent} missing); " + fix,
                                    value="auto", file=printable(weights), absent=", ".join(absent), how=how)
    return weights


def load_text_tower(layout: Layout, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, float]:
    """CLIP's text tower with its projection (stock CLIPTextModelWithProjection, strict) and the stored logit
    scale, from the CLIP folder the image encoder comes from."""
    from transformers import CLIPTextModelWithProjection

    weights = check_text_tower(layout)
    model = _load_strict(
        "CLIP text tower", weights, layout,
        lambda: CLIPTextModelWithProjection.from_pretrained(layout.clip, dtype=dtype, output_loading_info=True,
                                                            **_format_kwargs(weights)),
        allowed_unexpected=CLIP_IMAGE_TOWER,
    )
    if weights.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt") as handle:
            scale = float(handle.get_tensor("logit_scale").float().reshape(-1)[0])
    else:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        if "logit_scale" not in state:
            raise CheckpointError(f"{printable(weights)} has no logit_scale; {layout.how_to_get()}")
        scale = float(state["logit_scale"].float().reshape(-1)[0])
    if scale != scale or abs(scale) == float("inf"):
        raise CheckpointError(f"the CLIP logit scale in {printable(weights)} is not finite; {layout.how_to_get()}")
    return model, scale


def load_image_processor(layout: Layout):  # noqa: ANN201
    try:  # the PIL-based processor is the one the original ran (newer ones may use torchvision)
        from transformers import CLIPImageProcessorPil as Processor
    except ImportError:
        from transformers import CLIPImageProcessor as Processor

    config = require_file(layout.clip / "preprocessor_config.json", layout)
    return _load("CLIP image processor", config, layout, lambda: Processor.from_pretrained(layout.clip))


def load_vae(layout: Layout, dtype: torch.dtype):  # noqa: ANN201
    from diffusers import AutoencoderKL

    weights = find_weights(layout.vae, "diffusers", layout)
    return _load_strict(
        "VAE", weights, layout,
        lambda: AutoencoderKL.from_pretrained(layout.vae, torch_dtype=dtype, output_loading_info=True,
                                              **_format_kwargs(weights)),
    )


def load_unet(folder: Path, layout: Layout, dtype: torch.dtype, what: str):  # noqa: ANN201
    """Stock UNet2DConditionModel: the released UNets keep the stock parameters under custom class names."""
    from diffusers import UNet2DConditionModel

    weights = find_weights(folder, "diffusers", layout)
    return _load_strict(
        what, weights, layout,
        lambda: UNet2DConditionModel.from_pretrained(folder, torch_dtype=dtype, output_loading_info=True,
                                                     **_format_kwargs(weights)),
    )


def load_scheduler_config(layout: Layout) -> dict:
    """The scheduler config as the original sees it: read by the class the pipeline folder names.

    Keys absent from the file take that class's defaults (e.g. PNDM's "leading" spacing),
    which is what the released weights were used with (docs/upstream.md §4).
    """
    import diffusers

    config_file = require_file(layout.scheduler / "scheduler_config.json", layout)
    index_file = require_file(layout.model_index, layout)
    index = read_json(index_file, layout)
    try:
        class_name = index.get("scheduler", [None, "PNDMScheduler"])[1]
    except (AttributeError, IndexError, TypeError) as exc:
        raise CheckpointError(f"cannot parse {index_file}: {exc}; {layout.how_to_get()}") from exc
    cls = getattr(diffusers, str(class_name), None)
    if cls is None or not hasattr(cls, "from_pretrained"):
        raise CheckpointError(f"{index_file} names an unknown scheduler class {class_name!r}")
    base = _load("scheduler config", config_file, layout, lambda: cls.from_pretrained(layout.scheduler))
    config = dict(base.config)
    # diffusers marks the keys that took the reading class's defaults and drops them when another class
    # reads the config; the original's diffusers kept them, so the defaults must stay.
    config.pop("_use_default_values", None)
    return config


@dataclass
class Components:
    """Every network and helper object one try-on needs (a fine-tune's have no CLIP encoders: None)."""

    tokenizer: object
    text_encoder: torch.nn.Module | None
    image_encoder: torch.nn.Module | None
    image_processor: object
    vae: torch.nn.Module
    unet_garm: torch.nn.Module
    unet_vton: torch.nn.Module
    scheduler_config: dict


def load_components(root: Path, model_type: ModelType | str, dtypes: dict[str, torch.dtype],
                    progress: Callable[[str, int, int], None] | None = None) -> Components:
    """Load every component of one model type (hd or dc) onto the CPU in the given dtypes. `progress` hears
    ("load", done, total) after each component, for a progress bar."""
    model_type = ModelType(model_type)
    layout = Layout(Path(root))
    if not layout.root.is_dir():
        raise CheckpointError(f"checkpoints folder {layout.root} does not exist; {layout.how_to_get()}")
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("tokenizer", lambda: load_tokenizer(layout)),
        ("text_encoder", lambda: load_text_encoder(layout, dtypes["text_encoder"])),
        ("image_encoder", lambda: load_image_encoder(layout, dtypes["image_encoder"])),
        ("image_processor", lambda: load_image_processor(layout)),
        ("vae", lambda: load_vae(layout, dtypes["vae"])),
        ("unet_garm", lambda: load_unet(layout.unet_garm(model_type), layout, dtypes["unet"], "garment UNet")),
        ("unet_vton", lambda: load_unet(layout.unet_vton(model_type), layout, dtypes["unet"], "try-on UNet")),
        ("scheduler_config", lambda: load_scheduler_config(layout)),
    ]
    loaded: dict[str, Any] = {}
    for done, (name, load) in enumerate(steps, 1):
        loaded[name] = load()
        if progress is not None:
            progress("load", done, len(steps))
    return Components(**loaded)
