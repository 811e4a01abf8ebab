"""Results brought back to the photo (ootd/imaging/photo.py), against an independent reference written here: the
geometry of each framing computed from the sizes, distances to the mask from scipy's distance transform (the
seam is a box blur: its reach is a chessboard distance)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from scipy.ndimage import distance_transform_cdt

from ootd.imaging.files import load_photo
from ootd.imaging.framing import fit_to_aspect, frame_of, restore_framing
from ootd.imaging.photo import PhotoPictures, feather_pixels, in_photo_frame, kept_photo, photo_mask, photo_pictures
from tests.helpers.images import expected_region

WORKING = (384, 512)
SIZES = {"3:4": (600, 800), "1:1": (500, 500), "16:9 landscape": (800, 450), "9:16 portrait": (450, 800)}


def _random(size: tuple[int, int], mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    channels = len(mode)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8).squeeze(), mode)


def _result_and_mask(photo: Image.Image, fit: str) -> tuple[Image.Image, Image.Image]:
    """A generated picture and a mask as the pipeline returns them: working scale, the padding cut away."""
    framed, info = fit_to_aspect(photo.convert("RGB"), WORKING, fit)
    generated = restore_framing(_random(WORKING, seed=1), info, keep_scale=True)
    mask = np.zeros((WORKING[1], WORKING[0]), np.uint8)
    mask[150:350, 100:290] = 255
    return generated, restore_framing(Image.fromarray(mask, "L"), info, keep_scale=True)


@pytest.mark.parametrize("fit", ["pad", "crop", "stretch"])
@pytest.mark.parametrize("aspect", list(SIZES))
def test_only_the_repainted_region_changes_and_it_is_the_generated_picture(aspect: str, fit: str) -> None:
    photo = _random(SIZES[aspect], seed=2)
    generated, mask = _result_and_mask(photo, fit)
    info = frame_of(photo.size, WORKING, fit)
    weight = photo_mask(mask, info, feather=4)
    out = kept_photo(photo, generated, weight, info)
    assert out.size == photo.size and out.mode == photo.mode

    got, original, w = (np.asarray(x).astype(int) for x in (out, photo, weight))
    # the reference: the generated picture resized onto the region the framing covers, computed independently
    left, top, right, bottom = expected_region(photo.size, fit, WORKING)
    reference = original.copy()
    reference[top:bottom, left:right] = np.asarray(generated.resize((right - left, bottom - top), Image.LANCZOS))
    region = np.asarray(mask.resize((right - left, bottom - top), Image.BILINEAR)) >= 128
    inside = np.zeros(w.shape, bool)
    inside[top:bottom, left:right] = region
    radius = feather_pixels(4, photo.height)
    outside_by = distance_transform_cdt(~inside, metric="chessboard")  # each pixel's distance to the region
    inside_by = distance_transform_cdt(inside, metric="chessboard")  # ... and to the photo kept around it
    far, deep = outside_by > radius, inside_by > radius
    assert far.any() and deep.any()
    assert np.array_equal(got[far], original[far])  # outside the feathered mask: the photo, exactly
    assert (w[far] == 0).all() and (w[deep] == 255).all()
    assert np.array_equal(got[deep], reference[deep])  # well inside: the generated picture brought back
    band = (w > 0) & (w < 255)
    assert band.any()
    low, high = np.minimum(original, reference)[band], np.maximum(original, reference)[band]
    assert ((got[band] >= low - 1) & (got[band] <= high + 1)).all()  # the seam: a blend of the two


def test_the_generated_picture_at_the_photos_size_and_framing() -> None:
    photo = _random(SIZES["16:9 landscape"])
    for fit in ("pad", "crop", "stretch"):
        generated, _ = _result_and_mask(photo, fit)
        picture, offset = in_photo_frame(generated, frame_of(photo.size, WORKING, fit))
        left, top, right, bottom = expected_region(photo.size, fit, WORKING)
        assert picture.size == (right - left, bottom - top) and offset == (left, top)


def test_a_transparent_photo_keeps_its_alpha_outside_and_is_opaque_where_repainted() -> None:
    photo = _random(SIZES["3:4"], "RGBA", seed=3)
    generated, mask = _result_and_mask(photo, "pad")
    info = frame_of(photo.size, WORKING, "pad")
    weight = photo_mask(mask, info, 4)
    out = kept_photo(photo, generated, weight, info)
    alpha, original, w = (np.asarray(x) for x in (out.getchannel("A"), photo.getchannel("A"), weight))
    assert out.mode == "RGBA"
    assert np.array_equal(alpha[w == 0], original[w == 0]) and (alpha[w == 255] == 255).all()


def test_the_photo_is_read_as_given_upright(tmp_path) -> None:  # noqa: ANN001
    picture = _random((400, 300), seed=4)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: shown upright it is 300 wide, 400 high
    picture.save(tmp_path / "p.jpg", exif=exif, quality=95)
    assert load_photo(tmp_path / "p.jpg", "p.jpg").size == (300, 400)
    _random((300, 400), "RGBA").save(tmp_path / "p.png")
    assert load_photo(tmp_path / "p.png", "p.png").mode == "RGBA"
    assert load_photo((tmp_path / "p.png").read_bytes(), "upload.png").mode == "RGBA"
    assert load_photo(Image.new("L", (300, 400)), "in memory").mode == "L"  # its own mode


def test_no_feather_is_the_binary_mask_and_the_seam_grows_with_the_photo() -> None:
    assert feather_pixels(0, 8000) == 0 and feather_pixels(4, 1024) == 4 and feather_pixels(4, 8000) == 31
    photo = _random(SIZES["3:4"])
    generated, mask = _result_and_mask(photo, "pad")
    weight = np.asarray(photo_mask(mask, frame_of(photo.size, WORKING, "pad"), 0))
    assert set(np.unique(weight)) == {0, 255}


def _profile(space: bytes) -> bytes:
    """An ICC profile whose header names `space` (b"RGB ", b"GRAY", b"CMYK"): Pillow's sRGB one, relabelled."""
    from PIL import ImageCms

    icc = bytearray(ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes())
    icc[16:20] = space
    return bytes(icc)


