"""Atomic writes (ootd/imaging/atomic.py): a file is complete under its name or absent, never replaces a file unless
asked, and a folder is proven writable before work starts."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ootd.errors import NoSpaceError, OutputError
from ootd.imaging import atomic
from ootd.imaging.atomic import check_output_dir, save_png_atomic, write_bytes_atomic


def _gradient(w: int = 120, h: int = 160) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // w, y * 255 // h, (x + y) % 256], axis=-1).astype(np.uint8)


def test_save_and_metadata_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "out.png"
    meta = {"seed": "42", "steps": "20", "note": "über ✓"}
    save_png_atomic(Image.fromarray(_gradient()), path, meta, overwrite=False)
    with Image.open(path) as im:
        assert im.size == (120, 160)
        assert {k: im.text[k] for k in meta} == meta
    assert [p.name for p in tmp_path.iterdir()] == ["out.png"]


def test_existing_file_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "out.png"
    path.write_bytes(b"old contents")
    with pytest.raises(OutputError, match="already exists"):
        save_png_atomic(Image.new("RGB", (64, 64)), path, {}, overwrite=False)
    assert path.read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png"]
    save_png_atomic(Image.new("RGB", (64, 64)), path, {"seed": "1"}, overwrite=True)
    with Image.open(path) as im:
        assert im.text["seed"] == "1"


def test_exception_mid_save_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_save = Image.Image.save

    def failing_save(self, fp, *args, **kwargs):
        real_save(self, fp, *args, **kwargs)  # some bytes are written ...
        raise RuntimeError("disk on fire")  # ... then it fails

    monkeypatch.setattr(Image.Image, "save", failing_save)
    with pytest.raises(RuntimeError, match="disk on fire"):
        save_png_atomic(Image.new("RGB", (64, 64)), tmp_path / "out.png", {}, overwrite=False)
    assert list(tmp_path.iterdir()) == []


def test_oserror_mid_save_becomes_output_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(self, fp, *args, **kwargs):
        fp.write(b"\x89PNG partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Image.Image, "save", full_disk)
    with pytest.raises(NoSpaceError, match=r"^no space left on device \(.*out\.png\)$"):
        save_png_atomic(Image.new("RGB", (64, 64)), tmp_path / "out.png", {}, overwrite=True)
    assert list(tmp_path.iterdir()) == []


def test_save_into_missing_or_unwritable_folder(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OutputError, match="does not exist"):
        save_png_atomic(Image.new("RGB", (64, 64)), tmp_path / "missing" / "out.png", {}, overwrite=False)
    with pytest.raises(OutputError):
        save_png_atomic(Image.new("RGB", (64, 64)), afile / "out.png", {}, overwrite=False)


def test_check_output_dir(tmp_path: Path) -> None:
    created = check_output_dir(tmp_path / "a" / "b")
    assert created.is_dir() and list(created.iterdir()) == []
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OutputError, match="cannot create output folder"):
        check_output_dir(afile / "out")
    with pytest.raises(OutputError, match="not a folder"):
        check_output_dir(afile)


def test_check_output_dir_not_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def deny(path, flags, mode=0o777, *args, **kwargs):
        if ".ootd-write-test" in str(path):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, mode, *args, **kwargs)

    monkeypatch.setattr(atomic.os, "open", deny)
    with pytest.raises(OutputError, match="not writable: Permission denied"):
        check_output_dir(tmp_path)


def test_bytes_are_written_whole_and_never_replace_unless_asked(tmp_path: Path) -> None:
    path = write_bytes_atomic(tmp_path / "a.png", b"first")
    assert path.read_bytes() == b"first"
    with pytest.raises(OutputError, match="already exists"):
        write_bytes_atomic(path, b"second")
    write_bytes_atomic(path, b"second", overwrite=True)
    assert path.read_bytes() == b"second" and [p.name for p in tmp_path.iterdir()] == ["a.png"]
