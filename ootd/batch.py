"""Many try-ons with the models loaded once: pairs, their outputs, reuse, resume and the JSON-lines report.

Shared with `ootd run` (a batch of one): the validated `RunConfig`, output names, PNG metadata, atomic saving and
the cheap checkpoint check that runs before any model is loaded.

Reuse: what depends on one input only is computed once per distinct input. Pairs run garment by garment, so the
garment side (garment UNet features: hundreds of MB at 768x1024) is prepared once per (garment, category) and
only one is held at a time; the person side (mask and latents: a few MB) stays in a small LRU across garments,
so it is prepared once per (person, category, mask) as long as the distinct people fit in that cache.
"""

from __future__ import annotations

import csv
import gc
import json
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ootd.checkpoints import Layout
from ootd.config import Category, ModelType, SamplingSettings, check_model_category, default_model_type
from ootd.errors import CheckpointError, NoPersonError, OotdError, UsageError

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".avif", ".bmp", ".tif", ".tiff", ".gif", ".ppm")
INTERMEDIATES = ("pose", "parsing", "mask", "masked_person")  # what --save-intermediates writes
REPORT_NAME = "batch_report.jsonl"
PAIRINGS = ("zip", "product")
FIT_MODES = ("pad", "crop", "stretch")
CSV_HEADER_WORDS = {
    "person": ("person", "model", "person_path", "model_path", "human"),
    "garment": ("garment", "cloth", "garment_path", "cloth_path", "clothes"),
    "category": ("category", "type"),
    "mask": ("mask", "mask_path"),
}

Progress = Callable[[str, int, int], None]  # (stage, done, total), as the pipeline reports it


# ---------------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class RunConfig:
    """Everything a try-on needs besides its inputs, validated once by the CLI."""

    checkpoints: Path  # the released layout (SPEC section 1)
    output: Path  # folder for results, created if needed
    sampling: SamplingSettings  # seed already drawn, so it can be printed before the work starts
    model_type: ModelType | None = None  # None: hd for upper-body garments, dc otherwise
    device: str | None = None  # None/"auto": the best available
    precision: str = "auto"  # auto|fp32|fp16|bf16
    attention: str = "auto"  # auto|flash|sdpa|chunked|math
    parsing_provider: str = "auto"  # ONNX Runtime provider for human parsing
    max_memory: int | None = None  # bytes the memory plan may use (when the pipeline supports it)
    fit: str = "pad"  # how non-3:4 inputs are framed: pad|crop|stretch
    mask_grow: int = 0  # extra pixels (at 512 px height) added around the mask
    save_intermediates: bool = False  # pose, parsing, mask, masked person next to the outputs
    overwrite: bool = False  # replace existing outputs (else: run refuses, batch skips/keeps them)
    channels_last: bool | None = None  # None: the device profile's choice
    compile: bool | None = None  # torch.compile the try-on UNet; None: the device profile's choice

    def model_type_for(self, category: Category) -> ModelType:
        """The model for a category: the forced one (if compatible) or the default (hd upper, dc otherwise)."""
        model_type = self.model_type or default_model_type(category)
        check_model_category(model_type, category)
        return model_type


# ---------------------------------------------------------------------------------------------- pairs


@dataclass(frozen=True)
class Pair:
    """One person + garment try-on request, as read from a CSV row or a folder listing."""

    person: Path
    garment: Path
    category: Category | None  # None only when `problem` says why
    mask: Path | None = None  # None: computed from pose + parsing
    index: int = 0  # position in the input (report order)
    source: str = ""  # where it came from, for messages ("pairs.csv line 4")
    problem: str | None = None  # a request that could not even be read (bad CSV row)

    def describe(self) -> str:
        return f"{self.person.name} + {self.garment.name}"


def _cells(row: list[str]) -> list[str]:
    cells = [c.strip() for c in row]
    while cells and not cells[-1]:
        cells.pop()
    return cells


