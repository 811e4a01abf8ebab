"""Application-level reliability through the `ootd` command: outputs never replace inputs, concurrent batches,
a budget that cannot fit, full devices, odd CSVs and file names, kills during a write, early option checks.

Batch logic runs against FakePipe (tests/helpers/fakes.py) on the tiny tree; the memory check reads the tiny tree's
configs; the full-stdout check runs the real command in a subprocess against /dev/full.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from ootd import cli
from ootd.app.batch.report import ReportWriter
from ootd.app.tryon.config import build_config
from ootd.errors import OutputError, UsageError
from ootd.imaging import atomic as ootd_images
from ootd.settings import MAX_MASK_GROW
from tests.helpers import REPO
from tests.helpers.fakes import FakePipe, images_tree, read_report


def batch(args: list[str], tiny_tree: Path):  # noqa: ANN201
    return CliRunner().invoke(cli.app, ["batch", *map(str, args), "--checkpoints", str(tiny_tree), "--seed", "5"])


def one_error(result, code: int, *needles: str) -> str:  # noqa: ANN001
    """The one error line on stderr; any other lines are the per-pair lines a batch prints when stderr is not a
    terminal ("[k/n] status ...")."""
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    assert all(line.startswith("[") for line in lines[:-1]), result.stderr
    line = errors[0]
    for needle in needles:
        assert needle in line, line
    return line


def folder_args(people: Path, garments: Path, out: Path) -> list[object]:
    return ["--models", people, "--cloths", garments, "--category", "upper", "-o", out]


def names(folder: Path) -> list[str]:
    """The files in a folder, less the contact sheet page (rewritten by every batch)."""
    return sorted(p.name for p in folder.iterdir() if p.name != "index.html")


# -- 1. data loss -------------------------------------------------------------------------------------------


def test_batch_refuses_outputs_that_are_inputs_or_not_ours(models, tmp_path: Path, example_images: dict[str, Path],
                                                           tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    people, garments = images_tree(tmp_path, example_images, people=1, garments=1)
    models.forbid()
    out = tmp_path / "out"
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_text(f"{people / 'p0.png'},{garments / 'g0.png'},upper\n")
    before = csv_file.read_bytes()
    one_error(batch([csv_file, "-o", out, "--report", csv_file], tiny_tree), 2, "would replace the input")
    assert csv_file.read_bytes() == before
    photo = people / "p0.png"
    photo_bytes = photo.read_bytes()
    one_error(batch([csv_file, "-o", out, "--report", photo], tiny_tree), 2, "would replace the input")
    assert photo.read_bytes() == photo_bytes
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    one_error(batch([csv_file, "-o", out, "--report", notes], tiny_tree), 2, "is not a batch report")
    assert notes.read_text() == "my notes\n"
    out.mkdir()
    foreign = out / "p0__g0__0.png"  # a picture at an output name that ootd did not write
    Image.new("RGB", (8, 8)).save(foreign)
    foreign_bytes = foreign.read_bytes()
    one_error(batch([csv_file, "-o", out], tiny_tree), 2, "is not an ootd picture")
    assert foreign.read_bytes() == foreign_bytes


def test_batch_output_folder_is_the_people_folder_rerun_skips(models, tmp_path: Path, example_images: dict[str, Path],
                                                              tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    people, garments = images_tree(tmp_path, example_images, people=2, garments=1)
    models.fake()
    first = batch(folder_args(people, garments, people), tiny_tree)
    assert first.exit_code == 0, first.output
    listing = names(people)
    assert listing == ["batch_report.jsonl", "p0.png", "p0__g0__0.png", "p1.png", "p1__g0__0.png"]
    again = batch(folder_args(people, garments, people), tiny_tree)  # its own outputs are not people
    assert again.exit_code == 0, again.output
    assert [r["status"] for r in read_report(people / "batch_report.jsonl")] == ["skipped", "skipped"]
    assert names(people) == listing


def test_second_batch_on_the_same_report_is_refused(models, tmp_path: Path, example_images: dict[str, Path],
                                                    tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    people, garments = images_tree(tmp_path, example_images, people=1, garments=1)
    models.fake()
    out = tmp_path / "out"
    out.mkdir()
    running = ReportWriter(out / "batch_report.jsonl").open()  # another batch, mid-run
    running.write({"index": 0, "status": "ok", "person": "a", "garment": "b"})
    try:
        one_error(batch(folder_args(people, garments, out), tiny_tree), 1, "another batch is writing here")
        assert read_report(out / "batch_report.jsonl") == [{"index": 0, "status": "ok", "person": "a",
                                                             "garment": "b"}]
        with pytest.raises(OutputError, match="another batch"):
            ReportWriter(out / "batch_report.jsonl").open()
    finally:
        running.close()  # its process ends: the lock goes with it
    result = batch(folder_args(people, garments, out), tiny_tree)
    assert result.exit_code == 0, result.output
    assert [r["status"] for r in read_report(out / "batch_report.jsonl")] == ["ok"]


# -- 2. a memory budget that nothing fits ---------------------------------------------------------------------


def test_max_memory_that_cannot_fit_stops_before_loading(models, tmp_path: Path, example_images: dict[str, Path],
                                                         tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    people, garments = images_tree(tmp_path, example_images, people=1, garments=1)
    models.forbid()
    result = batch([*folder_args(people, garments, tmp_path / "out"), "--device", "cpu", "--max-memory", "1GiB",
                    "--samples", "64", "--resolution", "768x1024"], tiny_tree)
    line = one_error(result, 2, "64 sample(s) at 768x1024", "--max-memory 1GiB", "what would fit")
    assert "--samples " in line and "--resolution 384x512" in line and line.count("--max-memory") == 2
    suggested = int(line.split("--samples ")[1].split(",")[0])
    assert 1 <= suggested < 64


# -- 3. full devices ------------------------------------------------------------------------------------------


def test_full_disk_while_writing_a_png_stops_the_batch_keeping_what_is_written(models,
        tmp_path: Path, example_images: dict[str, Path], tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    people, garments = images_tree(tmp_path, example_images, people=3, garments=1)
    models.fake()
    real_fsync, calls = os.fsync, []

    def fsync(fd: int) -> None:  # the disk fills up while the second picture is written
        if ".png." in os.readlink(f"/proc/self/fd/{fd}"):  # a picture's temporary file (not the index page)
            calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(ootd_images.os, "fsync", fsync)
    out = tmp_path / "out"
    one_error(batch(folder_args(people, garments, out), tiny_tree), 1, "no space left on device (",
              "p1__g0__0.png)")
    assert len(calls) == 2  # stopped: no third pair tried
    assert names(out) == ["batch_report.jsonl", "p0__g0__0.png"]  # no temp files
    assert Image.open(out / "p0__g0__0.png").size == (48, 64)
    assert [r["status"] for r in read_report(out / "batch_report.jsonl")] == ["ok"]


def test_full_disk_while_writing_the_report_keeps_whole_lines(models,
        tmp_path: Path, example_images: dict[str, Path], tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    people, garments = images_tree(tmp_path, example_images, people=3, garments=1)
    models.fake()
    out = tmp_path / "out"
    report = out / "batch_report.jsonl"
    real_write, lines = os.write, []

    def write(fd: int, data: bytes) -> int:  # the second report line: half of it fits, then the disk is full
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target != str(report):
            return real_write(fd, data)
        lines.append(data)
        if len(lines) == 2:
            return real_write(fd, data[: len(data) // 2])
        if len(lines) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    one_error(batch(folder_args(people, garments, out), tiny_tree), 1, f"no space left on device ({report})")
    assert [r["status"] for r in read_report(report)] == ["ok"]  # whole lines only
    assert report.read_bytes().endswith(b"\n")


def test_full_stdout_is_one_line(tmp_path: Path) -> None:
    """The real command with stdout on /dev/full (every write: ENOSPC); a batch whose only pair has a missing
    photo loads nothing, reports that pair on stderr and its summary on stdout."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_text("missing.png,missing_too.png,upper\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "ootd", "batch", str(csv_file), "-o", str(tmp_path / "out"), "--checkpoints",
             str(tmp_path / "none"), "--json"],
            stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == "error: no space left on device (/dev/full)", done.stderr
    assert len(lines) == 2 and "file not found" in lines[0], done.stderr


