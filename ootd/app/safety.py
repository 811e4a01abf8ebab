"""Never lose a file: outputs that would replace an input or a file that is not ours are refused before any
work, and the batch report is written under a lock, one whole line at a time.

Ours: a PNG carrying ootd's `software` text chunk (every output and intermediate has it), or a JSON-lines batch
report. An output path that names an input of the same run (the pairs CSV, a person, garment or mask photo, also
through another name: a hard or symbolic link) is refused even with --overwrite; an existing file at an output
path that is not ours is refused unless --overwrite.

The report lock: `ReportWriter` takes an exclusive flock on the report file itself before truncating it, so a
second batch writing the same report (same output folder, same shard) stops at once with "another batch is
writing here"; shards have their own reports and still share a folder. The kernel drops the lock when its
process ends, however it ends, so a killed batch never leaves a stale lock. Each line goes out in one append
write; a line that could not be written whole is cut off again, so the report only ever holds whole lines.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ootd.errors import OutputError, UsageError, no_space, printable

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, whole-line appends only
    fcntl = None

if TYPE_CHECKING:
    from ootd.app.config import RunConfig
    from ootd.app.pairs import Pair

SOFTWARE_KEY = "software"
SOFTWARE_PREFIX = "ootd"
REPORT_LINE_START = b'{"index": '  # how every report line begins (PairReport.to_json)


def _identity(path: Path) -> tuple[object, ...]:
    """What makes two paths the same file: device and inode when it exists, else the absolute path."""
    try:
        info = os.stat(path)
    except OSError:
        return ("path", os.path.abspath(path))
    return ("inode", info.st_dev, info.st_ino)


def is_our_png(path: Path) -> bool:
    """A PNG written by ootd (reads the header chunks only)."""
    from PIL import Image

    try:
        if not path.is_file():
            return False
        with Image.open(path) as im:
            if im.format != "PNG":
                return False
            return str(im.text.get(SOFTWARE_KEY, "")).startswith(SOFTWARE_PREFIX)
    except Exception:  # noqa: BLE001 - anything unreadable is not ours
        return False


def is_our_report(path: Path) -> bool:
    """An empty file or a JSON-lines batch report (its first line is a pair's entry)."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline(1 << 20)
    except OSError:
        return False
    if not first:
        return True  # empty: a batch stopped before its first line
    if not first.endswith(b"\n"):  # a running batch is writing its first line
        return first.startswith(REPORT_LINE_START)
    try:
        entry = json.loads(first)
    except ValueError:
        return False
    return isinstance(entry, dict) and {"index", "status", "person", "garment"} <= entry.keys()


def check_outputs(images: Iterable[Path], inputs: Iterable[Path | None], *, report: Path | None = None,
                  overwrite: bool = False, pages: Iterable[Path] = ()) -> None:
    """Refuse (UsageError, before any work) an output path that is an input, or an existing file that is not
    ours (without `overwrite`). `images`: every PNG the run may write; `report`: the batch report; `pages`:
    other files the run rewrites (the contact sheet's index.html), checked against the inputs only."""
    sources = {_identity(Path(p)): Path(p) for p in inputs if p is not None}
    outputs = [(Path(p), "output") for p in images]
    if report is not None:
        outputs.append((Path(report), "report"))
    outputs += [(Path(p), "page") for p in pages]
    for path, what in outputs:
        source = sources.get(_identity(path))
        if source is not None:
            raise UsageError(f"the {what} {printable(path)} would replace the input {printable(source)}; "
                             "choose another --output" + (" or --report" if what == "report" else ""))
        if what == "page" or overwrite or not os.path.lexists(path):
            continue
        if path.is_dir():
            raise UsageError(f"the {what} {printable(path)} is a folder")
        ours = is_our_report(path) if what == "report" else is_our_png(path)
        if not ours:
            kind = "a batch report" if what == "report" else "an ootd picture"
            raise UsageError(f"{printable(path)} exists and is not {kind}; it would be replaced: move it away, "
                             "choose another --output, or pass --overwrite")


def check_batch_outputs(pairs: Iterable[Pair], config: RunConfig, report: Path | None,
                        extra_inputs: Iterable[Path | None] = (), pages: Iterable[Path] = ()) -> None:
    """`check_outputs` for a batch: every readable pair's targets against every pair's inputs."""
    from ootd.app.outputs import targets_for

    pairs = list(pairs)
    inputs: list[Path | None] = list(extra_inputs)
    images: list[Path] = []
    for pair in pairs:
        inputs += [pair.person, pair.garment, pair.mask]
        if pair.problem is None and pair.category is not None:
            try:
                images += targets_for(pair.request(), config).all()
            except UsageError:  # a pair the batch reports as its own error (e.g. hd with a lower garment)
                continue
    check_outputs(images, inputs, report=report, overwrite=config.overwrite, pages=pages)


class ReportWriter:
    """The batch report: locked against a second batch, truncated, then one whole-line append per entry."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._size = 0

    def open(self) -> ReportWriter:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        except OSError as exc:
            raise self._error(exc, "cannot write the report") from None
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise OutputError(f"another batch is writing here ({printable(self.path)} is locked by a running "
                                  "ootd batch); wait for it to finish, or use another --output or --report") from None
        try:
            os.ftruncate(fd, 0)  # only now: the report of a running batch is never cut
        except OSError as exc:
            os.close(fd)
            raise self._error(exc, "cannot write the report") from None
        self._fd, self._size = fd, 0
        return self

    def _error(self, exc: OSError, what: str) -> OutputError:
        if exc.errno == errno.ENOSPC:
            return no_space(self.path)
        return OutputError(f"{what} {printable(self.path)}: {exc.strerror or exc}")

    def write(self, entry: dict[str, Any]) -> None:
        """Append one line; on failure the file is cut back to its last whole line and the error raised."""
        if self._fd is None:
            raise OutputError(f"the report {printable(self.path)} is not open")
        data = (json.dumps(entry) + "\n").encode("utf-8")
        try:
            written = os.write(self._fd, data)
            while written < len(data):  # a short write: the device filled up mid-line
                written += os.write(self._fd, data[written:])
        except OSError as exc:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                pass
            raise self._error(exc, "cannot write the report") from None
        self._size += len(data)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # releases the lock

    def __enter__(self) -> ReportWriter:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