def _header_columns(cells: list[str]) -> dict[str, int] | None:
    """Column index per field when `cells` is a header row, else None."""
    lowered = [c.lower().replace(" ", "_") for c in cells]
    if not lowered or lowered[0] not in CSV_HEADER_WORDS["person"] + CSV_HEADER_WORDS["garment"]:
        return None
    columns = {}
    for name, words in CSV_HEADER_WORDS.items():
        for i, cell in enumerate(lowered):
            if cell in words:
                columns[name] = i
                break
    if "person" not in columns or "garment" not in columns:
        raise UsageError(f"CSV header {','.join(cells)!r} needs person and garment columns")
    return columns


def _cell(cells: list[str], columns: dict[str, int], name: str) -> str:
    i = columns.get(name)
    return cells[i] if i is not None and i < len(cells) else ""


def _resolve(base: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def read_pairs_csv(path: str | Path, default_category: Category | None = None) -> list[Pair]:
    """Pairs from `person,garment,category[,mask]` rows; header optional; paths relative to the CSV's folder.

    Blank lines and lines starting with '#' are ignored. A row that cannot be understood becomes a Pair with a
    `problem` (reported as an error for that row) instead of stopping the whole batch.
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"pairs file {path}: {'is a folder' if path.is_dir() else 'file not found'}")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"pairs file {path}: cannot be read as UTF-8 text ({exc})") from None
    base = path.parent
    columns = {"person": 0, "garment": 1, "category": 2, "mask": 3}
    pairs: list[Pair] = []
    first = True
    for line_no, row in enumerate(csv.reader(text.splitlines()), start=1):
        cells = _cells(row)
        if not cells or cells[0].startswith("#"):
            continue
        if first:
            first = False
            header = _header_columns(cells)
            if header is not None:
                columns = header
                continue
        source = f"{path.name} line {line_no}"

        person, garment, category_word, mask = (_cell(cells, columns, name)
                                                for name in ("person", "garment", "category", "mask"))
        problem = None
        category = None
        if len(cells) > max(columns.values()) + 1:
            problem = f"{source}: {len(cells)} columns, expected person,garment,category[,mask]"
        elif not person or not garment:
            problem = f"{source}: needs a person and a garment path (person,garment,category[,mask])"
        else:
            try:
                category = Category.parse(category_word) if category_word else default_category
            except UsageError as exc:
                problem = f"{source}: {exc}"
            if category is None and problem is None:
                problem = f"{source}: no category (add a category column or pass --category)"
        pairs.append(
            Pair(
                person=_resolve(base, person or "?"), garment=_resolve(base, garment or "?"), category=category,
                mask=_resolve(base, mask) if mask else None, index=len(pairs), source=source, problem=problem,
            )
        )
    if not pairs:
        raise UsageError(f"pairs file {path} lists no pairs (expected rows person,garment,category[,mask])")
    return pairs


def list_images(folder: str | Path, what: str) -> list[Path]:
    """Image files in a folder (not recursive, hidden files skipped), sorted by name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"{what} folder {folder}: {'is not a folder' if folder.exists() else 'not found'}")
    files = sorted(
        p for p in folder.iterdir()
        if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS
    )
    if not files:
        raise UsageError(f"{what} folder {folder} holds no images ({', '.join(IMAGE_EXTENSIONS)})")
    return files


def pairs_from_folders(
    people: str | Path, garments: str | Path, category: Category, pairing: str = "product",
    masks: str | Path | None = None,
) -> list[Pair]:
    """Every person with every garment (product) or the i-th with the i-th (zip), in name order.

    With `masks`, a person's mask is the image in that folder with the person's file stem (any extension);
    people without one get the automatic mask.
    """
    if pairing not in PAIRINGS:
        raise UsageError(f"unknown pairing {pairing!r}: use zip or product")
    person_files = list_images(people, "people")
    garment_files = list_images(garments, "garments")
    mask_by_stem: dict[str, Path] = {}
    if masks is not None:
        for file in list_images(masks, "masks"):
            mask_by_stem.setdefault(file.stem, file)
    if pairing == "zip":
        if len(person_files) != len(garment_files):
            raise UsageError(
                f"zip pairing needs as many people as garments ({len(person_files)} vs {len(garment_files)}); "
                "use --pairing product for every combination"
            )
        combos = list(zip(person_files, garment_files, strict=True))
    else:
        combos = [(p, g) for p in person_files for g in garment_files]
    return [
        Pair(person=p, garment=g, category=category, mask=mask_by_stem.get(p.stem), index=i,
             source=f"{pairing} #{i + 1}")
        for i, (p, g) in enumerate(combos)
    ]


