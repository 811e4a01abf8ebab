"""Compare two folders of images pixel by pixel: how far a speed mode (or any other change) moves the results.

Images are paired by file name. For each pair: PSNR (dB, over all RGB values, 8-bit range), SSIM (the Wang et
al. 2004 form with an 11x11 Gaussian window, sigma 1.5, K1 0.01, K2 0.03, computed per RGB channel and averaged,
the 5-pixel border excluded, as scikit-image's `structural_similarity(..., gaussian_weights=True)` does) and the
largest and mean absolute difference in pixel levels; the summary counts the identical pairs and averages the
others. Each is computed a strip of rows at a time (SSIM's strips read the window's radius more on each side),
so memory stays a strip's worth at any image size and the values are the whole-image ones. Pairs that cannot be
compared (a file missing on one side, different sizes, an unreadable file, one that is not a regular file, one
over the input limit of 50 megapixels: the checks of `ootd run`'s image loading) are reported as problems, not
errors.

By default only results are compared: the pictures ootd writes beside them (pose, parsing, mask, masked person,
contact sheets, `ootd mask`'s files), known by their PNG record (ours, without a sample number), are left out and
listed as skipped, since identical masks and grids would pull the averages towards "identical".

Metrics against real photos (LPIPS, FID, KID, and this SSIM per pair) are `ootd eval`'s (ootd/evaluation/,
ootd/app/evaluate/).

Preservation (docs/preservation.md): where a folder's results were measured against their person photos (a
batch measures each pair it makes; `ootd eval DIR --preservation` writes DIR/preservation.jsonl), each pair shows
both sides' figures, and the summary the mean of each side's score (the share of the worst region outside the
mask that changed) over the pairs measured on both sides, and in how many B changed more: how a speed mode or an
adapter moves what the try-on should keep, on the same pairs. Nothing is measured here.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from PIL import Image

from ootd.app.evaluate.preservation import recorded_figures
from ootd.app.tryon.provenance import is_intermediate_record, is_ours, read_record, setting_changes
from ootd.errors import InputImageError, OotdError, UsageError, printable
from ootd.evaluation.preservation import Preservation
from ootd.imaging.opener import open_image
from ootd.imaging.similarity import differences, psnr, ssim


@dataclass(frozen=True)
class ImageComparison:
    """One pair of same-named images: the metrics, or why they could not be compared (`problem`)."""

    name: str
    psnr: float | None = None
    ssim: float | None = None
    max_abs: int | None = None
    mean_abs: float | None = None
    problem: str | None = None
    settings: dict[str, tuple[str, str]] = field(default_factory=dict)  # what the two records say differently
    kept: tuple[Preservation | None, Preservation | None] = (None, None)  # each side's preservation figures

    def to_dict(self) -> dict[str, object]:
        kept = {"preservation": {side: {"score": p.score, "summary": p.summary()} if p is not None else None
                                 for side, p in zip("ab", self.kept, strict=True)}} if any(self.kept) else {}
        if self.problem is not None:
            return {"name": self.name, "problem": self.problem, **kept}
        return {"name": self.name, "psnr": _json_number(self.psnr), "ssim": self.ssim, "max_abs": self.max_abs,
                "mean_abs": self.mean_abs, "settings": {k: list(v) for k, v in self.settings.items()}, **kept}


@dataclass(frozen=True)
class FolderComparison:
    """Every pair of two folders; `summary` counts the identical pairs and averages the others, so one identical
    pair does not make the mean PSNR infinite. `skipped`: the names left out as intermediates (see the module
    docstring)."""

    a_dir: Path
    b_dir: Path
    images: list[ImageComparison] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def compared(self) -> list[ImageComparison]:
        return [c for c in self.images if c.problem is None]

    @property
    def problems(self) -> list[ImageComparison]:
        return [c for c in self.images if c.problem is not None]

    def preservation(self) -> dict[str, object] | None:
        """Over the pairs whose results were measured on both sides: how many, each side's mean score, and in
        how many B changed more than A; None when no pair was."""
        both = [(a, b) for a, b in (c.kept for c in self.images) if a is not None and b is not None]
        if not both:
            return None
        return {"measured": len(both), "score_a": float(np.mean([a.score for a, _ in both])),
                "score_b": float(np.mean([b.score for _, b in both])),
                "b_changed_more": sum(b.score > a.score for a, b in both)}

    def summary(self) -> dict[str, object]:
        """Counts, then the means over the pairs that differ (`differing`; all identical: PSNR inf, SSIM 1)."""
        done = self.compared
        counts: dict[str, object] = {"compared": len(done), "problems": len(self.problems),
                                     "skipped": len(self.skipped)}
        kept = self.preservation()
        if kept is not None:
            counts["preservation"] = kept
        if not done:
            return counts
        differ = [c for c in done if c.max_abs != 0]
        counts.update(identical=len(done) - len(differ), differing=len(differ))
        if not differ:
            return {**counts, "psnr_mean": "inf", "ssim_mean": 1.0, "max_abs": 0, "mean_abs": 0.0}
        return {
            **counts,
            "psnr_mean": float(np.mean([c.psnr for c in differ])),
            "ssim_mean": float(np.mean([c.ssim for c in differ])),
            "max_abs": max(c.max_abs for c in differ),
            "mean_abs": float(np.mean([c.mean_abs for c in differ])),
        }

    def to_dict(self) -> dict[str, object]:
        return {"a": str(self.a_dir), "b": str(self.b_dir), "images": [c.to_dict() for c in self.images],
                "skipped": list(self.skipped), "overall": self.summary()}


def _json_number(value: float | None) -> float | str | None:
    """JSON has no infinity: identical images' PSNR is the string "inf"."""
    return "inf" if value is not None and math.isinf(value) else value


