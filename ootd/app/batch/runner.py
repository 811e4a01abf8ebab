"""The local batch engine: many pairs with the models loaded once, reusing prepared inputs, resumable.

Reuse: what depends on one input only is computed once per distinct input. Pairs run garment by garment, so the
garment side (garment UNet features: hundreds of MB at 768x1024) is prepared once per (garment, category) and
only one is held at a time; the person side (mask and latents: a few MB) stays in a small LRU across garments,
so it is prepared once per (person, category, mask) as long as the distinct people fit in that cache.

Resume: a pair whose outputs all exist and record this run's settings is `skipped` (unless overwrite), so
rerunning the same command finishes a batch; outputs made with other settings make the batch refuse to start
(the checks: ootd/app/batch/precheck.py). Each pair's JSON line is written to the report as soon as it is done,
and the folder's contact sheet (index.html, ootd/app/batch/index.py) is refreshed. When the batch ends, however it
ends, the stale temporary files of writers that died are swept from the folder (ootd/app/tryon/tempfiles.py).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ootd.app.batch.index import ContactIndex
from ootd.app.batch.pages import Heading
from ootd.app.batch.pairs import Pair
from ootd.app.batch.precheck import TODO, Precheck, planned_files, precheck
from ootd.app.batch.report import BatchSummary, PairReport, ReportWriter, Tally
from ootd.app.console import one_line
from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.job import TryOnJob
from ootd.app.tryon.loader import models_for
from ootd.app.tryon.masking import BATCH_REMEDY, PersonNotFound
from ootd.app.tryon.outputs import peak_memory, prepare_output_dir
from ootd.app.tryon.preflight import check_batch, check_output_folder
from ootd.app.tryon.preservation import ParseCache, PreservationChoice, measure_pair
from ootd.app.tryon.record import Record
from ootd.app.tryon.tempfiles import clean_stale_temps
from ootd.errors import CheckpointError, DeviceError, Namer, NoSpaceError, OotdError, library_name, worded
from ootd.models import Models
from ootd.pipeline_types import Progress, RunInfo
from ootd.settings import ModelType

logger = logging.getLogger(__name__)


class _Cache:
    """A small LRU of prepared inputs; remembers failures too, so a bad input fails fast for every pair."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self.items: OrderedDict[tuple, Any] = OrderedDict()
        self.computed = 0

    def get(self, key: tuple, compute: Callable[[], Any]) -> tuple[Any, bool]:
        """(value, computed now); raises the remembered error for a key that failed."""
        if key in self.items:
            self.items.move_to_end(key)
            value = self.items[key]
            if isinstance(value, BaseException):  # a fresh traceback: raised again, each would chain onto the last
                raise value.with_traceback(None)
            return value, False
        self.computed += 1
        try:
            value = compute()
        except OotdError as exc:
            self._put(key, exc)
            raise
        self._put(key, value)
        return value, True

    def _put(self, key: tuple, value: Any) -> None:
        self.items[key] = value
        while len(self.items) > self.size:
            self.items.popitem(last=False)

    def clear(self) -> None:
        self.items.clear()


