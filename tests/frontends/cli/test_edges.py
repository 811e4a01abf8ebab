"""The command line's edges: `--name` widths bounded before formatting, `-o FILE` one rule for `run` and `mask`,
dot-temp files dead once their lock is free (whatever their age), one exit code (3) for every setting this machine
cannot run, budgets echoed in the unit given, and what `ootd mask` says about a photo without a person and about
its files.

Through the `ootd` command on the tiny tree; diffusion models are FakePipes or forbidden (everything here is
decided before they load).
"""

from __future__ import annotations

import importlib.util
import json
import os
import tracemalloc
from pathlib import Path

import pytest
import torch
from PIL import Image

from ootd.app.tryon.config import ByteSize, build_config, parse_size
from ootd.app.tryon.naming import MAX_STEM, check_template
from ootd.app.tryon.tempfiles import clean_stale_temps
from ootd.errors import UnsupportedError, UsageError
from ootd.imaging import atomic as ootd_files
from tests.helpers.cli import assert_hints_are_its_options, assert_one_line_error, invoke
from tests.helpers.fakes import images_tree
from tests.helpers.synthetic import synthetic_preprocessor

RUN = ["--steps", "1", "--resolution", "384x512", "--seed", "3"]


def run_args(images: dict[str, Path], tree: Path, out: Path, *extra: object, mask: bool = True) -> list[object]:
    given = ["--mask", images["mask"]] if mask else []
    return ["run", "-m", images["person"], "-c", images["tshirt"], "-k", "upper", *given, "--checkpoints", tree,
            "-o", out, *RUN, *extra]


def mask_args(images: dict[str, Path], tree: Path, out: Path, *extra: object) -> list[object]:
    return ["mask", "-m", images["person"], "-k", "upper", "--checkpoints", tree, "-o", out, *extra]


# ---------------------------------------------------------------------------------------------- --name widths


@pytest.mark.parametrize("template", ["{i:50000000}", "{person}__{i:>50000000}", "{scale:.50000000f}__{i}",
                                      "{i:0>99999999999999999999}"])
def test_name_widths_are_refused_before_anything_is_formatted(template: str) -> None:
    """A width or precision over the longest allowed name is refused from the template alone: no string of that
    size is ever built (the peak allocation stays far below it)."""
    tracemalloc.start()
    try:
        with pytest.raises(UsageError, match=f"more than the {MAX_STEM} a name may have"):
            check_template(template)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated to check {template!r}"


def test_name_formats_that_stay_in_bounds_still_work() -> None:
    assert check_template("{person}__{i:03}") == "{person}__{i:03}"
    assert check_template("{i:0>180}") == "{i:0>180}"  # in bounds: judged on the name it renders
    with pytest.raises(UsageError, match="takes no field in its format"):
        check_template("{i:{seed}}")  # a width taken from a value (a seed of 10**9) is never allowed


def test_run_refuses_a_billion_wide_name_at_once(models, tmp_path: Path, tiny_tree: Path, example_images) -> None:  # noqa: ANN001
    models.forbid()
    result = invoke(*run_args(example_images, tiny_tree, tmp_path / "out"), "--name", "{i:1000000000}")
    assert_one_line_error(result, 2, "--name", "1000000000", f"more than the {MAX_STEM}")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- -o FILE


def test_an_output_that_is_a_file_is_the_same_usage_error_for_run_and_mask(models, tmp_path: Path, tiny_tree: Path,  # noqa: ANN001
                                                                          example_images) -> None:
    models.forbid()
    afile = tmp_path / "person.png"
    afile.write_bytes(b"mine")
    ran = invoke(*run_args(example_images, tiny_tree, afile))
    masked = invoke(*mask_args(example_images, tiny_tree, afile))
    for result in (ran, masked):
        assert_one_line_error(result, 2, f"output folder {afile} exists and is not a folder")
    assert afile.read_bytes() == b"mine"


# ---------------------------------------------------------------------------------------------- dead temp files


def leave_temp(folder: Path, name: str) -> Path:
    """What a kill -9 during a PNG write leaves: a temporary file of ours, unlocked, written just now."""
    folder.mkdir(parents=True, exist_ok=True)
    left = folder / f".{name}.0123456789ab.tmp"
    left.write_bytes(b"\x89PNG half")
    return left


def test_a_rerun_right_after_a_kill_removes_its_temp_file(models, tmp_path: Path, tiny_tree: Path,  # noqa: ANN001
                                                          example_images) -> None:
    models.fake()
    out = tmp_path / "out"
    left = leave_temp(out, "person__tshirt__0.png")  # seconds old, not ten
    result = invoke(*run_args(example_images, tiny_tree, out))
    assert result.exit_code == 0, result.output
    assert not left.exists()
    assert sorted(p.name for p in out.iterdir()) == ["person__tshirt__0.png"]


