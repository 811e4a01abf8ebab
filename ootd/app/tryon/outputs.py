"""What a try-on leaves behind: output paths, atomic files or PNG bytes, and how it ran.

Names come from the config's template (ootd/app/tryon/naming.py; default `<person>__<garment>__<i>.png` per
sample and `<person>__<garment>__<kind>.png` per intermediate), filled from the request's names (so an upload
without a path gets stable names too). Every file carries its record (ootd/app/tryon/record.py).
"""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.naming import render_name
from ootd.app.tryon.request import TryOnRequest
from ootd.errors import OotdError, OutputError, UsageError
from ootd.imaging.atomic import check_output_dir, png_info, save_png_atomic
from ootd.imaging.files import sanitise_stem
from ootd.pipeline_types import RunInfo
from ootd.settings import ModelType

if TYPE_CHECKING:
    from PIL import Image

    from ootd.pipeline import TryOnPipeline

logger = logging.getLogger(__name__)

INTERMEDIATES = ("pose", "parsing", "mask", "masked_person")  # what --save-intermediates writes
WITH_MASK_INTERMEDIATES = ("mask", "masked_person")  # a given mask skips pose and parsing
GRID = "grid"  # the contact sheet's kind (its `{i}` in the name template)


@dataclass(frozen=True)
class Targets:
    """The files one try-on writes, and how any other file of it is named (`path(kind)`)."""

    images: list[Path]
    intermediates: dict[str, Path] = field(default_factory=dict)
    grid: Path | None = None  # the contact sheet, when asked for
    folder: Path = Path(".")
    fields: dict[str, Any] = field(default_factory=dict, repr=False)  # the name template's values
    template: str = ""

    def all(self) -> list[Path]:
        return [*self.images, *self.intermediates.values(), *([self.grid] if self.grid is not None else [])]

    def path(self, kind: int | str) -> Path:
        """The file named by the template with `{i}` = `kind` (a sample number or a kind of picture)."""
        return self.folder / f"{render_name(self.template, {**self.fields, 'i': kind})}.png"

    def moved(self, folder: Path) -> Targets:
        """The same files in another folder."""
        def there(path: Path) -> Path:
            return folder / path.relative_to(self.folder)

        return Targets([there(p) for p in self.images], {k: there(p) for k, p in self.intermediates.items()},
                       there(self.grid) if self.grid is not None else None, folder, self.fields, self.template)


def name_fields(request: TryOnRequest, config: RunConfig) -> dict[str, Any]:
    """The values of the name template's fields for one request (see ootd.app.tryon.naming.NAME_FIELDS)."""
    sampling = config.sampling
    return {
        "person": sanitise_stem(Path(request.name("person")).stem),
        "garment": sanitise_stem(Path(request.name("garment")).stem),
        "mask": sanitise_stem(Path(request.name("mask")).stem) if request.mask is not None else "auto",
        "category": request.category.value, "model": config.model_type_for(request.category).value,
        "seed": sampling.seed, "steps": sampling.steps, "scale": sampling.guidance_scale,
        "resolution": str(sampling.resolution), "scheduler": sampling.scheduler.value, "fit": config.fit.value,
    }


def job_targets(config: RunConfig, request: TryOnRequest, model_type: ModelType, garments: list[str],
                kinds: list[str]) -> Targets:
    """The config's name template per sample (`{i}` = 0, 1, ...) and per kind of other picture (`{i}` = its
    kind): filled from `request` (an outfit's: its first pass's, with the category of its last) and `model_type`,
    with the garment field made of every garment's name (`top-with-trousers`)."""
    fields = {**name_fields(request, replace(config, model_type=model_type)),
              "garment": "-with-".join(sanitise_stem(Path(name).stem) for name in garments)}
    targets = Targets([], folder=config.output, fields=fields, template=config.name_template)
    return Targets([targets.path(i) for i in range(config.sampling.num_samples)],
                   {kind: targets.path(kind) for kind in kinds}, targets.path(GRID) if config.grid else None,
                   targets.folder, targets.fields, targets.template)


def prepare_output_dir(path: Path) -> Path:
    """The output folder, created and proven writable; a path naming a file is a usage error (exit 2)."""
    if path.exists() and not path.is_dir():
        raise UsageError.about("output", "output folder {path} exists and is not a folder: {@output} takes a "
                               "folder", path=path)
    return check_output_dir(path)


