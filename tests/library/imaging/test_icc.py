"""Colour management (ootd/imaging/icc.py) through the loaders every front end uses (ootd/imaging/files.py) and the
pictures that are the photo (ootd/imaging/photo.py), with real profiles from the system's packages, each pixel
within 1/255 of LittleCMS called here (tests/helpers/profiles.py); each profile chosen so that ignoring it (the code
before) is far off."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageCms

from ootd.imaging.files import decode_image, load_image, load_photo, read_rgb
from ootd.imaging.framing import fit_to_aspect, frame_of, restore_framing
from ootd.imaging.masks import as_image
from ootd.imaging.photo import kept_photo, photo_mask, photo_pictures
from tests.helpers.profiles import (
    ADOBE_COMPATIBLE,
    ADOBE_RGB,
    CMYK,
    GREY,
    LAB,
    PROPHOTO_RGB,
    PS_CMYK,
    ROMM_RGB,
    far_apart,
    gradient,
    reference_from_srgb,
    reference_srgb,
    system_profile,
)

FAR = 20  # how far off at least one pixel is when the profile is ignored


def _saved(tmp_path: Path, image: Image.Image, fmt: str, icc: bytes | None,
           **options: object) -> tuple[Path, Image.Image]:
    """`image` written as `fmt` with the profile, and its pixels as Pillow decodes them (the lossy formats' own)."""
    path = tmp_path / f"in.{fmt.lower()}"
    image.save(path, format=fmt, **({"icc_profile": icc} if icc else {}), **options)
    with Image.open(path) as im:
        return path, im.copy()


@pytest.mark.parametrize(("profile", "fmt"), [(ADOBE_RGB, "PNG"), (PROPHOTO_RGB, "JPEG"), (ADOBE_COMPATIBLE, "TIFF"),
                                              (ROMM_RGB, "WEBP")])
@pytest.mark.parametrize("role", ["person", "garment"])
def test_rgb_photos_reach_the_model_in_srgb(tmp_path: Path, profile: str, fmt: str, role: str) -> None:
    icc = system_profile(profile)
    path, stored = _saved(tmp_path, gradient(), fmt, icc, **({"quality": 95} if fmt in ("JPEG", "WEBP") else {}))
    assert stored.info.get("icc_profile") == icc  # the format carried it
    reference = reference_srgb(stored, icc)
    for got in (load_image(path, role), decode_image(path.read_bytes(), role, "upload")):
        assert got.mode == "RGB" and not got.info
        assert far_apart(np.asarray(got), reference) <= 1
    assert far_apart(np.asarray(stored.convert("RGB")), reference) > FAR  # ignoring the profile is far off


@pytest.mark.parametrize("profile", [CMYK, PS_CMYK])
@pytest.mark.parametrize("fmt", ["JPEG", "TIFF"])
def test_a_garment_exported_in_cmyk_for_print(tmp_path: Path, profile: str, fmt: str) -> None:
    icc = system_profile(profile)
    path, stored = _saved(tmp_path, gradient(mode="CMYK"), fmt, icc, **({"quality": 95} if fmt == "JPEG" else {}))
    assert stored.mode == "CMYK"
    reference = reference_srgb(stored, icc)
    assert far_apart(np.asarray(load_image(path, "garment")), reference) <= 1
    assert far_apart(np.asarray(stored.convert("RGB")), reference) > FAR


def test_grey_pictures_and_masks_through_their_grey_profile(tmp_path: Path) -> None:
    icc = system_profile(GREY)
    ramp = Image.fromarray(np.tile(np.repeat(np.arange(128, dtype=np.uint8) * 2, 1), (96, 1)).T.copy(), "L")
    path, stored = _saved(tmp_path, ramp, "PNG", icc)
    reference = reference_srgb(stored, icc)
    assert far_apart(np.asarray(load_image(path, "person")), reference) <= 1
    mask = np.asarray(load_image(path, "mask"))  # the mask's grey, in sRGB
    assert far_apart(mask, reference[..., 0]) <= 1 and far_apart(mask, np.asarray(stored)) > FAR
    grey_alpha = ramp.convert("LA")
    grey_alpha.putalpha(Image.new("L", ramp.size, 255))
    path, stored = _saved(tmp_path, grey_alpha, "PNG", icc)
    assert far_apart(np.asarray(load_image(path, "garment")), reference) <= 1  # opaque: the same colours


def test_transparency_is_composited_over_white_after_the_conversion(tmp_path: Path) -> None:
    icc = system_profile(ADOBE_RGB)
    image = gradient(mode="RGBA", seed=1)
    image.putalpha(Image.fromarray(np.tile(np.linspace(0, 255, 96).astype(np.uint8), (128, 1))))
    path, stored = _saved(tmp_path, image, "PNG", icc)
    converted = Image.fromarray(reference_srgb(stored, icc, "RGBA"), "RGBA")
    white = Image.new("RGBA", image.size, (255, 255, 255, 255))
    reference = np.asarray(Image.alpha_composite(white, converted).convert("RGB"))
    assert far_apart(np.asarray(load_image(path, "person")), reference) <= 1
    # a mask read from its transparency: the alpha, whatever the profile
    assert np.array_equal(np.asarray(load_image(path, "mask")), np.asarray(stored.getchannel("A")))


def test_a_palette_picture_through_its_profile(tmp_path: Path) -> None:
    icc = system_profile(ADOBE_RGB)
    path, stored = _saved(tmp_path, gradient(seed=2).quantize(64), "PNG", icc)
    assert stored.mode == "P"
    reference = reference_srgb(stored.convert("RGB"), icc)
    assert far_apart(np.asarray(load_image(path, "garment")), reference) <= 1


def test_an_image_in_memory_is_converted_as_its_file_is(tmp_path: Path) -> None:
    icc = system_profile(ADOBE_RGB)
    path, stored = _saved(tmp_path, gradient(seed=3), "PNG", icc)
    assert np.array_equal(np.asarray(as_image(stored, "garment")), np.asarray(load_image(path, "garment")))
    assert np.array_equal(np.asarray(as_image(path, "garment")), np.asarray(load_image(path, "garment")))


@pytest.mark.parametrize("problem", ["damaged", "for CMYK colours", "for Lab colours", "not a profile at all"])
def test_a_profile_that_cannot_be_used_is_left_out_with_a_warning(tmp_path: Path, problem: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    adobe = system_profile(ADOBE_RGB)
    icc = {"damaged": adobe[:200], "for CMYK colours": system_profile(CMYK), "for Lab colours": system_profile(LAB),
           "not a profile at all": b"nonsense" * 40}[problem]
    path, stored = _saved(tmp_path, gradient(seed=4), "PNG", icc)
    with caplog.at_level(logging.WARNING):
        got = load_image(path, "garment")
    assert np.array_equal(np.asarray(got), np.asarray(stored.convert("RGB")))  # taken as sRGB, as browsers do
    (warning,) = [r.getMessage() for r in caplog.records if "ICC" in r.getMessage()]
    assert str(path) in warning and "taken as sRGB" in warning


def test_eval_reads_results_and_photos_in_srgb(tmp_path: Path) -> None:
    icc = system_profile(PROPHOTO_RGB)
    path, stored = _saved(tmp_path, gradient(seed=5), "PNG", icc)
    assert far_apart(np.asarray(read_rgb(path, ValueError)), reference_srgb(stored, icc)) <= 1


# ------------------------------------------------------------------------------ pictures that are the photo

WORKING = (384, 512)


def _generated_and_mask(photo: Image.Image) -> tuple[Image.Image, Image.Image]:
    """A generated picture (sRGB) and its mask as the pipeline returns them (working scale, padding cut away)."""
    _, info = fit_to_aspect(photo.convert("RGB"), WORKING, "pad")
    generated = restore_framing(gradient(WORKING, seed=9), info, keep_scale=True)
    mask = np.zeros((WORKING[1], WORKING[0]), np.uint8)
    mask[150:350, 100:290] = 255
    return generated, restore_framing(Image.fromarray(mask, "L"), info, keep_scale=True)


@pytest.mark.parametrize(("profile", "mode"), [(ADOBE_RGB, "RGB"), (PROPHOTO_RGB, "RGBA"), (GREY, "L")])
def test_kept_photo_is_in_the_photos_own_profile(tmp_path: Path, profile: str, mode: str) -> None:
    """--keep-unmasked: outside the mask the photo's own numbers, exactly; inside the generated (sRGB) colours in
    the photo's profile; the profile carried."""
    icc = system_profile(profile)
    path, _ = _saved(tmp_path, gradient((600, 800), mode, seed=6), "PNG", icc)
    photo = load_photo(path, path.name)
    with Image.open(path) as im:
        assert np.array_equal(np.asarray(photo), np.asarray(im)) and photo.info["icc_profile"] == icc
    generated, mask = _generated_and_mask(photo)
    info = frame_of(photo.size, WORKING, "pad")
    weight = photo_mask(mask, info, 4)
    out = kept_photo(photo, generated, weight, info)
    got, given, w = np.asarray(out), np.asarray(photo), np.asarray(weight)
    assert out.mode == mode and out.info["icc_profile"] == icc
    assert np.array_equal(got[w == 0], given[w == 0])
    colour = "L" if mode == "L" else "RGB"
    resized = generated.resize(photo.size, Image.LANCZOS)
    reference = reference_from_srgb(resized, icc, colour)
    inside = got[w == 255][..., :3] if mode != "L" else got[w == 255]
    assert far_apart(inside, reference[w == 255]) <= 1
    naive = np.asarray(resized.convert(colour))[w == 255]
    assert far_apart(naive, reference[w == 255]) > FAR  # pasting the sRGB numbers as they are is far off


def test_pictures_at_the_photos_size_are_in_its_rgb_profile(tmp_path: Path) -> None:
    icc = system_profile(ADOBE_RGB)
    path, _ = _saved(tmp_path, gradient((500, 500), seed=7), "PNG", icc)
    photo = load_photo(path, path.name)
    generated, _ = _generated_and_mask(photo)
    pictures, _ = photo_pictures(photo, [generated], frame_of(photo.size, WORKING, "pad"), None, False, 4)
    picture = pictures[0]
    assert picture.info["icc_profile"] == icc
    reference = reference_from_srgb(generated.resize(photo.size, Image.LANCZOS), icc)
    assert far_apart(np.asarray(picture), reference) <= 1


def test_a_cmyk_photo_is_given_back_as_the_try_on_saw_it(tmp_path: Path) -> None:
    icc = system_profile(CMYK)
    path, stored = _saved(tmp_path, gradient(mode="CMYK", seed=8), "JPEG", icc, quality=95)
    photo = load_photo(path, path.name)
    assert photo.mode == "RGB" and "icc_profile" not in photo.info  # sRGB now: a PNG cannot hold CMYK
    assert far_apart(np.asarray(photo), reference_srgb(stored, icc)) <= 1
    assert np.array_equal(np.asarray(photo), np.asarray(load_image(path, "person")))


def test_srgb_needs_no_profile_and_changes_nothing(tmp_path: Path) -> None:
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    path, stored = _saved(tmp_path, gradient(seed=10), "PNG", srgb)
    assert np.array_equal(np.asarray(load_image(path, "person")), np.asarray(stored))
    plain, stored = _saved(tmp_path, gradient(seed=10), "BMP", None)
    assert np.array_equal(np.asarray(load_image(plain, "person")), np.asarray(stored))
