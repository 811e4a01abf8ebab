"""The one guarded opener (ootd/imaging/opener.py): every image that comes in goes through it. A scan of the shipped
source (ootd/, preprocess/, run/, scripts/) fails with its file and line on any other way in: Pillow's `Image.open`
(however it was imported), `ImageFile.Parser`, OpenCV's `imread`/`imdecode`, torchvision's and imageio's readers;
and the guards hold for every caller (files, bytes, header reads)."""

from __future__ import annotations

import ast
import io
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from ootd.errors import InputImageError
from ootd.imaging.opener import MAX_PIXELS, open_image, read_header
from tests.helpers import REPO

OPENER = REPO / "ootd" / "imaging" / "opener.py"
SHIPPED = ("ootd", "preprocess", "run", "scripts")
# (module, attribute) pairs that read an image's bytes
READERS = {("PIL.Image", "open"), ("PIL.ImageFile", "Parser"), ("cv2", "imread"), ("cv2", "imdecode"),
           ("torchvision.io", "read_image"), ("torchvision.io", "decode_image"), ("imageio", "imread"),
           ("imageio.v3", "imread"), ("skimage.io", "imread")}


def _readers_called(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module reads an image other than through the opener: (line, what)."""
    modules: dict[str, str] = {}  # a local name -> the module it is
    functions: dict[str, str] = {}  # a local name -> "module.attribute" of a reader imported by name
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                modules[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                    alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                modules[alias.asname or alias.name] = full
                if (node.module, alias.name) in READERS:
                    functions[alias.asname or alias.name] = full
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in functions:
            found.append((node.lineno, functions[func.id]))
        elif isinstance(func, ast.Attribute):
            owner = _dotted(func.value)
            if owner is None:
                continue
            head, _, rest = owner.partition(".")
            module = modules.get(head, head) + (f".{rest}" if rest else "")
            if (module, func.attr) in READERS:
                found.append((node.lineno, f"{module}.{func.attr}"))
    return found


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def test_no_image_comes_in_except_through_the_opener() -> None:
    files = [p for folder in SHIPPED for p in (REPO / folder).rglob("*.py")]
    assert OPENER in files and len(files) > 100
    found = [f"{path.relative_to(REPO)}:{line}: {what}" for path in files if path != OPENER
             for line, what in _readers_called(ast.parse(path.read_text(encoding="utf-8")))]
    assert not found, "images read outside ootd/imaging/opener.py:\n" + "\n".join(found)
    assert [what for _, what in _readers_called(ast.parse(OPENER.read_text()))] == ["PIL.Image.open"]


@pytest.mark.parametrize("source", [
    "from PIL import Image\nImage.open(p)", "import PIL.Image\nPIL.Image.open(p)",
    "from PIL.Image import open\nopen(p)", "from PIL import Image as I\nI.open(p)",
    "import PIL.Image as pim\npim.open(p)", "import cv2\ncv2.imdecode(b, 1)",
    "from PIL import ImageFile\nImageFile.Parser()", "from torchvision.io import read_image\nread_image(p)"])
def test_the_scan_finds_each_way_in(source: str) -> None:
    assert len(_readers_called(ast.parse(source))) == 1
    assert _readers_called(ast.parse("path.open('rb')\nopen(p)\nImage.new('RGB', (1, 1))")) == []


def _png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))


def test_the_guards_hold_for_bytes_and_header_reads(tmp_path: Path) -> None:
    huge = _png(20_000, 20_000)
    assert 20_000 * 20_000 > MAX_PIXELS
    with pytest.raises(InputImageError, match="image too large"):
        read_header(huge, InputImageError)
    with pytest.raises(InputImageError, match="image too large"), open_image(huge, InputImageError, decode=False):
        pass
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 100 100\nshowpage\n"
    with pytest.raises(InputImageError, match="not a supported format"):
        read_header(eps, InputImageError)
    with pytest.raises(InputImageError, match="empty upload"):
        read_header(b"", InputImageError)
    buffer = io.BytesIO()
    Image.new("RGB", (80, 60)).save(buffer, "JPEG", exif=_turned())
    header = read_header(buffer.getvalue(), InputImageError, orientation=True)
    assert (header.size, header.upright, header.format) == ((80, 60), (60, 80), "JPEG")
    (tmp_path / "a.png").write_bytes(buffer.getvalue())  # a JPEG named .png: the content decides
    assert read_header(tmp_path / "a.png", InputImageError).format == "JPEG"
    with pytest.raises(InputImageError, match="PNG"):  # a caller that takes only PNG (a record's reader)
        read_header(tmp_path / "a.png", InputImageError, formats=("PNG",))


def _turned() -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = 6
    return exif
