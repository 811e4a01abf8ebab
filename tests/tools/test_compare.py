"""`ootd compare`: PSNR, SSIM and pixel differences of two folders, checked against figures computed here."""

from __future__ import annotations

import json
import math
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from PIL import Image
from typer.testing import CliRunner

from ootd import cli
from ootd.tools.compare import compare_folders
from tests.helpers.cli import invoke as invoke_cli
from tests.helpers.cli import invoke_bounded


def invoke(*args: object):  # noqa: ANN201
    return CliRunner().invoke(cli.app, ["compare", *[str(a) for a in args]])


def reference_ssim(a: np.ndarray, b: np.ndarray) -> float:
    """SSIM written out: an explicit 11x11 Gaussian window (sigma 1.5) slid over the valid region of each
    channel, the means, variances and covariance per window, the Wang et al. formula, averaged."""
    r = np.arange(-5, 6)
    g = np.exp(-(r**2) / (2 * 1.5**2))
    w = np.outer(g, g) / np.outer(g, g).sum()
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    values = []
    for c in range(a.shape[-1]):
        x = sliding_window_view(a[..., c].astype(np.float64), (11, 11))
        y = sliding_window_view(b[..., c].astype(np.float64), (11, 11))
        mx, my = (x * w).sum((-1, -2)), (y * w).sum((-1, -2))
        vx = (((x - mx[..., None, None]) ** 2) * w).sum((-1, -2))
        vy = (((y - my[..., None, None]) ** 2) * w).sum((-1, -2))
        cxy = ((x - mx[..., None, None]) * (y - my[..., None, None]) * w).sum((-1, -2))
        s = (2 * mx * my + c1) * (2 * cxy + c2) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
        values.append(s.mean())
    return float(np.mean(values))


def whole_image_ssim(a: np.ndarray, b: np.ndarray) -> float:
    """SSIM as one float64 pass over each whole channel (the form the strips must reproduce)."""
    from scipy.ndimage import gaussian_filter

    def blur(v: np.ndarray) -> np.ndarray:
        return gaussian_filter(v, 1.5, truncate=3.5, mode="reflect")

    values = []
    for c in range(a.shape[-1]):
        x, y = a[..., c].astype(np.float64), b[..., c].astype(np.float64)
        mx, my = blur(x), blur(y)
        vx, vy, cxy = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
        c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
        s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
        values.append(s[5:-5, 5:-5].mean())
    return float(np.mean(values))