def _order_key(pair: Pair, config: RunConfig) -> tuple:
    """Runs grouped by model type, then garment (each garment prepared once), then person."""
    try:
        model = config.model_type_for(pair.category).value if pair.category is not None else ""
    except UsageError:
        model = ""
    category = pair.category.value if pair.category is not None else ""
    return (model, str(pair.garment), category, str(pair.person), str(pair.mask or ""), pair.index)


def select_shard(pairs: Sequence[Pair], shard: int, shards: int, config: RunConfig) -> list[Pair]:
    """Shard `shard` of `shards`: a contiguous block of the run order, so each garment's pairs stay together
    (reuse) and the shards are near-equal in size. Stable across runs, so resuming a shard works."""
    if shards < 1 or not 0 <= shard < shards:
        raise UsageError(f"shard must be K/N with 0 <= K < N, got {shard}/{shards}")
    ordered = sorted(pairs, key=lambda p: _order_key(p, config))
    size, extra = divmod(len(ordered), shards)
    start = shard * size + min(shard, extra)
    stop = start + size + (1 if shard < extra else 0)
    return sorted(ordered[start:stop], key=lambda p: p.index)


# ---------------------------------------------------------------------------------------------- outputs


@dataclass(frozen=True)
class Targets:
    """The files one pair writes."""

    images: list[Path]
    intermediates: dict[str, Path] = field(default_factory=dict)

    def all(self) -> list[Path]:
        return [*self.images, *self.intermediates.values()]


def targets_for(pair: Pair, config: RunConfig) -> Targets:
    """`<person>__<garment>__<i>.png` per sample; intermediates as `<person>__<garment>__<kind>.png`."""
    from ootd.images import output_name

    names = [output_name(pair.person, pair.garment, i) for i in range(config.sampling.num_samples)]
    intermediates = {}
    if config.save_intermediates:
        stem = names[0].rsplit("__", 1)[0]
        kinds = INTERMEDIATES if pair.mask is None else ("mask", "masked_person")
        intermediates = {kind: config.output / f"{stem}__{kind}.png" for kind in kinds}
    return Targets([config.output / name for name in names], intermediates)


def _dtype_word(dtype: object) -> str:
    text = str(dtype).removeprefix("torch.")
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(text, text)


def describe_pipeline(pipe: Any, config: RunConfig) -> dict[str, Any]:
    """Device, precision and attention backend of a loaded pipeline as short strings (for --json, PNG metadata
    and the summary line), plus whatever else `pipe.describe()` reports (the memory plan, per-component dtypes).

    Pipelines without `describe()` are described from their attributes.
    """
    described = getattr(pipe, "describe", None)
    info: dict[str, Any] = {}
    if callable(described):
        try:
            info = dict(described() or {})
        except Exception as exc:  # a description must never fail a try-on
            logger.debug("pipe.describe() failed: %s", exc)
    device = getattr(pipe, "device", None)
    if "device" not in info and device is not None:
        info["device"] = str(getattr(device, "torch_device", None) or getattr(device, "type", device))
        info.setdefault("device_name", getattr(device, "name", None))
    name = info.get("device_name")
    if name and name != info.get("device") and "(" not in str(info.get("device")):
        info["device"] = f"{info['device']} ({name})"
    if "arch" not in info and getattr(device, "arch", None):
        info["arch"] = device.arch
    precision = info.get("precision")
    if precision is None:
        precision = getattr(pipe, "precision", None)
        precision = getattr(precision, "unet", precision)
    if isinstance(precision, dict):  # per component: the UNets' dtype is the one that matters
        info["precision_by_component"] = precision
        precision = precision.get("unet", next(iter(precision.values()), None))
    info["precision"] = _dtype_word(precision) if precision is not None else "unknown"
    info["attention"] = str(info.get("attention") or config.attention)
    return info


