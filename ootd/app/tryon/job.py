"""One try-on job: every pre-flight check once, in one order, then the try-on on a loaded pipeline, then atomic
files. `ootd run`, `ootd batch`, `ootd serve` and `run/run_ootd.py` all go through here.

    job = prepare_job(config, request, loader)   # the checks below; nothing heavy loads, nothing is written
    pipe = loader.get(job.model_type)            # minutes, the first time
    outcome = job.run(pipe)                      # the try-on sequence
    images, intermediates = job.save(outcome)    # complete files or none

The pre-flight sequence, cheapest first, so a mistake fails in one line before minutes of loading:
  1. the model for the category (hd takes upper-body garments only)
  2. the inputs decoded and checked (not an image, truncated, too small or large; a mask of another aspect)
  3. the checkpoint files the run needs are there
  4. the output folder exists and is writable (stale temporary files of ours removed)
  5. the output names, and no output replaces an input or a file that is not ours (or exists, without
     --overwrite)
  6. --max-memory: the request fits the budget with every saving on
  7. an automatic mask: pose and parsing (seconds) find a person; the mask made here is the one the try-on uses
A batch checks the per-pair part (1, 5 and the files' existence) for every pair before anything runs, and 3, 4
and 6 once for the whole batch (ootd/app/batch/precheck.py); its jobs are made by `TryOnJob.planned`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ootd.app.tryon.budget import check_memory_budget
from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.loader import PipelineLoader, check_checkpoints_present
from ootd.app.tryon.masking import check_mask_input, no_person_error
from ootd.app.tryon.outcome import InputCache, TryOnOutcome
from ootd.app.tryon.outputs import (
    Targets,
    describe_pipeline,
    prepare_output_dir,
    refuse_existing,
    save_outcome,
    targets_for,
)
from ootd.app.tryon.request import TryOnRequest
from ootd.app.tryon.safety import check_outputs
from ootd.app.tryon.tempfiles import clean_stale_temps
from ootd.errors import NoPersonError
from ootd.imaging.framing import restore_framing
from ootd.pipeline_types import Progress
from ootd.preprocessing import PersonMask, mask_person
from ootd.settings import ModelType


@dataclass(frozen=True)
class TryOnJob:
    """A checked try-on: what to run, with which model, into which files; `run` it on a loaded pipeline and
    `save` what it gives."""

    config: RunConfig
    request: TryOnRequest
    model_type: ModelType
    targets: Targets
    person_mask: PersonMask | None = None  # made during the checks (automatic masks), used by `run`

    @classmethod
    def planned(cls, config: RunConfig, request: TryOnRequest) -> TryOnJob:
        """The job of a request, with its model and output names (checks 1 and the names of 5; no I/O)."""
        return cls(config, request, config.model_type_for(request.category), targets_for(request, config))

    def run(self, pipe: Any, progress: Progress | None = None, callback: Callable[..., Any] | None = None, *,
            persons: InputCache | None = None, garments: InputCache | None = None) -> TryOnOutcome:
        """The try-on sequence: prepare the person (no person found: its error, naming the file), prepare the
        garment, generate. `persons`/`garments` let a batch reuse prepared inputs; `callback` goes to the
        pipeline's per-step hook."""
        return run_tryon(pipe, self.request, self.config, progress, callback, persons=persons, garments=garments,
                         person_mask=self.person_mask)

    def save(self, outcome: TryOnOutcome, keep_existing: bool = False) -> tuple[list[Path], dict[str, Path]]:
        """Every output of the job, written atomically with its record (`keep_existing`: a resumed batch)."""
        return save_outcome(outcome, self.config, self.targets, keep_existing=keep_existing)


