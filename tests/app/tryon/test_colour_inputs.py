"""Colour-managed inputs end to end: what the models are given by `ootd run`, `ootd batch` and the HTTP API for a
person photo in Adobe RGB and a garment exported in CMYK (within 1/255 of LittleCMS called in the test), the record
saying so, and `--keep-unmasked` given back in the photo's own profile through `ootd run` on the tiny pipelines
(outside the mask the photo's own numbers, inside the generated sRGB colours in the photo's profile)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy.ndimage import distance_transform_cdt

from ootd.app.tryon.record import COLOUR
from tests.helpers.cli import invoke
from tests.helpers.fakes import FakePipe, read_report
from tests.helpers.images import expected_region
from tests.helpers.profiles import (
    ADOBE_RGB,
    CMYK,
    far_apart,
    gradient,
    reference_from_srgb,
    reference_srgb,
    system_profile,
)

RUN = ["--steps", "1", "--resolution", "384x512", "--seed", "3"]


@pytest.fixture
def shop_photos(tmp_path: Path) -> dict[str, Path]:
    """A person photo in Adobe RGB (PNG) and a garment in CMYK with a print profile (JPEG)."""
    person, garment = tmp_path / "person.png", tmp_path / "garment.jpg"
    gradient((300, 400), seed=1).save(person, icc_profile=system_profile(ADOBE_RGB))
    gradient((300, 400), "CMYK", seed=2).save(garment, quality=95, icc_profile=system_profile(CMYK))
    return {"person": person, "garment": garment}


def _references(photos: dict[str, Path]) -> dict[str, np.ndarray]:
    out = {}
    for role, path in photos.items():
        with Image.open(path) as im:
            out[role] = reference_srgb(im, im.info["icc_profile"])
            assert far_apart(np.asarray(im.convert("RGB")), out[role]) > 20  # ignoring the profile: far off
    return out


def _given(value: object) -> np.ndarray:
    assert isinstance(value, Image.Image), value
    return np.asarray(value.convert("RGB"))


def test_ootd_run_gives_the_models_srgb_and_records_it(models, shop_photos, tmp_path: Path,  # noqa: ANN001
                                                       tiny_tree: Path, example_images: dict[str, Path]) -> None:
    made = models.fake()
    result = invoke("run", "-m", shop_photos["person"], "-c", shop_photos["garment"], "-k", "upper",
                    "--mask", example_images["mask"], "--checkpoints", tiny_tree, "-o", tmp_path / "out", *RUN)
    assert result.exit_code == 0, result.output
    pipe: FakePipe = made["hd"][0]
    references = _references(shop_photos)
    assert far_apart(_given(pipe.persons[0]), references["person"]) <= 1
    assert far_apart(_given(pipe.garments[0]), references["garment"]) <= 1
    with Image.open(tmp_path / "out" / "person__garment__0.png") as im:
        assert {key: im.text.get(key) for key in COLOUR} == COLOUR


class SeeingPipe(FakePipe):
    """A FakePipe that keeps the images it prepared (a batch hands it paths, which it loads as the real one does)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.seen: dict[str, list[Image.Image]] = {"person": [], "garment": []}

    def prepare_person(self, *args: object, **kwargs: object) -> object:
        prepared = super().prepare_person(*args, **kwargs)
        self.seen["person"].append(prepared.image)
        return prepared

    def prepare_garment(self, *args: object, **kwargs: object) -> object:
        prepared = super().prepare_garment(*args, **kwargs)
        self.seen["garment"].append(prepared.image)
        return prepared


def test_a_batch_gives_the_models_srgb(models, shop_photos, tmp_path: Path, tiny_tree: Path) -> None:  # noqa: ANN001
    pipe = SeeingPipe("hd")
    models.use(pipe)
    people, garments = tmp_path / "people", tmp_path / "garments"
    people.mkdir()
    garments.mkdir()
    shutil.copy(shop_photos["person"], people / "p.png")
    shutil.copy(shop_photos["garment"], garments / "g.jpg")
    result = invoke("batch", "--models", people, "--cloths", garments, "--category", "upper", "-o", tmp_path / "out",
                    "--checkpoints", tiny_tree, *RUN)
    assert result.exit_code == 0, result.output
    assert [row["status"] for row in read_report(tmp_path / "out" / "batch_report.jsonl")] == ["ok"]
    references = _references(shop_photos)
    assert far_apart(_given(pipe.seen["person"][0]), references["person"]) <= 1
    assert far_apart(_given(pipe.seen["garment"][0]), references["garment"]) <= 1


