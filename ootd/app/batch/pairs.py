"""Many try-on requests: pairs from a CSV or from two folders, and the shard of them one process runs.

A pair that cannot even be read (a bad CSV row) is kept, with its `problem`, so the batch reports it in its
place instead of stopping. The pairs are returned as a `PairTable` (a few dozen bytes a pair).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ootd.app.batch.folders import list_images
from ootd.app.batch.pair import Pair
from ootd.app.batch.table import PairTable
from ootd.app.tryon.config import RunConfig
from ootd.errors import CheckpointError, Namer, UsageError, library_name, printable, worded
from ootd.settings import AUTO_CATEGORY, Category, CategoryWord, Pairing, parse_category_word

if TYPE_CHECKING:
    from ootd.models import Models

CSV_HEADER_WORDS = {
    "person": ("person", "model", "person_path", "model_path", "human"),
    "garment": ("garment", "cloth", "garment_path", "cloth_path", "clothes"),
    "category": ("category", "type"),
    "mask": ("mask", "mask_path"),
}
OUTFIT_SEPARATOR = ";"  # an outfit row: `person,top.png;trousers.png,upper;lower[,top_mask.png;trousers_mask.png]`


def _outfit_cells(garment: str, category: str, mask: str) -> tuple[list[str], list[str], list[str]] | str:
    """An outfit row's garments, categories (one per garment) and masks (one per garment, or none), or what is
    wrong with them; one garment: one of each, as written."""
    garments, categories, masks = ([c.strip() for c in cell.split(OUTFIT_SEPARATOR)] if cell else []
                                   for cell in (garment, category, mask))
    if len(garments) == 1:
        return [garment], [category], [mask] if mask else []
    if len(garments) != 2 or not all(garments):
        return f"an outfit is two garments (upper{OUTFIT_SEPARATOR}lower), got {garment!r}"
    if len(categories) != 2 or not all(categories):
        return (f"an outfit row needs one category per garment (e.g. upper{OUTFIT_SEPARATOR}lower), got "
                f"{category!r}")
    if masks and (len(masks) != 2 or not all(masks)):
        return f"an outfit row takes one mask per garment or none, got {mask!r}"
    return garments, categories, masks


def _cells(row: list[str]) -> list[str]:
    cells = [c.strip() for c in row]
    while cells and not cells[-1]:
        cells.pop()
    return cells


def _header_columns(cells: list[str]) -> dict[str, int] | None:
    """Column index per field when `cells` is a header row (it names a person or garment column), else None.

    The rule for other columns: a column the header names that ootd does not use (`notes`, `id`) is ignored,
    wherever it is; a header that names one of ootd's columns twice, or lacks person or garment, is refused."""
    lowered = [c.lower().replace(" ", "_") for c in cells]
    field_of = {word: name for name, words in CSV_HEADER_WORDS.items() for word in words}
    if not any(field_of.get(cell) in ("person", "garment") for cell in lowered):
        return None
    columns: dict[str, int] = {}
    for i, cell in enumerate(lowered):
        name = field_of.get(cell)
        if name is None:
            continue
        if name in columns:
            raise UsageError(f"CSV header {printable(','.join(cells))!r} names the {name} column twice "
                             f"({cells[columns[name]]}, {cells[i]})")
        columns[name] = i
    if "person" not in columns or "garment" not in columns:
        raise UsageError(f"CSV header {printable(','.join(cells))!r} needs person and garment columns")
    return columns


def _cell(cells: list[str], columns: dict[str, int], name: str) -> str:
    i = columns.get(name)
    return cells[i] if i is not None and i < len(cells) else ""


