"""Results that are the user's photo, through `ootd run`, `ootd batch` and the HTTP API on the tiny pipelines
(automatic masks from the synthetic pose and parsing): the photo's size, orientation and mode, every pixel outside
the feathered mask the photo's, the setting recorded, compared on resume and named by `ootd compare`, the memory
plan counting the work; without the options every output as before."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ootd.imaging.files import load_photo
from tests.helpers.cli import assert_one_line_error, invoke
from tests.helpers.synthetic import synthetic_preprocessor

RUN = ["--steps", "1", "--resolution", "384x512", "--seed", "3"]


@pytest.fixture
def use_pipes(models, pipe_hd, pipe_dc):  # noqa: ANN001, ANN201
    pipes = {"hd": pipe_hd, "dc": pipe_dc}
    models.use(lambda model_type: pipes[model_type.value], preprocessor=synthetic_preprocessor())


@pytest.fixture
def photos(tmp_path: Path, example_images: dict[str, Path]) -> dict[str, Path]:
    """The example person as a JPEG stored on its side with an EXIF orientation, and as an RGBA PNG of 1:1 whose
    corners are transparent."""
    person = Image.open(example_images["person"]).convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = 6  # shown rotated 90 degrees clockwise: stored 1024x768
    person.rotate(90, expand=True).save(tmp_path / "sideways.jpg", exif=exif, quality=95)
    square = Image.new("RGBA", (900, 900), (0, 0, 0, 0))
    square.paste(person.resize((675, 900)), (112, 0))
    square.save(tmp_path / "square.png")
    return {"sideways": tmp_path / "sideways.jpg", "square": tmp_path / "square.png"}


def _run(photo: Path, example_images: dict[str, Path], tiny_tree: Path, out: Path, *extra: object):  # noqa: ANN202
    return invoke("run", "-m", photo, "-c", example_images["tshirt"], "-k", "upper", "--checkpoints", tiny_tree,
                  "-o", out, *RUN, *extra)


@pytest.mark.parametrize("fit", ["pad", "crop"])
@pytest.mark.parametrize("which", ["sideways", "square"])
def test_keep_unmasked_gives_back_the_photo_with_only_the_garment_region_changed(
        use_pipes, photos, example_images, tiny_tree: Path, tmp_path: Path, which: str, fit: str) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    result = _run(photos[which], example_images, tiny_tree, out, "--keep-unmasked", "--save-intermediates",
                  "--fit", fit)
    assert result.exit_code == 0, result.output
    stem = photos[which].stem
    photo = load_photo(photos[which], which)  # upright, RGBA when transparent
    with Image.open(out / f"{stem}__tshirt__0.png") as im:
        picture = im.copy()
        record = dict(im.text)
    weight = np.asarray(Image.open(out / f"{stem}__tshirt__photo_mask.png"))
    assert picture.size == photo.size == Image.open(out / f"{stem}__tshirt__photo_mask.png").size
    assert picture.mode == photo.mode == ("RGBA" if which == "square" else "RGB")
    got, given = np.asarray(picture), np.asarray(photo)
    assert np.array_equal(got[weight == 0], given[weight == 0])  # outside the feathered mask: the photo
    assert (weight == 255).any() and not np.array_equal(got[weight == 255], given[weight == 255])
    assert (record["keep_unmasked"], record["output_size"], record["feather"]) == ("yes", "photo", "4")
    with Image.open(out / f"{stem}__tshirt__mask.png") as mask:  # the intermediates stay at the working scale
        assert mask.height <= 512


def test_output_size_photo_and_no_option_as_before(use_pipes, photos, example_images, tiny_tree: Path,  # noqa: ANN001
                                                   tmp_path: Path) -> None:
    result = _run(photos["sideways"], example_images, tiny_tree, tmp_path / "photo", "--output-size", "photo",
                  "--json")
    assert result.exit_code == 0, result.output
    settings = json.loads(result.stdout)["settings"]
    assert (settings["output_size"], settings["keep_unmasked"]) == ("photo", False)
    with Image.open(tmp_path / "photo" / "sideways__tshirt__0.png") as im:
        assert im.size == (768, 1024) and im.text["output_size"] == "photo" and im.text["feather"] == "none"
    plain = _run(photos["sideways"], example_images, tiny_tree, tmp_path / "plain", "--json")
    assert "output_size" not in json.loads(plain.stdout)["settings"]
    with Image.open(tmp_path / "plain" / "sideways__tshirt__0.png") as im:  # today's output, today's record
        assert im.size == (384, 512) and not {"output_size", "keep_unmasked", "feather"} & set(im.text)


def test_refused_combinations_are_one_line(example_images, tiny_tree: Path, tmp_path: Path, models) -> None:  # noqa: ANN001
    models.forbid()
    person = example_images["person"]
    for extra, words in ((["--keep-unmasked", "--output-size", "working"], "leave out --output-size working"),
                         (["--feather", "6"], "--feather is the seam of --keep-unmasked"),
                         (["--keep-unmasked", "--feather", "200"], "--feather must be 0 to 64")):
        assert_one_line_error(_run(person, example_images, tiny_tree, tmp_path / "x", *extra), 2, words)


def test_a_batch_resumes_only_with_the_same_output_setting_and_compare_names_it(
        use_pipes, photos, example_images, tiny_tree: Path, tmp_path: Path) -> None:  # noqa: ANN001
    pairs = tmp_path / "pairs.csv"
    pairs.write_text(f"{photos['sideways']},{example_images['tshirt']},upper,{example_images['mask']}\n")
    base = ["batch", pairs, "--checkpoints", tiny_tree, "-o", tmp_path / "b", *RUN]
    first = invoke(*base, "--keep-unmasked")
    assert first.exit_code == 0, first.output
    again = invoke(*base, "--keep-unmasked")
    assert again.exit_code == 0 and "1 skipped" in again.stdout
    refused = invoke(*base)
    assert refused.exit_code == 1 and "keep_unmasked yes (now no)" in refused.stderr, refused.stderr
    page = (tmp_path / "b" / "index.html").read_text()
    assert "kept outside the garment" in page
    other = ["batch", pairs, "--checkpoints", tiny_tree, "-o", tmp_path / "f", *RUN, "--keep-unmasked"]
    assert invoke(*other, "--feather", "8").exit_code == 0
    compared = invoke("compare", tmp_path / "b", tmp_path / "f")
    assert "feather" in compared.stdout, compared.stdout  # the setting the two record differently, named


def test_the_memory_plan_counts_the_photo_work_on_the_cpu() -> None:
    from ootd.hardware.device import DeviceInfo
    from ootd.memory.estimate import PlanRequest
    from ootd.memory.planner import make_plan
    from ootd.memory.sizes import RELEASED_SIZES

    cpu = DeviceInfo(type="cpu", total_memory=64 << 30, free_memory=60 << 30)
    gpu = DeviceInfo(type="cuda", index=0, vendor="nvidia", arch="sm_89", name="gpu", total_memory=24 << 30,
                     free_memory=24 << 30)
    plans = {pixels: make_plan(PlanRequest(cpu, (768, 1024), 1, True, "fp32", "sdpa", RELEASED_SIZES,
                                           photo_pixels=pixels)) for pixels in (0, 3000 * 4000, 6000 * 8000)}
    assert "photo" not in plans[0].estimate
    small, large = plans[3000 * 4000].estimate["photo"], plans[6000 * 8000].estimate["photo"]
    assert large > small > plans[0].estimate["weights_resident"]
    assert plans[6000 * 8000].estimate["peak"] >= large and "photo" in plans[6000 * 8000].explain()
    on_gpu = make_plan(PlanRequest(gpu, (768, 1024), 1, True, "fp16", "sdpa", RELEASED_SIZES,
                                   photo_pixels=6000 * 8000))
    assert "photo" not in on_gpu.estimate  # host memory: not the device's budget


def test_the_api_gives_back_the_photo_when_asked(tiny_tree: Path, photos, example_images, pipe_hd) -> None:  # noqa: ANN001
    pytest.importorskip("fastapi")
    import httpx

    from tests.helpers.serving import assert_one_line_error as api_error
    from tests.helpers.serving import decode_data_url, files_for, live_server, pipes_factory, tiny_config

    files = files_for({"person": photos["square"], "garment": example_images["tshirt"]})
    data = {"category": "upper", "steps": "1", "resolution": "384x512", "seed": "2"}
    with live_server(tiny_config(tiny_tree), models=pipes_factory({"hd": pipe_hd}, synthetic_preprocessor())) as live:
        kept = httpx.post(live.url + "api/tryon", files=files, data={**data, "keep_unmasked": "true"}, timeout=300)
        plain = httpx.post(live.url + "api/tryon", files=files, data=data, timeout=300)
        bad = httpx.post(live.url + "api/tryon", files=files, data={**data, "keep_unmasked": "maybe"}, timeout=60)
    assert kept.status_code == plain.status_code == 200, (kept.text, plain.text)
    picture = decode_data_url(kept.json()["images"][0])
    assert picture.size == (900, 900) and picture.mode == "RGBA" and picture.text["keep_unmasked"] == "yes"
    assert kept.json()["settings"]["keep_unmasked"] is True
    assert decode_data_url(plain.json()["images"][0]).size == (384, 384)  # the server's own setting: working
    api_error(bad, 422, "keep_unmasked must be true or false")


def test_an_outfit_keeps_what_neither_garment_repainted(use_pipes, photos, example_images, tiny_tree: Path,  # noqa: ANN001
                                                        tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = invoke("run", "-m", photos["sideways"], "-c", example_images["tshirt"], "-c", example_images["trousers"],
                    "-k", "upper", "-k", "lower", "--checkpoints", tiny_tree, "-o", out, *RUN, "--keep-unmasked",
                    "--save-intermediates")
    assert result.exit_code == 0, result.output
    photo = np.asarray(load_photo(photos["sideways"], "sideways"))
    got = np.asarray(Image.open(out / "sideways__tshirt-with-trousers__0.png"))
    weight = np.asarray(Image.open(out / "sideways__tshirt-with-trousers__photo_mask.png"))
    lower = np.asarray(Image.open(out / "sideways__tshirt-with-trousers__lower_mask.png").resize(
        (weight.shape[1], weight.shape[0])))
    assert got.shape == photo.shape and np.array_equal(got[weight == 0], photo[weight == 0])
    assert (weight[lower > 127] > 0).mean() > 0.99  # the trousers' region is among what was repainted
