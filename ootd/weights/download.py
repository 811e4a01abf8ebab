"""Fetch exactly the released files the port needs from the Hugging Face hub into the docs/upstream.md §1 layout.

`levihsu/OOTDiffusion` keeps its files under `checkpoints/` in the repo; they land at `dest/ootd/...`,
`dest/humanparsing/...` and `dest/openpose/...`. `openai/clip-vit-large-patch14` lands at
`dest/clip-vit-large-patch14/`. Each repo is downloaded into a staging folder inside `dest` (same file system,
so moving files into place is a rename, and an interrupted download resumes from there), then moved.

The pattern and path mapping are pure functions, testable without a network.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

from ootd.errors import CheckpointError, UsageError
from ootd.hardware.units import size_text
from ootd.settings import ModelType
from ootd.weights.layout import CHECKPOINT_STEP, CLIP_REPO, HUB_REPO

logger = logging.getLogger(__name__)

CLIP_DIR = "clip-vit-large-patch14"
STAGING_DIR = ".download"  # inside dest; removed after a complete download
DISK_MARGIN = 256 * 2**20  # room kept free beyond the files themselves
_OOTD_PREFIX = "checkpoints/"
_OOTD_TOP_DIRS = ("ootd", "humanparsing", "openpose")

# Exactly what the port loads (ECOSYSTEM: checkpoints on the hub). The SCHP .pth files, the other CLIP weight
# formats (pytorch_model.bin, tf_model.h5, flax_model.msgpack) and the unused model type's UNets are left out.
_OOTD_COMMON = [
    "checkpoints/ootd/model_index.json",
    "checkpoints/ootd/scheduler/scheduler_config.json",
    "checkpoints/ootd/feature_extractor/preprocessor_config.json",
    "checkpoints/ootd/text_encoder/config.json",
    "checkpoints/ootd/text_encoder/pytorch_model.bin",
    "checkpoints/ootd/tokenizer/*.json",
    "checkpoints/ootd/tokenizer/*.txt",
    "checkpoints/ootd/vae/config.json",
    "checkpoints/ootd/vae/diffusion_pytorch_model.bin",
    "checkpoints/humanparsing/*.onnx",
    "checkpoints/openpose/ckpts/body_pose_model.pth",
]
_CLIP = ["*.json", "*.txt", "model.safetensors"]

# Files that must exist after a download (the globs above must yield at least these).
_OOTD_REQUIRED_COMMON = [p for p in _OOTD_COMMON if "*" not in p] + [
    "checkpoints/ootd/tokenizer/vocab.json",
    "checkpoints/ootd/tokenizer/merges.txt",
    "checkpoints/humanparsing/parsing_atr.onnx",
    "checkpoints/humanparsing/parsing_lip.onnx",
]
_CLIP_REQUIRED = ["config.json", "preprocessor_config.json", "model.safetensors"]


def parse_models(models: Iterable[str | ModelType]) -> list[ModelType]:
    """hd/dc words to ModelTypes, in order, without duplicates."""
    out: list[ModelType] = []
    for model in models:
        value = ModelType.parse(model)
        if value not in out:
            out.append(value)
    if not out:
        raise UsageError("no model type chosen: use hd and/or dc")
    return out


def _unet_files(model: ModelType) -> list[str]:
    base = f"checkpoints/ootd/ootd_{model.value}/{CHECKPOINT_STEP}"
    return [
        f"{base}/{unet}/{name}"
        for unet in ("unet_garm", "unet_vton")
        for name in ("config.json", "diffusion_pytorch_model.safetensors")
    ]


def _per_repo(models: Sequence[str | ModelType], common: list[str], clip: list[str]) -> dict[str, list[str]]:
    ootd = list(common)
    for model in parse_models(models):
        ootd += _unet_files(model)
    return {HUB_REPO: ootd, CLIP_REPO: list(clip)}


def allow_patterns(models: Sequence[str | ModelType] = ("hd", "dc")) -> dict[str, list[str]]:
    """snapshot_download allow_patterns per repo (fnmatch globs against full repo paths)."""
    return _per_repo(models, _OOTD_COMMON, _CLIP)


def required_files(models: Sequence[str | ModelType] = ("hd", "dc")) -> dict[str, list[str]]:
    """Repo paths that a complete download must have produced, per repo."""
    return _per_repo(models, _OOTD_REQUIRED_COMMON, _CLIP_REQUIRED)


def repo_path_to_layout_path(repo_id: str, repo_path: str) -> PurePosixPath | None:
    """Where a repo file goes, relative to the checkpoints root; None for files outside the layout."""
    path = PurePosixPath(repo_path)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        return None
    if repo_id == HUB_REPO:
        if not repo_path.startswith(_OOTD_PREFIX) or len(path.parts) < 3:
            return None
        rel = PurePosixPath(*path.parts[1:])
        return rel if rel.parts[0] in _OOTD_TOP_DIRS else None
    if repo_id == CLIP_REPO:
        return PurePosixPath(CLIP_DIR, *path.parts)
    return None


def layout_path_to_repo_path(rel_path: str | PurePosixPath) -> tuple[str, str] | None:
    """The (repo, repo path) a layout file comes from: the inverse of `repo_path_to_layout_path`."""
    path = PurePosixPath(rel_path)
    if not path.parts or path.is_absolute() or ".." in path.parts:
        return None
    if path.parts[0] == CLIP_DIR and len(path.parts) > 1:
        return CLIP_REPO, str(PurePosixPath(*path.parts[1:]))
    if path.parts[0] in _OOTD_TOP_DIRS and len(path.parts) > 1:
        return HUB_REPO, _OOTD_PREFIX + str(path)
    return None


def _matches(repo_path: str, patterns: Iterable[str]) -> bool:
    return any(fnmatchcase(repo_path, pattern) for pattern in patterns)


def _layout_files_of(dest: Path, repo_id: str) -> list[tuple[str, Path]]:
    """(repo path, file) for every file already in the layout that comes from repo_id."""
    tops = _OOTD_TOP_DIRS if repo_id == HUB_REPO else (CLIP_DIR,)
    found = []
    for top in tops:
        base = dest / top
        if not base.is_dir():
            continue
        for file in base.rglob("*"):
            if not file.is_file() or ".cache" in file.relative_to(dest).parts:
                continue
            source = layout_path_to_repo_path(file.relative_to(dest).as_posix())
            if source is not None and source[0] == repo_id:
                found.append((source[1], file))
    return found


def _missing(dest: Path, repo_id: str, repo_paths: Iterable[str]) -> list[Path]:
    out = []
    for repo_path in repo_paths:
        rel = repo_path_to_layout_path(repo_id, repo_path)
        assert rel is not None, repo_path
        target = dest / rel
        if not target.is_file() or target.stat().st_size == 0:
            out.append(target)
    return out


def _offline() -> bool:
    try:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            return True
    except ImportError:
        pass
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def fetch_instructions(dest: Path, models: Sequence[str | ModelType] = ("hd", "dc")) -> str:
    """One line saying which hub files to put where, for users who fetch them by hand."""
    patterns = allow_patterns(models)
    ootd = ", ".join(p.removeprefix(_OOTD_PREFIX) for p in patterns[HUB_REPO])
    clip = ", ".join(patterns[CLIP_REPO])
    return (
        f"fetch from https://huggingface.co/{HUB_REPO} the files {ootd} (under its checkpoints/ folder) "
        f"into {dest}/, "
        f"and from https://huggingface.co/{CLIP_REPO} the files {clip} into {dest / CLIP_DIR}/"
    )


def _hub_error(exc: BaseException, repo_id: str, revision: str | None, dest: Path, models) -> CheckpointError:
    """One line for any failure of the hub client: what went wrong and how to get the files anyway."""
    from huggingface_hub import errors as hub_errors

    cause = _short_cause(exc)
    if isinstance(exc, hub_errors.RevisionNotFoundError):
        return CheckpointError(f"revision {revision!r} not found in {repo_id} on the Hugging Face hub ({cause})")
    if isinstance(exc, hub_errors.GatedRepoError | hub_errors.RepositoryNotFoundError):
        return CheckpointError(f"cannot access {repo_id} on the Hugging Face hub ({cause}); check HF_TOKEN")
    chain, link = [], exc
    while link is not None and len(chain) < 8:
        chain.append(link)
        link = link.__cause__ or link.__context__
    if any(isinstance(e, hub_errors.OfflineModeIsEnabled) for e in chain) or _offline():
        why = "offline mode is on (HF_HUB_OFFLINE)"
    else:
        why = "the Hugging Face hub could not be reached"
    return CheckpointError(f"cannot download {repo_id}: {why} ({cause}); {BY_HAND.format(dest=dest)}")


BY_HAND = "retry online, or fetch the files into {dest} by hand (`ootd download --list` says which go where)"


def _short_cause(exc: BaseException) -> str:
    """The root of an exception chain in a few words (the hub client's own messages run to paragraphs)."""
    link: BaseException = exc
    for _ in range(8):
        nxt = link.__cause__ or link.__context__
        if nxt is None:
            break
        link = nxt
    text = " ".join(str(link).split())
    first = text.split(". ")[0]
    return f"{type(link).__name__}: {first[:120]}"


def file_list(dest: Path, models: Sequence[str | ModelType] = ("hd", "dc")) -> list[tuple[str, Path]]:
    """(hub URL, local path) of every file a download must produce: for fetching by hand."""
    rows = []
    for repo_id, paths in required_files(models).items():
        for repo_path in paths:
            rel = repo_path_to_layout_path(repo_id, repo_path)
            if rel is not None:
                rows.append((f"https://huggingface.co/{repo_id}/resolve/main/{repo_path}", Path(dest) / rel))
    return rows


def remote_size(repo_id: str, patterns: list[str], present: Iterable[str], revision: str | None) -> int | None:
    """Bytes the files still to fetch take on the hub (None when the hub cannot say: the download reports
    that error itself)."""
    try:
        import huggingface_hub

        info = huggingface_hub.HfApi().model_info(repo_id, revision=revision, files_metadata=True)
    except Exception as exc:
        if not _is_hub_failure(exc):
            raise
        logger.debug("size of %s unknown: %s", repo_id, _short_cause(exc))
        return None
    skip = set(present)
    return sum(int(s.size or 0) for s in (info.siblings or [])
               if _matches(s.rfilename, patterns) and s.rfilename not in skip)


def _prune_empty(folder: Path, keep: Path | None) -> None:
    """Remove empty folders under `folder` (and `folder` itself unless it is `keep`): a failed download leaves
    nothing empty behind, while partial files stay for the resume."""
    if not folder.is_dir():
        return
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        _remove_if_empty(sub)
    if folder != keep:
        _remove_if_empty(folder)


def _is_hub_failure(exc: BaseException) -> bool:
    module = type(exc).__module__.split(".")[0]
    return isinstance(exc, OSError | ValueError) or module in {
        "huggingface_hub",
        "httpx",
        "httpx2",
        "requests",
        "urllib3",
    }


def _move_into_layout(staging: Path, dest: Path, repo_id: str, patterns: list[str]) -> list[Path]:
    moved = []
    for file in sorted(staging.rglob("*")):
        rel_staging = file.relative_to(staging)
        if not file.is_file() or rel_staging.parts[0] == ".cache":
            continue
        repo_path = rel_staging.as_posix()
        rel = repo_path_to_layout_path(repo_id, repo_path)
        if rel is None or not _matches(repo_path, patterns):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(file, target)
        moved.append(target)
    return moved


def download_checkpoints(
    dest: Path,
    models: Sequence[str | ModelType] = ("hd", "dc"),
    revision: str | None = None,
    progress: bool = True,
    *,
    clip_revision: str | None = None,
    force: bool = False,
    on_size: Callable[[str, int | None, int], None] | None = None,
) -> list[Path]:
    """Download the checkpoint files for `models` into `dest`; returns every layout file the download covers.

    `revision` pins levihsu/OOTDiffusion (a 40-hex commit for reproducibility), `clip_revision` pins the CLIP
    repo (their commits differ). Files already in place are not fetched again unless `force`. Before each repo,
    the size still to fetch is asked of the hub and checked against the free disk space; `on_size(repo, bytes or
    None, free bytes)` hears it. A failed download leaves no empty folder behind (partial files stay, to resume).
    Raises CheckpointError (one line) when the hub cannot be used or the disk is too small.
    """
    dest = Path(dest)
    chosen = parse_models(models)
    existed = dest.exists()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot create checkpoints folder {dest}: {exc.strerror or exc}") from None
    try:
        for repo_id in allow_patterns(chosen):
            _download_repo(dest, repo_id, chosen, revision if repo_id == HUB_REPO else clip_revision, progress,
                           force, on_size)
    except BaseException:
        _prune_empty(dest, keep=dest if existed else None)
        raise
    _remove_if_empty(dest / STAGING_DIR)
    covered = []
    for repo_id, repo_patterns in allow_patterns(chosen).items():
        covered += [file for path, file in _layout_files_of(dest, repo_id) if _matches(path, repo_patterns)]
    return sorted(covered)


def _download_repo(dest: Path, repo_id: str, chosen: list[ModelType], revision: str | None, progress: bool,
                   force: bool, on_size: Callable[[str, int | None, int], None] | None) -> None:
    """One repo: skip when complete, refuse offline or without room, fetch into staging, move into place."""
    repo_patterns = allow_patterns(chosen)[repo_id]
    required = required_files(chosen)[repo_id]
    missing = _missing(dest, repo_id, required)
    if not missing and not force:
        logger.info("%s: all files already in %s", repo_id, dest)
        return
    if _offline():
        what = f"{len(missing)} file(s) are missing" if missing else "a fresh copy was asked for"
        raise CheckpointError(
            f"cannot download {repo_id}: offline mode is on (HF_HUB_OFFLINE) and {what}; {BY_HAND.format(dest=dest)}"
        )
    present = [] if force else [p for p, _ in _layout_files_of(dest, repo_id) if _matches(p, repo_patterns)]
    need = remote_size(repo_id, repo_patterns, present, revision)
    free = shutil.disk_usage(dest).free
    if on_size is not None:
        on_size(repo_id, need, free)
    if need is not None and need + DISK_MARGIN > free:
        raise CheckpointError.about(
            "dest", "not enough free disk space in {folder}: {repo} needs {need} and {free} is free; free some "
            "space or choose another {@dest}", value=dest, folder=dest, repo=repo_id, need=size_text(need),
            free=size_text(free))
    staging = dest / STAGING_DIR / repo_id.replace("/", "--")
    logger.info("downloading %s into %s", repo_id, dest)
    _snapshot(repo_id, repo_patterns, [glob.escape(p) for p in present], staging, revision, progress, dest, chosen)
    try:
        moved = _move_into_layout(staging, dest, repo_id, repo_patterns)
    except OSError as exc:
        raise CheckpointError(f"cannot move downloaded files into {dest}: {exc}") from None
    logger.info("%s: %d file(s) placed", repo_id, len(moved))
    still_missing = _missing(dest, repo_id, required)
    if still_missing:
        names = ", ".join(str(p) for p in still_missing[:4]) + (" ..." if len(still_missing) > 4 else "")
        raise CheckpointError(
            f"download of {repo_id} incomplete: missing {names}; run the download again (it resumes) or put the "
            f"files in {dest} by hand (`ootd download --list`)"
        )
    shutil.rmtree(staging, ignore_errors=True)


def _snapshot(repo_id, patterns, ignore, staging: Path, revision, progress: bool, dest: Path, models) -> None:
    """snapshot_download into the staging folder, its errors turned into one CheckpointError line."""
    try:
        import huggingface_hub
        from huggingface_hub.utils import (
            are_progress_bars_disabled,
            disable_progress_bars,
            enable_progress_bars,
        )
    except ImportError:
        raise CheckpointError(
            "huggingface_hub is not installed (pip install huggingface_hub); " + fetch_instructions(dest, models)
        ) from None
    was_disabled = are_progress_bars_disabled()
    if not progress:
        disable_progress_bars()
    try:
        huggingface_hub.snapshot_download(
            repo_id,
            allow_patterns=patterns,
            ignore_patterns=ignore or None,
            local_dir=staging,
            revision=revision,
        )
    except Exception as exc:
        if not _is_hub_failure(exc):
            raise
        raise _hub_error(exc, repo_id, revision, dest, models) from None
    finally:
        if not progress and not was_disabled:
            enable_progress_bars()


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass
