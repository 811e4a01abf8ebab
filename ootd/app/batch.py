"""The local batch engine: many pairs with the models loaded once, reusing prepared inputs, resumable.

Reuse: what depends on one input only is computed once per distinct input. Pairs run garment by garment, so the
garment side (garment UNet features: hundreds of MB at 768x1024) is prepared once per (garment, category) and
only one is held at a time; the person side (mask and latents: a few MB) stays in a small LRU across garments,
so it is prepared once per (person, category, mask) as long as the distinct people fit in that cache.

Resume: a pair whose outputs all exist and record this run's settings is `skipped` (unless overwrite), so
rerunning the same command finishes a batch; outputs made with other settings make the batch refuse to start
(the rule: ootd/app/resume.py). Each pair's JSON line is written to the report as soon as it is done, and the
folder's contact sheet (index.html, ootd/app/contact.py) is refreshed.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ootd.app.budget import check_memory_budget
from ootd.app.config import RunConfig
from ootd.app.console import one_line
from ootd.app.contact import ContactIndex
from ootd.app.load import PipelineLoader, check_checkpoints_present
from ootd.app.outputs import Targets, format_seconds, peak_memory, save_outcome, targets_for
from ootd.app.pairs import Pair, order_key
from ootd.app.resume import expected_settings, resume_state, stale_error
from ootd.app.safety import ReportWriter
from ootd.app.tryon import Progress, run_tryon
from ootd.config import ModelType
from ootd.errors import CheckpointError, DeviceError, NoSpaceError, OotdError, OutputError, UsageError, printable

logger = logging.getLogger(__name__)

REPORT_NAME = "batch_report.jsonl"


def report_name(shard: tuple[int, int] | None = None) -> str:
    """The report's file name in the output folder: one per shard, so shards never share a file."""
    return REPORT_NAME if shard is None else f"batch_report.shard{shard[0]}of{shard[1]}.jsonl"


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
            if isinstance(value, BaseException):
                raise value
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


@dataclass
class PairReport:
    """One line of the JSON-lines report."""

    pair: Pair
    status: str  # ok | skipped | error
    model_type: str | None = None
    outputs: list[str] = field(default_factory=list)
    intermediates: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    seed: int | None = None
    timings: dict[str, Any] = field(default_factory=dict)
    reused: dict[str, bool] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        pair = self.pair
        return {
            "index": pair.index,
            "source": pair.source,
            "person": printable(pair.person),  # file names that are not UTF-8 as \xNN escapes
            "garment": printable(pair.garment),
            "category": pair.category.value if pair.category is not None else None,
            "mask": printable(pair.mask) if pair.mask is not None else None,
            "model_type": self.model_type,
            "status": self.status,
            "outputs": [printable(p) for p in self.outputs],
            "intermediates": {k: printable(p) for k, p in self.intermediates.items()},
            "error": printable(self.error) if self.error is not None else None,
            "seed": self.seed,
            "timings": self.timings,
            "reused": self.reused,
        }


@dataclass
class BatchSummary:
    reports: list[PairReport]
    seconds: float
    load_seconds: float
    loads: dict[str, int]
    prepared: dict[str, int]  # how many person/garment preparations actually ran
    report_path: Path | None
    info: dict[str, Any] = field(default_factory=dict)
    peak_memory: dict[str, int | None] = field(default_factory=dict)
    seed: int | None = None  # the batch's seed (a resumed random-seed batch keeps its files' seed)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.reports)

    @property
    def ok(self) -> bool:
        """True when every pair succeeded now or earlier (skipped = already done)."""
        return self.count("error") == 0

    def summary_lines(self, config: RunConfig) -> list[str]:
        """The human summary printed after a batch (counts, time, reuse, seed, where things went)."""
        counts = f"{self.count('ok')} ok, {self.count('skipped')} skipped, {self.count('error')} error"
        people, garments = self.prepared["person"], self.prepared["garment"]
        lines = [
            f"{len(self.reports)} pairs: {counts} in {format_seconds(self.seconds)} "
            f"(model loading {format_seconds(self.load_seconds)}; prepared {people} "
            f"{'person' if people == 1 else 'people'}, {garments} garment{'' if garments == 1 else 's'})",
            f"seed: {self.seed if self.seed is not None else config.sampling.seed}",
            f"outputs: {config.output}",
            f"report: {self.report_path}",
        ]
        if not self.ok:
            lines.append(f"{self.count('error')} pair(s) failed (listed above and in the report); fix them and "
                         "rerun the same command: finished pairs are skipped")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "pairs": len(self.reports), "ok": self.count("ok"), "skipped": self.count("skipped"),
            "error": self.count("error"), "seconds": round(self.seconds, 3),
            "load_seconds": round(self.load_seconds, 3), "loads": self.loads, "prepared": self.prepared,
            "report": str(self.report_path) if self.report_path else None,
            "seed": self.seed if self.seed is not None else next((r.seed for r in self.reports if r.seed is not None),
                                                                 None),
            **self.info, "peak_memory": self.peak_memory,
            "errors": [
                {"index": r.pair.index, "person": str(r.pair.person), "garment": str(r.pair.garment),
                 "error": r.error}
                for r in self.reports if r.status == "error"
            ],
        }


