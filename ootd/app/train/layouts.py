"""The pairs of a training set, in the layouts people have them (docs/training.md):

- a VITON-HD-style folder: `image/` (person photos), `cloth/` (garment photos) and a pairs list (`train_pairs.txt`,
  `pairs.txt`, or the one `*pairs*.txt` there; lines `person.jpg garment.jpg`); upper-body garments;
- a Dress Code-style folder: `upper_body/`, `lower_body/`, `dresses/`, each with `images/` holding `<id>_0.jpg`
  (the person) and `<id>_1.jpg` (the garment) and optionally a pairs list; the category is the subfolder's;
- the batch CSV (`person,garment,category[,mask]`, ootd/app/batch/pairs.py), where the person photo is the target:
  that person wearing that garment.

Every row keeps its number and where it came from, so a bad row is reported as `row N (file line M): problem`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ootd.errors import UsageError, printable
from ootd.settings import Category

DRESS_CODE_FOLDERS = {"upper_body": Category.UPPER, "lower_body": Category.LOWER, "dresses": Category.DRESS}
PAIRS_NAMES = ("train_pairs.txt", "pairs.txt")


@dataclass(frozen=True)
class Row:
    """One listed pair: the person photo is the target wearing the garment."""

    number: int  # 1-based, over the whole data set
    source: str  # "train_pairs.txt line 4"
    person: Path
    garment: Path
    category: Category | None
    mask: Path | None = None
    problem: str | None = None  # a row that could not even be read

    def where(self) -> str:
        return f"row {self.number} ({self.source})"


def _pairs_file(folder: Path, given: Path | None) -> Path | None:
    if given is not None:
        return given
    for name in PAIRS_NAMES:
        if (folder / name).is_file():
            return folder / name
    found = sorted(folder.glob("*pairs*.txt"))
    return found[0] if len(found) == 1 else None


def _read_pairs_list(path: Path) -> list[tuple[int, list[str]]]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"pairs list {printable(path)} cannot be read as UTF-8 text ({exc})") from None
    return [(n, line.split()) for n, line in enumerate(text.splitlines(), 1)
            if line.strip() and not line.lstrip().startswith("#")]


def viton_rows(folder: Path, pairs: Path | None = None) -> list[Row]:
    pairs_file = _pairs_file(folder, pairs)
    if pairs_file is None:
        raise UsageError.about("pairs", "VITON-HD folder {folder} has no pairs list: give one with {@pairs} "
                               "FILE (lines `person.jpg garment.jpg`)", folder=printable(folder))
    rows = []
    for number, (line, cells) in enumerate(_read_pairs_list(pairs_file), 1):
        source = f"{pairs_file.name} line {line}"
        problem = None if len(cells) >= 2 else "needs `person garment` on the line"
        cells = cells + ["?", "?"]
        rows.append(Row(number, source, folder / "image" / cells[0], folder / "cloth" / cells[1], Category.UPPER,
                        problem=problem))
    return rows


def dress_code_rows(folder: Path) -> list[Row]:
    rows: list[Row] = []
    for name, category in DRESS_CODE_FOLDERS.items():
        sub = folder / name
        if not sub.is_dir():
            continue
        images = sub / "images"
        pairs_file = _pairs_file(sub, None)
        if pairs_file is not None:
            for line, cells in _read_pairs_list(pairs_file):
                problem = None if len(cells) >= 2 else "needs `person garment` on the line"
                cells = cells + ["?", "?"]
                rows.append(Row(len(rows) + 1, f"{name}/{pairs_file.name} line {line}", images / cells[0],
                                images / cells[1], category, problem=problem))
            continue
        for person in sorted(images.glob("*_0.*")):
            garments = sorted(images.glob(person.name.replace("_0.", "_1.", 1).rsplit(".", 1)[0] + ".*"))
            problem = None if garments else f"no garment photo {person.stem[:-2]}_1.* beside it"
            rows.append(Row(len(rows) + 1, f"{name}/images/{person.name}", person,
                            garments[0] if garments else images / "?", category, problem=problem))
    return rows


def csv_rows(path: Path) -> list[Row]:
    from ootd.app.batch.pairs import read_pairs_csv

    rows = []
    for pair in read_pairs_csv(path):
        problem = pair.problem
        if problem is None and (pair.auto or pair.outfit):
            problem = "a training pair names its garment's category (upper, lower or dress) and one garment"
        rows.append(Row(pair.index + 1, pair.source, pair.person, pair.garment, pair.category, pair.mask,
                        problem.split(": ", 1)[-1] if problem else None))
    return rows


def read_rows(data: str | Path, pairs: str | Path | None = None) -> tuple[str, list[Row]]:
    """The layout's name and its rows: a CSV file, a Dress Code-style folder or a VITON-HD-style folder."""
    data = Path(data)
    if data.is_file():
        return "csv", csv_rows(data)
    if not data.is_dir():
        raise UsageError(f"training data {printable(data)}: not found (give a folder or a pairs CSV)")
    if any((data / name).is_dir() for name in DRESS_CODE_FOLDERS):
        return "dress-code", dress_code_rows(data)
    if (data / "image").is_dir() and (data / "cloth").is_dir():
        return "viton-hd", viton_rows(data, Path(pairs) if pairs is not None else None)
    raise UsageError(f"training data {printable(data)} is none of the layouts ootd reads: a VITON-HD-style folder "
                     "(image/, cloth/, a pairs list), a Dress Code-style folder (upper_body/, lower_body/, "
                     "dresses/) or a pairs CSV (person,garment,category[,mask])")