def peak_memory(pipe: Any = None) -> dict[str, int | None]:
    """Peak device memory allocated by torch (GPUs) and the process's peak resident memory, in bytes."""
    device_peak = None
    torch = sys.modules.get("torch")
    device = getattr(getattr(pipe, "device", None), "torch_device", None)
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


def png_metadata(result: Any, pair: Pair, config: RunConfig, info: dict[str, Any],
                 sample: int | None = None) -> dict[str, str]:
    """Settings + seed (and where the pixels came from) as PNG text chunks."""
    from ootd import __version__

    meta = {"software": f"ootd {__version__}"}
    meta.update({str(k): str(v) for k, v in (getattr(result, "settings", None) or {}).items()})
    meta.update({
        "seed": str(result.seed),
        "person": pair.person.name,
        "garment": pair.garment.name,
        "mask": pair.mask.name if pair.mask is not None else "auto",
        "fit": config.fit,
        "mask_grow": str(config.mask_grow),
        "device": str(info.get("device", "")),
        "precision": str(info.get("precision", "")),
        "attention": str(info.get("attention", "")),
    })
    if sample is not None:
        meta["sample"] = str(sample)
    return meta


def save_result(result: Any, pair: Pair, config: RunConfig, targets: Targets, info: dict[str, Any],
                keep_existing: bool = False) -> tuple[list[Path], dict[str, Path]]:
    """Write the images (and intermediates) atomically. `keep_existing`: leave files that already exist alone
    (a resumed batch), instead of failing on them."""
    from ootd.images import save_png_atomic

    def write(image: Any, path: Path, meta: dict[str, str]) -> None:
        if keep_existing and not config.overwrite and path.exists():
            logger.info("keeping existing %s", path)
            return
        save_png_atomic(image, path, meta, overwrite=config.overwrite)

    images = list(result.images)
    if len(images) != len(targets.images):
        raise OotdError(f"expected {len(targets.images)} images from the pipeline, got {len(images)}")
    for i, (image, path) in enumerate(zip(images, targets.images, strict=True)):
        write(image, path, png_metadata(result, pair, config, info, sample=i))
    written_intermediates = {}
    available = dict(getattr(result, "intermediates", None) or {})
    for kind, path in targets.intermediates.items():
        image = available.get(kind)
        if image is None:
            logger.debug("no %s intermediate for %s", kind, pair.describe())
            continue
        write(image, path, png_metadata(result, pair, config, info))
        written_intermediates[kind] = path
    return list(targets.images), written_intermediates


def check_checkpoints_present(root: Path, model_types: Iterable[ModelType], need_preprocess: bool) -> None:
    """Fail now, with the file and the fix, when a file the run needs is missing or empty (no model loading).

    Truncated or corrupt files are caught when they are loaded; this only makes the common cases instant.
    """
    from ootd.verify import verify_checkpoints

    root = Path(root)
    hint = f"run `ootd download --dest {root}`, or pass --checkpoints DIR / set OOTD_CHECKPOINTS"
    if not root.exists():
        raise CheckpointError(f"checkpoints folder {root} does not exist; {hint}")
    if not root.is_dir():
        raise CheckpointError(f"checkpoints path {root} is not a folder; {hint}")
    models = sorted(set(model_types), key=lambda m: m.value)
    if not models:
        return
    layout = Layout(root)
    optional = set() if need_preprocess else {layout.parsing_atr, layout.parsing_lip, layout.body_pose}
    bad = [c for c in verify_checkpoints(root, models, load=False) if not c.ok and c.path not in optional]
    if bad:
        first = bad[0]
        more = f" ({len(bad) - 1} more: run `ootd checkpoints verify {root}`)" if len(bad) > 1 else ""
        raise CheckpointError(f"{first.component}: {first.path}: {first.problem}; {first.fix}{more}")


def no_person_error(pair_person: Path, exc: NoPersonError) -> NoPersonError:
    """The pose model's error, naming the file and the way around it."""
    return NoPersonError(
        f"no person detected in {pair_person} (pose estimation found nobody; use a photo showing one person, "
        "or pass a mask image)"
    )


# ---------------------------------------------------------------------------------------------- runner