class BatchRunner:
    """Runs pairs in reuse-friendly order, writes each pair's report line as soon as it is done."""

    def __init__(
        self,
        config: RunConfig,
        models: Models | None = None,
        *,
        report_path: Path | None = None,
        person_cache: int = 32,
        garment_cache: int = 1,
        progress: Progress | None = None,
        on_report: Callable[[PairReport], None] | None = None,
        index_path: Path | None = None,
        preservation: PreservationChoice | None = None,
        name: Namer = library_name,
    ) -> None:
        self.config = config
        self.name = name  # the front end's word for each setting an error names (its report lines say it)
        self.models = models if models is not None else models_for(config)  # every model of the batch
        self.report_path = report_path
        self.persons = _Cache(person_cache)
        self.garments = _Cache(garment_cache)
        self.progress = progress
        self.on_report = on_report
        self._report_file: ReportWriter | None = None
        self.ran: RunInfo | None = None  # how the latest pair ran
        self._model: ModelType | None = None  # the model type of the pairs the caches were filled for
        self.index_path = index_path  # the batch's contact sheet (index.html), refreshed as pairs finish
        self._index: ContactIndex | None = None
        self.preservation = preservation or PreservationChoice()  # each pair made now measured (docs/preservation.md)
        self.tally = Tally(self.preservation)  # the summary's counts, as reports go past (none is kept)
        self.parses = ParseCache(self.models.preprocessor, person_cache)  # the photos' parses, as the persons'

    def _emit(self, report: PairReport) -> None:
        self.tally.add(report)
        if self._report_file is not None:
            self._report_file.write(report.to_json())
        if self._index is not None:
            self._index.add(report)
        if self.on_report is not None:
            self.on_report(report)

    def _tick(self, stage: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(stage, done, total)

    def run(self, pairs: Sequence[Pair]) -> BatchSummary:
        """Every pair: the precheck, then the batch-wide checks (checkpoints, --max-memory, the engine's own),
        and only then anything written: the output folder, the report, the contact sheet, the pairs' files."""
        start = time.perf_counter()
        self.tally = Tally(self.preservation)
        output = self.config.output
        if output.exists() and not output.is_dir():
            prepare_output_dir(output)  # its one-line usage error, before any work
        checked = precheck(pairs, self.config, self.name)
        self.config = checked.config
        if checked.todo_count:  # a fully resumed batch needs no checkpoints at all
            check_batch(self.config, checked.models, checked.automatic,
                        persons=(checked.pairs[i].person for i, verdict in enumerate(checked.verdicts)
                                 if verdict == TODO))
        self._start(checked)
        try:
            self._run(pairs, checked)
        finally:
            self._stop()
        return BatchSummary(
            tally=self.tally, seconds=time.perf_counter() - start, load_seconds=self.models.seconds,
            loads=self.models.loads,
            prepared={"person": self.persons.computed, "garment": self.garments.computed},
            report_path=self.report_path, ran=self.ran, peak_memory=peak_memory(self.models.device),
            seed=self.config.sampling.seed,
        )

    def _start(self, checked: Precheck) -> None:
        """An engine's own checks and start-up before anything is written (the local engine has none)."""

    def _stop(self) -> None:
        """Undo `_start` (always called after it)."""

    def _run(self, pairs: Sequence[Pair], checked: Precheck) -> None:
        check_output_folder(self.config.output)
        if self.index_path is not None:
            self._index = ContactIndex(self.index_path, pairs, Heading.of(self.config),
                                       files=partial(planned_files, self.config))
        if self.report_path is not None:  # locked: a second batch on the same report stops here
            self._report_file = ReportWriter(self.report_path).open()
        total = len(pairs)
        try:
            for report in checked.done():
                self._emit(report)
                self._tick("pairs", self.tally.pairs, total)
            if checked.todo_count and self._index is not None:
                self._index.refresh()  # the page says "running" from here on, rewritten on a timer
            for report in self._execute(checked.todo()):  # in run order, each planned as it is reached
                self._emit(report)
                self._tick("pairs", self.tally.pairs, total)
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM
            self._end("interrupted")
            raise
        except BaseException as exc:
            self._end("stopped", one_line(worded(exc, self.name)) if isinstance(exc, OotdError) else type(exc).__name__)
            raise
        else:
            self._end("finished")
        finally:
            if self._report_file is not None:
                self._report_file.close()
                self._report_file = None
            clean_stale_temps(self.config.output)  # what writers that died left (a Ray worker's), however it ended

    def _end(self, phase: str, reason: str | None = None) -> None:
        if self._index is not None:
            self._index.finish(phase, reason)

    def _execute(self, order: list[tuple[Pair, TryOnJob]]) -> Iterator[PairReport]:
        """The reports of the pairs to do (given in run order), as they finish: here one after the other in this
        process; another engine (ootd/app/batch/ray_engine.py) runs them elsewhere."""
        for pair, job in order:
            report = self.run_one(pair, job)
            failed = next((f for m in job.models if (f := self.models.failure(m)) is not None), None)
            if report.status == "error" and isinstance(failed, CheckpointError | DeviceError):
                # every later pair of this model would fail the same way: stop once, with one line
                raise type(failed)(f"cannot load the {job.model_type.value} model: "
                                   f"{one_line(worded(failed, self.name))}; stopped "
                                   f"before {pair.source} (finished pairs are in the report)") from failed
            yield report

    def run_one(self, pair: Pair, job: TryOnJob) -> PairReport:
        """One pair that passed the precheck; never raises (a failure is the report's error)."""
        if job.models != (self._model,):  # inputs prepared by another model are no use now
            self.persons.clear()
            self.garments.clear()
            self._model = job.model_type if len(job.models) == 1 else None
        report = PairReport.of(pair, "error", job.planned_record())
        return self._guarded(pair, report, lambda report: self._run_job(job, report))

    def _guarded(self, pair: Pair, report: PairReport, work: Callable[[PairReport], None]) -> PairReport:
        """`work` fills the report of a pair that succeeded; a failure is the report's error instead."""
        try:
            work(report)
        except NoSpaceError:  # every later pair would fail the same way: stop, keeping what is written
            raise
        except OotdError as exc:
            shown = exc.with_remedy(BATCH_REMEDY) if isinstance(exc, PersonNotFound) else exc  # a batch's way round
            report.error = one_line(worded(shown, self.name))
            logger.debug("pair %s failed", pair.source, exc_info=True)
        except Exception as exc:  # keep going; the report says what broke
            report.error = f"internal error: {type(exc).__name__}: {one_line(exc)}"
            logger.warning("pair %s (%s): %s", pair.source, pair.describe(), report.error, exc_info=True)
        return report

    def _run_job(self, job: TryOnJob, report: PairReport) -> None:
        start = time.perf_counter()
        with self.models.timed() as loading:  # loading is reported once, not in this pair's time
            outcome = job.run(self.models, self.progress, persons=self.persons, garments=self.garments)
        self.ran = outcome.ran
        t = time.perf_counter()
        images, intermediates = job.save(outcome, keep_existing=True)
        timings = outcome.timings()
        timings.add("save", time.perf_counter() - t)
        if self.preservation.on:  # with the owner's pose and parsing: the ones the pipeline's masks came from
            t = time.perf_counter()
            self.parses.remember(outcome.parse)  # the parse the pair's automatic mask came from: not made again
            masks = {Path(m).name: Path(m) for m in (report.pair.mask, report.pair.mask2) if m is not None}
            report.preservation = measure_pair(images, report.pair.person, self.parses, masks,
                                               self.preservation.review_above)
            timings.add("preservation", time.perf_counter() - t)
        wall = time.perf_counter() - start - loading.seconds
        self._succeeded(report, outcome.record(0), images, intermediates, timings.to_json(4, wall=wall))
        report.reused = dict(outcome.reused)

    @staticmethod
    def _succeeded(report: PairReport, record: Record, images: list[Path], intermediates: dict[str, Path],
                   timings: dict[str, Any]) -> None:
        report.status = "ok"
        report.ran(record)
        report.outputs = [str(p) for p in images]
        report.intermediates = {k: str(p) for k, p in intermediates.items()}
        report.timings = timings
