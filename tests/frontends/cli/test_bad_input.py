"""Bad input through `ootd run`: one clear line on stderr, exit 2 (usage) or 1 (failure), no traceback unless
--debug, no output file, and nothing loaded when a cheap check can tell. Unusual but valid images are accepted."""

from __future__ import annotations

import shutil
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers.cli import assert_one_line_error, invoke


def _png_header_only(path: Path, width: int, height: int) -> None:
    """A PNG whose header claims a huge image (a decompression bomb needs no pixel data to be dangerous)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16))
                     + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, example_images: dict[str, Path]) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("inputs")
    person = example_images["person"]
    data = person.read_bytes()
    made = {"person": person, "tshirt": example_images["tshirt"], "mask": example_images["mask"]}
    (root / "folder.png").mkdir()
    made["folder"] = root / "folder.png"
    made["text"] = root / "notes.png"
    made["text"].write_text("this is not an image\n")
    made["truncated"] = root / "truncated.png"
    made["truncated"].write_bytes(data[: len(data) // 3])
    made["tiny"] = root / "tiny.png"
    Image.new("RGB", (32, 40), (200, 10, 10)).save(made["tiny"])
    made["bomb"] = root / "bomb.png"
    _png_header_only(made["bomb"], 40_000, 40_000)
    made["regular_file"] = root / "a_file"
    made["regular_file"].write_text("x")

    base = Image.open(person).convert("RGB").resize((96, 128))
    made["gray"] = root / "gray.png"
    base.convert("L").save(made["gray"])
    made["rgba"] = root / "rgba.png"
    rgba = base.convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize(base.size))
    rgba.save(made["rgba"])
    made["la"] = root / "la.png"
    rgba.convert("LA").save(made["la"])
    made["palette"] = root / "palette.png"
    base.convert("P", palette=Image.Palette.ADAPTIVE, colors=16).save(made["palette"], transparency=0)
    made["16bit"] = root / "deep.png"
    Image.fromarray(np.asarray(base.convert("L")).astype(np.uint16) * 257).save(made["16bit"])
    made["cmyk"] = root / "cmyk.jpg"
    base.convert("CMYK").save(made["cmyk"], quality=95)
    made["exif"] = root / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    base.rotate(90, expand=True).save(made["exif"], exif=exif)  # stored 128x96, shown 96x128
    return made


USAGE_CASES = [
    # (person, garment, extra args, expected exit, fragments)
    ("missing", "tshirt", [], 2, ["person image", "file not found"]),
    ("folder", "tshirt", [], 2, ["is a directory"]),
    ("person", "text", [], 2, ["garment image", "not an image file"]),
    ("truncated", "tshirt", [], 2, ["corrupt or truncated"]),
    ("tiny", "tshirt", [], 2, ["too small", "32x40"]),
    ("bomb", "tshirt", [], 2, ["too large", "bomb.png"]),
    ("person", "tshirt", ["--mask", "{truncated}"], 2, ["mask image", "truncated"]),
    ("person", "tshirt", ["--category", "hat"], 2, ["unknown category 'hat'"]),
    ("person", "tshirt", ["--category", "lower", "--model-type", "hd"], 2, ["hd model only does upper-body"]),
    ("person", "tshirt", ["--category", "dress", "--model-type", "hd"], 2, ["--model-type dc"]),
    ("person", "tshirt", ["--model-type", "xl"], 2, ["unknown model type"]),
    ("person", "tshirt", ["--resolution", "512x512"], 2, ["unknown resolution '512x512'"]),
    ("person", "tshirt", ["--resolution", "big"], 2, ["resolution"]),
    ("person", "tshirt", ["--scheduler", "magic"], 2, ["unknown scheduler"]),
    ("person", "tshirt", ["--precision", "fp8"], 2, ["unknown precision"]),
    ("person", "tshirt", ["--attention", "quantum"], 2, ["unknown attention backend"]),
    ("person", "tshirt", ["--steps", "0"], 2, ["steps must be"]),
    ("person", "tshirt", ["--samples", "-1"], 2, ["samples must be"]),
    ("person", "tshirt", ["--fit", "zoom"], 2, ["unknown fit mode"]),
    ("person", "tshirt", ["--mask-grow", "-3"], 2, ["--mask-grow"]),
    ("person", "tshirt", ["--steps", "many"], 2, ["--steps"]),
    ("person", "tshirt", ["--output", "{regular_file}/out"], 1, ["cannot create output folder"]),
    ("person", "tshirt", ["--checkpoints", "{tmp}/missing"], 1, ["checkpoints folder", "does not exist",
                                                                   "ootd download"]),
]


@pytest.mark.parametrize(("person", "garment", "extra", "code", "fragments"), USAGE_CASES,
                         ids=[f"{c[0]}-{c[1]}-{'-'.join(c[2]) or 'plain'}" for c in USAGE_CASES])
def test_bad_input_is_one_line_before_loading(models, person: str, garment: str, extra: list[str], code: int,
                                              fragments: list[str], files: dict[str, Path], tiny_tree: Path,
                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    models.forbid()
    names = {key: str(path) for key, path in files.items()} | {"tmp": str(tmp_path)}
    person_path = files.get(person, tmp_path / f"{person}.png")
    start = time.perf_counter()
    result = invoke("run", "--model", person_path, "--cloth", files[garment], "--category", "upper",
                    "--checkpoints", tiny_tree, "--output", tmp_path / "out",  # later options win
                    *[arg.format(**names) for arg in extra])
    assert time.perf_counter() - start < 10
    assert_one_line_error(result, code, *fragments)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_missing_required_option_is_one_line(files: dict[str, Path]) -> None:
    result = invoke("run", "--model", files["person"], "--category", "upper")
    assert_one_line_error(result, 2, "Missing option", "--cloth")


@pytest.mark.parametrize("damage", ["deleted unet weights", "truncated vae"])
def test_damaged_checkpoints(models, damage: str, files: dict[str, Path], tiny_tree: Path, tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "ck"
    shutil.copytree(tiny_tree, tree)
    if damage == "deleted unet weights":
        models.forbid()  # presence is checked before loading
        (tree / "ootd/ootd_hd/checkpoint-36000/unet_garm/diffusion_pytorch_model.safetensors").unlink()
        fragments = ["unet_garm (hd) weights", "no weights in", "ootd download"]
    else:  # present but unloadable: found when the real loader reads it
        vae = tree / "ootd/vae/diffusion_pytorch_model.bin"
        vae.write_bytes(vae.read_bytes()[:2000])
        fragments = ["cannot load the VAE", str(vae), "re-download"]
    out = tmp_path / "out"
    result = invoke("run", "-m", files["person"], "-c", files["tshirt"], "-k", "upper", "--mask", files["mask"],
                    "--checkpoints", tree, "-o", out, "--steps", "1", "--resolution", "384x512")
    assert_one_line_error(result, 1, *fragments)
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("name", ["gray", "rgba", "la", "palette", "16bit", "cmyk", "exif"])
def test_unusual_but_valid_images_are_accepted(models, name: str, files: dict[str, Path], tiny_tree: Path,
                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = models.fake()
    result = invoke("run", "-m", files[name], "-c", files[name], "-k", "upper", "--mask", files["mask"],
                    "--checkpoints", tiny_tree, "-o", tmp_path, "--seed", "1")
    assert result.exit_code == 0, result.output
    (pipe,) = made["hd"]
    person = pipe.persons[0]
    assert isinstance(person, Image.Image) and person.mode == "RGB"
    assert person.size == (96, 128)  # EXIF orientation honoured: stored 128x96, used upright
    assert (tmp_path / f"{files[name].stem}__{files[name].stem}__0.png").is_file()


def test_internal_error_and_debug(models, files: dict[str, Path], tiny_tree: Path, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    models.fake(fail_generate=RuntimeError("boom\nsecond line"))
    args = ["run", "-m", files["person"], "-c", files["tshirt"], "-k", "upper", "--mask", files["mask"],
            "--checkpoints", tiny_tree, "-o", tmp_path / "out"]
    result = invoke(*args)
    assert result.exit_code == 1
    line = "internal error: RuntimeError: boom second line"
    assert result.stderr.strip() == f"{line} (rerun with --debug for the traceback)"
    debug = invoke(*args, "--debug")
    assert debug.exit_code == 1
    assert "Traceback" in debug.stderr and debug.stderr.strip().endswith(line)
    assert not any((tmp_path / "out").iterdir())


def test_keyboard_interrupt_exits_130_without_files(models, files: dict[str, Path], tiny_tree: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    models.fake(fail_generate=KeyboardInterrupt())
    out = tmp_path / "out"
    result = invoke("run", "-m", files["person"], "-c", files["tshirt"], "-k", "upper", "--mask", files["mask"],
                    "--checkpoints", tiny_tree, "-o", out)
    assert result.exit_code == 130
    assert result.stderr.strip() == "interrupted"
    assert list(out.iterdir()) == []
