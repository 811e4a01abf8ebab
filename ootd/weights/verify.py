"""Check a checkpoints folder file by file, cheaply, before a run fails an hour into a batch.

Each expected file (docs/upstream.md §1) is looked for and given the cheapest check that catches the usual damage:
truncated downloads, Git LFS pointer files instead of the data (a clone without LFS), hand-edited JSON.
Nothing is loaded into memory in full: safetensors headers, memory-mapped torch files, ONNX protobuf parsing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ootd.settings import ModelType
from ootd.weights.download import layout_path_to_repo_path, parse_models
from ootd.weights.layout import WEIGHT_NAMES, Layout

logger = logging.getLogger(__name__)

LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec"


@dataclass(frozen=True)
class FileCheck:
    """The verdict on one expected file. `fix` says what to do when not ok."""

    component: str  # e.g. "vae weights", "unet_vton (hd) config"
    path: Path
    present: bool
    size: int | None
    ok: bool
    problem: str | None = None
    fix: str | None = None


def _source_hint(root: Path, path: Path) -> str:
    """Where the file comes from on the hub, for the fix message."""
    try:
        rel = path.relative_to(root).as_posix()
    except ValueError:
        return ""
    source = layout_path_to_repo_path(rel)
    if source is None:
        return ""
    repo, repo_path = source
    return f"(hub: {repo}, file {repo_path})"


def _download_cmd(root: Path, models: Sequence[ModelType]) -> str:
    return f"ootd download --dest {root}"  # the command checkpoints.HOW_TO_GET names


def is_lfs_pointer(path: Path) -> bool:
    """True for a Git LFS pointer text file standing in for the real data."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(LFS_POINTER_PREFIX)) == LFS_POINTER_PREFIX
    except OSError:
        return False


def check_json(path: Path) -> str | None:
    """None if the file is a JSON object, else the problem."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except UnicodeDecodeError:
        return "not UTF-8 text (not a JSON file)"
    except json.JSONDecodeError as exc:
        return f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
    if not isinstance(data, dict):
        return f"JSON is a {type(data).__name__}, expected an object"
    return None


def check_text(path: Path) -> str | None:
    """Tokenizer text files (merges.txt): non-empty UTF-8."""
    try:
        with open(path, encoding="utf-8") as handle:
            head = handle.read(4096)
    except UnicodeDecodeError:
        return "not UTF-8 text"
    return None if head.strip() else "empty text file"


def check_safetensors(path: Path) -> str | None:
    """The header parses and covers the file exactly (a truncated file fails here) and lists tensors."""
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            keys = list(handle.keys())
    except Exception as exc:
        return f"unreadable safetensors file, probably truncated ({' '.join(str(exc).split())})"
    return None if keys else "safetensors file holds no tensors"


def check_torch_file(path: Path) -> str | None:
    """A .bin/.pth loads with weights_only (no code execution) and is a dict of tensors."""
    import torch

    try:
        try:
            data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            data = torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) format
    except Exception as exc:
        why = " ".join(str(exc).split())[:200]
        return f"cannot be loaded as a PyTorch state dict, probably truncated ({why})"
    if not isinstance(data, dict) or not data:
        return f"expected a non-empty dict of tensors, found {type(data).__name__}"
    bad = [key for key, value in data.items() if not isinstance(value, torch.Tensor)]
    if bad:
        return f"expected a dict of tensors, but {len(bad)} entries are not tensors (e.g. {bad[0]!r})"
    return None


def check_onnx(path: Path) -> str | None:
    """The protobuf parses and passes the ONNX checker (INVALID_PROTOBUF in ONNX Runtime otherwise)."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
        onnx.checker.check_model(model)
    except Exception as exc:
        return f"not a valid ONNX model, probably truncated ({' '.join(str(exc).split())[:200]})"
    return None


def _checker_for(path: Path) -> Callable[[Path], str | None]:
    name = path.name
    if name.endswith(".json"):
        return check_json
    if name.endswith(".safetensors"):
        return check_safetensors
    if name.endswith((".bin", ".pth", ".pt")):
        return check_torch_file
    if name.endswith(".onnx"):
        return check_onnx
    return check_text


