"""A corpus of hostile and unusual image files, generated in the test suite (nothing downloaded), and what every
entry point must make of each: a picture, or one line that names the file - never a traceback, a hang or a 5xx.

- `mutated(seed)`: for every format Pillow writes here, a valid file and seeded mutations of it: truncations, byte
  flips (in the header and anywhere), and extreme header fields (the width and height found in the header, in
  either byte order and width, replaced by 0, 1, 2^15-1, 2^16-1, 2^31-1, 2^32-1; a PNG's chunk checksums fixed
  after each change, so Pillow reads past them into the decoder), plus an image with a damaged ICC profile.
- `image_files()`: a Hypothesis strategy of valid but unusual files: every mode, EXIF orientations, palette and
  grey transparency, 16-bit, animated (GIF, APNG, WebP) and multipage (TIFF) files, embedded ICC profiles (real
  and damaged), sizes below and above the smallest a photo may have.
"""

from __future__ import annotations

import io
import random
import struct
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from PIL import Image, ImageCms

WIDTH, HEIGHT = 67, 71  # distinct, so the header fields holding them can be found; over 64, the smallest photo side
EXTREMES = (0, 1, 2**15 - 1, 2**16 - 1, 2**31 - 1, 2**32 - 1)
HEADER_BYTES = 512  # where header fields are looked for
# modes tried for each format, the first that saves is used (a format's own kind of picture)
TRY_MODES = ("RGB", "RGBA", "L", "P", "1", "CMYK", "I;16", "F")
NO_WRITER_HERE = {"BUFR", "GRIB", "HDF5", "WMF"}  # Pillow writes these only through a handler a program installs
BIG = 1 << 18  # a valid file over this many bytes gets one mutation only
HANG_LIMIT_S = 30.0  # one file's check that has not returned by then is a hang


@dataclass(frozen=True)
class Sample:
    name: str  # a file name whose suffix is the format's own
    data: bytes
    origin: str  # how it was made, for failure messages


def _base(mode: str, seed: int = 0, size: tuple[int, int] = (WIDTH, HEIGHT)) -> Image.Image:
    rng = np.random.default_rng(seed)
    rgb = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")
    return _in_mode(rgb, mode)


@cache
def writable_formats() -> dict[str, bytes]:
    """Every format Pillow saves here, as one valid file of WIDTH x HEIGHT (the first mode of TRY_MODES it takes)."""
    Image.init()
    made = {}
    for fmt in sorted(Image.SAVE):
        if fmt in NO_WRITER_HERE:
            continue
        for mode in TRY_MODES:
            buffer = io.BytesIO()
            try:
                _base(mode).save(buffer, format=fmt)
            except Exception:  # noqa: BLE001 - not this mode: try the next
                continue
            made[fmt] = buffer.getvalue()
            break
    return made


def _suffix(fmt: str) -> str:
    Image.init()
    suffixes = [ext for ext, name in Image.registered_extensions().items() if name == fmt]
    return suffixes[0] if suffixes else f".{fmt.lower()}"