def test_ssim_in_strips_is_the_whole_images_and_its_memory_does_not_grow_with_the_image(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Strips of 64 rows, each read with the window's 5 rows more on each side, give the whole-image value (to
    1e-12; only the order of the final sum differs), and the work arrays are a strip's, not the image's: four
    times the rows, the same peak, under a float64 copy of the image."""
    import tracemalloc

    from ootd.imaging import similarity as compare  # what `ootd compare` measures with

    rng = np.random.default_rng(1)
    base = rng.integers(0, 256, size=(300, 48, 3), dtype=np.uint8)
    other = np.clip(base.astype(int) + rng.integers(-30, 31, size=base.shape), 0, 255).astype(np.uint8)
    monkeypatch.setattr(compare, "STRIP_PIXELS", 64 * 48)  # five strips: four boundaries inside the image
    assert len(compare._strips(300, 48, 5)) == 5
    assert compare.ssim(base, other) == pytest.approx(whole_image_ssim(base, other), abs=1e-12)
    assert compare.ssim(base, other) == pytest.approx(reference_ssim(base, other), abs=1e-9)
    monkeypatch.undo()

    peaks = []
    for rows in (600, 2400):
        a = rng.integers(0, 256, size=(rows, 500, 3), dtype=np.uint8)
        b = a ^ 3
        tracemalloc.start()
        compare.ssim(a, b)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 1.2 * peaks[0], peaks
    assert peaks[1] < a.size * 8 / 2, peaks  # half a float64 copy of the 2400-row image


@pytest.fixture()
def folders(tmp_path: Path) -> dict[str, object]:
    rng = np.random.default_rng(0)
    base = rng.integers(0, 252, size=(40, 32, 3), dtype=np.uint8)
    noisy = np.clip(base.astype(int) + rng.integers(-20, 21, size=base.shape), 0, 255).astype(np.uint8)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    Image.fromarray(base).save(a / "offset.png")
    Image.fromarray(base + 4).save(b / "offset.png")
    Image.fromarray(base).save(a / "same.png")
    Image.fromarray(base).save(b / "same.png")
    Image.fromarray(base).save(a / "noisy.png")
    Image.fromarray(noisy).save(b / "noisy.png")
    return {"a": a, "b": b, "base": base, "noisy": noisy}


def test_known_offset_and_noise_give_the_expected_metrics(folders: dict[str, object]) -> None:
    result = {c.name: c for c in compare_folders(folders["a"], folders["b"]).images}
    offset = result["offset.png"]
    assert offset.psnr == pytest.approx(20 * math.log10(255 / 4), abs=1e-9)  # 36.09 dB
    assert (offset.max_abs, offset.mean_abs) == (4, 4.0)
    base, noisy = folders["base"], folders["noisy"]
    assert offset.ssim == pytest.approx(reference_ssim(base, base + 4), abs=1e-9)
    mse = np.mean((base.astype(float) - noisy.astype(float)) ** 2)
    assert result["noisy.png"].psnr == pytest.approx(10 * math.log10(255**2 / mse), abs=1e-9)
    assert result["noisy.png"].ssim == pytest.approx(reference_ssim(base, noisy), abs=1e-9)
    assert result["noisy.png"].ssim < offset.ssim < 1.0
    assert result["same.png"].psnr == math.inf and result["same.png"].ssim == 1.0


def test_cli_text_and_json(folders: dict[str, object]) -> None:
    out = invoke(folders["a"], folders["b"])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0].startswith("noisy.png: PSNR ")
    assert lines[1].startswith(f"offset.png: PSNR {20 * math.log10(255 / 4):.2f} dB  SSIM ")  # 36.09 dB
    assert lines[1].endswith("max |diff| 4  mean |diff| 4.000")
    assert lines[2].startswith("same.png: PSNR inf (identical)  SSIM 1.0000  max |diff| 0")
    data = json.loads(invoke(folders["a"], folders["b"], "--json").stdout)
    by_name = {i["name"]: i for i in data["images"]}
    assert by_name["same.png"]["psnr"] == "inf" and by_name["same.png"]["ssim"] == 1.0
    assert by_name["offset.png"]["psnr"] == pytest.approx(20 * math.log10(255 / 4), abs=1e-9)
    overall = data["overall"]
    assert (overall["compared"], overall["identical"], overall["differing"], overall["max_abs"]) == (3, 1, 2, 20)
    differ = [by_name["noisy.png"], by_name["offset.png"]]  # the means are over the pairs that differ
    assert overall["psnr_mean"] == pytest.approx(np.mean([i["psnr"] for i in differ]), abs=1e-9)
    assert overall["ssim_mean"] == pytest.approx(np.mean([i["ssim"] for i in differ]), abs=1e-12)
    assert lines[3] == (f"overall (3 compared, 0 problem(s)): 1 of 3 identical; the other 2 (mean): PSNR "
                        f"{overall['psnr_mean']:.2f} dB  SSIM {overall['ssim_mean']:.4f}  max |diff| 20  mean |diff| "
                        f"{overall['mean_abs']:.3f}")


def test_the_overall_line_counts_identical_pairs_and_averages_the_others(folders: dict[str, object]) -> None:
    """One identical pair and one at about 20 dB: the overall PSNR is the other's, not inf."""
    a, b = folders["a"], folders["b"]
    for name in ("offset.png", "noisy.png"):
        (a / name).unlink()
        (b / name).unlink()
    far = np.clip(folders["base"].astype(int) + 25, 0, 255).astype(np.uint8)
    Image.fromarray(folders["base"]).save(a / "far.png")
    Image.fromarray(far).save(b / "far.png")
    (a / "gone.png").write_bytes((a / "same.png").read_bytes())
    lines = invoke(a, b).stdout.splitlines()
    far_line = next(line for line in lines if line.startswith("far.png: "))
    psnr_text = far_line.split("PSNR ")[1].split(" dB")[0]
    assert 19 < float(psnr_text) < 22, far_line
    assert lines[-1].startswith(f"overall (2 compared, 1 problem(s)): 1 of 2 identical; the other: PSNR "
                                f"{psnr_text} dB  SSIM "), lines[-1]
    for path in (a / "far.png", b / "far.png", a / "gone.png"):
        path.unlink()
    assert invoke(a, b).stdout.splitlines()[-1] == \
        "overall (1 compared, 0 problem(s)): all 1 identical (PSNR inf, SSIM 1.0000, max |diff| 0)"
    overall = json.loads(invoke(a, b, "--json").stdout)["overall"]
    assert (overall["identical"], overall["differing"], overall["psnr_mean"], overall["ssim_mean"]) == \
        (1, 0, "inf", 1.0)


def test_missing_counterpart_and_size_mismatch_are_one_line_reports(folders: dict[str, object]) -> None:
    a, b = folders["a"], folders["b"]
    Image.fromarray(folders["base"]).save(a / "only_a.png")
    Image.fromarray(folders["base"][:30]).save(b / "same.png")
    (b / "notes.txt").write_text("not an image")
    (b / "broken.png").write_bytes(b"not a png")
    Image.fromarray(folders["base"]).save(a / "broken.png")
    out = invoke(a, b)
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert f"only_a.png: only in {a}" in lines
    assert "same.png: sizes differ: 32x40 vs 32x30" in lines
    assert any(line.startswith("broken.png: ") and "not an image file" in line for line in lines)
    assert not any("notes.txt" in line for line in lines)
    assert lines[-1].startswith("overall (2 compared, 3 problem(s)): 0 of 2 identical; mean: PSNR ")
    assert not any(line.startswith("skipped") for line in lines)  # none of these is an ootd intermediate


