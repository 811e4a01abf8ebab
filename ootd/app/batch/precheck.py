"""Every pair of a batch checked before any model loads: the pair steps of the pre-flight (ootd/app/tryon/
preflight.py) for each pair, output names that collide, outputs that would replace an input or a file that is not
ours, and resume.

`check_batch_outputs` refuses outputs that are inputs (all pairs at once, each distinct input looked at once).
`precheck` sorts the pairs into reports that are final already (unreadable rows, missing files, model/category
mismatches, colliding names: errors; pairs done earlier with these settings: skipped) and jobs to run; an
existing output that is not ours, or that was made with other settings, stops the batch with one line
(ootd/app/batch/resume.py). Each existing output's record is read once, for both questions. The checks that
concern the whole batch (checkpoints, the output folder, --max-memory) run once, in the runner.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ootd.app.batch.pairs import Pair
from ootd.app.batch.report import PairReport, is_our_report
from ootd.app.batch.resume import resume_state, stale_error
from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.job import TryOnJob, plan_job
from ootd.app.tryon.provenance import is_ours, read_record
from ootd.app.tryon.safety import Other, check_outputs
from ootd.errors import OutputError, UsageError


def check_batch_outputs(pairs: Iterable[Pair], config: RunConfig, report: Path | None,
                        extra_inputs: Iterable[Path | None] = (), pages: Iterable[Path] = ()) -> None:
    """`check_outputs` for a batch: every readable pair's targets against every pair's inputs (each distinct
    input once); the report must be a batch report, and pages (index.html) may be rewritten but never replace an
    input. Whether an existing output is ours is asked by `precheck`, with the record it reads for resume."""
    inputs: dict[Path, None] = dict.fromkeys(p for p in extra_inputs if p is not None)
    outputs: list[Other] = []
    for pair in pairs:
        inputs.update(dict.fromkeys(p for p in pair.inputs() if p is not None))
        if pair.problem is None and pair.classified:
            try:
                outputs += [Other(p, "output") for p in plan_job(config, pair.job_inputs()).targets.all()]
            except UsageError:  # a pair the batch reports as its own error (e.g. hd with a lower garment)
                continue
    others = [Other(Path(report), "report", is_our_report, "a batch report")] if report is not None else []
    others += [Other(Path(page), "page") for page in pages]
    check_outputs([], inputs, overwrite=config.overwrite, others=outputs + others)


@dataclass
class Precheck:
    """The outcome of the checks: final reports, the jobs left to run, and the config they run with (a
    resumed batch whose seed was drawn keeps the seed its files were made with)."""

    done: list[PairReport]
    todo: list[tuple[Pair, TryOnJob]]
    config: RunConfig


class _Files:
    """What is wrong with each distinct input file (None: a file), looked at once per batch."""

    def __init__(self) -> None:
        self.seen: dict[Path, str | None] = {}

    def problem(self, path: Path) -> str | None:
        if path not in self.seen:
            self.seen[path] = None if path.is_file() else (
                "is a folder, not an image file" if path.is_dir() else "file not found")
        return self.seen[path]

    def missing(self, pair: Pair) -> list[str]:
        roles = (("person", pair.person), ("garment", pair.garment), ("mask", pair.mask),
                 ("garment", pair.garment2), ("mask", pair.mask2))
        return [f"{role} image {os.path.normpath(path)}: {problem}" for role, path in roles
                if path is not None and (problem := self.problem(path)) is not None]


class _Records:
    """The records of one pair's existing outputs, each read once (whose file is it; is it done)."""

    def __init__(self) -> None:
        self.seen: dict[Path, dict[str, str]] = {}

    def __call__(self, path: Path) -> dict[str, str]:
        record = self.seen.get(path)
        if record is None:
            record = self.seen[path] = read_record(path)
        return record

    def ours(self, path: Path) -> bool:
        return is_ours(self(path))


def precheck(pairs: Sequence[Pair], config: RunConfig) -> Precheck:
    """Everything knowable without models, per pair (see the module docstring)."""
    done: list[PairReport] = []
    todo: list[tuple[Pair, TryOnJob]] = []
    claimed: dict[Path, Pair] = {}
    stale: list[str] = []
    seeds: set[int] = set()  # the seeds existing outputs were made with
    seed = config.sampling.seed
    files = _Files()
    for pair in pairs:
        if pair.problem is not None:
            done.append(PairReport(pair, "error", error=pair.problem, seed=seed))
            continue
        try:
            job = plan_job(config, pair.job_inputs())  # step 1
        except UsageError as exc:
            done.append(PairReport(pair, "error", error=f"{pair.source}: {exc}", seed=seed))
            continue
        model = job.describe_models()
        outputs = job.targets.all()
        records = _Records()
        if not config.overwrite:  # an existing file at an output name must be ours (exit 2 otherwise)
            check_outputs([], [], others=[Other(p, "output", records.ours, "an ootd picture") for p in outputs])
        missing = files.missing(pair)
        if missing:
            done.append(PairReport(pair, "error", model, error="; ".join(missing), seed=seed))
            continue
        clash = next((claimed[p] for p in outputs if p in claimed), None)
        if clash is not None:
            done.append(PairReport(
                pair, "error", model, seed=seed,
                error=f"its output names collide with {clash.source} ({clash.describe()}); "
                      "rename one of the inputs, drop the duplicate or use a --name with {category}",
            ))
            continue
        claimed.update(dict.fromkeys(outputs, pair))
        state = None if config.overwrite else resume_state(job.targets, job.expected(), read=records,
                                                           view=job.comparable)
        if state is not None and state.status == "stale":
            stale.append(f"{pair.source}: {state.reason}")
            continue
        if state is not None and state.seed is not None and job.records_run_seed:
            seeds.add(state.seed)
        if state is not None and state.status == "done":
            done.append(PairReport(
                pair, "skipped", model, outputs=[str(p) for p in job.targets.images],
                intermediates={k: str(p) for k, p in job.targets.intermediates.items() if p.exists()},
                seed=state.seed,
            ))
            continue
        todo.append((pair, job))
    if stale:
        raise OutputError(stale_error(len(stale), stale[0]))
    if config.seed_random and len(seeds) == 1:  # a rerun of the same command finishes the batch it started
        (kept,) = seeds
        config = replace(config, sampling=replace(config.sampling, seed=kept))
        todo = [(pair, plan_job(config, job.inputs)) for pair, job in todo]
        for report in done:
            if report.status == "error":
                report.seed = kept
    return Precheck(done, todo, config)
