"""Results that are the user's photo, through `ootd run`, `ootd batch` and the HTTP API on the tiny pipelines
(automatic masks from the synthetic pose and parsing): the photo's size, orientation and mode, every pixel outside
the feathered mask the photo's, the setting recorded, compared on resume and named by `ootd compare`, the memory
plan counting the work; without the options every output as before."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageCms
from scipy.ndimage import distance_transform_cdt

from ootd.imaging.files import load_photo
from tests.helpers.cli import assert_one_line_error, invoke
from tests.helpers.images import expected_region
from tests.helpers.synthetic import synthetic_preprocessor

RUN = ["--steps", "1", "--resolution", "384x512", "--seed", "3"]
WORKING = (384, 512)
SRGB = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()  # the sideways JPEG's ICC profile


@pytest.fixture
def use_pipes(models, pipe_hd, pipe_dc):  # noqa: ANN001, ANN201
    pipes = {"hd": pipe_hd, "dc": pipe_dc}
    models.use(lambda model_type: pipes[model_type.value], preprocessor=synthetic_preprocessor())


@pytest.fixture
def photos(tmp_path: Path, example_images: dict[str, Path]) -> dict[str, Path]:
    """The example person as a JPEG stored on its side with an EXIF orientation and an sRGB ICC profile, and as
    an RGBA PNG of 1:1 whose corners are transparent."""
    person = Image.open(example_images["person"]).convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = 6  # shown rotated 90 degrees clockwise: stored 1024x768
    person.rotate(90, expand=True).save(tmp_path / "sideways.jpg", exif=exif, quality=95, icc_profile=SRGB)
    square = Image.new("RGBA", (900, 900), (0, 0, 0, 0))
    square.paste(person.resize((675, 900)), (112, 0))
    square.save(tmp_path / "square.png")
    return {"sideways": tmp_path / "sideways.jpg", "square": tmp_path / "square.png"}


def _upright(which: str, path: Path) -> np.ndarray:
    """The photo as shown, decoded here without the code under test: the JPEG stored on its side turned back by
    an explicit transpose (EXIF orientation 6), the PNG as it is."""
    with Image.open(path) as im:
        shown = im.transpose(Image.Transpose.ROTATE_270) if which == "sideways" else im.copy()
    return np.asarray(shown).astype(int)


def _run(photo: Path, example_images: dict[str, Path], tiny_tree: Path, out: Path, *extra: object):  # noqa: ANN202
    return invoke("run", "-m", photo, "-c", example_images["tshirt"], "-k", "upper", "--checkpoints", tiny_tree,
                  "-o", out, *RUN, *extra)


@pytest.fixture(scope="module")
def working_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return {"folder": tmp_path_factory.mktemp("working")}


def _working(runs: dict, which: str, fit: str, photos: dict[str, Path], example_images: dict[str, Path],
             tiny_tree: Path) -> tuple[Image.Image, dict[str, str]]:
    """Today's picture of `which` photo at `fit` (no option: the working size) and its record, made once."""
    if (which, fit) not in runs:
        out = runs["folder"] / f"{which}-{fit}"
        result = _run(photos[which], example_images, tiny_tree, out, "--fit", fit)
        assert result.exit_code == 0, result.output
        with Image.open(out / f"{photos[which].stem}__tshirt__0.png") as im:
            runs[which, fit] = (im.copy(), {**im.info, **im.text})
    return runs[which, fit]