def check_file(
    component: str, path: Path, root: Path, models: Sequence[ModelType], load: bool = True
) -> FileCheck:
    """Presence, size and (if `load`) the cheap loadability check of one file."""
    hint = _source_hint(root, path)
    get = f"run `{_download_cmd(root, models)}` or download it to {path} {hint}".strip()
    if not path.is_file():
        problem = "is a folder, not a file" if path.is_dir() else "missing"
        return FileCheck(component, path, False, None, False, problem, get)
    size = path.stat().st_size
    if size == 0:
        return FileCheck(component, path, True, 0, False, "empty file", f"delete it and {get}")
    weights_or_model = path.suffix in (".safetensors", ".bin", ".pth", ".pt", ".onnx")
    if weights_or_model and is_lfs_pointer(path):
        return FileCheck(
            component,
            path,
            True,
            size,
            False,
            "is a Git LFS pointer, not the file (the repository was cloned without LFS)",
            f"run `git lfs pull` in that clone, or delete it and {get}",
        )
    if load:
        problem = _checker_for(path)(path)
        if problem is not None:
            return FileCheck(component, path, True, size, False, problem, f"delete it and {get}")
    return FileCheck(component, path, True, size, True)


def find_weight_file(folder: Path, kind: str) -> Path | None:
    """The weight file loading would use (WEIGHT_NAMES order), or None."""
    for name in WEIGHT_NAMES[kind]:
        if (folder / name).is_file():
            return folder / name
    return None


def released_weight_name(root: Path, folder: Path, kind: str) -> str:
    """The weight file name the released layout has in `folder` (`pytorch_model.bin` for the text encoder,
    `diffusion_pytorch_model.bin` for the VAE, safetensors for the UNets and CLIP): what a missing file is
    listed as."""
    from ootd.weights.download import repo_path_to_layout_path, required_files

    for repo_id, paths in required_files(("hd", "dc")).items():
        for repo_path in paths:
            rel = repo_path_to_layout_path(repo_id, repo_path)
            if rel is not None and root / rel.parent == folder and rel.name in WEIGHT_NAMES[kind]:
                return rel.name
    return WEIGHT_NAMES[kind][0]


def _check_weights(component: str, folder: Path, kind: str, root: Path, models, load: bool) -> FileCheck:
    chosen = find_weight_file(folder, kind)
    if chosen is not None:
        return check_file(component, chosen, root, models, load)
    expected = " or ".join(WEIGHT_NAMES[kind])
    hint = _source_hint(root, folder / "config.json").replace("config.json", "*")
    return FileCheck(
        component,
        folder / released_weight_name(root, folder, kind),
        False,
        None,
        False,
        f"no weights in {folder} (expected {expected})",
        f"run `{_download_cmd(root, models)}` or download the weights into {folder} {hint}".strip(),
    )


def expected_files(layout: Layout, models: Sequence[ModelType]) -> list[tuple[str, Path | tuple[Path, str]]]:
    """(component, file) or (component, (folder, weight kind)) for every file a try-on needs."""
    items: list[tuple[str, Path | tuple[Path, str]]] = [
        ("pipeline model_index", layout.model_index),
        ("scheduler config", layout.scheduler / "scheduler_config.json"),
        ("text_encoder config", layout.text_encoder / "config.json"),
        ("text_encoder weights", (layout.text_encoder, "transformers")),
        ("tokenizer vocab", layout.tokenizer / "vocab.json"),
        ("tokenizer merges", layout.tokenizer / "merges.txt"),
        ("vae config", layout.vae / "config.json"),
        ("vae weights", (layout.vae, "diffusers")),
    ]
    for model in models:
        for name, folder in (("unet_garm", layout.unet_garm(model)), ("unet_vton", layout.unet_vton(model))):
            items.append((f"{name} ({model.value}) config", folder / "config.json"))
            items.append((f"{name} ({model.value}) weights", (folder, "diffusers")))
    items += [
        ("CLIP image encoder config", layout.clip / "config.json"),
        ("CLIP image encoder weights", (layout.clip, "transformers")),
        ("CLIP image processor config", layout.clip / "preprocessor_config.json"),
        ("human parsing ATR", layout.parsing_atr),
        ("human parsing LIP", layout.parsing_lip),
        ("OpenPose body model", layout.body_pose),
    ]
    return items


def verify_checkpoints(
    root: Path, models: Sequence[str | ModelType] = ("hd", "dc"), load: bool = True
) -> list[FileCheck]:
    """One FileCheck per expected file, in layout order. `load=False` checks presence and size only."""
    root = Path(root)
    chosen = parse_models(models)
    layout = Layout(root)
    checks = []
    for component, target in expected_files(layout, chosen):
        if isinstance(target, tuple):
            check = _check_weights(component, target[0], target[1], root, chosen, load)
        else:
            check = check_file(component, target, root, chosen, load)
        if not check.ok:
            logger.debug("%s: %s: %s", component, check.path, check.problem)
        checks.append(check)
    return checks
