"""Input validation/normalisation and 3:4 framing (ootd/imaging/files.py, framing.py)."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile

from ootd.errors import InputImageError
from ootd.imaging.files import load_image
from ootd.imaging.framing import FitInfo, fit_to_aspect, restore_framing


def _gradient(w: int = 120, h: int = 160) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // w, y * 255 // h, (x + y) % 256], axis=-1).astype(np.uint8)


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (1-bit gray) with almost no data: tiny on disk."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 16))
        + chunk(b"IEND", b"")
    )


# ------------------------------------------------------------------------------------------- bad inputs


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputImageError, match=r"person image .*nope\.png: file not found"):
        load_image(tmp_path / "nope.png", "person")


def test_directory(tmp_path: Path) -> None:
    folder = tmp_path / "dir.png"
    folder.mkdir()
    with pytest.raises(InputImageError, match="is a directory"):
        load_image(folder, "garment")


def test_text_file_with_image_extension(tmp_path: Path) -> None:
    path = tmp_path / "notes.png"
    path.write_text("this is not a picture\n")
    with pytest.raises(InputImageError, match=r"garment image .*notes\.png: not an image file"):
        load_image(path, "garment")


def test_postscript_is_not_handed_to_ghostscript(tmp_path: Path) -> None:
    path = tmp_path / "photo.png"
    path.write_text("%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 100 100\nshowpage\n")
    with pytest.raises(InputImageError, match="not a supported format"):
        load_image(path, "person")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_image(tmp_path: Path, fmt: str) -> None:
    good = tmp_path / f"good.{fmt.lower()}"
    Image.fromarray(_gradient()).save(good, format=fmt)
    data = good.read_bytes()
    bad = tmp_path / f"bad.{fmt.lower()}"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputImageError, match="corrupt or truncated") as info:
        load_image(bad, "person")
    assert "\n" not in str(info.value)
    assert str(bad) in str(info.value)


def test_tiny_image(tmp_path: Path) -> None:
    path = tmp_path / "tiny.png"
    Image.new("RGB", (32, 32), "red").save(path)
    with pytest.raises(InputImageError, match=r"too small: 32x32"):
        load_image(path, "person")


def test_bomb_sized_header_rejected_before_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bomb.png"
    path.write_bytes(_png_header_only(30000, 30000))  # 900 megapixels claimed, ~100 bytes on disk
    assert path.stat().st_size < 1000
    decoded = []
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: decoded.append(1))
    with pytest.raises(InputImageError, match="too large"):
        load_image(path, "person")
    assert not decoded


def test_large_header_under_pillow_limit_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.png"
    path.write_bytes(_png_header_only(10000, 6000))  # 60 MP: below Pillow's own guard, above ours
    decoded = []
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: decoded.append(1))
    with pytest.raises(InputImageError, match=r"too large: 10000x6000"):
        load_image(path, "person")
    assert not decoded


# ------------------------------------------------------------------------------------------- normalisation


def test_grayscale_becomes_rgb(tmp_path: Path) -> None:
    path = tmp_path / "gray.png"
    Image.new("L", (100, 120), 77).save(path)
    im = load_image(path, "person")
    assert im.mode == "RGB" and im.size == (100, 120)
    assert im.getpixel((5, 5)) == (77, 77, 77)


def test_rgba_composited_over_white(tmp_path: Path) -> None:
    arr = np.zeros((100, 100, 4), np.uint8)
    arr[..., 0] = 255  # red
    arr[:50, :, 3] = 0  # top half fully transparent
    arr[50:, :, 3] = 255
    path = tmp_path / "rgba.png"
    Image.fromarray(arr, "RGBA").save(path)
    im = load_image(path, "garment")
    assert im.mode == "RGB"
    assert im.getpixel((10, 10)) == (255, 255, 255)
    assert im.getpixel((10, 90)) == (255, 0, 0)


def test_la_composited_over_white(tmp_path: Path) -> None:
    arr = np.zeros((100, 100, 2), np.uint8)
    arr[:, :50, 1] = 0
    arr[:, 50:, 1] = 255
    path = tmp_path / "la.png"
    Image.fromarray(arr, "LA").save(path)
    im = load_image(path, "garment")
    assert im.mode == "RGB"
    assert im.getpixel((10, 10)) == (255, 255, 255)
    assert im.getpixel((90, 10)) == (0, 0, 0)


def test_palette_with_transparency_composited_over_white(tmp_path: Path) -> None:
    im = Image.new("P", (100, 100), 0)
    im.putpalette([0, 0, 255] + [0, 255, 0] + [0, 0, 0] * 254)
    im.paste(1, (0, 50, 100, 100))
    path = tmp_path / "p.png"
    im.save(path, transparency=0)
    assert Image.open(path).info.get("transparency") == 0
    out = load_image(path, "garment")
    assert out.mode == "RGB"
    assert out.getpixel((10, 10)) == (255, 255, 255)  # index 0 is transparent
    assert out.getpixel((10, 90)) == (0, 255, 0)


def test_16bit_png_scaled_not_clipped(tmp_path: Path) -> None:
    arr = np.zeros((100, 100), np.uint16)
    arr[:, :50] = 65535
    arr[:, 50:] = 32896  # 128 * 257
    path = tmp_path / "g16.png"
    Image.fromarray(arr).save(path)
    assert Image.open(path).mode.startswith("I")
    im = load_image(path, "person")
    assert im.mode == "RGB"
    assert im.getpixel((10, 10)) == (255, 255, 255)
    assert im.getpixel((90, 10)) == (128, 128, 128)  # convert("L") would have clipped this to 255
    mask = load_image(path, "mask")
    assert mask.mode == "L" and mask.getpixel((90, 10)) == 128


def test_cmyk_jpeg_to_rgb(tmp_path: Path) -> None:
    path = tmp_path / "cmyk.jpg"
    Image.new("CMYK", (100, 100), (0, 255, 255, 0)).save(path, quality=95)  # pure red in CMYK
    assert Image.open(path).mode == "CMYK"
    im = load_image(path, "garment")
    assert im.mode == "RGB"
    r, g, b = im.getpixel((50, 50))
    assert r > 230 and g < 30 and b < 30


def test_exif_orientation_applied(tmp_path: Path) -> None:
    arr = np.zeros((100, 200, 3), np.uint8)  # 200 wide, 100 high; left half red, right half blue
    arr[:, :100] = (255, 0, 0)
    arr[:, 100:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    path = tmp_path / "rotated.jpg"
    Image.fromarray(arr).save(path, exif=exif, quality=95)
    im = load_image(path, "person")
    assert im.size == (100, 200)  # width and height swapped
    top, bottom = im.getpixel((50, 20)), im.getpixel((50, 180))
    assert top[0] > 200 and top[2] < 50  # the left (red) half is now on top
    assert bottom[2] > 200 and bottom[0] < 50


def test_rgb_mask_becomes_l(tmp_path: Path) -> None:
    path = tmp_path / "mask.png"
    Image.new("RGB", (100, 100), (255, 255, 255)).save(path)
    mask = load_image(path, "mask")
    assert mask.mode == "L" and mask.getpixel((1, 1)) == 255


def test_mask_with_alpha_uses_alpha(tmp_path: Path) -> None:
    arr = np.zeros((100, 100, 4), np.uint8)  # black strokes painted on a transparent layer
    arr[40:60, :, 3] = 255
    path = tmp_path / "mask_alpha.png"
    Image.fromarray(arr, "RGBA").save(path)
    mask = load_image(path, "mask")
    assert mask.mode == "L"
    assert mask.getpixel((50, 50)) == 255 and mask.getpixel((50, 5)) == 0


def test_loaded_image_is_detached_from_file(tmp_path: Path) -> None:
    path = tmp_path / "a.png"
    Image.fromarray(_gradient()).save(path)
    im = load_image(path, "person")
    os.unlink(path)
    assert np.asarray(im).shape == (160, 120, 3)


def test_unknown_role() -> None:
    with pytest.raises(ValueError):
        load_image("x.png", "shoe")


# ------------------------------------------------------------------------------------------- framing


def test_pad_fit_and_restore_round_trip() -> None:
    src = Image.fromarray(_gradient(300, 200))  # landscape: padded top and bottom
    fitted, info = fit_to_aspect(src, (384, 512), mode="pad", pad_color="edge")
    assert fitted.size == (384, 512)
    assert info.mode == "pad" and info.original_size == (300, 200)
    left, top, right, bottom = info.box
    assert (left, right) == (0, 384) and top > 0 and bottom < 512
    assert abs((right - left) / (bottom - top) - 1.5) < 0.02
    top_fill = np.asarray(fitted)[: top - 1]
    assert (np.abs(top_fill.astype(int) - np.asarray(fitted)[top].astype(int).mean(axis=0)) < 64).all()
    back = restore_framing(fitted, info)
    assert back.size == (300, 200)
    diff = np.abs(np.asarray(back).astype(int) - np.asarray(src).astype(int))
    assert diff.mean() < 4


def test_restore_from_another_resolution() -> None:
    src = Image.fromarray(_gradient(100, 300))  # tall: padded left and right
    fitted, info = fit_to_aspect(src, (768, 1024), mode="pad", pad_color=(0, 0, 0))
    assert fitted.getpixel((0, 500)) == (0, 0, 0)
    small = fitted.resize((384, 512))
    back = restore_framing(small, info)
    assert back.size == (100, 300)
    assert np.abs(np.asarray(back).astype(int) - np.asarray(src).astype(int)).mean() < 8


def test_crop_and_stretch() -> None:
    src = Image.fromarray(_gradient(400, 300))
    cropped, info = fit_to_aspect(src, (384, 512), mode="crop")
    assert cropped.size == (384, 512) and info.box == (87, 0, 312, 300)
    assert restore_framing(cropped, info).size == (225, 300)
    stretched, info = fit_to_aspect(src, (384, 512), mode="stretch")
    assert stretched.size == (384, 512) and restore_framing(stretched, info).size == (400, 300)
    assert isinstance(info, FitInfo)
    with pytest.raises(ValueError):
        fit_to_aspect(src, (384, 512), mode="zoom")  # type: ignore[arg-type]


def test_already_3_4_pad_is_plain_resize() -> None:
    src = Image.fromarray(_gradient(300, 400))
    fitted, info = fit_to_aspect(src, (768, 1024))
    assert info.box == (0, 0, 768, 1024)
    assert np.array_equal(np.asarray(fitted), np.asarray(src.resize((768, 1024))))