def prepare_job(config: RunConfig, request: TryOnRequest, loader: PipelineLoader | None = None, *,
                protect: Iterable[Path | None] = (), progress: Progress | None = None) -> TryOnJob:
    """Every pre-flight check of one try-on, once, in the order of this module's docstring, and the job that
    passed them. `loader` gives the pose and parsing models for an automatic mask (None: a loader of `config`);
    `protect`: files besides the request's own inputs that no output may replace."""
    tick = progress or (lambda stage, done, total: None)
    config.model_type_for(request.category)  # 1
    inputs = [*request.paths(), *protect]
    request = check_mask_input(request.decoded(), raw_mask=request.source("mask"), fit=config.fit)  # 2
    job = TryOnJob.planned(config, request)
    check_checkpoints_present(config.checkpoints, [job.model_type], need_preprocess=request.mask is None)  # 3
    prepare_output_dir(config.output)  # 4
    clean_stale_temps(config.output)
    check_outputs(job.targets.all(), inputs, overwrite=config.overwrite)  # 5
    if not config.overwrite:
        refuse_existing(job.targets.all())
    check_memory_budget(config, [job.model_type])  # 6
    if request.mask is not None:
        return job
    tick("pose", 0, 2)  # 7
    preprocessor = (loader or PipelineLoader(config)).preprocessor()
    tick("pose", 1, 2)
    try:
        masked = mask_person(request.pipeline_input("person"), request.category, job.model_type,
                             config.sampling.resolution, config.fit, config.mask_grow, preprocessor=preprocessor)
    except NoPersonError:
        raise no_person_error(request.label("person")) from None
    tick("pose", 2, 2)
    return TryOnJob(config, request, job.model_type, job.targets, masked)


def _frame_like_results(result: Any, fit: Any) -> None:
    """Crop the padding off the intermediates (mask, masked person, pose, parsing) as the pipeline crops it off
    the results, so every saved picture of a --fit pad try-on has the photo's framing."""
    intermediates = getattr(result, "intermediates", None)
    if fit is None or not intermediates:
        return
    result.intermediates = {k: restore_framing(v, fit, keep_scale=True) for k, v in intermediates.items()}


def _cached(cache: InputCache | None, key: tuple | None, compute: Callable[[], Any]) -> tuple[Any, bool]:
    if cache is None or key is None:
        return compute(), True
    return cache.get(key, compute)


def run_tryon(
    pipe: Any, request: TryOnRequest, config: RunConfig, progress: Progress | None = None,
    callback: Callable[..., Any] | None = None, *, persons: InputCache | None = None,
    garments: InputCache | None = None, person_mask: PersonMask | None = None,
) -> TryOnOutcome:
    """The try-on sequence on a loaded pipeline (see `TryOnJob.run`); `person_mask`: the person's mask made
    before the pipeline loaded, encoded as it is."""
    tick = progress or (lambda stage, done, total: None)
    category = request.category
    model_type = config.model_type_for(category)
    resolution = config.sampling.resolution

    def prepare_person() -> Any:
        tick("person", 0, 1)
        if person_mask is not None:
            prepared = pipe.encode_person(person_mask)
        else:
            check_mask_input(request, fit=config.fit)
            mask = request.pipeline_input("mask") if request.mask is not None else None
            try:
                prepared = pipe.prepare_person(request.pipeline_input("person"), category, mask=mask,
                                               resolution=resolution, fit=config.fit, mask_grow=config.mask_grow)
            except NoPersonError:
                raise no_person_error(request.label("person")) from None
        tick("person", 1, 1)
        return prepared

    def prepare_garment() -> Any:
        tick("garment", 0, 1)
        prepared = pipe.prepare_garment(request.pipeline_input("garment"), category, resolution=resolution,
                                        fit=config.fit)
        tick("garment", 1, 1)
        return prepared

    person_key = request.key("person"), request.key("mask")
    person, person_new = _cached(persons, None if None in person_key else (model_type, category, *person_key),
                                 prepare_person)
    garment_key = request.key("garment")
    garment, garment_new = _cached(garments, None if garment_key is None else (model_type, category, garment_key),
                                   prepare_garment)
    extra = {"callback": callback} if callback is not None else {}

    def staged(stage: str, done: int, total: int) -> None:  # the decode starts when the last step ends
        tick(stage, done, total)
        if stage == "denoise" and done == total:
            tick("decode", 0, config.sampling.num_samples)

    result = pipe.generate(person, garment, config.sampling, progress=staged if progress else None,
                           modes=config.speed, **extra)
    _frame_like_results(result, getattr(person, "fit", None))
    return TryOnOutcome(request, model_type, result, describe_pipeline(pipe, config),
                        {"person": not person_new, "garment": not garment_new})