class _Paths:
    """One Path per distinct file name in a pairs file, so a person in 1,000 rows is one object (parsed once,
    hashed once, compared by identity first) instead of 1,000."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.seen: dict[str, Path] = {}

    def __call__(self, value: str) -> Path:
        path = self.seen.get(value)
        if path is None:
            path = Path(value).expanduser()
            path = self.seen[value] = path if path.is_absolute() else self.base / path
        return path


def _rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(first line number, cells) per CSV record, the file handed to the csv module as it is (a quoted cell may
    hold a newline; only \\n and \\r end a line). What it cannot take - a field over csv.field_size_limit(), a
    NUL byte (not a text file), bytes that are not UTF-8 - is one UsageError naming its line."""
    line = 0
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            reader = csv.reader(handle)
            while True:
                try:
                    row = next(reader)
                except StopIteration:
                    return
                except csv.Error as exc:
                    raise UsageError(f"pairs file {printable(path)} line {line + 1}: {exc}") from None
                if any("\0" in cell for cell in row):
                    raise UsageError(f"pairs file {printable(path)} line {line + 1}: a NUL byte (is it a text "
                                     "CSV?)")
                first, line = line + 1, reader.line_num
                yield first, row
    except UnicodeDecodeError:
        raise UsageError(f"pairs file {printable(path)} line {_bad_utf8_line(path)}: cannot be read as UTF-8 "
                         "text") from None
    except OSError as exc:
        raise UsageError(f"pairs file {printable(path)}: cannot be read ({exc.strerror or exc})") from None


def _bad_utf8_line(path: Path) -> int:
    """The line of the first byte that is not UTF-8 (the text reader decodes ahead, in blocks)."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return data.count(b"\n", 0, exc.start) + 1
    return 1


def read_pairs_csv(path: str | Path, default_category: CategoryWord | None = None) -> PairTable:
    """Pairs from `person,garment,category[,mask]` rows; header optional; paths relative to the CSV's folder. A
    row whose category is `auto`, or empty (without a `default_category`), is classified (`classify_pairs`).

    Blank lines and lines starting with '#' are ignored; so are the columns a header names that ootd does not use
    (wherever they are). A row that cannot be understood becomes a Pair with a `problem` (reported as an error
    for that row) instead of stopping the whole batch.
    """
    path = Path(path)
    if not path.is_file():
        problem = ("is a folder" if path.is_dir() else "is not a regular file (a pipe or device would block)"
                   if path.exists() else "file not found")
        raise UsageError(f"pairs file {printable(path)}: {problem}")
    rows = _RowReader(path, default_category)
    pairs = PairTable()
    first = True
    for line_no, row in _rows(path):
        cells = _cells(row)
        if not cells or cells[0].startswith("#"):
            continue
        if first:
            first = False
            try:
                header = _header_columns(cells)
            except UsageError as exc:
                raise UsageError(f"pairs file {printable(path)} line {line_no}: {exc}") from None
            if header is not None:
                rows.columns, rows.limit = header, len(cells)
                rows.expected = f"at most {len(cells)}, the columns the header names"
                continue
        pairs.append(rows.pair(cells, f"{path.name} line {line_no}", len(pairs)))
    if not pairs:
        raise UsageError(f"pairs file {path} lists no pairs (expected rows person,garment,category[,mask])")
    return pairs


class _RowReader:
    """One CSV row's cells -> its Pair, by the columns of the header (or person,garment,category,mask)."""

    def __init__(self, path: Path, default_category: CategoryWord | None) -> None:
        self.resolve = _Paths(path.parent)
        self.default_category = default_category
        self.columns = {"person": 0, "garment": 1, "category": 2, "mask": 3}
        self.limit, self.expected = len(self.columns), "person,garment,category[,mask]"

    def pair(self, cells: list[str], source: str, index: int) -> Pair:
        resolve = self.resolve
        person, garment, category_word, mask = (_cell(cells, self.columns, name)
                                                for name in ("person", "garment", "category", "mask"))
        problem = None
        category: CategoryWord | None = None
        second: dict[str, object] = {}
        outfit = _outfit_cells(garment, category_word, mask)
        if len(cells) > self.limit:
            problem = f"{len(cells)} columns, expected {self.expected}"
        elif not person or not garment:
            problem = "needs a person and a garment path (person,garment,category[,mask])"
        elif isinstance(outfit, str):
            problem = outfit
        elif len(outfit[0]) == 2:
            (garment, garment2), words, masks = outfit
            category_word, mask = words[0], masks[0] if masks else ""
            try:
                category2 = parse_category_word(words[1])
                second = {"garment2": resolve(garment2), "category2": None if category2 == AUTO_CATEGORY else category2,
                          "auto2": category2 == AUTO_CATEGORY, "mask2": resolve(masks[1]) if masks else None}
                category = parse_category_word(category_word)
            except UsageError as exc:
                problem = str(exc)
        else:
            try:
                category = parse_category_word(category_word) if category_word else self.default_category
            except UsageError as exc:
                problem = str(exc)
            if category is None and problem is None:
                category = AUTO_CATEGORY
        auto = category == AUTO_CATEGORY
        return Pair(person=resolve(person or "?"), garment=resolve(garment or "?"),
                    category=None if auto else category, mask=resolve(mask) if mask else None, index=index,
                    source=source, reason=problem, auto=auto, **second)  # type: ignore[arg-type]