# -- 4. odd CSVs and file names -------------------------------------------------------------------------------


def test_csv_with_a_huge_field_names_its_line(models, tmp_path: Path, tiny_tree: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    models.forbid()
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_text("person,garment,category\n" + "a.png," + "x" * 200_000 + ".png,upper\n")
    one_error(batch([csv_file, "-o", tmp_path / "out"], tiny_tree), 2, "pairs.csv line 2", "field larger")


def test_csv_with_a_nul_byte_is_one_line_naming_it(models, tmp_path: Path, tiny_tree: Path) -> None:
    models.forbid()
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_bytes(b"person,garment,category\na.png,b.png,upper\nc.png,d\x00.png,upper\n")
    one_error(batch([csv_file, "-o", tmp_path / "out"], tiny_tree), 2, "pairs.csv line 3", "NUL byte")
    assert not (tmp_path / "out").exists()


def test_a_quoted_newline_never_names_another_file(models, tmp_path: Path, tiny_tree: Path,
                                                   example_images: dict[str, Path]) -> None:
    """`"p.png\nother.png"` is one (missing) file: the photo other.png beside it is never dressed."""
    models.fake()
    for name in ("p.png", "other.png"):
        (tmp_path / name).write_bytes(example_images["person"].read_bytes())
    (tmp_path / "g.png").write_bytes(example_images["tshirt"].read_bytes())
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_text('person,notes,garment,category\n"p.png\nother.png",hi,g.png,upper\n')
    result = batch([csv_file, "-o", tmp_path / "out"], tiny_tree)
    assert result.exit_code == 1, result.output
    (entry,) = read_report(tmp_path / "out" / "batch_report.jsonl")
    assert entry["status"] == "error" and entry["person"].endswith("p.png\nother.png"), entry
    assert not list((tmp_path / "out").glob("*.png"))


def test_csv_that_is_a_fifo_is_refused(models, tmp_path: Path, tiny_tree: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    models.forbid()
    fifo = tmp_path / "pairs.csv"
    os.mkfifo(fifo)
    one_error(batch([fifo, "-o", tmp_path / "out"], tiny_tree), 2, "not a regular file")


def test_report_of_non_utf8_file_names_is_valid_utf8(models, tmp_path: Path, example_images: dict[str, Path],
                                                    tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    people, garments = images_tree(tmp_path, example_images, people=0, garments=1)
    odd = people / os.fsdecode(b"caf\xe9.png")
    odd.write_bytes(example_images["person"].read_bytes())
    models.fake()
    out = tmp_path / "out"
    result = batch(folder_args(people, garments, out), tiny_tree)
    assert result.exit_code == 0, result.output
    (entry,) = read_report(out / "batch_report.jsonl")
    for value in (entry["person"], *entry["outputs"]):
        value.encode("utf-8")  # no lone surrogates: any JSON reader takes it
    assert entry["person"].endswith("caf\\xe9.png")


# -- 5. kills during a write ----------------------------------------------------------------------------------


def test_stale_temp_files_of_ours_are_cleaned_live_and_foreign_ones_kept(models,
        tmp_path: Path, example_images: dict[str, Path], tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    people, garments = images_tree(tmp_path, example_images, people=1, garments=1)
    models.fake()
    out = tmp_path / "out"
    out.mkdir()
    stale = out / ".p0__g0__0.png.0123456789ab.tmp"  # a kill -9 mid-write left it
    live = out / ".other__g0__0.png.ba9876543210.tmp"  # another process is writing it now
    foreign = out / ".notes.tmp"  # not ours
    for path in (stale, live, foreign):
        path.write_bytes(b"partial")
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    with open(live, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        result = batch(folder_args(people, garments, out), tiny_tree)
    assert result.exit_code == 0, result.output
    assert not stale.exists() and live.exists() and foreign.exists()


@pytest.mark.parametrize("when", ["generate", "write"])
def test_sigterm_is_handled_like_ctrl_c(models, when: str, tmp_path: Path, example_images: dict[str, Path],
                                        tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM mid-pair or mid-PNG-write: exit 143, the finished pair and whole report lines kept, no temp file."""
    people, garments = images_tree(tmp_path, example_images, people=2, garments=1)
    real_fsync, calls = os.fsync, []

    def terminate() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here

    if when == "generate":
        models.fake(fail_generate=None)
        original = FakePipe.generate

        def generate(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            if self.calls["generate"] == 1:
                terminate()
            return original(self, *args, **kwargs)

        monkeypatch.setattr(FakePipe, "generate", generate)
    else:
        models.fake()

        def fsync(fd: int) -> None:
            if ".png." in os.readlink(f"/proc/self/fd/{fd}"):  # a picture's temporary file (not the index page)
                calls.append(fd)
            if len(calls) == 2:
                terminate()
            real_fsync(fd)

        monkeypatch.setattr(ootd_images.os, "fsync", fsync)
    def unhandled(signum: int, frame: object) -> None:  # what the test process gets if ootd does not handle it
        raise RuntimeError("SIGTERM was not handled by ootd")

    out = tmp_path / "out"
    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        result = batch(folder_args(people, garments, out), tiny_tree)
        assert signal.getsignal(signal.SIGTERM) is unhandled  # given back
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 143, result.output
    lines = result.stderr.strip().splitlines()  # the per-pair lines of a batch whose stderr is not a terminal
    assert lines[-1] == "terminated" and all(line.startswith("[") for line in lines[:-2]), result.stderr
    assert lines[-2].startswith("stopped after 1 of 2 pairs;") and "rerun the same command" in lines[-2]
    assert names(out) == ["batch_report.jsonl", "p0__g0__0.png"]
    assert [r["status"] for r in read_report(out / "batch_report.jsonl")] == ["ok"]


# -- 6. options checked while the config is built -------------------------------------------------------------


def test_build_config_checks_mask_grow_and_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="^mask_grow must be 0 to 512") as refused:  # build_config's keyword
        build_config(checkpoints=tmp_path, mask_grow=MAX_MASK_GROW + 1)
    assert (refused.value.setting, refused.value.value) == ("mask_grow", MAX_MASK_GROW + 1)
    assert build_config(checkpoints=tmp_path, mask_grow=MAX_MASK_GROW).mask_grow == MAX_MASK_GROW
    with pytest.raises(UsageError, match="unknown device 'tpu'"):
        build_config(checkpoints=tmp_path, device="tpu")
    monkeypatch.setenv("OOTD_DEVICE", "cuda:x")
    with pytest.raises(UsageError, match="OOTD_DEVICE"):
        build_config(checkpoints=tmp_path, device="cuda:x")


def test_batch_bad_mask_grow_and_device_stop_before_any_work(models, tmp_path: Path, example_images: dict[str, Path],
                                                             tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    people, garments = images_tree(tmp_path, example_images, people=1, garments=1)
    models.forbid()
    out = tmp_path / "out"
    one_error(batch([*folder_args(people, garments, out), "--mask-grow", "20000"], tiny_tree), 2, "--mask-grow")
    one_error(batch([*folder_args(people, garments, out), "--device", "tpu"], tiny_tree), 2, "unknown device")
    assert not out.exists()