def _fix_png_crcs(data: bytes) -> bytes:
    """A PNG's chunks with their checksums recomputed (as far as the chunk lengths allow)."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return data
    out, pos = bytearray(data[:8]), 8
    while pos + 12 <= len(data):
        length = struct.unpack_from(">I", data, pos)[0]
        end = pos + 12 + length
        if end > len(data):
            break
        body = data[pos + 4:pos + 8 + length]
        out += data[pos:pos + 8 + length] + struct.pack(">I", zlib.crc32(body))
        pos = end
    return bytes(out + data[pos:])


def _header_fields(data: bytes) -> list[tuple[int, str]]:
    """(offset, struct format) of each place in the header holding the width or the height."""
    found = []
    for value in (WIDTH, HEIGHT):
        for fmt in (">H", "<H", ">I", "<I"):
            packed = struct.pack(fmt, value)
            start = 0
            while (at := data.find(packed, start, HEADER_BYTES)) >= 0:
                found.append((at, fmt))
                start = at + 1
    return found


@cache
def mutated(seed: int = 0, flips: int = 6, cuts: int = 5, fields: int = 4) -> tuple[Sample, ...]:
    """The valid file of every writable format and its seeded mutations (see the module): `cuts` truncations,
    `flips` byte flips, the extremes of `fields` header fields."""
    rng = random.Random(seed)
    samples = []
    for fmt, data in writable_formats().items():
        name = f"{fmt.lower()}{_suffix(fmt)}"

        def add(kind: str, body: bytes, fmt: str = fmt, name: str = name) -> None:
            samples.append(Sample(f"{len(samples):03d}-{kind}-{name}", _fix_png_crcs(body) if fmt == "PNG" else body,
                                  f"{fmt} {kind}"))

        add("valid", data)
        if len(data) > BIG:  # a format that writes many sizes at once (ICNS): cut once, the rest is the same
            add("cut-half", data[: len(data) // 2])
            continue
        for cut in sorted({8, len(data) // 10, len(data) // 2, len(data) * 9 // 10, len(data) - 1})[-cuts:]:
            add(f"cut{cut}", data[:cut])
        for number in range(flips):
            flipped = bytearray(data)
            reach = min(len(data), HEADER_BYTES) if number % 2 == 0 else len(data)
            for _ in range(1 + number):
                at = rng.randrange(reach)
                flipped[at] ^= rng.randrange(1, 256)
            add(f"flip{number}", bytes(flipped))
        for at, field in _header_fields(data)[:fields]:
            for extreme in EXTREMES:
                limit = 2 ** (8 * struct.calcsize(field)) - 1
                changed = bytearray(data)
                struct.pack_into(field, changed, at, min(extreme, limit))
                add(f"field{at}-{min(extreme, limit)}", bytes(changed))
    buffer = io.BytesIO()
    _base("RGB").save(buffer, format="PNG", icc_profile=_srgb()[:300] + bytes(rng.randrange(256) for _ in range(200)))
    samples.append(Sample("damaged-icc.png", buffer.getvalue(), "PNG with a damaged ICC profile"))
    return tuple(samples)


def _srgb() -> bytes:
    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()


# ------------------------------------------------------------------------------------ valid but unusual files

MODES = ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr", "LAB", "HSV", "I", "I;16", "I;16B", "F")
FORMATS_OF = {"PNG": ".png", "JPEG": ".jpg", "TIFF": ".tif", "WEBP": ".webp", "GIF": ".gif", "BMP": ".bmp",
              "PPM": ".ppm", "AVIF": ".avif"}
# save_all: animated or multipage files (not AVIF: Pillow 13 crashes, a segmentation fault, writing some animated ones)
ANIMATED = ("GIF", "PNG", "WEBP", "TIFF")


def image_files() -> Any:
    """A Hypothesis strategy of (name, bytes, what) for valid but unusual image files (see the module)."""
    from hypothesis import strategies as st

    @st.composite
    def files(draw: Callable[[Any], Any]) -> tuple[str, bytes, str]:
        from hypothesis import reject

        mode = draw(st.sampled_from(MODES))
        fmt = draw(st.sampled_from(sorted(FORMATS_OF)))
        small = draw(st.booleans()) and draw(st.booleans())  # a quarter: below the smallest photo side
        size = (draw(st.integers(1, 63) if small else st.integers(64, 90)), draw(st.integers(1, 90)))
        seed = draw(st.integers(0, 2**16))
        image = _base("RGB", seed, size)
        image = _in_mode(image, mode)
        options: dict[str, Any] = {}
        orientation = draw(st.sampled_from([None, 1, 2, 3, 4, 5, 6, 7, 8]))
        if orientation is not None:
            exif = Image.Exif()
            exif[0x0112] = orientation
            options["exif"] = exif
        if mode in ("P", "L", "RGB") and draw(st.booleans()):
            options["transparency"] = 0 if mode != "RGB" else (0, 0, 0)
        icc = draw(st.sampled_from(["none", "srgb", "damaged"]))
        if icc != "none":
            options["icc_profile"] = _srgb() if icc == "srgb" else _srgb()[:128] + bytes(range(256)) * 2
        frames = draw(st.integers(1, 3)) if fmt in ANIMATED else 1
        if frames > 1:
            options.update(save_all=True, append_images=[_in_mode(_base("RGB", seed + n, size), mode)
                                                         for n in range(1, frames)], duration=40, loop=0)
        buffer = io.BytesIO()
        try:
            image.save(buffer, format=fmt, **options)
        except Exception:  # noqa: BLE001 - a combination this format cannot hold
            reject()
        what = f"{mode} {size[0]}x{size[1]} {fmt}, {frames} frame(s), orientation {orientation}, icc {icc}" + (
            ", transparency" if "transparency" in options else "")
        return f"h{seed}{FORMATS_OF[fmt]}", buffer.getvalue(), what

    return files()


def _in_mode(image: Image.Image, mode: str) -> Image.Image:
    """`image` (RGB) in `mode`: grey levels scaled to the mode's range for the 16- and 32-bit ones."""
    grey = np.asarray(image.convert("L"))
    if mode == "F":
        return Image.fromarray(grey.astype(np.float32) / 255.0)
    if mode == "I":
        return Image.fromarray(grey.astype(np.int32) * 257)
    if mode == "I;16":
        return Image.fromarray(grey.astype(np.uint16) * 257)
    if mode == "I;16B":
        return Image.frombytes(mode, image.size, (grey.astype(">u2") * 257).tobytes())
    if mode == "PA":
        return image.convert("P").convert("PA")
    return image.convert(mode)


# ------------------------------------------------------------------------------------------ running them


def bounded(fn: Callable[[], Any], what: str, limit: float = HANG_LIMIT_S) -> Any:
    """`fn()` in a thread: its result, its exception raised here, or a failure naming `what` when it hangs."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        raise AssertionError(f"{what}: still running after {limit} s (a hang)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def no_traceback(text: str) -> bool:
    """Output without a traceback or an internal error."""
    return "Traceback" not in text and "internal error" not in text


@cache
def drawn(count: int) -> tuple[Sample, ...]:
    """`count` files of `image_files()`, the same ones on every run (Hypothesis derandomized), for the entry points
    that take a folder or a CSV at once."""
    from hypothesis import HealthCheck, Phase, given, settings

    found: list[Sample] = []

    @settings(max_examples=count, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(image_files())
    def collect(made: tuple[str, bytes, str]) -> None:
        name, data, what = made
        found.append(Sample(f"{len(found):03d}-{name}", data, what))

    collect()
    return tuple(found)


def written(folder: Any, samples: Sequence[Sample], suffix: str = "") -> list[Any]:
    """The samples as files in `folder` (each name with `suffix` added: a folder listing takes only the image
    suffixes it knows, and the content decides the format anyway)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for sample in samples:
        path = folder / f"{sample.name}{suffix}"
        path.write_bytes(sample.data)
        paths.append(path)
    return paths


EVERYDAY = {"flips": 2, "cuts": 2, "fields": 1}  # of each format's mutations: what the everyday group runs