class BatchRunner:
    """Runs pairs in reuse-friendly order, writes each pair's report line as soon as it is done."""

    def __init__(
        self,
        config: RunConfig,
        loader: PipelineLoader | None = None,
        *,
        report_path: Path | None = None,
        person_cache: int = 32,
        garment_cache: int = 1,
        progress: Progress | None = None,
        on_report: Callable[[PairReport], None] | None = None,
        index_path: Path | None = None,
    ) -> None:
        self.config = config
        self.loader = loader if loader is not None else PipelineLoader(config)
        self.report_path = report_path
        self.persons = _Cache(person_cache)
        self.garments = _Cache(garment_cache)
        self.progress = progress
        self.on_report = on_report
        self._report_file: ReportWriter | None = None
        self.info: dict[str, Any] = {}
        self._model: ModelType | None = None  # the model type of the pairs the caches were filled for
        self.index_path = index_path  # the batch's contact sheet (index.html), refreshed as pairs finish
        self._index: ContactIndex | None = None

    # -- phases -------------------------------------------------------------------------------------

    def _precheck(self, pairs: Sequence[Pair]) -> tuple[list[PairReport], list[tuple[Pair, ModelType, Targets]]]:
        """Everything knowable without models: unreadable rows, missing files, model/category mismatches,
        colliding output names, and pairs already done with these settings (skipped unless overwrite). Outputs
        made with other settings: an OutputError before anything runs (ootd/app/resume.py)."""
        done: list[PairReport] = []
        todo: list[tuple[Pair, ModelType, Targets]] = []
        claimed: dict[Path, Pair] = {}
        stale: list[str] = []
        seeds: set[int] = set()  # the seeds existing outputs were made with
        for pair in pairs:
            seed = self.config.sampling.seed
            if pair.problem is not None:
                done.append(PairReport(pair, "error", error=pair.problem, seed=seed))
                continue
            try:
                model_type = self.config.model_type_for(pair.category)
            except UsageError as exc:
                done.append(PairReport(pair, "error", error=f"{pair.source}: {exc}", seed=seed))
                continue
            missing = [
                f"{role} image {path}: {'is a folder, not an image file' if path.is_dir() else 'file not found'}"
                for role, path in (("person", pair.person), ("garment", pair.garment), ("mask", pair.mask))
                if path is not None and not path.is_file()
            ]
            if missing:
                done.append(PairReport(pair, "error", model_type.value, error="; ".join(missing), seed=seed))
                continue
            targets = targets_for(pair.request(), self.config)
            clash = next((claimed[p] for p in targets.all() if p in claimed), None)
            if clash is not None:
                done.append(PairReport(
                    pair, "error", model_type.value, seed=seed,
                    error=f"its output names collide with {clash.source} ({clash.describe()}); "
                          "rename one of the inputs, drop the duplicate or use a --name with {category}",
                ))
                continue
            claimed.update(dict.fromkeys(targets.all(), pair))
            state = None if self.config.overwrite else resume_state(targets, expected_settings(pair.request(),
                                                                                              self.config))
            if state is not None and state.status == "stale":
                stale.append(f"{pair.source}: {state.reason}")
                continue
            if state is not None and state.seed is not None:
                seeds.add(state.seed)
            if state is not None and state.status == "done":
                done.append(PairReport(
                    pair, "skipped", model_type.value, outputs=[str(p) for p in targets.images],
                    intermediates={k: str(p) for k, p in targets.intermediates.items() if p.exists()},
                    seed=state.seed,
                ))
                continue
            todo.append((pair, model_type, targets))
        if stale:
            raise OutputError(stale_error(len(stale), stale[0]))
        self._keep_resumed_seed(seeds, done)
        if self.index_path is not None:
            self._index = ContactIndex(self.index_path, pairs)
        return done, todo

    def _keep_resumed_seed(self, seeds: set[int], done: list[PairReport]) -> None:
        """A batch whose seed was drawn at random continues with the seed its existing outputs were made with,
        so a rerun of the same command finishes the batch it started (one seed for every pair)."""
        if not self.config.seed_random or len(seeds) != 1:
            return
        (seed,) = seeds
        self.config = replace(self.config, sampling=replace(self.config.sampling, seed=seed))
        for report in done:
            if report.status == "error":
                report.seed = seed

    def _emit(self, report: PairReport) -> None:
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
        start = time.perf_counter()
        reports: list[PairReport] = []
        done, todo = self._precheck(pairs)
        if todo:  # a fully resumed batch needs no checkpoints at all
            check_checkpoints_present(
                self.config.checkpoints, {m for _, m, _ in todo}, any(p.mask is None for p, _, _ in todo)
            )
            check_memory_budget(self.config, {m for _, m, _ in todo})  # --max-memory: fits before loading?
        if self.report_path is not None:  # locked: a second batch on the same report stops here
            self._report_file = ReportWriter(self.report_path).open()
        try:
            total = len(pairs)
            for report in done:
                reports.append(report)
                self._emit(report)
                self._tick("pairs", len(reports), total)
            for report in self._execute(sorted(todo, key=lambda item: order_key(item[0], self.config))):
                reports.append(report)
                self._emit(report)
                self._tick("pairs", len(reports), total)
        finally:
            if self._report_file is not None:
                self._report_file.close()
                self._report_file = None
        reports.sort(key=lambda r: r.pair.index)
        return BatchSummary(
            reports=reports, seconds=time.perf_counter() - start, load_seconds=self.loader.seconds,
            loads=dict(self.loader.loads),
            prepared={"person": self.persons.computed, "garment": self.garments.computed},
            report_path=self.report_path, info=self.info, peak_memory=peak_memory(self.loader.current),
            seed=self.config.sampling.seed,
        )

    def _execute(self, order: list[tuple[Pair, ModelType, Targets]]) -> Iterator[PairReport]:
        """The reports of the pairs to do (given in run order), as they finish: here one after the other in this
        process; another engine (ootd/app/ray_engine.py) runs them elsewhere."""
        for pair, model_type, targets in order:
            report = self.run_one(pair, model_type, targets)
            failed = self.loader.failure(model_type)
            if report.status == "error" and isinstance(failed, CheckpointError | DeviceError):
                # every later pair of this model would fail the same way: stop once, with one line
                raise type(failed)(f"cannot load the {model_type.value} model: {one_line(failed)}; stopped "
                                   f"before {pair.source} (finished pairs are in the report)") from failed
            yield report

    def run_one(self, pair: Pair, model_type: ModelType, targets: Targets) -> PairReport:
        """One pair that passed the precheck; never raises (a failure is the report's error)."""
        if model_type is not self._model:  # inputs prepared by the other model are no use now
            self.persons.clear()
            self.garments.clear()
            self._model = model_type
        return self._run_pair(pair, model_type, targets)

    def _run_pair(self, pair: Pair, model_type: ModelType, targets: Targets) -> PairReport:
        config = self.config
        report = PairReport(pair, "error", model_type.value, seed=config.sampling.seed)
        start = time.perf_counter()
        try:
            loading = not self.loader.holds(model_type)
            if loading:
                self._tick("load", 0, 1)
            pipe = self.loader.get(model_type)
            if loading:
                self._tick("load", 1, 1)
                start = time.perf_counter()  # loading is reported once, not in this pair's time
            outcome = run_tryon(pipe, pair.request(), config, self.progress, persons=self.persons,
                                garments=self.garments)
            self.info = outcome.info
            t = time.perf_counter()
            images, intermediates = save_outcome(outcome, config, targets, keep_existing=True)
            save_seconds = time.perf_counter() - t
        except NoSpaceError:  # every later pair would fail the same way: stop, keeping what is written
            raise
        except OotdError as exc:
            report.error = one_line(exc)
            logger.debug("pair %s failed", pair.source, exc_info=True)
            return report
        except Exception as exc:  # keep going; the report says what broke
            report.error = f"internal error: {type(exc).__name__}: {one_line(exc)}"
            logger.warning("pair %s (%s): %s", pair.source, pair.describe(), report.error, exc_info=True)
            return report
        timings = outcome.timings()
        timings["save"] = save_seconds
        timings["wall"] = time.perf_counter() - start
        report.status = "ok"
        report.seed = outcome.result.seed
        report.outputs = [str(p) for p in images]
        report.intermediates = {k: str(p) for k, p in intermediates.items()}
        report.timings = _rounded(timings)
        report.reused = dict(outcome.reused)
        return report


def _rounded(timings: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in timings.items():
        if isinstance(value, float):
            out[key] = round(value, 4)
        elif isinstance(value, list):
            out[key] = [round(v, 4) if isinstance(v, float) else v for v in value]
        else:
            out[key] = value
    return out