def pairs_from_folders(
    people: str | Path, garments: str | Path, category: Category, pairing: str | Pairing = Pairing.PRODUCT,
    masks: str | Path | None = None, *, output: str | Path | None = None,
) -> list[Pair]:
    """Every person with every garment (product) or the i-th with the i-th (zip), in name order.

    With `masks`, a person's mask is the image in that folder with the person's file stem (any extension);
    people without one get the automatic mask. `output`: the run's output folder, whose pictures are never
    inputs (a rerun with the outputs among the people must not dress its own results).
    """
    pairing = Pairing.parse(pairing, "pairing")
    person_files = list_images(people, "people", output)
    garment_files = list_images(garments, "garments", output)
    mask_by_stem: dict[str, Path] = {}
    if masks is not None:
        for file in list_images(masks, "masks", output):
            mask_by_stem.setdefault(file.stem, file)
    if pairing is Pairing.ZIP:
        if len(person_files) != len(garment_files):
            raise UsageError.about(
                "pairing", "zip pairing needs as many people as garments ({people} vs {garments}); use "
                "{@pairing} product for every combination", value=pairing, people=len(person_files),
                garments=len(garment_files))
        combos = list(zip(person_files, garment_files, strict=True))
    else:
        combos = [(p, g) for p in person_files for g in garment_files]
    return PairTable(Pair(person=p, garment=g, category=category, mask=mask_by_stem.get(p.stem), index=i,
                          source=f"{pairing} #{i + 1}") for i, (p, g) in enumerate(combos))


def collect_pairs(
    csv_file: str | Path | None, people: str | Path | None, garments: str | Path | None,
    category: str | Category | None = None, pairing: str | Pairing = Pairing.PRODUCT, masks: str | Path | None = None,
    *, output: str | Path | None = None,
) -> PairTable:
    """The pairs of a batch: from a CSV (`category` for rows without one), or from folders of people and
    garments (`category` required); exactly one of the two."""
    default_category = parse_category_word(category) if category is not None else None
    folder_mode = people is not None or garments is not None
    if csv_file is not None and folder_mode:
        raise UsageError.about("people", "give either a pairs CSV or {@people}/{@garments} folders, not both")
    if csv_file is not None:
        return read_pairs_csv(csv_file, default_category)
    if not folder_mode:
        raise UsageError.about("people", "nothing to do: give a pairs CSV or {@people} DIR {@garments} DIR "
                               "{@category} C")
    if people is None or garments is None:
        raise UsageError.about("people" if people is None else "garments",
                               "folder mode needs both {@people} DIR and {@garments} DIR")
    if default_category is None:
        raise UsageError.about("category", "folder mode needs {@category} upper|lower|dress|auto")
    if default_category == AUTO_CATEGORY:
        listed = pairs_from_folders(people, garments, Category.UPPER, pairing, masks, output=output)
        return PairTable(replace(pair, category=None, auto=True) for pair in listed)
    return pairs_from_folders(people, garments, default_category, pairing, masks, output=output)


