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

from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.job import TryOnJob, prepare_job
from ootd.app.tryon.loader import ModelSource, PipelineLoader
from ootd.app.tryon.outcome import TryOnOutcome
from ootd.app.tryon.request import TryOnRequest
from ootd.imaging.files import save_png_atomic
from ootd.serve.worker import Job
from ootd.settings import Category, FitMode, ModelType


@dataclass(frozen=True)
class JobSpec:
    """One request as the worker runs it: the inputs and the server's config with this request's settings."""

    request: TryOnRequest
    config: RunConfig
    person_size: tuple[int, int]  # the photo's size (EXIF orientation applied), for the editor's mask
    outfit: tuple[Any, ...] | None = None  # two garments (ootd.app.tryon.outfit.Garment): `request` is the first


@dataclass
class Finished:
    """A finished try-on's files (all inside the job folder) and what the answer reports."""

    names: list[str]  # result file names, as `ootd run` names them
    mask: str  # the mask framed like the results (as --save-intermediates writes it)
    masked_person: str
    person_mask: str  # the mask in the person photo's own framing and size: the editor's starting point
    seed: int
    model_type: str
    settings: dict[str, str]
    timings: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)  # every servable name -> its path
    replica: str | None = None  # the Ray Serve replica that ran it (the Ray engine); None: this process
    person_mask2: str | None = None  # an outfit's: `person_mask` is the first garment's, this the second's


class TryOnService:
    """Owns the pipelines (one loader per model type, so both stay loaded; or one for both with `one_model`)
    and runs one job at a time, through the same job as `ootd run` (ootd/app/tryon/job.py)."""

    def __init__(self, config: RunConfig, models: ModelSource | None = None, one_model: bool = False) -> None:
        self.config = config
        if one_model:  # one loader for both: switching model types releases the other (less memory)
            shared = PipelineLoader(config, models)
            self.loaders = dict.fromkeys(ModelType, shared)
        else:
            self.loaders = {model_type: PipelineLoader(config, models) for model_type in ModelType}
        self.info: dict[str, Any] = {}  # describe_pipeline of the latest run: device, precision, attention

    def describe(self) -> dict[str, str]:
        """Device, precision and attention backend as the latest try-on used them; the configured words before."""
        if self.info:
            return {"device": str(self.info.get("device", "")), "precision": str(self.info.get("precision", "")),
                    "attention": attention_used(self.info.get("attention"))}
        config = self.config
        return {"device": config.device or "auto", "precision": config.precision.value,
                "attention": config.attention.value}

    def _run_outfit(self, job: Job) -> Finished:
        return _outfit_finished(self, job)

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
        if spec.outfit is not None:
            return self._run_outfit(job)
        model_type = spec.config.model_type_for(spec.request.category)
        loader = self.loaders[model_type]
        # the checks of every try-on, in their order (the uploads were decoded when the request came in)
        prepared = prepare_job(spec.config, spec.request, loader, progress=job.progress)
        timings: dict[str, Any] = {}
        if not loader.holds(model_type):
            job.progress("load", 0, 1)
            start = time.perf_counter()
            pipe = loader.get(model_type)
            timings["load"] = time.perf_counter() - start
        else:
            pipe = loader.get(model_type)
        job.check()  # cancelled while the model loaded
        outcome = prepared.run(pipe, progress=job.progress, callback=job.step)
        self.info = dict(outcome.info)
        job.check()  # cancelled during the decode: nobody will fetch the files
        start = time.perf_counter()
        finished = write_outcome(prepared, outcome, spec.person_size)
        timings.update(outcome.timings())
        timings["encode"] = time.perf_counter() - start
        finished.timings = timings
        return finished


