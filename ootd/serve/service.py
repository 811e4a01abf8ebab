"""The try-on behind the worker: the pipelines it keeps, one request run through `run_tryon`, its files.

Each model type is loaded when the first request needs it and then kept (a server answers both kinds of garment
all day; reloading for every switch would cost seconds each time). Results are written into the job's folder as
the same PNGs, with the same names and metadata, that `ootd run` writes; the page and the API serve only those.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ootd.app.config import RunConfig
from ootd.app.load import PipelineLoader, check_checkpoints_present
from ootd.app.outputs import encode_png, png_metadata, targets_for
from ootd.app.tryon import TryOnOutcome, TryOnRequest, run_tryon
from ootd.config import ModelType
from ootd.serve.worker import Job


@dataclass(frozen=True)
class JobSpec:
    """One request as the worker runs it: the inputs and the server's config with this request's settings."""

    request: TryOnRequest
    config: RunConfig
    person_size: tuple[int, int]  # the photo's size (EXIF orientation applied), for the editor's mask


@dataclass
class Finished:
    """A finished try-on's files (all inside the job folder) and what the answer reports."""

    names: list[str]  # result file names, as `ootd run` names them
    mask: str  # the mask at the working resolution (as --save-intermediates writes it)
    masked_person: str
    person_mask: str  # the mask in the person photo's own framing and size: the editor's starting point
    seed: int
    model_type: str
    settings: dict[str, str]
    timings: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)  # every servable name -> its path


class TryOnService:
    """Owns the pipelines (one loader per model type, so both stay loaded; or one for both with `one_model`)
    and runs one job at a time."""

    def __init__(self, config: RunConfig, factory: Any = None, one_model: bool = False) -> None:
        self.config = config
        if one_model:  # one loader for both: switching model types releases the other (less memory)
            shared = PipelineLoader(config, factory)
            self.loaders = dict.fromkeys(ModelType, shared)
        else:
            self.loaders = {model_type: PipelineLoader(config, factory) for model_type in ModelType}
        self.info: dict[str, Any] = {}  # describe_pipeline of the latest run: device, precision, attention

    def describe(self) -> dict[str, str]:
        """Device, precision and attention backend as the latest try-on used them; the configured words before."""
        if self.info:
            return {key: str(self.info.get(key, "")) for key in ("device", "precision", "attention")}
        config = self.config
        return {"device": config.device or "auto", "precision": str(config.precision),
                "attention": str(config.attention)}

    def loaded(self) -> list[str]:
        return [m.value for m, loader in self.loaders.items() if loader.holds(m)]

    def run(self, job: Job) -> Finished:
        """Load the model if needed, run the try-on, write its PNGs into the job folder; the uploads go then."""
        try:
            return self._run(job)
        finally:
            shutil.rmtree(job.folder / "inputs", ignore_errors=True)

    def _run(self, job: Job) -> Finished:
        spec: JobSpec = job.spec
        model_type = spec.config.model_type_for(spec.request.category)
        loader = self.loaders[model_type]
        timings: dict[str, Any] = {}
        if not loader.holds(model_type):
            job.progress("load", 0, 1)
            start = time.perf_counter()
            check_checkpoints_present(spec.config.checkpoints, [model_type], spec.request.mask is None)
            pipe = loader.get(model_type)
            timings["load"] = time.perf_counter() - start
        else:
            pipe = loader.get(model_type)
        outcome = run_tryon(pipe, spec.request, spec.config, progress=job.progress)
        self.info = dict(outcome.info)
        start = time.perf_counter()
        finished = write_outcome(outcome, spec.config, job.folder, spec.person_size)
        timings.update(outcome.timings())
        timings["encode"] = time.perf_counter() - start
        finished.timings = timings
        return finished


def write_outcome(outcome: TryOnOutcome, config: RunConfig, folder: Path, person_size: tuple[int, int]) -> Finished:
    """The result PNGs (with `ootd run`'s names and metadata), the mask, the masked person and the editor's mask."""
    result = outcome.result
    names = [path.name for path in targets_for(outcome.request, config).images]
    stem = names[0].rsplit("__", 1)[0]
    out = folder / "results"
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}

    def write(name: str, image: Any, meta: dict[str, str]) -> str:
        path = out / name
        path.write_bytes(encode_png(image, meta))
        files[name] = path
        return name

    for i, (name, image) in enumerate(zip(names, result.images, strict=True)):
        write(name, image, png_metadata(outcome, config, sample=i))
    meta = png_metadata(outcome, config)
    mask = write(f"{stem}__mask.png", result.mask, meta)
    masked = write(f"{stem}__masked_person.png", result.masked_person, meta)
    person_mask = write(f"{stem}__mask_editable.png", mask_in_person_frame(result.mask, person_size, config.fit), {})
    return Finished(names, mask, masked, person_mask, int(result.seed), outcome.model_type.value,
                    dict(result.settings or {}), {}, files)


def mask_in_person_frame(mask: Any, person_size: tuple[int, int], fit: str) -> Any:
    """The working-resolution mask mapped back onto the person photo, so a mask painted over the photo and sent
    back as `mask` is framed as the photo is (pad and stretch map back to within a pixel; crop keeps the kept
    region and leaves the cut-off border unmasked)."""
    from PIL import Image

    from ootd.framing import fit_to_aspect, restore_framing

    _, info = fit_to_aspect(Image.new("L", person_size), mask.size, str(fit), pad_color=0, resample=Image.NEAREST)
    restored = restore_framing(mask, info, resample=Image.NEAREST)
    if info.mode != "crop":
        return restored
    canvas = Image.new("L", person_size, 0)
    canvas.paste(restored, info.box[:2])
    return canvas