def _transparent(mode: str) -> Image.Image:
    im = _random((80, 100), "L", seed=5).convert(mode)
    im.info["transparency"] = 0
    return im


@pytest.mark.parametrize(("given", "kept", "profile"), [
    ("L", "L", b"GRAY"), ("LA", "LA", b"GRAY"), ("RGB", "RGB", b"RGB "), ("RGBA", "RGBA", b"RGB "),
    ("P", "RGB", b"RGB "), ("P transparent", "RGBA", b"RGB "), ("L transparent", "LA", b"GRAY"),
    ("1", "L", b"GRAY"), ("I;16", "L", b"GRAY"), ("CMYK", "RGB", None), ("RGB with a CMYK profile", "RGB", None)])
def test_a_photo_keeps_its_mode_and_its_colour_profile(tmp_path, given: str, kept: str,  # noqa: ANN001
                                                       profile: bytes | None) -> None:
    """The mode a PNG can hold is kept (others as documented in load_photo); the ICC profile is kept when it
    describes the kept colours, and dropped with a conversion it no longer describes."""
    mode = given.split()[0]
    if given.endswith("transparent"):
        image = _transparent(mode)
    elif mode == "I;16":
        image = Image.fromarray(np.arange(100 * 80, dtype=np.uint16).reshape(100, 80) * 8)
    else:
        image = _random((80, 100), "RGB", seed=6).convert(mode)
    icc = _profile(b"CMYK" if "CMYK" in given else b"GRAY" if kept in ("L", "LA") else b"RGB ")
    path = tmp_path / ("p.jpg" if mode == "CMYK" else "p.png" if mode != "1" else "p.tif")
    image.save(path, icc_profile=icc, **({"transparency": 0} if given.endswith("transparent") else {}))
    with Image.open(path) as im:
        assert im.mode == mode or mode == "I;16" and im.mode.startswith("I")  # the mode the case is about
    photo = load_photo(path, path.name)
    assert photo.mode == kept and photo.size == (80, 100)
    assert photo.info.get("icc_profile") == (icc if profile is not None else None)
    if mode in ("L", "RGB") and not given.endswith("transparent"):  # kept as it is: the very pixels
        assert np.array_equal(np.asarray(photo), np.asarray(Image.open(path)))
    if mode == "I;16":  # 16 bits to 8, scaled as on input (not clipped)
        assert np.asarray(photo).max() == round(np.asarray(image).max() / 257)


