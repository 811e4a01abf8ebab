"""The try-on behind the worker: the pipelines it keeps, one request run through the job of `ootd run`, its files.

Each model type is loaded when the first request needs it and then kept (a server answers both kinds of garment
all day; reloading for every switch would cost seconds each time). Results are written into the job's folder as
the same PNGs, with the same names and metadata, that `ootd run` writes; the page and the API serve only those.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.inputs import JobInputs
from ootd.app.tryon.job import JobOutcome, TryOnJob
from ootd.app.tryon.loader import models_for
from ootd.app.tryon.masking import mask_in_person_frame
from ootd.app.tryon.outputs import attention_used
from ootd.app.tryon.preflight import check_job
from ootd.app.tryon.preservation import Measured, PairPreservation, measure_made
from ootd.app.tryon.tempfiles import clean_stale_temps
from ootd.imaging.atomic import save_png_atomic
from ootd.models import Keep, ModelSource
from ootd.pipeline_types import RunInfo, Timings
from ootd.serve.worker import Job
from ootd.settings import ModelType


@dataclass(frozen=True)
class JobSpec:
    """One request as the worker runs it: its job, planned and its images checked when it came in (steps 1-2 of
    the pre-flight), with the server's config and this request's settings."""

    job: TryOnJob
    person_size: tuple[int, int]  # the photo's size (EXIF orientation applied), for the editor's mask
    uploads: JobInputs | None = None  # the inputs as files in the job folder (what preservation reads again)

    @property
    def config(self) -> RunConfig:
        return self.job.config


@dataclass
class Finished:
    """A finished try-on's files (all inside the job folder) and what the answer reports."""

    names: list[str]  # result file names, as `ootd run` names them
    mask: str  # the mask framed like the results (as --save-intermediates writes it)
    masked_person: str
    person_mask: str  # the mask in the person photo's own framing and size: the editor's starting point
    seed: int
    model_type: str
    settings: dict[str, Any]  # the pictures' settings as their record gives them for JSON
    timings: Timings
    files: dict[str, Path] = field(default_factory=dict)  # every servable name -> its path
    replica: str | None = None  # the Ray Serve replica that ran it (the Ray engine); None: this process
    more_masks: tuple[str, ...] = ()  # an outfit's: `person_mask` is the first garment's, these the others'
    preservation: PairPreservation | None = None  # what the results changed of the photo, each named by its file


class TryOnService:
    """The server's model owner (both model types stay loaded, or one at a time with `one_model`; the classifier
    stays for the next request) and one job at a time through the same job as `ootd run`
    (ootd/app/tryon/job.py)."""

    def __init__(self, config: RunConfig, models: ModelSource | None = None, one_model: bool = False) -> None:
        self.config = config
        # one model at a time: switching model types releases the other (less memory)
        keep = Keep(pipelines=1 if one_model else len(ModelType), classifier=True)
        self.models = models_for(config, keep, models)
        self.ran: RunInfo | None = None  # how the latest try-on ran: device, precision, attention

    def describe(self) -> dict[str, str]:
        """Device, precision and attention backend as the latest try-on used them; the configured words before."""
        if self.ran is not None:
            return {"device": self.ran.device, "precision": self.ran.precision,
                    "attention": attention_used(self.ran.attention)}
        config = self.config
        return {"device": config.device or "auto", "precision": config.precision.value,
                "attention": config.attention.value}

    def loaded(self) -> list[str]:
        return [m.value for m in ModelType if self.models.holds(m)]

    def run(self, job: Job) -> Finished:
        """Load the model if needed, run the try-on, write its PNGs into the job folder; the uploads go then, and
        any temporary file a writer left (the job is settled: nothing of it is written any more)."""
        try:
            return self._run(job)
        finally:
            shutil.rmtree(job.folder / "inputs", ignore_errors=True)
            clean_stale_temps(job.spec.config.output)

    def _run(self, job: Job) -> Finished:
        spec: JobSpec = job.spec
        timings = Timings()
        # the rest of the checks of every try-on, in their order (the uploads were checked when the request came in)
        prepared = check_job(spec.job, self.models, progress=job.progress)
        with self.models.timed() as loading:  # a load reports its progress to the job (cancelled: it stops there)
            outcome = prepared.run(self.models, progress=job.progress, callback=job.step)
        if loading.count:
            timings.add("load", loading.seconds)
        self.ran = outcome.ran
        job.check()  # cancelled during the decode: nobody will fetch the files
        start = time.perf_counter()
        finished = write_outcome(prepared, outcome, spec.person_size)
        timings.extend(outcome.timings())
        timings.add("encode", time.perf_counter() - start)
        if spec.config.preservation:  # the request's `preservation` (default on)
            start = time.perf_counter()
            finished.preservation = measured(spec, outcome, finished, self.models.preprocessor)
            timings.add("preservation", time.perf_counter() - start)
        finished.timings = timings
        return finished


def measured(spec: JobSpec, outcome: JobOutcome, finished: Finished, parser: Callable[[], Any]
             ) -> PairPreservation:
    """What the job's results changed of its photo (docs/preservation.md), as `ootd run` measures them: from the
    parse its automatic mask came from (`parser`, the owner's pose and parsing models, only for an uploaded mask),
    while the uploads are still there. Never raises (a problem is each result's reason); the results and the
    photo are named as the client knows them, never by this server's folders."""
    inputs = spec.uploads or spec.job.inputs
    kept = measure_made([finished.files[name] for name in finished.names], inputs, parser, parse=outcome.parse)
    photo, name = inputs.photo_source, spec.job.inputs.person_name
    return PairPreservation(tuple(
        Measured(Path(m.result).name, m.figures,
                 m.problem.replace(str(photo), name or "the person photo") if m.problem else None)
        for m in kept.results), kept.review)


def checkpoints_note(config: RunConfig) -> str | None:
    """None when the server's checkpoints are the released OOTDiffusion models (as far as their configs and
    safetensors headers say: no weight is read); else one line saying how they differ."""
    from ootd.weights.architecture import compare_to_released, summary

    models = [config.model_type] if config.model_type is not None else list(ModelType)
    diffs = compare_to_released(config.checkpoints, models, count_params=False)
    return summary(diffs) if diffs else None


def write_outcome(job: TryOnJob, outcome: JobOutcome, person_size: tuple[int, int]) -> Finished:
    """The files `ootd run --save-intermediates` writes (results, mask and masked person framed like the
    results, with `ootd run`'s names and records) and each garment's mask in the photo's framing, in the
    request's order (what the page's editor starts from: `mask`, `mask2`; recorded as the job's other pictures),
    each written atomically into the job's results folder."""
    images, intermediates = job.save(outcome)
    record = outcome.record(None).text()
    masks = [save_png_atomic(mask_in_person_frame(mask, person_size, job.config.fit),
                             job.targets.path(f"{prefix}mask_editable"), record, overwrite=True)
             for prefix, mask in outcome.garment_masks()]  # in the request's order
    final = job.passes[-1]  # the pass that made the pictures
    files = {path.name: path for path in (*images, *intermediates.values(), *masks)}
    return Finished([p.name for p in images], intermediates[f"{final.prefix}mask"].name,
                    intermediates[f"{final.prefix}masked_person"].name, masks[0].name,
                    int(job.config.sampling.seed), final.model_type.value, outcome.record(0).settings(), Timings(),
                    files, more_masks=tuple(mask.name for mask in masks[1:]))