def _image_names(folder: Path) -> set[str]:
    suffixes = {ext.lower() for ext in Image.registered_extensions()}
    return {entry.name for entry in os.scandir(folder)
            if not entry.name.startswith(".") and Path(entry.name).suffix.lower() in suffixes}


def is_intermediate(path: Path) -> bool:
    """A picture ootd wrote beside its results (its record has no sample number), read from the PNG's header
    chunks only; anything else (a result, another program's image, a file that is not a regular file) is not."""
    try:
        if not path.is_file():  # a FIFO would block the header read; compare_pair reports it
            return False
    except OSError:
        return False
    return is_intermediate_record(read_record(path))


def _read_rgb(path: Path) -> np.ndarray:
    def fail(problem: str) -> InputImageError:
        return InputImageError(f"{printable(path)}: {' '.join(problem.split())}")

    with open_image(path, fail, min_side=1) as im:  # no size is too small to compare; the values as stored
        try:
            return np.asarray(im.convert("RGB"))
        except (OSError, ValueError) as exc:
            raise fail(f"unsupported image ({im.mode} mode): {exc}") from None


def compare_pair(name: str, a_path: Path, b_path: Path) -> ImageComparison:
    """The metrics of one pair, or the one-line reason it cannot be compared."""
    try:
        a, b = _read_rgb(a_path), _read_rgb(b_path)
    except InputImageError as exc:
        return ImageComparison(name, problem=str(exc))
    if a.shape != b.shape:
        return ImageComparison(name, problem=f"sizes differ: {a.shape[1]}x{a.shape[0]} vs {b.shape[1]}x{b.shape[0]}")
    largest, mean = differences(a, b)
    return ImageComparison(name, psnr=psnr(a, b), ssim=ssim(a, b), max_abs=largest, mean_abs=mean,
                           settings=setting_differences(a_path, b_path))


def setting_differences(a_path: Path, b_path: Path) -> dict[str, tuple[str, str]]:
    """The settings two of our PNGs record differently (e.g. a LoRA adapter and its scale); {} when either is
    not ours."""
    a, b = read_record(a_path), read_record(b_path)
    if not (is_ours(a) and is_ours(b)):
        return {}
    return setting_changes(a, b)


def compare_folders(a_dir: str | Path, b_dir: str | Path, include_intermediates: bool = False) -> FolderComparison:
    """Pair the images of two folders by file name and compare each pair (sorted by name); without
    `include_intermediates` the pictures ootd writes beside its results are skipped (and listed)."""
    a_dir, b_dir = Path(a_dir), Path(b_dir)
    for folder in (a_dir, b_dir):
        if not folder.is_dir():
            raise UsageError(f"{printable(folder)} is not a folder")
    try:
        a_names, b_names = _image_names(a_dir), _image_names(b_dir)
    except OSError as exc:
        raise UsageError(f"cannot list a folder: {exc.strerror or exc}") from None
    images, skipped = [], []
    figures = (recorded_figures(a_dir), recorded_figures(b_dir))
    for name in sorted(a_names | b_names):
        paths = [folder / name for folder, names in ((a_dir, a_names), (b_dir, b_names)) if name in names]
        if not include_intermediates and any(is_intermediate(p) for p in paths):
            skipped.append(name)
        elif name not in b_names:
            images.append(ImageComparison(name, problem=f"only in {printable(a_dir)}"))
        elif name not in a_names:
            images.append(ImageComparison(name, problem=f"only in {printable(b_dir)}"))
        else:
            images.append(compare_pair(name, a_dir / name, b_dir / name))
        kept = (figures[0].get(name), figures[1].get(name))
        if images and images[-1].name == name and kept != (None, None):
            images[-1] = replace(images[-1], kept=kept)
    if not images and not skipped:
        raise OotdError(f"no images in {printable(a_dir)} or {printable(b_dir)}")
    return FolderComparison(a_dir, b_dir, images, skipped)