@pytest.mark.parametrize("fit", ["pad", "crop", "stretch"])
@pytest.mark.parametrize("which", ["sideways", "square"])
def test_keep_unmasked_gives_back_the_photo_with_only_the_garment_region_changed(
        use_pipes, photos, example_images, tiny_tree: Path, tmp_path: Path, working_runs, which: str,  # noqa: ANN001
        fit: str) -> None:
    out = tmp_path / "out"
    result = _run(photos[which], example_images, tiny_tree, out, "--keep-unmasked", "--save-intermediates",
                  "--fit", fit)
    assert result.exit_code == 0, result.output
    stem = photos[which].stem
    given = _upright(which, photos[which])
    with Image.open(out / f"{stem}__tshirt__0.png") as im:
        picture = im.copy()
        record = dict(im.text)
        profile = im.info.get("icc_profile")
    weight = np.asarray(Image.open(out / f"{stem}__tshirt__photo_mask.png")).astype(int)
    got = np.asarray(picture).astype(int)
    assert got.shape == given.shape and weight.shape == given.shape[:2]  # the photo's size, upright
    assert picture.mode == ("RGBA" if which == "square" else "RGB")
    assert profile == (SRGB if which == "sideways" else None)  # the photo's ICC profile, written with it
    assert (record["keep_unmasked"], record["output_size"], record["feather"]) == ("yes", "photo", "4")

    # the reference, made here: today's working picture (same seed) resized (Lanczos) onto the region the framing
    # covers; what was repainted: the working mask resized the same way; the seam's reach from the photo's height
    working, plain_record = _working(working_runs, which, fit, photos, example_images, tiny_tree)
    assert "icc_profile" not in plain_record  # without the options: no profile, as before
    left, top, right, bottom = expected_region(picture.size, fit, WORKING)
    reference = given.copy()
    reference[top:bottom, left:right, :3] = np.asarray(working.resize((right - left, bottom - top), Image.LANCZOS))
    with Image.open(out / f"{stem}__tshirt__mask.png") as mask:  # the intermediates stay at the working scale
        assert mask.size == working.size
        region = np.asarray(mask.convert("L").resize((right - left, bottom - top), Image.BILINEAR)) >= 128
    inside = np.zeros(weight.shape, bool)
    inside[top:bottom, left:right] = region
    radius = max(1, round(4 * picture.height / 1024))
    far = distance_transform_cdt(~inside, metric="chessboard") > radius
    deep = distance_transform_cdt(inside, metric="chessboard") > radius
    assert far.any() and deep.any()
    assert np.array_equal(got[far], given[far])  # outside the feathered mask: the photo, exactly
    assert np.array_equal(got[deep][:, :3], reference[deep][:, :3])  # well inside: the generated picture
    if which == "square":
        assert (got[deep][:, 3] == 255).all()  # the repainted region is opaque
    assert (weight[far] == 0).all() and (weight[deep] == 255).all()
    band = (weight > 0) & (weight < 255)
    low, high = np.minimum(given, reference)[band][:, :3], np.maximum(given, reference)[band][:, :3]
    assert band.any() and ((got[band][:, :3] >= low - 1) & (got[band][:, :3] <= high + 1)).all()  # a blend
    assert not np.array_equal(got[band][:, :3], given[band][:, :3])


@pytest.mark.parametrize(("which", "fit"), [("sideways", "pad"), ("square", "crop")])
def test_output_size_photo_and_no_option_as_before(use_pipes, photos, example_images, tiny_tree: Path,  # noqa: ANN001
                                                   tmp_path: Path, working_runs, which: str, fit: str) -> None:
    result = _run(photos[which], example_images, tiny_tree, tmp_path / "photo", "--output-size", "photo",
                  "--fit", fit, "--json")
    assert result.exit_code == 0, result.output
    settings = json.loads(result.stdout)["settings"]
    assert (settings["output_size"], settings["keep_unmasked"]) == ("photo", False)
    working, record = _working(working_runs, which, fit, photos, example_images, tiny_tree)
    size = Image.open(photos[which]).size
    left, top, right, bottom = expected_region(size[::-1] if which == "sideways" else size, fit, WORKING)
    with Image.open(tmp_path / "photo" / f"{which}__tshirt__0.png") as im:
        assert im.size == (right - left, bottom - top)  # the photo's size and framing (crop: the part it kept)
        assert im.text["output_size"] == "photo" and im.text["feather"] == "none"
        assert im.info.get("icc_profile") == (SRGB if which == "sideways" else None)
        got = np.asarray(im).astype(int)
    reference = np.asarray(working.resize(im.size, Image.LANCZOS)).astype(int)  # independent of ootd's code
    assert np.abs(got - reference).max() <= 1
    # today's output, today's record (the working run above, without any of the options)
    assert working.size == WORKING and not {"output_size", "keep_unmasked", "feather", "icc_profile"} & set(record)