def test_mask_cleans_its_folder_too(models, tmp_path: Path, tiny_tree: Path, example_images) -> None:  # noqa: ANN001
    models.use(lambda model_type: pytest.fail("no diffusion model"), preprocessor=synthetic_preprocessor())
    out = tmp_path / "masks"
    left = leave_temp(out, "person__upper__mask.png")
    result = invoke(*mask_args(example_images, tiny_tree, out, "--resolution", "384x512"))
    assert result.exit_code == 0, result.output
    assert not left.exists() and not [p for p in out.iterdir() if p.name.startswith(".")]


def test_a_live_write_survives_a_cleaner_at_every_instant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another run's cleaner between the temp file's creation and its lock, and between its last byte and its
    rename: the picture is written whole, under its name, and no temp file is left."""
    fcntl = pytest.importorskip("fcntl")
    real_flock, real_fsync = fcntl.flock, os.fsync
    cleaned: list[list[Path]] = []

    def flock_after_a_cleaner(fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_EX and not cleaned:  # the writer, about to lock its new file
            cleaned.append(clean_stale_temps(tmp_path))
        return real_flock(fd, operation)

    def fsync_then_a_cleaner(fd: int) -> None:
        real_fsync(fd)
        cleaned.append(clean_stale_temps(tmp_path))

    monkeypatch.setattr(fcntl, "flock", flock_after_a_cleaner)
    monkeypatch.setattr(ootd_files.os, "fsync", fsync_then_a_cleaner)
    image = Image.new("RGB", (64, 64), (10, 20, 30))
    path = ootd_files.save_png_atomic(image, tmp_path / "picture.png", {"software": "ootd test"})
    assert len(cleaned[0]) == 1  # the cleaner did take the first, not yet locked, temporary file
    assert cleaned[1:] == [[]]  # and nothing once the writer held its lock
    with Image.open(path) as saved:
        assert saved.getpixel((0, 0)) == (10, 20, 30)
    assert [p.name for p in tmp_path.iterdir()] == ["picture.png"]


# ---------------------------------------------------------------------------------------------- exit code 3


def _has_flash() -> bool:
    return importlib.util.find_spec("flash_attn") is not None and torch.cuda.is_available()


UNSUPPORTED = {  # what this CPU machine cannot run, and what the one line says
    "attention flash": (["--attention", "flash"], "attention flash cannot run here"),
    "fp16 on the CPU": (["--device", "cpu", "--precision", "fp16"], "fp16 is not supported on cpu"),
    "fp8 on the CPU": (["--device", "cpu", "--quantize", "fp8"], "quantization fp8 is not supported on the CPU"),
    "a GPU that is not there": (["--device", "cuda:7"], "device cuda:7 requested but"),
    "a parsing provider not installed": (["--parsing-provider", "cuda"], "CUDAExecutionProvider was requested"),
}


def _skip_where_it_runs(case: str) -> None:
    if case == "attention flash" and _has_flash():
        pytest.skip("flash-attn runs here")
    if case == "a GPU that is not there" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has 8 GPUs")
    if case == "a parsing provider not installed":
        import onnxruntime

        if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            pytest.skip("onnxruntime-gpu is installed")


@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_a_setting_this_machine_cannot_run_is_exit_3_everywhere(case: str, models, tmp_path: Path,  # noqa: ANN001
                                                                tiny_tree: Path, example_images) -> None:
    _skip_where_it_runs(case)
    models.forbid()
    extra, said = UNSUPPORTED[case]
    people, garments = images_tree(tmp_path, example_images, 1, 1)
    commands = {
        "run": run_args(example_images, tiny_tree, tmp_path / "run", *extra),
        "batch": ["batch", "--models", people, "--cloths", garments, "-k", "upper", "--checkpoints", tiny_tree,
                  "-o", tmp_path / "batch", *RUN, *extra],
        "bench": ["bench", "--random-weights", "tiny", "--resolution", "384x512", "-n", "1", "--steps", "1", "-q",
                  *extra],
    }
    if case in ("a GPU that is not there", "a parsing provider not installed"):  # the options `ootd mask` has
        commands["mask"] = mask_args(example_images, tiny_tree, tmp_path / "mask", *extra)
    if case == "a parsing provider not installed":  # bench does no parsing
        del commands["bench"]
    for name, args in commands.items():
        result = invoke(*args)
        assert result.exit_code == 3, (name, result.output)
        line = assert_one_line_error(result, 3, said)
        assert "internal error" not in line, name
    assert not any((tmp_path / name).exists() for name in ("run", "batch", "mask"))  # refused before any work


def test_the_library_raises_the_same_class(tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a pipeline with such a setting raises UnsupportedError (exit code 3) before any weight is read."""
    from ootd.models import Models

    monkeypatch.setattr("ootd.models.build.read_components", lambda *a, **k: pytest.fail("weights were read"))
    cases = [{"device": "cpu", "dtype": "fp16"}, {"device": "cpu", "quantize": "fp8"}, {"device": "cuda:7"}]
    if not _has_flash():
        cases.append({"device": "cpu", "attention": "flash"})
    for kwargs in cases:
        with pytest.raises(UnsupportedError) as caught:
            Models.from_pretrained(tiny_tree, **kwargs).pipeline("hd")
        assert caught.value.exit_code == 3, kwargs


