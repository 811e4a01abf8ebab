"""File names with control characters, through every `ootd` command that prints names: each human-readable line
shows them escaped (`\\n`, `\\x1b`), as `--json` does, so one name can neither forge another line nor drive the
terminal; and `ootd classify` reports what it cannot read (a symbolic link loop, a FIFO) on its own line.

Through the `ootd` command on the tiny tree; diffusion models are FakePipes (tests/helpers/fakes.py).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from ootd.app.console import one_line
from tests.helpers.cli import invoke
from tests.helpers.synthetic import synthetic_preprocessor

RUN = ["--steps", "1", "--resolution", "384x512", "--seed", "3"]
FORGED = "p\nforged.png: upper 0.99 (upper 0.99)\x1b[2J\u202e"  # a newline, an ANSI escape, a bidi override
SHOWN = "p\\nforged.png: upper 0.99 (upper 0.99)\\x1b[2J\\u202e"
RAW = ("\x1b", "\u202e", "\r")


def clean(text: str) -> None:
    """No character a terminal would act on."""
    assert not any(c in text for c in RAW), repr(text)


def odd_copy(source: Path, folder: Path, stem: str = FORGED) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{stem}.png"
    shutil.copy(source, target)
    return target


def test_run_prints_its_output_names_escaped(models, tmp_path: Path, tiny_tree: Path, example_images) -> None:  # noqa: ANN001
    """Output names are made safe from the inputs' (ootd/app/tryon/naming.py); the folder is the user's."""
    models.fake()
    out = tmp_path / FORGED
    result = invoke("run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper", "--mask",
                    example_images["mask"], "--checkpoints", tiny_tree, "-o", out, *RUN)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith(f"{tmp_path}/{SHOWN}/person__tshirt__"), lines
    assert lines[1].startswith("seed: ") and lines[2].startswith("time: ")
    clean(result.output)
    assert os.path.exists(lines[0].replace(SHOWN, FORGED))  # the escaped line names the file it wrote


def test_batch_lines_and_errors_show_names_escaped(models, tmp_path: Path, tiny_tree: Path, example_images) -> None:  # noqa: ANN001
    models.fake()
    person = odd_copy(example_images["person"], tmp_path / "in")
    csv_file = tmp_path / "pairs.csv"
    rows = [f'"{person}",{example_images["tshirt"]},upper,{example_images["mask"]}',
            f'"{tmp_path / "in" / ("gone" + FORGED)}",{example_images["tshirt"]},upper']
    csv_file.write_text("\n".join(rows) + "\n")
    # the fakes' 48x64 pictures are not framed from the photo, so preservation (measured by default) is left out
    result = invoke("batch", csv_file, "--checkpoints", tiny_tree, "-o", tmp_path / "out", "--no-preservation", *RUN)
    assert result.exit_code == 1, result.output
    errors = result.stderr.splitlines()
    assert [line[:6] for line in errors] == ["error:", "[2/2] "], errors  # one line each
    assert f"pairs.csv line 3 (gone{SHOWN} + tshirt.png)" in errors[0] and "file not found" in errors[0]
    assert SHOWN in errors[1] and errors[1].startswith("[2/2] ok"), errors
    clean(result.output)
    summary = result.stdout.splitlines()
    assert summary[0].startswith("2 pairs: 1 ok, 0 skipped, 1 error") and len(summary) == 6, summary
    assert summary[-1] == f"contact sheet: {(tmp_path / 'out' / 'index.html').as_uri()}"


def test_classify_reports_what_it_cannot_read_and_escapes_names(models, tmp_path: Path, tiny_tree: Path,  # noqa: ANN001
                                                                example_images) -> None:
    models.forbid()
    folder = tmp_path / "garments"
    odd_copy(example_images["tshirt"], folder)
    shutil.copy(example_images["tshirt"], folder / "b_shirt.png")
    os.symlink("c_loop.png", folder / "c_loop.png")  # a link to itself: ELOOP
    os.symlink("nowhere.png", folder / "d_dangling.png")
    os.mkfifo(folder / "e_fifo.png")
    (folder / "f_folder.png").mkdir()
    (folder / "notes.txt").write_text("not named like an image: not a garment")
    result = invoke("classify", folder, "--checkpoints", tiny_tree)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 7, lines  # six entries, one line each, then the counts
    assert lines[0].startswith(f"{folder}/b_shirt.png: ")
    expected = {"c_loop.png": "symbolic link loop", "d_dangling.png": "symbolic link to nothing",
                "e_fifo.png": "FIFO", "f_folder.png": "a folder"}
    for line, (name, words) in zip(lines[1:5], expected.items(), strict=True):
        assert line.startswith(f"{folder}/{name}: error: ") and words in line, line
    assert lines[5].startswith(f"{folder}/{SHOWN}.png: "), lines[5]
    assert lines[6].startswith("6 garments: ") and "4 failed" in lines[6], lines[6]
    clean(result.stdout)
    as_json = [json.loads(line) for line in invoke("classify", folder, "--checkpoints", tiny_tree,
                                                   "--json").stdout.splitlines()]
    assert sum(1 for entry in as_json[:-1] if entry["error"]) == 4
    assert as_json[-1]["summary"]["failed"] == 4 and sum(as_json[-1]["summary"].values()) == 6
    assert as_json[5]["garment"] == str(folder / f"{FORGED}.png")


def test_batch_folder_mode_says_what_it_left_out(models, tmp_path: Path, tiny_tree: Path, example_images) -> None:  # noqa: ANN001
    models.fake()
    people, garments = tmp_path / "people", tmp_path / "garments"
    odd_copy(example_images["person"], people, "a")
    odd_copy(example_images["tshirt"], garments, "g")
    odd_copy(example_images["mask"], tmp_path / "masks", "a")
    os.mkfifo(people / "b_fifo.png")
    result = invoke("batch", "--models", people, "--cloths", garments, "-k", "upper", "--masks", tmp_path / "masks",
                    "--checkpoints", tiny_tree, "-o", tmp_path / "out", *RUN)
    assert result.exit_code == 0, result.output
    warned = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert warned == [f"warning: people folder: {people}/b_fifo.png is a FIFO (named pipe), not an image file; "
                      "left out"], result.stderr


def test_compare_and_mask_print_names_escaped(models, tmp_path: Path, tiny_tree: Path, example_images) -> None:  # noqa: ANN001
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        Image.new("RGB", (8, 8), (10, 20, 30)).save(tmp_path / side / f"{FORGED}.png")
    Image.new("RGB", (8, 8)).save(tmp_path / "a" / f"{FORGED}2.png")  # on one side only: a problem line
    compared = invoke("compare", tmp_path / "a", tmp_path / "b")
    assert compared.exit_code == 0, compared.output
    lines = compared.stdout.splitlines()
    assert lines[0].startswith(f"{SHOWN}.png: PSNR") and lines[1].startswith(f"{SHOWN}2.png: "), lines
    assert len(lines) == 3 and lines[2].startswith("overall"), lines
    clean(compared.stdout)

    models.use(lambda model_type: pytest.fail("no diffusion model"), preprocessor=synthetic_preprocessor())
    masked = invoke("mask", "-m", example_images["person"], "-k", "upper", "--checkpoints", tiny_tree, "-o",
                    tmp_path / FORGED, "--resolution", "384x512")
    assert masked.exit_code == 0, masked.output
    lines = masked.stdout.splitlines()
    assert len(lines) == 4 and all(SHOWN in line for line in lines), lines
    clean(masked.stdout)


def test_error_lines_stay_one_line_without_terminal_controls() -> None:
    assert one_line(f"garment image {FORGED}: file not found") == (
        "garment image p forged.png: upper 0.99 (upper 0.99)\\x1b[2J\\u202e: file not found")
