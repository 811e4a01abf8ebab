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
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path

from ootd.app.batch.pairs import Pair, run_order
from ootd.app.batch.report import PairReport, is_our_report
from ootd.app.batch.resume import ResumeState, resume_state, stale_error
from ootd.app.batch.texts import TextStore
from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.job import TryOnJob, plan_job
from ootd.app.tryon.provenance import is_ours, read_record
from ootd.app.tryon.safety import Other, check_outputs
from ootd.errors import Namer, OutputError, UsageError, library_name, worded
from ootd.settings import ModelType


def check_batch_outputs(pairs: Sequence[Pair], config: RunConfig, report: Path | None,
                        extra_inputs: Iterable[Path | None] = (), pages: Iterable[Path] = ()) -> None:
    """`check_outputs` for a batch: every readable pair's targets against every pair's inputs (each distinct
    input once; the targets made one pair at a time, never all held); the report must be a batch report, and
    pages (index.html) may be rewritten but never replace an input. Whether an existing output is ours is asked
    by `precheck`, with the record it reads for resume."""
    inputs: dict[Path, None] = dict.fromkeys(p for p in extra_inputs if p is not None)
    for pair in pairs:
        inputs.update(dict.fromkeys(p for p in pair.inputs() if p is not None))
    others = [Other(Path(report), "report", is_our_report, "a batch report")] if report is not None else []
    others += [Other(Path(page), "page") for page in pages]
    check_outputs([], inputs, overwrite=config.overwrite, others=chain(_targets(pairs, config), others))


def _targets(pairs: Iterable[Pair], config: RunConfig) -> Iterator[Other]:
    for pair in pairs:
        if pair.reason is None and pair.classified:
            try:
                paths = _plan(config, pair).targets.all()
            except UsageError:  # a pair the batch reports as its own error (e.g. hd with a lower garment)
                continue
            yield from (Other(p, "output") for p in paths)


TODO, SKIPPED, ERROR, STALE, PLANNED_ERROR = 0, 1, 2, 3, 4  # a pair's verdict (PLANNED_ERROR: an error with a job)
NO_SEED = -1
NO_MESSAGE = -1


@dataclass
class Precheck:
    """The outcome of the checks, a few bytes a pair: each pair's verdict (to do, skipped, error), the errors'
    messages (compressed), the skipped pairs' seeds, what the pairs to do need, and the config they run with (a
    resumed batch whose seed was drawn keeps the seed its files were made with). The reports of the pairs
    already decided (`done`) and the jobs of the pairs to do (`todo`) are made again one at a time when they are
    wanted, so a batch of 10^6 pairs never holds 10^6 of either."""

    pairs: Sequence[Pair]
    config: RunConfig
    verdicts: bytearray
    seeds: array  # position -> the seed a skipped pair's files record (NO_SEED: none)
    messages: array = field(default_factory=lambda: array("i"))  # position -> its error's number in `texts`
    texts: TextStore = field(default_factory=TextStore)
    models: set[ModelType] = field(default_factory=set)  # the models the pairs to do need
    automatic: bool = False  # some pair to do needs pose and parsing (no mask given)
    todo_count: int = 0

    def done(self) -> Iterator[PairReport]:
        """The reports of the pairs already decided (errors, skipped), in input order, each with its job's planned
        record (made again here, one pair at a time) when it has one."""
        seed, config = self.config.sampling.seed, self.config
        for position, verdict in enumerate(self.verdicts):
            pair = self.pairs[position]
            if verdict in (ERROR, PLANNED_ERROR):
                error = self.message(position)
                if verdict == PLANNED_ERROR:
                    yield PairReport.of(pair, "error", _plan(config, pair).planned_record(), error=error)
                else:
                    yield PairReport.unplanned(pair, error, seed)
            elif verdict == SKIPPED:
                job = _plan(config, pair)
                kept = self.seeds[position]
                made = {k: str(p) for k, p in job.targets.intermediates.items() if p.exists()}
                yield PairReport.of(pair, "skipped", job.planned_record(), kept if kept != NO_SEED else None,
                                    resumed=True, outputs=[str(p) for p in job.targets.images], intermediates=made)

    def fail(self, position: int, message: str | None, planned: bool = False) -> None:
        """The pair at `position` is an error (`message`; None: its row's own problem)."""
        self.verdicts[position] = PLANNED_ERROR if planned else ERROR
        if message is None:
            return
        if not self.messages:  # made at the first message: a batch without errors needs no array
            self.messages = array("i", [NO_MESSAGE]) * len(self.pairs)
        self.messages[position] = self.texts.add(message)

    def message(self, position: int) -> str | None:
        """The error of a pair whose verdict is an error."""
        number = self.messages[position] if self.messages else NO_MESSAGE
        return self.pairs[position].problem if number == NO_MESSAGE else self.texts.get(number)

    def todo(self) -> Iterator[tuple[Pair, TryOnJob]]:
        """The pairs to do in run order (model type, garment, person), each planned as it is reached."""
        todo = (i for i, verdict in enumerate(self.verdicts) if verdict == TODO)
        for position in run_order(self.pairs, todo, self.config):
            pair = self.pairs[int(position)]
            yield pair, _plan(self.config, pair)


def _plan(config: RunConfig, pair: Pair) -> TryOnJob:
    return plan_job(config, pair.job_inputs())  # step 1 of the pre-flight


