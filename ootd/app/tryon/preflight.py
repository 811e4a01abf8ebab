"""The pre-flight sequence: every check of a try-on job, cheapest first, in one order, so a mistake fails in one
line before minutes of model loading. Each check says whether it holds per pair or once per batch (a single
try-on is a batch of one):

  step            scope   what
  1 passes        pair    the model for each garment's category; an outfit's garments go together (plan_job)
  2 inputs        pair    the images decoded and checked: not an image, truncated, too small or large, a mask of
                          another aspect (a batch: the files exist; they are decoded when the pair runs, each input
                          once)
  3 checkpoints   batch   the files the jobs' models need are there (pose and parsing only for automatic masks)
  4 output folder batch   exists and is writable; stale temporary files of ours removed
  5 outputs       pair    no output replaces an input or a file that is not ours (or exists, without --overwrite;
                          a batch: resume decides, ootd/app/batch/precheck.py)
  6 memory        batch   --max-memory: the request fits the budget with every saving on
  7 masks         pair    pose and parsing find a person; the masks made here are the ones the try-on uses (a
                          batch: when the pair runs, once per person)

`prepare_job` runs them all for one job (`ootd run`, `run/run_ootd.py`, the server's worker); `plan_inputs` is
steps 1-2, which the server runs when a request comes in (every input checked before it is accepted), and
`check_job` the rest. A batch runs the pair steps for every pair and the batch steps once (`check_batch`);
`ootd mask` runs the steps a mask needs (ootd/app/tryon/masking.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ootd.app.tryon.budget import check_memory_budget
from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.inputs import JobInputs
from ootd.app.tryon.job import TryOnJob, plan_job
from ootd.app.tryon.loader import check_checkpoints_present, models_for
from ootd.app.tryon.masking import MaskJob, mask_targets
from ootd.app.tryon.outputs import prepare_output_dir, refuse_existing
from ootd.app.tryon.request import load_input
from ootd.app.tryon.safety import check_outputs
from ootd.app.tryon.tempfiles import clean_stale_temps
from ootd.errors import InputImageError
from ootd.imaging.opener import read_header
from ootd.pipeline_types import Progress
from ootd.settings import Category, ModelType

if TYPE_CHECKING:
    from ootd.models import Models


def plan_inputs(config: RunConfig, inputs: JobInputs) -> TryOnJob:
    """Steps 1 and 2: the job's passes, then every image decoded and checked (in the order the passes use them)."""
    return plan_job(config, inputs).decoded()  # 1, then 2 (planned once: decoding keeps the names)


def check_job(job: TryOnJob, models: Models | None = None, *, protect: Iterable[Path | None] = (),
              progress: Progress | None = None, writes: bool = True) -> TryOnJob:
    """Steps 3 to 7 of a planned job (`plan_inputs`), and the job with its masks. `models` gives the pose and
    parsing models (None: an owner of the job's config); `protect`: files besides the job's own inputs that no
    output may replace. `writes` False: the pictures are handed over in memory, never saved (the ComfyUI nodes),
    so there is no output folder or file to check (steps 4 and 5)."""
    config = job.config
    check_checkpoints_present(config.checkpoints, job.models, need_preprocess=job.made_masks)  # 3
    if writes:
        check_output_folder(config.output)  # 4
        check_outputs(job.targets.all(), [*job.inputs.paths(), *protect], overwrite=config.overwrite)  # 5
        if not config.overwrite:
            refuse_existing(job.targets.all())
    check_memory_budget(config, list(job.models), job.photo_pixels())  # 6
    if not job.made_masks:
        return job
    tick = progress or (lambda stage, done, total: None)
    tick("pose", 0, 2)  # 7
    preprocessor = (models or models_for(config)).preprocessor()
    tick("pose", 1, 2)
    job = job.with_masks(preprocessor)
    tick("pose", 2, 2)
    return job


def prepare_job(config: RunConfig, inputs: JobInputs, models: Models | None = None, *,
                protect: Iterable[Path | None] = (), progress: Progress | None = None, writes: bool = True
                ) -> TryOnJob:
    """Every pre-flight step of one job, in order, and the job that passed them (nothing heavy loads, nothing is
    written but the checked output folder; `writes` False: no folder either, see `check_job`)."""
    return check_job(plan_inputs(config, inputs), models, protect=protect, progress=progress, writes=writes)


def check_output_folder(folder: Path) -> None:
    """Step 4: the output folder created and proven writable, stale temporary files of ours removed."""
    prepare_output_dir(folder)
    clean_stale_temps(folder)


def prepare_mask_job(config: RunConfig, person: Path | Any, category: Category, *, label: str | None = None,
                     writes: bool = True) -> MaskJob:
    """The steps `ootd mask` needs, in the same order: the model for the category (1), the photo decoded (2), pose
    and parsing's files (3), the output folder (4), no existing file replaced without --overwrite (5); step 7 is
    the job's run. `person`: a path, or an image in memory named by `label`; `writes` False: the pictures are
    handed over in memory (the ComfyUI nodes): no folder or file to check, nothing to save."""
    label = label or str(person)
    model_type = config.model_type_for(category)  # 1
    decoded = load_input(person, "person", label)  # 2
    check_checkpoints_present(config.checkpoints, [], need_preprocess=True)  # 3
    if not writes:
        return MaskJob(config, decoded, label, category, model_type, {})
    check_output_folder(config.output)  # 4: `-o FILE` is the usage error it is for `ootd run`
    targets = mask_targets(Path(label).name, category, config)
    if not config.overwrite:  # 5
        refuse_existing(list(targets.values()))
    return MaskJob(config, decoded, label, category, model_type, targets)


def check_batch(config: RunConfig, models: Iterable[ModelType], made_masks: bool,
                persons: Iterable[str | Path] = ()) -> None:
    """The batch steps 3 and 6 over every pair left to run (step 4 runs when the batch starts writing).
    `persons`: those pairs' person photos; with --max-memory and results at the photo's size, the largest one
    (its header's size, no pixel decoded) is counted as `prepare_job` counts a pair's."""
    models = set(models)
    check_checkpoints_present(config.checkpoints, models, made_masks)  # 3
    counted = config.max_memory is not None and config.photo.at_photo_size  # read no header otherwise
    check_memory_budget(config, models, _largest_photo(persons) if counted else 0)  # 6


def _largest_photo(persons: Iterable[str | Path]) -> int:
    """The pixels of the largest of these photos, from their headers (the orientation does not change the count:
    it is not read, as a PNG's EXIF may make Pillow decode it); one that cannot be read is left out (its pair
    fails on its own, with its error)."""
    largest = 0
    for person in set(map(Path, persons)):
        try:
            width, height = read_header(person, InputImageError).size
        except InputImageError:  # any unreadable header: that pair's own check says why
            continue
        largest = max(largest, width * height)
    return largest
