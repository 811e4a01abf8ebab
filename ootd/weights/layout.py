"""The released checkpoint layout (docs/upstream.md §1) and finding the weight file in a component folder."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ootd.errors import CheckpointError
from ootd.settings import ModelType

HUB_REPO = "levihsu/OOTDiffusion"
CLIP_REPO = "openai/clip-vit-large-patch14"
CHECKPOINT_STEP = "checkpoint-36000"
ENV_CHECKPOINTS = "OOTD_CHECKPOINTS"

# Preference order when a folder holds several formats of the same weights.
WEIGHT_NAMES = {
    "diffusers": [
        "diffusion_pytorch_model.safetensors",
        "diffusion_pytorch_model.fp16.safetensors",
        "diffusion_pytorch_model.bin",
        "diffusion_pytorch_model.fp16.bin",
    ],
    "transformers": ["model.safetensors", "model.fp16.safetensors", "pytorch_model.bin", "pytorch_model.fp16.bin"],
}

HOW_TO_GET = (
    "run `ootd download --dest {root}` or fetch the files of the Hugging Face repos "
    f"{HUB_REPO} (its checkpoints/ folder) and {CLIP_REPO} into {{root}} (see checkpoints/README.md)"
)


def user_checkpoints_dir() -> Path:
    """The per-user checkpoints folder: `$XDG_DATA_HOME/ootd/checkpoints` (default `~/.local/share/...`) on
    Linux, `~/Library/Application Support/ootd/checkpoints` on macOS, `%LOCALAPPDATA%\\ootd\\checkpoints` on
    Windows. `ootd download` fills it when no ./checkpoints folder exists, so `ootd run` works from any folder."""
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "ootd" / "checkpoints"


def default_checkpoints_dir() -> Path:
    """$OOTD_CHECKPOINTS, else ./checkpoints when that folder exists, else the per-user folder."""
    env = os.environ.get(ENV_CHECKPOINTS)
    if env:
        return Path(env)
    local = Path("checkpoints")
    return local if local.is_dir() else user_checkpoints_dir()


@dataclass(frozen=True)
class Layout:
    """Paths of every component inside a checkpoints folder."""

    root: Path

    @property
    def ootd(self) -> Path:
        return self.root / "ootd"

    @property
    def model_index(self) -> Path:
        return self.ootd / "model_index.json"

    @property
    def scheduler(self) -> Path:
        return self.ootd / "scheduler"

    @property
    def text_encoder(self) -> Path:
        return self.ootd / "text_encoder"

    @property
    def tokenizer(self) -> Path:
        return self.ootd / "tokenizer"

    @property
    def vae(self) -> Path:
        return self.ootd / "vae"

    def unet_garm(self, model_type: ModelType) -> Path:
        return self.ootd / f"ootd_{model_type.value}" / CHECKPOINT_STEP / "unet_garm"

    def unet_vton(self, model_type: ModelType) -> Path:
        return self.ootd / f"ootd_{model_type.value}" / CHECKPOINT_STEP / "unet_vton"

    @property
    def clip(self) -> Path:
        return self.root / "clip-vit-large-patch14"

    @property
    def parsing_atr(self) -> Path:
        return self.root / "humanparsing" / "parsing_atr.onnx"

    @property
    def parsing_lip(self) -> Path:
        return self.root / "humanparsing" / "parsing_lip.onnx"

    @property
    def body_pose(self) -> Path:
        return self.root / "openpose" / "ckpts" / "body_pose_model.pth"

    def how_to_get(self) -> str:
        return HOW_TO_GET.format(root=self.root)


def require_file(path: Path, layout: Layout) -> Path:
    """Return path if it is a readable file (for .json: a UTF-8 JSON object), else a CheckpointError that says
    how to get it."""
    if not path.is_file():
        raise CheckpointError(f"missing checkpoint file {path}; {layout.how_to_get()}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint file {path} is empty; re-download it: {layout.how_to_get()}")
    if path.suffix == ".json":
        read_json(path, layout)
    return path


def read_json(path: Path, layout: Layout) -> dict:
    """A checkpoint's JSON file as a dict; anything else (not UTF-8, not JSON, not an object) is a
    CheckpointError, never a decoding error from deep inside a loader."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        problem = f"is not UTF-8 text (byte {exc.start}), so not a JSON file"
    except json.JSONDecodeError as exc:
        problem = f"is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
    except OSError as exc:
        problem = f"cannot be read ({exc.strerror or exc})"
    else:
        if isinstance(data, dict):
            return data
        problem = f"holds a JSON {type(data).__name__}, not an object"
    raise CheckpointError(f"checkpoint file {path} {problem}; replace it: {layout.how_to_get()}")


def find_weights(folder: Path, kind: str, layout: Layout) -> Path:
    """The weight file of a component folder, safetensors first, fp16 variants accepted."""
    require_file(folder / "config.json", layout)
    for name in WEIGHT_NAMES[kind]:
        candidate = folder / name
        if candidate.is_file():
            return require_file(candidate, layout)
    expected = " or ".join(WEIGHT_NAMES[kind])
    raise CheckpointError(f"no weights in {folder} (expected {expected}); {layout.how_to_get()}")


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read a block at a time (a UNet's weights are gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
