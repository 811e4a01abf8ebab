"""Is a checkpoints tree the released OOTDiffusion models, or something else of the same layout?

A tree of tiny random weights (tests, the quickstart) passes every file check and loads, yet its pictures are
noise. This compares each component's config dimensions and, where cheap, its parameter count with the
released architectures (SD1.5 UNets with 4 and 8 input channels, the SD VAE, CLIP ViT-L/14 text and vision;
docs/upstream.md §1), so `ootd checkpoints verify` and `ootd doctor` can say plainly when a tree is not the
released one. A difference is a warning, never a failure: such trees are legitimate for tests.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ootd.settings import ModelType
from ootd.weights.layout import Layout
from ootd.weights.released import RELEASED_PARAMETERS, RELEASED_UNET_CONFIG, RELEASED_VAE_CONFIG

# config key -> released value, per component (nested keys with dots)
_UNET = {k: RELEASED_UNET_CONFIG[k] for k in ("block_out_channels", "layers_per_block", "cross_attention_dim")}
_VAE = {k: RELEASED_VAE_CONFIG[k] for k in ("block_out_channels", "latent_channels", "layers_per_block")}
_TEXT = {"hidden_size": 768, "num_hidden_layers": 12, "intermediate_size": 3072}
_VISION = {"vision_config.hidden_size": 1024, "vision_config.num_hidden_layers": 24, "projection_dim": 768}


@dataclass(frozen=True)
class Difference:
    """One way a component differs from the released one."""

    component: str  # e.g. "unet_vton (hd)"
    what: str  # e.g. "block_out_channels"
    found: Any
    released: Any

    def __str__(self) -> str:
        return f"{self.component} {self.what} {_show(self.found)} (released: {_show(self.released)})"


def _show(value: Any) -> str:
    if isinstance(value, int) and value >= 10_000:
        return f"{value:,}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def _config(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # missing or broken: the file checks report it
    return data if isinstance(data, dict) else None


def _get(config: dict[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return list(value) if isinstance(value, tuple) else value


def _compare_config(component: str, path: Path, expected: dict[str, Any]) -> list[Difference]:
    config = _config(path)
    if config is None:
        return []
    out = []
    for key, released in expected.items():
        found = _get(config, key)
        released = list(released) if isinstance(released, tuple) else released
        if found is not None and found != released:
            out.append(Difference(component, key, found, released))
    return out


def safetensors_params(path: Path, prefixes: Sequence[str] = ()) -> int | None:
    """Parameter count from a safetensors header alone (no tensor is read); only keys with one of `prefixes`
    when given."""
    try:
        with open(path, "rb") as handle:
            length = struct.unpack("<Q", handle.read(8))[0]
            if length > 100 * 2**20:
                return None
            header = json.loads(handle.read(length))
    except (OSError, ValueError, struct.error):
        return None
    total = 0
    for key, entry in header.items():
        if key == "__metadata__" or (prefixes and not key.startswith(tuple(prefixes))):
            continue
        count = 1
        for dim in entry.get("shape", []):
            count *= int(dim)
        total += count
    return total


def torch_file_params(path: Path) -> int | None:
    """Parameter count of a .bin state dict, memory-mapped (buffers such as position_ids left out)."""
    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - unreadable: the file checks report it
        return None
    if not isinstance(data, dict):
        return None
    return sum(v.numel() for k, v in data.items() if isinstance(v, torch.Tensor) and not k.endswith("position_ids"))


def _weights(folder: Path) -> Path | None:
    for name in ("diffusion_pytorch_model.safetensors", "model.safetensors", "diffusion_pytorch_model.bin",
                 "pytorch_model.bin"):
        if (folder / name).is_file():
            return folder / name
    return None


def _params(folder: Path, count_bin: bool) -> int | None:
    path = _weights(folder)
    if path is None:
        return None
    if path.suffix == ".safetensors":
        return safetensors_params(path)
    return torch_file_params(path) if count_bin else None


def compare_to_released(root: Path, models: Sequence[ModelType | str] = ("hd", "dc"),
                        count_params: bool = True) -> list[Difference]:
    """Every difference between the tree at `root` and the released models (empty: the released ones).

    Config dimensions always; parameter counts from safetensors headers, and from memory-mapped .bin files
    when `count_params` (a few seconds for the released text encoder and VAE)."""
    layout = Layout(Path(root))
    diffs = _compare_config("text_encoder", layout.text_encoder / "config.json", _TEXT)
    diffs += _compare_config("vae", layout.vae / "config.json", _VAE)
    diffs += _compare_config("CLIP image encoder", layout.clip / "config.json", _VISION)
    counted = [("text_encoder", layout.text_encoder, RELEASED_PARAMETERS["text_encoder"]),
               ("vae", layout.vae, RELEASED_PARAMETERS["vae"])]
    for model in (ModelType(str(getattr(m, "value", m))) for m in models):
        for name, folder, channels, params in (
            ("unet_garm", layout.unet_garm(model), 4, RELEASED_PARAMETERS["unet_garm"]),
            ("unet_vton", layout.unet_vton(model), 8, RELEASED_PARAMETERS["unet_vton"]),
        ):
            component = f"{name} ({model.value})"
            diffs += _compare_config(component, folder / "config.json", {**_UNET, "in_channels": channels})
            counted.append((component, folder, params))
    if not diffs:  # a different architecture already says it all; counts only catch what configs hide
        for component, folder, released in counted:
            found = _params(folder, count_params)
            if found is not None and found != released:
                diffs.append(Difference(component, "parameters", found, released))
    return diffs


def summary(diffs: Sequence[Difference], limit: int = 3) -> str:
    """`not the released OOTDiffusion models: a; b; c (and N more)`, one difference per component shown."""
    first: dict[str, Difference] = {}
    for diff in diffs:
        first.setdefault(diff.component, diff)
    shown = "; ".join(str(d) for d in list(first.values())[:limit])
    more = f" (and {len(diffs) - min(limit, len(first))} more differences)" if len(diffs) > limit else ""
    return f"not the released OOTDiffusion models: {shown}{more}"