def refuse_existing(paths: list[Path]) -> None:
    """Without --overwrite a try-on never replaces a file: say so before any work starts."""
    existing = [p for p in paths if p.exists()]
    if existing:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise OutputError.about(
            "overwrite", "{path} already exists{more}; use {@overwrite} to replace, or {@output} for another "
            "folder", path=existing[0], more=more)


def save_pictures(targets: Targets, images: list[Any], record: Callable[[int | None], Any],
                  intermediates: dict[str, Any], grid: Any = None, *, overwrite: bool = False,
                  keep_existing: bool = False) -> tuple[list[Path], dict[str, Path]]:
    """Write the images (and the intermediates the targets name, and the grid) atomically, each with its record
    (`record(sample)`; None for the other pictures). `keep_existing`: leave files that already exist alone (a
    resumed batch), instead of failing on them."""

    def write(image: Any, path: Path, sample: int | None) -> None:
        if keep_existing and not overwrite and path.exists():
            logger.info("keeping existing %s", path)
            return
        save_png_atomic(image, path, record(sample).text(), overwrite=overwrite)

    if len(images) != len(targets.images):
        raise OotdError(f"expected {len(targets.images)} images from the pipeline, got {len(images)}")
    for i, (image, path) in enumerate(zip(images, targets.images, strict=True)):
        write(image, path, i)
    written = {}
    for kind, path in targets.intermediates.items():
        image = intermediates.get(kind)
        if image is None:
            logger.debug("no %s picture for %s", kind, path)
            continue
        write(image, path, None)
        written[kind] = path
    if targets.grid is not None and grid is not None:
        write(grid, targets.grid, None)
        written[GRID] = targets.grid
    return list(targets.images), written


def encode_png(image: Image.Image, metadata: dict[str, str] | None = None) -> bytes:
    """PNG bytes with text metadata, for front ends that answer with bytes rather than files (HTTP)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=png_info(metadata or {}))
    return buffer.getvalue()


def describe_pipeline(pipe: TryOnPipeline, config: RunConfig) -> RunInfo:
    """Where and how `pipe` runs: its own description (`TryOnPipeline.describe`: device, precision, attention,
    speed options, memory plan), or for a stand-in without one what its attributes say."""
    import torch

    from ootd.hardware.dtypes import dtype_name

    described = getattr(pipe, "describe", None)
    if callable(described):
        try:
            return described()
        except Exception as exc:  # a description must never fail a try-on
            logger.debug("pipe.describe() failed: %s", exc)
    device = getattr(pipe, "device", None)
    name = getattr(device, "name", None)
    where = str(getattr(device, "torch_device", None) or getattr(device, "type", device))
    precision = getattr(pipe, "precision", None)
    precision = getattr(precision, "unet", precision)
    return RunInfo(device=f"{where} ({name})" if name and name != where and "(" not in where else where,
                   precision=dtype_name(precision) if precision is not None else "unknown",
                   attention=str(config.attention), threads=torch.get_num_threads(), device_name=name,
                   arch=getattr(device, "arch", None) or None)


def peak_memory(device: Any = None) -> dict[str, int | None]:
    """Peak memory allocated by torch on `device` (a GPU's; the model owner's `device`, None before any model ran)
    and the process's peak resident memory, in bytes."""
    device_peak = None
    torch = sys.modules.get("torch")
    if torch is not None and device is not None and getattr(device, "type", None) == "cuda":
        try:
            device_peak = int(torch.cuda.max_memory_allocated(device))
        except Exception:  # not initialised, or a fake device in tests
            device_peak = None
    host_peak = None
    try:
        import resource

        host_peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * (1 if sys.platform == "darwin" else 1024)
    except (ImportError, OSError):
        pass
    return {"device_bytes": device_peak, "host_rss_bytes": host_peak}


def attention_used(described: Any) -> str:
    """The backends that ran, without the dispatcher's trace and call counts, which grow with every call
    (`auto: sdpa > chunked > math (used: sdpa x 17)` -> `sdpa`); the full description is in --json and --explain."""
    text = str(described or "unknown")
    if "(used:" in text:
        used = text.split("(used:", 1)[1].rstrip(") ")
        return ", ".join(part.split(" x ")[0].strip() for part in used.split(","))
    return text.split(":", 1)[0]


def format_seconds(value: float) -> str:
    """1.2 s, or 340 ms below a second (summary lines of every front end)."""
    return f"{value:.1f} s" if value >= 1 else f"{value * 1000:.0f} ms"
