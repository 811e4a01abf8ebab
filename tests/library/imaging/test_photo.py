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
from ootd.imaging.photo import feather_pixels, in_photo_frame, kept_photo, photo_mask

WORKING = (384, 512)
SIZES = {"3:4": (600, 800), "1:1": (500, 500), "16:9 landscape": (800, 450), "9:16 portrait": (450, 800)}


def _random(size: tuple[int, int], mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    channels = len(mode)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8).squeeze(), mode)


def _expected_region(photo: tuple[int, int], fit: str) -> tuple[int, int, int, int]:
    """Where a result lands in the photo, from the sizes alone: the whole photo, or the centre the crop kept."""
    w, h = photo
    if fit != "crop":
        return 0, 0, w, h
    scale = max(WORKING[0] / w, WORKING[1] / h)
    kw, kh = min(w, round(WORKING[0] / scale)), min(h, round(WORKING[1] / scale))
    return (w - kw) // 2, (h - kh) // 2, (w - kw) // 2 + kw, (h - kh) // 2 + kh


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
    left, top, right, bottom = _expected_region(photo.size, fit)
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
        left, top, right, bottom = _expected_region(photo.size, fit)
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
    assert load_photo(Image.new("L", (300, 400)), "in memory").mode == "RGB"


def test_no_feather_is_the_binary_mask_and_the_seam_grows_with_the_photo() -> None:
    assert feather_pixels(0, 8000) == 0 and feather_pixels(4, 1024) == 4 and feather_pixels(4, 8000) == 31
    photo = _random(SIZES["3:4"])
    generated, mask = _result_and_mask(photo, "pad")
    weight = np.asarray(photo_mask(mask, frame_of(photo.size, WORKING, "pad"), 0))
    assert set(np.unique(weight)) == {0, 255}