class PipelineLoader:
    """Loads each model type lazily, when its first pair runs, and holds at most one at a time."""

    def __init__(self, factory: Callable[[ModelType], Any]) -> None:
        self.factory = factory
        self.loads: dict[str, int] = {}  # model type -> times loaded (tests check: once each)
        self.seconds = 0.0
        self._current: tuple[ModelType, Any] | None = None
        self._failed: dict[ModelType, OotdError] = {}

    def get(self, model_type: ModelType) -> Any:
        if model_type in self._failed:
            raise self._failed[model_type]
        if self._current is not None and self._current[0] is model_type:
            return self._current[1]
        self.release()
        start = time.perf_counter()
        try:
            pipe = self.factory(model_type)
        except OotdError as exc:  # the same error for every pair of this model type, without retrying
            self._failed[model_type] = exc
            raise
        self.seconds += time.perf_counter() - start
        self.loads[model_type.value] = self.loads.get(model_type.value, 0) + 1
        self._current = (model_type, pipe)
        return pipe

    def holds(self, model_type: ModelType) -> bool:
        return self._current is not None and self._current[0] is model_type

    @property
    def current(self) -> Any:
        return self._current[1] if self._current is not None else None

    def release(self) -> None:
        """Drop the loaded pipeline and give its memory back before another is loaded."""
        if self._current is None:
            return
        self._current = None
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()


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
            "person": str(pair.person),
            "garment": str(pair.garment),
            "category": pair.category.value if pair.category is not None else None,
            "mask": str(pair.mask) if pair.mask is not None else None,
            "model_type": self.model_type,
            "status": self.status,
            "outputs": self.outputs,
            "intermediates": self.intermediates,
            "error": self.error,
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

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.reports)

    @property
    def ok(self) -> bool:
        """True when every pair succeeded now or earlier (skipped = already done)."""
        return self.count("error") == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "pairs": len(self.reports), "ok": self.count("ok"), "skipped": self.count("skipped"),
            "error": self.count("error"), "seconds": round(self.seconds, 3),
            "load_seconds": round(self.load_seconds, 3), "loads": self.loads, "prepared": self.prepared,
            "report": str(self.report_path) if self.report_path else None,
            "seed": next((r.seed for r in self.reports if r.seed is not None), None),
            **self.info, "peak_memory": self.peak_memory,
            "errors": [
                {"index": r.pair.index, "person": str(r.pair.person), "garment": str(r.pair.garment),
                 "error": r.error}
                for r in self.reports if r.status == "error"
            ],
        }


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