def _outfit_finished(service: TryOnService, job: Job) -> Finished:
    """An outfit through the same job as `ootd run` with two --cloth (ootd/app/tryon/outfit.py)."""
    from ootd.app.tryon.outfit import prepare_outfit

    spec: JobSpec = job.spec
    request = spec.request
    prepared = prepare_outfit(spec.config, request.person, list(spec.outfit), service.loaders[ModelType.DC],
                              person_name=request.person_name)
    start = time.perf_counter()
    outcome = prepared.run(lambda model_type: service.loaders[model_type].get(model_type), progress=job.progress,
                           callback=job.step)
    timings: dict[str, Any] = {"run": time.perf_counter() - start}
    service.info = dict(outcome.second[0].info)
    job.check()
    images, intermediates = prepared.save(outcome)
    person_masks = outfit_person_masks(prepared, outcome, spec)
    files = {path.name: path for path in (*images, *intermediates.values(), *person_masks)}
    second = outcome.second[0].result
    timings.update(outcome.timings())
    return Finished([p.name for p in images], intermediates["upper_mask"].name,
                    intermediates["upper_masked_person"].name, person_masks[0].name, int(spec.config.sampling.seed),
                    prepared.upper_model.value, dict(second.settings or {}), timings, files,
                    person_mask2=person_masks[1].name)


def outfit_person_masks(prepared: Any, outcome: Any, spec: JobSpec) -> list[Path]:
    """Each garment's mask in the person photo's framing, in the request's order (`garment`, `garment2`): what
    the page puts back into its editor as `mask` and `mask2`."""
    by_pass = {Category.LOWER: outcome.first.result.mask, Category.UPPER: outcome.second[0].result.mask}
    return [save_png_atomic(mask_in_person_frame(by_pass[garment.category], spec.person_size, spec.config.fit),
                            prepared.targets.path(f"{garment.category.value}_mask_editable"), {}, overwrite=True)
            for garment in spec.outfit]


def attention_used(described: Any) -> str:
    """The backends that ran, without the dispatcher's call counts, which grow with every request
    (`auto: sdpa > chunked > math (used: sdpa x 268)` -> `sdpa`)."""
    text = str(described or "unknown")
    if "(used:" in text:
        used = text.split("(used:", 1)[1].rstrip(") ")
        return ", ".join(part.split(" x ")[0].strip() for part in used.split(","))
    return text.split(":", 1)[0]


def checkpoints_note(config: RunConfig) -> str | None:
    """None when the server's checkpoints are the released OOTDiffusion models (as far as their configs and
    safetensors headers say: no weight is read); else one line saying how they differ."""
    from ootd.weights.architecture import compare_to_released, summary

    models = [config.model_type] if config.model_type is not None else list(ModelType)
    diffs = compare_to_released(config.checkpoints, models, count_params=False)
    return summary(diffs) if diffs else None


def write_outcome(job: TryOnJob, outcome: TryOnOutcome, person_size: tuple[int, int]) -> Finished:
    """The files `ootd run --save-intermediates` writes (results, mask and masked person framed like the
    results, with `ootd run`'s names and records) and the editor's mask, each written atomically into the job's
    results folder."""
    images, intermediates = job.save(outcome)
    editable = mask_in_person_frame(outcome.result.mask, person_size, job.config.fit)
    person_mask = save_png_atomic(editable, job.targets.path("mask_editable"), {}, overwrite=True)
    files = {path.name: path for path in (*images, *intermediates.values(), person_mask)}
    result = outcome.result
    return Finished([p.name for p in images], intermediates["mask"].name, intermediates["masked_person"].name,
                    person_mask.name, int(result.seed), outcome.model_type.value, dict(result.settings or {}), {},
                    files)


def mask_in_person_frame(mask: Any, person_size: tuple[int, int], fit: FitMode) -> Any:
    """The working-resolution mask mapped back onto the person photo, so a mask painted over the photo and sent
    back as `mask` is framed as the photo is (pad and stretch map back to within a pixel; crop keeps the kept
    region and leaves the cut-off border unmasked)."""
    from PIL import Image

    from ootd.imaging.framing import fit_to_aspect, restore_framing

    _, info = fit_to_aspect(Image.new("L", person_size), mask.size, fit, pad_color=0, resample=Image.NEAREST)
    restored = restore_framing(mask, info, resample=Image.NEAREST)
    if info.mode != "crop":
        return restored
    canvas = Image.new("L", person_size, 0)
    canvas.paste(restored, info.box[:2])
    return canvas