def test_the_api_gives_the_models_srgb(shop_photos, tiny_tree: Path, example_images: dict[str, Path]) -> None:
    pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
    httpx = pytest.importorskip("httpx")
    from tests.helpers.serving import files_for, live_server, pipes_factory, tiny_config

    pipe = FakePipe("hd")
    files = files_for({"person": shop_photos["person"], "garment": shop_photos["garment"],
                       "mask": example_images["mask"]})
    with live_server(tiny_config(tiny_tree, model_type="hd"), models=pipes_factory({"hd": pipe})) as live:
        response = httpx.post(live.url + "api/tryon", files=files, timeout=120,
                              data={"category": "upper", "steps": "1", "seed": "3", "resolution": "384x512"})
    assert response.status_code == 200, response.text
    references = _references(shop_photos)
    assert far_apart(_given(pipe.persons[0]), references["person"]) <= 1
    assert far_apart(_given(pipe.garments[0]), references["garment"]) <= 1


@pytest.mark.parametrize("fit", ["pad", pytest.param("crop", marks=pytest.mark.slow)])
def test_keep_unmasked_is_given_back_in_the_photos_own_profile(models, pipe_hd, tmp_path: Path,  # noqa: ANN001
                                                               tiny_tree: Path, example_images: dict[str, Path],
                                                               fit: str) -> None:
    models.use(pipe_hd)
    icc = system_profile(ADOBE_RGB)
    person = tmp_path / "adobe.png"
    with Image.open(example_images["person"]) as im:
        im.convert("RGB").save(person, icc_profile=icc)
    args = ["-m", person, "-c", example_images["tshirt"], "-k", "upper", "--mask", example_images["mask"],
            "--checkpoints", tiny_tree, *RUN, "--fit", fit]
    assert invoke("run", *args, "-o", tmp_path / "working").exit_code == 0
    kept = invoke("run", *args, "-o", tmp_path / "kept", "--keep-unmasked", "--save-intermediates")
    assert kept.exit_code == 0, kept.output
    with Image.open(tmp_path / "working" / "adobe__tshirt__0.png") as im:
        working = im.convert("RGB")  # sRGB, as the model made it
        assert "icc_profile" not in im.info
    with Image.open(tmp_path / "kept" / "adobe__tshirt__0.png") as im:
        assert im.info["icc_profile"] == icc and im.text["colour"] == COLOUR["colour"]
        got = np.asarray(im).astype(int)
    with Image.open(person) as im:
        given = np.asarray(im).astype(int)
    weight = np.asarray(Image.open(tmp_path / "kept" / "adobe__tshirt__photo_mask.png")).astype(int)
    left, top, right, bottom = expected_region(person_size := (given.shape[1], given.shape[0]), fit, (384, 512))
    region = working.resize((right - left, bottom - top), Image.LANCZOS)
    reference = np.zeros_like(given)
    reference[top:bottom, left:right] = reference_from_srgb(region, icc)
    with Image.open(tmp_path / "kept" / "adobe__tshirt__mask.png") as mask:
        inside = np.zeros(weight.shape, bool)
        inside[top:bottom, left:right] = np.asarray(
            mask.convert("L").resize((right - left, bottom - top), Image.BILINEAR)) >= 128
    radius = max(1, round(4 * person_size[1] / 1024))
    far = distance_transform_cdt(~inside, metric="chessboard") > radius
    deep = distance_transform_cdt(inside, metric="chessboard") > radius
    assert far.any() and deep.any()
    assert np.array_equal(got[far], given[far])  # the photo's own numbers, in its own profile
    assert far_apart(got[deep], reference[deep]) <= 1  # the generated colours, in the photo's profile
    naive = np.zeros_like(given)
    naive[top:bottom, left:right] = np.asarray(region)
    assert far_apart(naive[deep], reference[deep]) > 20  # the sRGB numbers pasted as they are: far off
