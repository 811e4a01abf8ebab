"""`ootd compare`: PSNR, SSIM and pixel differences of two folders, checked against figures computed here."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from PIL import Image
from typer.testing import CliRunner

from ootd import cli
from ootd.tools.compare import compare_folders


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
    assert lines[3].startswith("overall (3 compared, 1 identical, 0 problem(s)): PSNR inf (identical)")
    data = json.loads(invoke(folders["a"], folders["b"], "--json").stdout)
    by_name = {i["name"]: i for i in data["images"]}
    assert by_name["same.png"]["psnr"] == "inf" and by_name["same.png"]["ssim"] == 1.0
    assert by_name["offset.png"]["psnr"] == pytest.approx(20 * math.log10(255 / 4), abs=1e-9)
    assert data["overall"]["compared"] == 3 and data["overall"]["max_abs"] == 20


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
    assert any(line.startswith("broken.png: ") and "unreadable" in line for line in lines)
    assert not any("notes.txt" in line for line in lines)
    assert lines[-1].startswith("overall (2 compared, 0 identical, 3 problem(s)): PSNR ")


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


def test_help_says_no_lpips() -> None:
    out = CliRunner().invoke(cli.app, ["compare", "--help"], terminal_width=200)
    assert out.exit_code == 0 and "LPIPS" in out.output