@pytest.mark.parametrize("which", ["missing", "file"])
def test_bad_folders_exit_2_with_one_line(which: str, folders: dict[str, object], tmp_path: Path) -> None:
    bad = tmp_path / "nowhere"
    if which == "file":
        bad = tmp_path / "a" / "same.png"
    out = invoke(folders["a"], bad)
    assert out.exit_code == 2, out.output
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "is not a folder" in lines[0]
    assert "Traceback" not in out.output


def test_help_points_to_eval_for_lpips() -> None:
    out = CliRunner().invoke(cli.app, ["compare", "--help"], terminal_width=200)
    assert out.exit_code == 0 and "LPIPS" in out.output and "ootd eval" in out.output


# -- what `ootd run` refuses is refused per file here too; results only by default ------------------------------


def png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG whose header declares `width` x `height` (and no pixel data): what a decompression bomb shows
    before it is decoded, without building one."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b""))
    return path


@pytest.mark.parametrize(("side", "said"), [(20000, "too large"), (8000, "image too large: 8000x8000 = 64 megapixels")])
def test_over_limit_images_are_refused_per_file(folders: dict[str, object], side: int, said: str) -> None:
    a, b = folders["a"], folders["b"]
    for folder in (a, b):
        png_header_only(folder / "bomb.png", side, side)
    out = invoke(a, b)
    assert out.exit_code == 0, out.output
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("bomb.png: ")]
    assert said in line and str(a / "bomb.png") in line, line
    assert "internal error" not in out.output and out.stdout.splitlines()[-1].startswith("overall (3 compared")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_fifo_is_reported_not_waited_on(folders: dict[str, object]) -> None:
    a, b = folders["a"], folders["b"]
    for folder in (a, b):
        os.mkfifo(folder / "f.png")
    out = invoke_bounded("compare", a, b, limit=60)
    assert out.exit_code == 0, out.output
    assert f"f.png: {a / 'f.png'}: is a FIFO (named pipe), not a regular file" in out.stdout.splitlines()


def test_results_only_by_default_intermediates_on_request(models, tmp_path: Path, tiny_tree: Path,  # noqa: ANN001
                                                          example_images: dict[str, Path]) -> None:
    """Two runs with --save-intermediates --grid whose samples differ and whose mask and masked person do not:
    by default only the sample is compared, and what was skipped (those two and the grid) is said."""
    models.fake()
    for folder, seed in (("exact", "1"), ("fast", "2")):
        done = invoke_cli("run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper",
                          "--mask", example_images["mask"], "--checkpoints", tiny_tree, "-o", tmp_path / folder,
                          "--seed", seed, "--steps", "1", "--resolution", "384x512", "--save-intermediates", "--grid")
        assert done.exit_code == 0, done.output
    default = invoke(tmp_path / "exact", tmp_path / "fast")
    assert default.exit_code == 0, default.output
    lines = default.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:1]] == ["person__tshirt__0.png"]
    assert lines[1].startswith("skipped 3 intermediate(s) and contact sheet(s), not results (person__tshirt__grid.png, "
                               "person__tshirt__mask.png, person__tshirt__masked_person.png)")
    assert "--include-intermediates" in lines[1]
    assert lines[2].startswith("overall (1 compared, 0 problem(s)): 0 of 1 identical; mean: PSNR ")
    assert "inf" not in lines[2]
    data = json.loads(invoke(tmp_path / "exact", tmp_path / "fast", "--json").stdout)
    assert data["overall"]["compared"] == 1 and data["overall"]["skipped"] == 3 and len(data["skipped"]) == 3
    everything = invoke(tmp_path / "exact", tmp_path / "fast", "--include-intermediates")
    assert everything.stdout.splitlines()[-1].startswith("overall (4 compared, 0 problem(s)): 2 of 4 identical; "
                                                         "the other 2 (mean): PSNR ")
    assert not any(line.startswith("skipped") for line in everything.stdout.splitlines())


def test_the_settings_two_results_record_differently_are_named(tmp_path: Path) -> None:
    """`ootd compare` of try-ons with and without an adapter says so (their PNG records differ)."""
    from ootd.app.tryon.record import software
    from ootd.imaging.atomic import save_png_atomic

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    base = {**software(), "sample": "0", "steps": "20", "seed": "1"}
    picture = Image.new("RGB", (16, 16), (10, 20, 30))
    save_png_atomic(picture, a / "x.png", base)
    save_png_atomic(picture, b / "x.png", {**base, "lora": "shop.safetensors", "lora_sha256": "ab12",
                                           "lora_scale": "0.8"})
    (item,) = compare_folders(a, b).images
    assert item.settings == {"lora_sha256": ("none", "ab12"), "lora_scale": ("none", "0.8"),
                             "lora": ("none", "shop.safetensors")}
    out = invoke(a, b).stdout
    assert "lora_scale none vs 0.8" in out
