"""Results people can trust and find: settings-aware resume, output name templates, contact sheets (run --grid,
a batch's index.html), `ootd mask`, masks checked against the photo, --fit pad intermediates framed like results.

Through the CLI; batch logic on FakePipe, framing and masks on the tiny pipelines with a synthetic preprocessor.
"""

from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFilter

from tests.helpers.cli import invoke
from tests.helpers.fakes import images_tree, read_report
from tests.helpers.images import array
from tests.helpers.synthetic import synthetic_preprocessor

RUN = ["--steps", "1", "--resolution", "384x512"]


# ---------------------------------------------------------------------------------------------- 1. resume


def test_batch_resume_compares_settings_and_keeps_seeds(models, tmp_path: Path, example_images: dict[str, Path],
                                                        tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    people, garments = images_tree(tmp_path, example_images, people=2, garments=1)
    out = tmp_path / "out"
    base = ["batch", "--models", people, "--cloths", garments, "-k", "upper", "--checkpoints", tiny_tree, "-o", out,
            "--resolution", "384x512"]
    models.fake()
    first = invoke(*base, "--seed", "11", "--steps", "1")
    assert first.exit_code == 0, first.output
    target = out / "p0__g0__0.png"
    mtime = target.stat().st_mtime_ns

    # other settings: refused in one line before anything loads, files untouched
    models.forbid()
    for changed, word in ((["--seed", "11", "--steps", "2"], "steps 1 (now 2)"),
                          (["--seed", "12", "--steps", "1"], "seed 11 (now 12)"),
                          (["--seed", "11", "--steps", "1", "--scheduler", "ddim"], "scheduler unipc (now ddim)"),
                          (["--seed", "11", "--steps", "1", "--fit", "crop"], "fit pad (now crop)"),
                          (["--seed", "11", "--steps", "1", "--cache-interval", "2"], "cache_interval 1 (now 2)")):
        refused = invoke(*base, *changed)
        assert refused.exit_code == 1, (changed, refused.output)
        assert word in refused.stderr and "--overwrite" in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    assert target.stat().st_mtime_ns == mtime

    # the same settings: skipped, and the report keeps the seed the files were made with
    same = invoke(*base, "--seed", "11", "--steps", "1")
    assert same.exit_code == 0 and "0 ok, 2 skipped" in same.stdout
    assert [r["seed"] for r in read_report(out / "batch_report.jsonl")] == [11, 11]

    # intermediates asked for now: those pairs are not done; redone, writing only the missing files
    models.fake()
    more = invoke(*base, "--seed", "11", "--steps", "1", "--save-intermediates")
    assert more.exit_code == 0 and "2 ok, 0 skipped" in more.stdout, more.output
    assert (out / "p0__g0__mask.png").is_file() and target.stat().st_mtime_ns == mtime
    models.forbid()
    assert "0 ok, 2 skipped" in invoke(*base, "--seed", "11", "--steps", "1", "--save-intermediates").stdout

    # no --seed (a random one is drawn): the batch keeps its files' seed, also for the pair it still has to do
    (out / "p1__g0__0.png").unlink()
    made = models.fake()
    resumed = invoke(*base, "--steps", "1")
    assert resumed.exit_code == 0, resumed.output
    assert "1 ok, 1 skipped" in resumed.stdout and "seed: 11" in resumed.stdout
    assert [r["seed"] for r in read_report(out / "batch_report.jsonl")] == [11, 11]
    assert array(out / "p1__g0__0.png")[0, 0, 0] == 11  # FakePipe's shade is the seed
    with Image.open(out / "p1__g0__0.png") as im:
        assert im.text["seed"] == "11"
    assert made["hd"][0].calls["generate"] == 1

    # --overwrite redoes them with the new settings
    redo = invoke(*base, "--seed", "11", "--steps", "2", "--overwrite")
    assert redo.exit_code == 0 and "2 ok" in redo.stdout
    with Image.open(target) as im:
        assert im.text["steps"] == "2"


# ---------------------------------------------------------------------------------------------- 2. names


def test_name_template_on_run_and_batch(models, tmp_path: Path, example_images: dict[str, Path], tiny_tree: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    models.fake()
    people, garments = images_tree(tmp_path, example_images, people=2, garments=1)
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_text("people/p0.png,garments/g0.png,upper\npeople/p0.png,garments/g0.png,dress\n")
    out = tmp_path / "out"
    template = "{person}__{garment}__{category}__{seed}__{i}"
    result = invoke("batch", csv_file, "--checkpoints", tiny_tree, "-o", out, "--seed", "5", *RUN,
                    "--name", template)
    assert result.exit_code == 0, result.output  # upper and dress no longer collide
    assert sorted(p.name for p in out.glob("*.png")) == ["p0__g0__dress__5__0.png", "p0__g0__upper__5__0.png"]

    # collisions are still found: one garment for two people named by the garment alone
    clash = invoke("batch", "--models", people, "--cloths", garments, "-k", "upper", "--checkpoints", tiny_tree,
                   "-o", tmp_path / "o2", "--name", "{garment}-{i}", "--json", *RUN)
    assert clash.exit_code == 1 and "collide" in json.loads(clash.stdout)["errors"][0]["error"]

    run = invoke("run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper", "--mask",
                 example_images["mask"], "--checkpoints", tiny_tree, "-o", tmp_path / "o3", "--seed", "7",
                 "--samples", "2", "--save-intermediates", "--name", "{model}-{person}.{steps}_{i}", *RUN)
    assert run.exit_code == 0, run.output
    assert sorted(p.name for p in (tmp_path / "o3").iterdir()) == [
        "hd-person.1_0.png", "hd-person.1_1.png", "hd-person.1_mask.png", "hd-person.1_masked_person.png"]

    for bad, message in (("{colour}_{i}", "unknown field {colour}"), ("../x{i}", "not a safe file name"),
                         ("{person}", "needs {i}"), ("{person", "bad --name")):
        refused = invoke("run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper",
                         "--checkpoints", tiny_tree, "-o", tmp_path / "o4", "--name", bad)
        assert refused.exit_code == 2, (bad, refused.output)
        assert message in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "{category}" in invoke("run", "--help").stdout


# ---------------------------------------------------------------------------------------------- 3. contact sheets


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.rows = 0
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.rows += tag == "tr"
        if tag == "img":
            self.images.append(dict(attrs)["src"] or "")

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_run_grid_and_batch_index(models, tmp_path: Path, example_images: dict[str, Path], tiny_tree: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    models.fake()
    out = tmp_path / "run"
    result = invoke("run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper", "--mask",
                    example_images["mask"], "--checkpoints", tiny_tree, "-o", out, "--seed", "9", "--grid", *RUN)
    assert result.exit_code == 0, result.output
    grid = out / "person__tshirt__grid.png"
    assert str(grid) in result.stdout
    sheet = array(grid).astype(int)
    # person | garment | mask | sample, each 512 px high (the photos are 3:4, FakePipe's images too), 8 px apart
    assert sheet.shape == (512, 4 * 384 + 3 * 8, 3)
    with Image.open(example_images["person"]) as im:
        person_mean = np.asarray(im.convert("RGB")).reshape(-1, 3).mean(axis=0)
    assert np.allclose(sheet[:, :384].reshape(-1, 3).mean(axis=0), person_mean, atol=3)
    assert (sheet[:, 384:392] == 255).all()  # the gap
    assert (sheet[:, 2 * 392:2 * 392 + 384] == 255).all()  # FakePipe's mask: all white
    assert (sheet[:, 3 * 392:] == (9, 0, 7)).all()  # the sample: FakePipe's colour for seed 9

    people, garments = images_tree(tmp_path, example_images, people=2, garments=2)
    data = example_images["person"].read_bytes()
    (people / "p1.png").write_bytes(data[: len(data) // 3])  # p1 fails
    batch_out = tmp_path / "batch"
    batch = invoke("batch", "--models", people, "--cloths", garments, "-k", "upper", "--checkpoints", tiny_tree,
                   "-o", batch_out, "--seed", "1", "--save-intermediates", *RUN)
    assert batch.exit_code == 1
    page = _Page()
    page.feed((batch_out / "index.html").read_text())
    assert page.rows == 1 + 2  # the garments' row, then one per person
    for name in ("p0__g0__0.png", "p0__g1__0.png", "p0__g0__mask.png", "../people/p0.png", "../garments/g1.png"):
        assert name in page.images, name
    assert all((batch_out / src).is_file() for src in page.images)  # relative links that work
    assert "corrupt or truncated" in "".join(page.text)
    assert "4 pairs: 2 done, 2 error, 0 pending" in "".join(page.text)
    assert not list(batch_out.glob(".*.tmp"))


# ---------------------------------------------------------------------------------------------- 4-6. masks


def wide_photo(tmp_path: Path, example_images: dict[str, Path]) -> tuple[Path, Path]:
    """The example person and its mask cut to 768x800: not 3:4, so --fit pad pads them."""
    photo, mask = tmp_path / "wide.png", tmp_path / "wide_mask.png"
    with Image.open(example_images["person"]) as im:
        im.crop((0, 100, 768, 900)).save(photo)
    with Image.open(example_images["mask"]) as im:
        im.crop((0, 100, 768, 900)).save(mask)
    return photo, mask


def test_mask_command_without_diffusion_models_and_fed_back(models, tmp_path: Path, example_images: dict[str, Path],
                                                            tiny_tree: Path, pipe_hd,  # noqa: ANN001
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from ootd.preprocessing import Preprocessor

    photo, _ = wide_photo(tmp_path, example_images)
    monkeypatch.setattr(Preprocessor, "from_checkpoints", classmethod(lambda cls, *a, **k: synthetic_preprocessor()))
    models.forbid()  # no diffusion model loads
    out = tmp_path / "masks"
    result = invoke("mask", "--model", photo, "--category", "upper", "-o", out, "--checkpoints", tiny_tree,
                    "--resolution", "384x512")
    assert result.exit_code == 0, result.output
    kinds = ("pose", "parsing", "mask", "masked_person")
    listed = [line.split()[0] for line in result.stdout.splitlines()]  # each path, then what it shows
    assert sorted(listed) == sorted(str(out / f"wide__upper__{k}.png") for k in kinds)
    mask = array(out / "wide__upper__mask.png")
    assert mask.shape == (400, 384)  # 768x800 at 384x512 with --fit pad: the padding cropped away
    assert set(np.unique(mask)) == {0, 255} and 0.02 < (mask > 0).mean() < 0.8
    masked = array(out / "wide__upper__masked_person.png")
    assert (masked[mask > 0] == 127).all()
    help_text = invoke("mask", "--help").stdout
    assert "Example" in help_text and "ootd mask --model" in help_text
    again = invoke("mask", "--model", photo, "--category", "upper", "-o", out, "--checkpoints", tiny_tree)
    assert again.exit_code == 1 and "already exists" in again.stderr

    # the same mask as a try-on makes, and one that can be given back as it is
    models.use(pipe_hd, preprocessor=synthetic_preprocessor())  # the early pose, and the pipeline
    auto = invoke("run", "-m", photo, "-c", example_images["tshirt"], "-k", "upper", "--checkpoints", tiny_tree,
                  "-o", tmp_path / "auto", "--save-intermediates", "--seed", "1", *RUN)
    assert auto.exit_code == 0, auto.output
    np.testing.assert_array_equal(array(tmp_path / "auto" / "wide__tshirt__mask.png"), mask)
    given = invoke("run", "-m", photo, "-c", example_images["tshirt"], "-k", "upper", "--checkpoints", tiny_tree,
                   "--mask", out / "wide__upper__mask.png", "-o", tmp_path / "given", "--save-intermediates",
                   "--seed", "1", *RUN)
    assert given.exit_code == 0, given.output
    np.testing.assert_array_equal(array(tmp_path / "given" / "wide__tshirt__mask.png"), mask)
    np.testing.assert_array_equal(array(tmp_path / "given" / "wide__tshirt__0.png"),
                                  array(tmp_path / "auto" / "wide__tshirt__0.png"))


def test_masks_are_checked_against_the_photo(models, tmp_path: Path, example_images: dict[str, Path], tiny_tree: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    models.fake()
    base = ["run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper",
            "--checkpoints", tiny_tree, *RUN]
    with Image.open(example_images["mask"]) as im:
        mask = im.convert("L")
    square, half, rounded = tmp_path / "square.png", tmp_path / "half.png", tmp_path / "rounded.png"
    mask.resize((400, 400)).save(square)
    mask.resize((384, 512)).save(half)  # the photo's aspect at another size: fine
    mask.resize((767, 1024)).save(rounded)  # a pixel of rounding: fine
    models.forbid()
    refused = invoke(*base, "--mask", square, "-o", tmp_path / "a")
    assert refused.exit_code == 2, refused.output
    assert "400x400" in refused.stderr and "768x1024" in refused.stderr and "aspect" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1

    # a 3:4 mask for a photo that is not 3:4: framed like the results, fine with --fit crop/stretch, not pad
    photo, _ = wide_photo(tmp_path, example_images)
    wide = ["run", "-m", photo, "-c", example_images["tshirt"], "-k", "upper", "--checkpoints", tiny_tree, *RUN,
            "--mask", half]
    assert invoke(*wide, "-o", tmp_path / "e").exit_code == 2
    models.fake()
    for fit in ("crop", "stretch"):
        assert invoke(*wide, "-o", tmp_path / fit, "--fit", fit).exit_code == 0
    for good in (half, rounded):
        ok = invoke(*base, "--mask", good, "-o", tmp_path / good.stem)
        assert ok.exit_code == 0 and ok.stderr == "", ok.output

    blurred, colour = tmp_path / "blurred.png", tmp_path / "colour.png"
    mask.filter(ImageFilter.GaussianBlur(25)).save(blurred)
    red = Image.new("RGB", mask.size, (0, 0, 0))
    red.paste((220, 30, 30), mask=mask)
    red.save(colour)
    soft = invoke(*base, "--mask", blurred, "-o", tmp_path / "b")
    assert soft.exit_code == 0 and "not two-tone" in soft.stderr, soft.output
    coloured = invoke(*base, "--mask", colour, "-o", tmp_path / "c")
    assert coloured.exit_code == 0 and "colour image" in coloured.stderr, coloured.output

    # in a batch: that pair fails, the others run
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_text(f"{example_images['person']},{example_images['tshirt']},upper,{square}\n"
                        f"{example_images['person']},{example_images['trousers']},upper,{half}\n")
    batch = invoke("batch", csv_file, "--checkpoints", tiny_tree, "-o", tmp_path / "d", "--json", *RUN)
    summary = json.loads(batch.stdout)
    assert batch.exit_code == 1 and summary["ok"] == 1
    assert "aspect" in summary["errors"][0]["error"]


def test_fit_pad_intermediates_are_framed_like_the_results(tmp_path: Path, example_images: dict[str, Path],
                                                           tiny_tree: Path, use_pipes) -> None:  # noqa: ANN001
    photo, mask = wide_photo(tmp_path, example_images)
    out = tmp_path / "out"
    result = invoke("run", "-m", photo, "-c", example_images["tshirt"], "-k", "upper", "--mask", mask,
                    "--checkpoints", tiny_tree, "-o", out, "--fit", "pad", "--save-intermediates", "--seed", "4", *RUN)
    assert result.exit_code == 0, result.output
    sizes = {p.name: Image.open(p).size for p in out.iterdir()}
    assert sizes == {"wide__tshirt__0.png": (384, 400), "wide__tshirt__mask.png": (384, 400),
                     "wide__tshirt__masked_person.png": (384, 400)}
    # the saved mask is the given one at the result's scale (the reference: a plain NEAREST resize)
    with Image.open(mask) as im:
        expected = np.asarray(im.convert("L").resize((384, 400), Image.NEAREST)) >= 127
    assert ((array(out / "wide__tshirt__mask.png") > 0) != expected).mean() < 0.01

    batch_out = tmp_path / "batch"
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_text(f"{photo},{example_images['tshirt']},upper,{mask}\n")
    batch = invoke("batch", csv_file, "--checkpoints", tiny_tree, "-o", batch_out, "--save-intermediates",
                   "--seed", "4", *RUN)
    assert batch.exit_code == 0, batch.output
    assert Image.open(batch_out / "wide__tshirt__masked_person.png").size == (384, 400)


@pytest.fixture
def use_pipes(models, pipe_hd, pipe_dc):  # noqa: ANN001, ANN201
    pipes = {"hd": pipe_hd, "dc": pipe_dc}
    models.use(lambda model_type: pipes[model_type.value])
    return pipe_hd, pipe_dc


def test_grid_name_is_part_of_the_targets(models, tmp_path: Path, example_images: dict[str, Path], tiny_tree: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """An existing contact sheet stops `run` before anything loads, like any other output."""
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(example_images["person"], out / "person__tshirt__grid.png")
    models.forbid()
    result = invoke("run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper", "--mask",
                    example_images["mask"], "--checkpoints", tiny_tree, "-o", out, "--grid", *RUN)
    # a picture ootd did not write there: refused as a usage error (it would be lost)
    assert result.exit_code == 2 and "person__tshirt__grid.png exists and is not an ootd picture" in result.stderr


def test_mask_command_with_the_real_preprocessor(models, tmp_path: Path, example_images: dict[str, Path],
                                                 tiny_tree: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny tree's random pose weights find nobody: the run's one-line error, nothing written."""
    models.forbid()
    out = tmp_path / "out"
    result = invoke("mask", "-m", example_images["person"], "-k", "upper", "-o", out, "--checkpoints", tiny_tree,
                    "--resolution", "384x512")
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error: no person detected in {example_images['person']}")
    assert list(out.iterdir()) == []
    wrong = invoke("mask", "-m", example_images["person"], "-k", "lower", "--model-type", "hd", "-o", out,
                   "--checkpoints", tiny_tree)
    assert wrong.exit_code == 2 and "upper" in wrong.stderr