def test_the_python_api_gives_the_cli_pictures_when_asked(use_pipes, pipe_hd, photos, example_images,  # noqa: ANN001
                                                          tiny_tree: Path, tmp_path: Path) -> None:
    from ootd.errors import UsageError

    person, mask = photos["sideways"], example_images["mask"]
    asks = [(["--keep-unmasked", "--feather", "6", "--fit", "crop"], "crop", {"feather": 6}),
            (["--output-size", "photo"], "pad", {"keep_unmasked": False})]
    for number, (flags, fit, asked) in enumerate(asks):
        out = tmp_path / str(number)
        result = _run(person, example_images, tiny_tree, out, "--mask", mask, *flags)
        assert result.exit_code == 0, result.output
        made = pipe_hd(person, example_images["tshirt"], "upper", mask=mask, steps=1, resolution="384x512", seed=3,
                       fit=fit)
        assert made.images[0].size == WORKING  # the method's own output unless asked
        (picture,) = made.on_photo(person, **asked)
        with Image.open(out / "sideways__tshirt__0.png") as im:
            assert picture.size == im.size and picture.mode == im.mode
            assert np.array_equal(np.asarray(picture), np.asarray(im))  # the same pixels as the CLI's
            assert picture.info.get("icc_profile") == im.info.get("icc_profile") == SRGB
        assert np.array_equal(np.asarray(made.on_photo(person.read_bytes(), **asked)[0]), np.asarray(picture))
    # the library's words: its own keywords (the CLI's flags are the CLI's, below)
    with pytest.raises(UsageError, match="^feather is the seam of keep_unmasked: pass keep_unmasked too"):
        made.on_photo(person, keep_unmasked=False, feather=6)
    with pytest.raises(UsageError, match="900x900 upright"):
        made.on_photo(photos["square"])


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
    samples = [make_plan(PlanRequest(cpu, (768, 1024), n, True, "fp32", "sdpa", RELEASED_SIZES,
                                     photo_pixels=6000 * 8000)).estimate["photo"] for n in (1, 4)]
    assert 0 < samples[1] - samples[0] < 16 << 20  # one picture at a time: only the latents grow with the samples
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


def test_the_batch_memory_check_counts_the_largest_photo_from_its_header(tiny_tree: Path, tmp_path: Path,
                                                                         example_images) -> None:  # noqa: ANN001
    import struct
    import zlib

    from ootd.app.tryon.config import build_config
    from ootd.app.tryon.preflight import check_batch
    from ootd.errors import UsageError
    from ootd.settings import ModelType

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    def header_only(path: Path, width: int, height: int) -> Path:  # a PNG's header, and no pixel: never decoded
        ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b""))
        return path

    huge = header_only(tmp_path / "huge.png", 7000, 7000)  # 49 MP: about 1 GiB of photo work on the CPU
    words = {"checkpoints": tiny_tree, "output": tmp_path / "out", "max_memory": "1GiB", "device": "cpu",
             "resolution": "384x512", "samples": 1}
    kept = build_config(**words, keep_unmasked=True)
    check_batch(kept, [ModelType.HD], False, persons=[example_images["person"]])  # a small photo fits
    with pytest.raises(UsageError, match="more than max_memory 1GiB") as refused:  # the setting, by its name
        check_batch(kept, [ModelType.HD], False, persons=[example_images["person"], huge, huge])
    assert "more than --max-memory 1GiB" in refused.value.words(lambda name: "--" + name.replace("_", "-"))
    check_batch(build_config(**words), [ModelType.HD], False, persons=[huge])  # the working size: no photo work
    check_batch(kept, [ModelType.HD], False, persons=[tmp_path / "missing.png"])  # its pair fails on its own


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