def test_typos_stay_usage_errors(models, tmp_path: Path, tiny_tree: Path, example_images) -> None:  # noqa: ANN001
    models.forbid()
    for extra in (["--attention", "flsh"], ["--precision", "fp17"], ["--device", "tpu"]):
        assert_one_line_error(invoke(*run_args(example_images, tiny_tree, tmp_path / "o", *extra)), 2)


# ---------------------------------------------------------------------------------------------- --max-memory


@pytest.mark.parametrize(("word", "unit", "size"), [("10MiB", "MiB", 10 * 2**20), ("10mib", "MiB", 10 * 2**20),
                                                     ("300MB", "MB", 300 * 2**20), ("1g", "GiB", 2**30)])
def test_budget_words_keep_their_unit(word: str, unit: str, size: int) -> None:
    parsed = parse_size(word)
    assert isinstance(parsed, ByteSize) and (parsed.text, parsed.unit, int(parsed)) == (word, unit, size)


def test_suggested_budgets_round_up_in_the_unit_given() -> None:
    mib = parse_size("10MiB")
    assert mib.format(481 * 2**20 + 1) == "482MiB" and mib.format(2**20) == "1MiB"
    assert parse_size("0.5GiB").format(int(0.47 * 2**30)) == "0.47GiB"
    assert parse_size("100").format(3 * 2**30) == "3GiB"  # bytes given: the number in a readable unit
    assert build_config(checkpoints=".", max_memory="10MiB").max_memory == 10 * 2**20


def test_max_memory_is_echoed_as_given(models, tmp_path: Path, tiny_tree: Path, example_images) -> None:  # noqa: ANN001
    models.forbid()
    result = invoke(*run_args(example_images, tiny_tree, tmp_path / "o", "--device", "cpu", "--max-memory", "10MiB"))
    line = assert_one_line_error(result, 2, "more than --max-memory 10MiB;", "what would fit: --max-memory ")
    suggested = line.rsplit("--max-memory ", 1)[1]
    assert suggested.endswith("MiB") and parse_size(suggested) > 10 * 2**20
    assert "GiB" not in line


# ---------------------------------------------------------------------------------------------- ootd mask


def test_mask_without_a_person_offers_what_mask_can_do(models, tmp_path: Path, tiny_tree: Path,  # noqa: ANN001
                                                       example_images) -> None:
    """The tiny tree's random pose weights find nobody: `ootd mask` has no --mask to offer."""
    models.forbid()
    result = invoke(*mask_args(example_images, tiny_tree, tmp_path / "m", "--resolution", "384x512"))
    line = assert_one_line_error(result, 1, "no person detected", "ootd run --mask")
    assert "give a mask image with --mask" not in line
    assert_hints_are_its_options(result, ["mask"])


def test_mask_says_what_each_file_is_and_its_size(models, tmp_path: Path, tiny_tree: Path, example_images) -> None:  # noqa: ANN001
    models.use(lambda model_type: pytest.fail("no diffusion model"), preprocessor=synthetic_preprocessor())
    out = tmp_path / "m"
    result = invoke(*mask_args(example_images, tiny_tree, out, "--resolution", "768x1024"))
    assert result.exit_code == 0, result.output
    lines = dict(line.split(None, 1) for line in result.stdout.splitlines())
    for kind in ("mask", "masked_person", "pose", "parsing"):
        path = out / f"person__upper__{kind}.png"
        with Image.open(path) as im:
            size = f"{im.width}x{im.height}"
        assert lines[str(path)].startswith(f"{kind}, {size}: "), lines[str(path)]
    assert "768x1024" in lines[str(out / "person__upper__mask.png")]
    assert "pose model's working size" in lines[str(out / "person__upper__pose.png")]
    as_json = invoke(*mask_args(example_images, tiny_tree, tmp_path / "j", "--resolution", "768x1024", "--json"))
    files = json.loads(as_json.stdout)["files"]
    assert files["mask"]["size"] == [768, 1024] and files["pose"]["size"] == [384, 512]
    assert files["mask"]["path"] == str(tmp_path / "j" / "person__upper__mask.png")