def classify_pairs(pairs: Sequence[Pair], models: Models, margin: float,
                   name: Namer = library_name) -> PairTable:
    """Each pair with its `auto` garments' categories (each garment file classified once, by the function every
    front end uses, with the owner's classifier); a garment that cannot be read or is refused under the margin
    fails its pairs alone. A CLIP without its text tower stops the batch."""
    from ootd.app.tryon.autocategory import resolve_inputs
    from ootd.errors import OotdError
    from ootd.models import Kind

    known: dict = {}
    reasons: dict[OotdError, str] = {}  # a garment's error -> its text, one string for all its rows
    out = PairTable()
    for pair in pairs:
        if pair.classified or pair.reason is not None:
            out.append(pair)
            continue
        try:
            garments = resolve_inputs(pair.job_inputs(), models, margin, known).garments
        except CheckpointError:
            raise
        except OotdError as exc:
            out.append(replace(pair, reason=reasons.setdefault(exc, worded(exc, name))))
            continue
        second = {"category2": garments[1].category, "category2_p": garments[1].category_p} if pair.outfit else {}
        out.append(replace(pair, category=garments[0].category, category_p=garments[0].category_p, auto=False,
                           auto2=False, **second))
    models.release(Kind.CLASSIFIER)  # every garment is classified: not resident while the try-ons run
    return out


def order_key(pair: Pair, config: RunConfig) -> tuple:
    """Runs grouped by model type, then garment (each garment prepared once), then person."""
    try:
        model = config.model_type_for(pair.category).value if pair.category is not None else ""
    except UsageError:
        model = ""
    category = pair.category.value if pair.category is not None else ""
    return (model, str(pair.garment), category, str(pair.person), str(pair.mask or ""), pair.index)


def run_order(pairs: Sequence[Pair], positions: Iterable[int], config: RunConfig) -> Any:
    """`positions` (in `pairs`) sorted by `order_key`, as a numpy array of them, at a few bytes a pair: each part
    of the key is ranked among its distinct values, then the ranks are sorted (sorting the keys themselves
    would hold a tuple a pair, ~150 MB at 10^6 pairs)."""
    import numpy as np

    chosen = np.fromiter(positions, dtype=np.int64)
    parts = np.empty((6, len(chosen)), dtype=np.int64)
    seen: list[dict[object, int]] = [{} for _ in range(5)]
    for column in range(len(chosen)):
        key = order_key(pairs[int(chosen[column])], config)
        for part in range(5):
            parts[part, column] = seen[part].setdefault(key[part], len(seen[part]))
        parts[5, column] = key[5]
    for part, values in enumerate(seen):  # first-seen numbers -> ranks in sorted order
        rank = np.empty(len(values), dtype=np.int64)
        rank[[values[value] for value in sorted(values)]] = np.arange(len(values))
        parts[part] = rank[parts[part]] if len(values) else parts[part]
    return chosen[np.lexsort(parts[::-1])]


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` (`--shard K/N`, from 0): checked once, when it is made."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise UsageError(f"bad shard {self.index}/{self.count}: need 0 <= K < N")

    @classmethod
    def parse(cls, value: str) -> Shard:
        """'K/N' -> Shard(K, N)."""
        try:
            index, count = (int(x) for x in value.split("/"))
        except ValueError:
            raise UsageError(f"bad shard {value!r}: use K/N, e.g. 0/4 for the first of four") from None
        return cls(index, count)

    def name(self) -> str:
        """`shardKofN`, the part of a file name that keeps shards' files apart."""
        return f"shard{self.index}of{self.count}"


def select_shard(pairs: Sequence[Pair], shard: Shard, config: RunConfig) -> PairTable:
    """The pairs of `shard`: a contiguous block of the run order, so each garment's pairs stay together (reuse)
    and the shards are near-equal in size. Stable across runs, so resuming a shard works."""
    ordered = run_order(pairs, range(len(pairs)), config)
    size, extra = divmod(len(ordered), shard.count)
    start = shard.index * size + min(shard.index, extra)
    stop = start + size + (1 if shard.index < extra else 0)
    return PairTable(pairs[int(i)] for i in sorted(ordered[start:stop].tolist()))