def planned_files(config: RunConfig, pair: Pair) -> tuple[list[str], dict[str, str]]:
    """Where a done pair's pictures and intermediates are: its job's targets, as its report lists them."""
    targets = _plan(config, pair).targets
    return [str(p) for p in targets.images], {kind: str(p) for kind, p in targets.intermediates.items()}


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


def precheck(pairs: Sequence[Pair], config: RunConfig, name: Namer = library_name) -> Precheck:
    """Everything knowable without models, per pair (see the module docstring)."""
    checked = Precheck(pairs, config, bytearray(len(pairs)), array("q"))
    claims = _Claims()
    stale = array("i")  # the pairs whose outputs were made with other settings
    seeds: set[int] = set()  # the seeds existing outputs were made with
    files = _Files()
    for position, pair in enumerate(pairs):
        if pair.reason is not None:
            checked.fail(position, None)
            continue
        try:
            job = _plan(config, pair)
        except UsageError as exc:
            checked.fail(position, f"{pair.source}: {worded(exc, name)}")
            continue
        outputs = job.targets.all()
        records = _Records()
        if not config.overwrite:  # an existing file at an output name must be ours (exit 2 otherwise)
            check_outputs([], [], others=[Other(p, "output", records.ours, "an ootd picture") for p in outputs])
        missing = files.missing(pair)
        if missing:
            checked.fail(position, "; ".join(missing), planned=True)
            continue
        claims.add(position, outputs)
        state = _resume(config, job, records)
        if state is not None and state.status == "stale":
            checked.verdicts[position] = STALE
            stale.append(position)
            continue
        if state is not None and state.seed is not None and job.records_run_seed:
            seeds.add(state.seed)
        if state is not None and state.status == "done":
            checked.verdicts[position] = SKIPPED
            _seed_of(checked, position, state.seed)
            continue
        _to_do(checked, pair, job)
    _settle_clashes(checked, claims.losers(pairs, config))
    stale = array("i", (position for position in stale if checked.verdicts[position] == STALE))
    if stale:
        first = pairs[stale[0]]
        state = _resume(config, _plan(config, first), _Records())
        raise OutputError(stale_error(len(stale), f"{first.source}: {state.reason if state else '?'}"))
    if config.seed_random and len(seeds) == 1:  # a rerun of the same command finishes the batch it started
        (kept,) = seeds
        checked.config = replace(config, sampling=replace(config.sampling, seed=kept))
    return checked


def _resume(config: RunConfig, job: TryOnJob, records: _Records) -> ResumeState | None:
    if config.overwrite:
        return None
    return resume_state(job.targets, job.expected(), read=records, view=job.comparable)


def _to_do(checked: Precheck, pair: Pair, job: TryOnJob) -> None:
    checked.todo_count += 1
    checked.models.update(job.models)
    checked.automatic = checked.automatic or job.made_masks


def _settle_clashes(checked: Precheck, lost: dict[int, Pair]) -> None:
    """Each pair whose output names another pair claimed first: an error, whatever else was found."""
    if not lost:
        return
    for position, clash in lost.items():
        checked.fail(position, f"its output names collide with {clash.source} ({clash.describe()}); rename one "
                               "of the inputs, drop the duplicate or use a --name with {category}", planned=True)
    redo = Precheck(checked.pairs, checked.config, checked.verdicts, checked.seeds)
    for position, verdict in enumerate(checked.verdicts):  # what the pairs left to do need, counted again
        if verdict == TODO:
            _to_do(redo, checked.pairs[position], _plan(checked.config, checked.pairs[position]))
    checked.todo_count, checked.models, checked.automatic = redo.todo_count, redo.models, redo.automatic


def _seed_of(checked: Precheck, position: int, seed: int | None) -> None:
    if not checked.seeds:  # made at the first skipped pair: a batch with none needs no array
        checked.seeds = array("q", [NO_SEED]) * len(checked.pairs)
    checked.seeds[position] = NO_SEED if seed is None else seed


class _Claims:
    """The hash of each output name and the pair that would write it, 12 bytes an output (not a Path and a
    Pair). After the checks, the pairs sharing a hash are settled in input order as if each had claimed its
    names in turn: the first keeps them, a later one whose names are taken is an error."""

    def __init__(self) -> None:
        self.hashes, self.owners = array("q"), array("i")

    def add(self, position: int, outputs: list[Path]) -> None:
        for output in outputs:
            self.hashes.append(hash(output))
            self.owners.append(position)

    def losers(self, pairs: Sequence[Pair], config: RunConfig) -> dict[int, Pair]:
        """Position -> the pair that claimed one of its names first."""
        import numpy as np

        hashes = np.frombuffer(self.hashes, dtype=np.int64) if self.hashes else np.empty(0, np.int64)
        order = np.argsort(hashes, kind="stable")
        twice = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
        if not len(twice):
            return {}
        owners = np.frombuffer(self.owners, dtype=np.int32)
        candidates = sorted(set(owners[order[twice]].tolist()) | set(owners[order[twice + 1]].tolist()))
        owner: dict[Path, int] = {}
        lost: dict[int, Pair] = {}
        for position in candidates:
            outputs = _plan(config, pairs[position]).targets.all()
            first = next((owner[p] for p in outputs if p in owner), None)
            if first is not None:
                lost[position] = pairs[first]
                continue
            for output in outputs:
                owner.setdefault(output, position)
        return lost