@pytest.mark.parametrize("mode", ["L", "LA"])
def test_a_grey_photo_stays_grey_and_keeps_its_profile(mode: str) -> None:
    photo = _random(SIZES["3:4"], mode, seed=7)
    photo.info["icc_profile"] = _profile(b"GRAY")
    generated, mask = _result_and_mask(photo, "crop")
    info = frame_of(photo.size, WORKING, "crop")
    weight = photo_mask(mask, info, 4)
    out = kept_photo(photo, generated, weight, info)
    got, given, w = np.asarray(out), np.asarray(photo), np.asarray(weight)
    assert out.mode == mode and out.info["icc_profile"] == photo.info["icc_profile"]
    assert np.array_equal(got[w == 0], given[w == 0])
    left, top, right, bottom = expected_region(photo.size, "crop", WORKING)
    grey = np.asarray(generated.resize((right - left, bottom - top), Image.LANCZOS).convert("L"))
    deep = np.zeros(w.shape, bool)
    deep[top:bottom, left:right] = True
    deep &= w == 255
    reference = np.zeros(w.shape, np.uint8)
    reference[top:bottom, left:right] = grey
    assert deep.any() and np.array_equal((got[..., 0] if mode == "LA" else got)[deep], reference[deep])
    if mode == "LA":
        assert (got[..., 1][deep] == 255).all()


def test_the_pictures_are_made_one_at_a_time_and_the_generated_ones_carry_an_rgb_profile() -> None:
    photo = _random(SIZES["1:1"], seed=8)
    photo.info["icc_profile"] = _profile(b"RGB ")
    generated, mask = _result_and_mask(photo, "pad")
    info = frame_of(photo.size, WORKING, "pad")
    samples = [generated, generated.transpose(Image.Transpose.FLIP_LEFT_RIGHT), generated.rotate(180)]
    kept, weight = photo_pictures(photo, samples, info, mask, True, 4)
    assert isinstance(kept, PhotoPictures) and len(kept) == 3 and weight is not None
    assert np.array_equal(np.asarray(kept[1]), np.asarray(kept_photo(photo, samples[1], weight, info)))
    seen = []
    for picture in kept:  # streamed: the one before is closed (its memory freed) when the next is made
        assert all(_closed(before) for before in seen)
        assert picture.size == photo.size and picture.info["icc_profile"] == photo.info["icc_profile"]
        seen.append(picture)
    assert not _closed(seen[-1]) and not _closed(kept[0])  # the last one, and one asked for by index, stay open
    framed, none = photo_pictures(photo, samples, info, None, False, 4)
    assert none is None and [p.size for p in framed[:2]] == [photo.size] * 2
    assert framed[0].info["icc_profile"] == photo.info["icc_profile"]
    photo.info["icc_profile"] = _profile(b"GRAY")  # a profile that does not describe an RGB picture: left out
    assert "icc_profile" not in photo_pictures(photo, samples, info, None, False, 4)[0][0].info


def _closed(picture: Image.Image) -> bool:
    try:
        picture.getpixel((0, 0))
    except ValueError:
        return True
    return False


def test_a_results_pictures_on_its_photo_are_every_sample_open() -> None:
    from ootd.pipeline_types import TryOnResult

    photo = _random(SIZES["16:9 landscape"], seed=9)
    framed, info = fit_to_aspect(photo, WORKING, "pad")
    padded = np.zeros((WORKING[1], WORKING[0]), np.uint8)
    padded[200:400, 100:300] = 255  # the mask as the pipeline returns it: at the working size, padding included
    samples = [restore_framing(_random(WORKING, seed=s), info, keep_scale=True) for s in (10, 11)]
    result = TryOnResult(samples, Image.fromarray(padded, "L"), framed, seed=0, fit=info)
    pictures = result.on_photo(photo, feather=2)
    weight = photo_mask(restore_framing(Image.fromarray(padded, "L"), info, keep_scale=True), info, 2)
    for picture, sample in zip(pictures, samples, strict=True):
        assert np.array_equal(np.asarray(picture), np.asarray(kept_photo(photo, sample, weight, info)))