class BatchRunner:
    """Runs pairs in reuse-friendly order, writes each pair's report line as soon as it is done."""

    PERSON_KEYS = ("preprocess", "encode_person")
    GARMENT_KEYS = ("conditioning", "encode_garment", "garment_unet")

    def __init__(
        self,
        config: RunConfig,
        loader: PipelineLoader,
        *,
        report_path: Path | None = None,
        person_cache: int = 32,
        garment_cache: int = 1,
        progress: Progress | None = None,
        on_report: Callable[[PairReport], None] | None = None,
    ) -> None:
        self.config = config
        self.loader = loader
        self.report_path = report_path
        self.persons = _Cache(person_cache)
        self.garments = _Cache(garment_cache)
        self.progress = progress
        self.on_report = on_report
        self._report_file = None
        self.info: dict[str, Any] = {}

    # -- phases -------------------------------------------------------------------------------------

    def _precheck(self, pairs: Sequence[Pair]) -> tuple[list[PairReport], list[tuple[Pair, ModelType, Targets]]]:
        """Everything knowable without models: unreadable rows, missing files, model/category mismatches,
        colliding output names, and pairs already done (skipped unless overwrite)."""
        done: list[PairReport] = []
        todo: list[tuple[Pair, ModelType, Targets]] = []
        claimed: dict[Path, Pair] = {}
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
            targets = targets_for(pair, self.config)
            clash = next((claimed[p] for p in targets.all() if p in claimed), None)
            if clash is not None:
                done.append(PairReport(
                    pair, "error", model_type.value, seed=seed,
                    error=f"its output names collide with {clash.source} ({clash.describe()}); "
                          "rename one of the inputs or drop the duplicate",
                ))
                continue
            claimed.update(dict.fromkeys(targets.all(), pair))
            if not self.config.overwrite and all(p.exists() for p in targets.images):
                done.append(PairReport(
                    pair, "skipped", model_type.value, outputs=[str(p) for p in targets.images],
                    intermediates={k: str(p) for k, p in targets.intermediates.items() if p.exists()},
                ))
                continue
            todo.append((pair, model_type, targets))
        return done, todo

    def _emit(self, report: PairReport) -> None:
        if self._report_file is not None:
            self._report_file.write(json.dumps(report.to_json()) + "\n")
            self._report_file.flush()
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
        if self.report_path is not None:
            try:
                self.report_path.parent.mkdir(parents=True, exist_ok=True)
                self._report_file = open(self.report_path, "w", encoding="utf-8")  # noqa: SIM115 - closed below
            except OSError as exc:
                raise OotdError(f"cannot write the report {self.report_path}: {exc.strerror or exc}") from None
        try:
            total = len(pairs)
            for report in done:
                reports.append(report)
                self._emit(report)
                self._tick("pairs", len(reports), total)
            order = sorted(todo, key=lambda item: _order_key(item[0], self.config))
            current_model: ModelType | None = None
            for pair, model_type, targets in order:
                if model_type is not current_model:  # inputs prepared by the other model are no use now
                    self.persons.clear()
                    self.garments.clear()
                    current_model = model_type
                report = self._run_pair(pair, model_type, targets)
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
        )

    def _run_pair(self, pair: Pair, model_type: ModelType, targets: Targets) -> PairReport:
        config = self.config
        seed = config.sampling.seed
        report = PairReport(pair, "error", model_type.value, seed=seed)
        start = time.perf_counter()
        category = pair.category
        assert category is not None  # pairs with a problem never get here
        try:
            loading = not self.loader.holds(model_type)
            if loading:
                self._tick("load", 0, 1)
            pipe = self.loader.get(model_type)
            if loading:
                self._tick("load", 1, 1)
                start = time.perf_counter()  # loading is reported once, not in this pair's time
            resolution = config.sampling.resolution

            def person_inputs() -> Any:
                self._tick("person", 0, 1)
                try:
                    return pipe.prepare_person(pair.person, category, mask=pair.mask, resolution=resolution,
                                               fit=config.fit, mask_grow=config.mask_grow)
                except NoPersonError as exc:
                    raise no_person_error(pair.person, exc) from None

            def garment_inputs() -> Any:
                self._tick("garment", 0, 1)
                return pipe.prepare_garment(pair.garment, category, resolution=resolution, fit=config.fit)

            key = (model_type, category, str(pair.person.resolve()), str(pair.mask.resolve()) if pair.mask else "")
            person, person_new = self.persons.get(key, person_inputs)
            garment, garment_new = self.garments.get(
                (model_type, category, str(pair.garment.resolve())), garment_inputs
            )
            result = pipe.generate(person, garment, config.sampling, progress=self.progress)
            self.info = describe_pipeline(pipe, config)
            t = time.perf_counter()
            images, intermediates = save_result(result, pair, config, targets, self.info, keep_existing=True)
            save_seconds = time.perf_counter() - t
        except OotdError as exc:
            report.error = _one_line(exc)
            logger.debug("pair %s failed", pair.source, exc_info=True)
            return report
        except Exception as exc:  # keep going; the report says what broke
            report.error = f"internal error: {type(exc).__name__}: {_one_line(exc)}"
            logger.warning("pair %s (%s): %s", pair.source, pair.describe(), report.error, exc_info=True)
            return report
        skip = (() if person_new else self.PERSON_KEYS) + (() if garment_new else self.GARMENT_KEYS)
        timings = {k: v for k, v in (result.timings or {}).items() if k not in skip and k != "total"}
        timings["save"] = save_seconds
        timings["wall"] = time.perf_counter() - start
        report.status = "ok"
        report.seed = result.seed
        report.outputs = [str(p) for p in images]
        report.intermediates = {k: str(p) for k, p in intermediates.items()}
        report.timings = _rounded(timings)
        report.reused = {"person": not person_new, "garment": not garment_new}
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
