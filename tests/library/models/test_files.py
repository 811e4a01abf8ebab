"""The state a failed load is remembered against: unchanged while nothing is written, changed by a file rewritten
in place at the same size, by another moved onto its name with the same size and times, by a file appearing in a
folder or where none was."""

from __future__ import annotations

import os
from pathlib import Path

from ootd.errors import CheckpointError
from ootd.models.files import Failure, files_state


def test_the_state_changes_with_the_files_and_only_then(tmp_path: Path) -> None:
    folder, missing = tmp_path / "unet", tmp_path / "lora.safetensors"
    folder.mkdir()
    weights = folder / "weights.safetensors"
    weights.write_bytes(b"a" * 64)
    os.utime(weights, ns=(1_000_000_000, 1_000_000_000))
    paths = (folder, missing)
    before = files_state(paths)
    assert files_state(paths) == before and [path for path, _ in before] == [str(folder), str(weights), str(missing)]

    weights.write_bytes(b"b" * 64)  # in place: the same size and inode, a later modification time
    os.utime(weights, ns=(2_000_000_000, 2_000_000_000))
    rewritten = files_state(paths)
    assert rewritten != before

    other = tmp_path / "other.safetensors"  # moved onto its name, with its size and times (`cp -p` then `mv`)
    other.write_bytes(b"c" * 64)
    os.utime(other, ns=(2_000_000_000, 2_000_000_000))
    os.replace(other, weights)
    replaced = files_state(paths)
    assert replaced != rewritten

    (folder / "config.json").write_text("{}")
    added = files_state(paths)
    assert added != replaced
    missing.write_bytes(b"d")
    assert files_state(paths) != added


def test_a_failure_stands_while_its_files_are_unchanged(tmp_path: Path) -> None:
    weights = tmp_path / "weights.safetensors"
    weights.write_bytes(b"damaged")
    error = CheckpointError("damaged")
    failed = Failure(error, (weights,), files_state((weights,)))
    assert failed.stands() and failed.stands()
    weights.write_bytes(b"repaired, longer")
    assert not failed.stands()
    assert Failure(error, (), files_state(())).stands()  # nothing read (models handed in): it stands for good
