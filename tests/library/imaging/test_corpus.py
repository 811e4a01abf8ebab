"""The generated corpus (tests/helpers/corpus.py) through every reader of the library: the loaders of person, garment
and mask photos (files and uploads), the photo kept for `--keep-unmasked`, header reads, eval's reader and the PNG
record reader. Each file gives a picture or one `InputImageError` line naming it - no other exception, no hang -
and a valid file of a supported format at least 64 px a side always gives a picture. The everyday group runs one
seed and a few dozen Hypothesis files (a few seconds); the slow group more seeds and hundreds of files."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from ootd.app.tryon.provenance import read_record
from ootd.errors import InputImageError
from ootd.imaging.files import decode_image, image_size, load_image, load_photo, read_rgb
from ootd.imaging.opener import FORMATS, read_header
from tests.helpers.corpus import EVERYDAY, bounded, image_files, mutated

MODES = {"person": "RGB", "garment": "RGB", "mask": "L"}


def _readers(path: Path, data: bytes, name: str, every: bool) -> dict[str, object]:
    """Each reader of the library on one file (`every`: each role through both loaders, else each loader once):
    what it gave (an image, a size, a record) or its one-line error."""
    out: dict[str, object] = {}
    calls = {
        **{f"load {role}": (lambda role=role: load_image(path, role)) for role in MODES},
        **{f"upload {role}": (lambda role=role: decode_image(data, role, name)) for role in MODES},
        "photo": lambda: load_photo(path, name), "upload photo": lambda: load_photo(data, name),
        "size": lambda: image_size(path), "header": lambda: read_header(path, InputImageError),
        "eval": lambda: read_rgb(path, InputImageError), "record": lambda: read_record(path),
    }
    if not every:
        calls = {k: v for k, v in calls.items() if k not in ("load garment", "upload person", "upload mask",
                                                               "upload photo", "header")}
    for what, call in calls.items():
        try:
            out[what] = call()
        except InputImageError as exc:
            message = str(exc)
            assert "\n" not in message and message, (what, message)
            assert what in ("header", "eval") or name in message, (what, message)  # they name their own files
            out[what] = exc
    return out


def _check(path: Path, data: bytes, name: str, origin: str, every: bool = True) -> dict[str, object]:
    path.write_bytes(data)
    try:
        got = bounded(lambda: _readers(path, data, name, every), origin)
    except AssertionError:
        raise
    except Exception as exc:  # noqa: BLE001 - any other exception is the failure this test is for
        raise AssertionError(f"{origin}: {type(exc).__name__}: {exc}") from exc
    for role, mode in MODES.items():
        for how in ("load", "upload"):
            value = got.get(f"{how} {role}")
            assert value is None or isinstance(value, InputImageError) or value.mode == mode, (origin, role, value)
    assert isinstance(got["record"], dict)
    return got


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)])
def test_the_mutated_corpus_through_every_reader(tmp_path: Path, seed: int) -> None:
    every = seed > 0  # the slow group: every mutation, every reader
    samples = mutated(seed) if every else mutated(seed, **EVERYDAY)
    pictures = 0
    for sample in samples:
        got = _check(tmp_path / sample.name, sample.data, sample.name, sample.origin, every)
        pictures += not isinstance(got["load person"], InputImageError)
        if sample.origin.endswith(" valid") and sample.origin.split()[0] in FORMATS:
            assert not isinstance(got["load person"], InputImageError), (sample.origin, got["load person"])
    assert len(samples) > (500 if every else 100) and 20 < pictures < len(samples)  # both kinds occur


def _unusual(data: tuple[str, bytes, str], tmp_path: Path) -> None:
    name, body, what = data
    got = _check(tmp_path / name, body, name, what)
    fmt = what.split()[2].rstrip(",")
    big_enough = all(int(side) >= 64 for side in what.split()[1].split("x"))
    if big_enough and fmt in FORMATS:  # a valid file ootd reads: a picture, never an error
        for role in MODES:
            assert not isinstance(got[f"load {role}"], InputImageError), (what, got[f"load {role}"])


@settings(max_examples=30, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=image_files())
def test_unusual_valid_files_are_pictures(tmp_path: Path, data: tuple[str, bytes, str]) -> None:
    _unusual(data, tmp_path)


@pytest.mark.slow
@settings(max_examples=600, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=image_files())
def test_unusual_valid_files_are_pictures_many(tmp_path: Path, data: tuple[str, bytes, str]) -> None:
    _unusual(data, tmp_path)
