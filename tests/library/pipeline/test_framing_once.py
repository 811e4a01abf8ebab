"""Every input is resized once, from the source straight to the working resolution (docs/upstream.md §2).

The pixels the VAE encoder receives are compared with conversions written here, independently of
`ootd.imaging.framing.fit_to_aspect`: no resize at all when the input already has the working size, exactly one
`Image.resize` from the source otherwise (pad, crop and stretch). Sharp patterns (a 1-px checkerboard, thin
stripes) survive one resize unchanged but not two, so a framing that goes through another size first fails.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from ootd.imaging.framing import FitInfo, restore_framing
from ootd.preprocessing import Preprocessor
from ootd.settings import Category, FitMode, parse_resolution


def _checkerboard(width: int, height: int) -> Image.Image:
    """1-px checkerboard in two saturated colours: any resample that is not the identity changes it."""
    yy, xx = np.mgrid[:height, :width]
    on = ((xx + yy) % 2 == 0)[..., None]
    return Image.fromarray(np.where(on, [230, 20, 60], [10, 200, 240]).astype(np.uint8), "RGB")


def _stripes(width: int, height: int, seed: int = 0) -> Image.Image:
    """Thin vertical stripes plus a random per-row tint: sharp everywhere, no flat region."""
    rng = np.random.default_rng(seed)
    x = np.arange(width)
    base = np.where((x // 2) % 2 == 0, 235, 25)[None, :, None]
    tint = rng.integers(0, 20, size=(height, 1, 3))
    return Image.fromarray(np.clip(base + tint, 0, 255).astype(np.uint8), "RGB")


def _vae_inputs(pipe, monkeypatch) -> list[torch.Tensor]:  # noqa: ANN001
    """Record every batch the VAE encoder is given."""
    seen: list[torch.Tensor] = []
    vae = pipe.components.vae
    encode = vae.encode

    def spy(pixels: torch.Tensor, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        seen.append(pixels.detach().float().cpu().clone())
        return encode(pixels, *args, **kwargs)

    monkeypatch.setattr(vae, "encode", spy)
    return seen


def _as_pixels(batch: torch.Tensor) -> list[np.ndarray]:
    """[-1, 1] NCHW back to uint8 HWC images (exact for 8-bit inputs)."""
    return [np.round((t.clamp(-1, 1).numpy().transpose(1, 2, 0) + 1.0) * 127.5).astype(np.uint8) for t in batch]


def _expected_tensor(image: Image.Image) -> torch.Tensor:
    """The VAE's input convention written out: 8-bit RGB to [-1, 1], channels first."""
    arr = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(2.0 * arr - 1.0).permute(2, 0, 1)


def _prepare(pipe, monkeypatch, person, garment, mask, resolution, fit):  # noqa: ANN001, ANN202
    """(person, masked person, garment) as the VAE encoder received them."""
    seen = _vae_inputs(pipe, monkeypatch)
    resolution, fit = parse_resolution(resolution), FitMode.parse(fit)  # the typed values the stages take
    prepared = pipe.prepare_person(person, Category.UPPER, mask=mask, resolution=resolution, fit=fit)
    pipe.prepare_garment(garment, Category.UPPER, resolution=resolution, fit=fit)
    images = [img for batch in seen for img in _as_pixels(batch)]
    assert len(images) == 3
    masked, person_px, garment_px = images
    return person_px, masked, garment_px, prepared


def _gray_where(person: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where((mask >= 127)[..., None], np.uint8(127), person)


@pytest.mark.parametrize("fit", ["pad", "crop", "stretch"])
def test_native_size_reaches_the_vae_untouched(pipe_hd, monkeypatch, fit) -> None:  # noqa: ANN001
    person = _checkerboard(384, 512)
    garment = _stripes(384, 512, seed=1)
    mask = Image.new("L", (384, 512), 0)
    mask.paste(255, (100, 150, 300, 400))
    # the pattern is discriminating: going through 768x1024 first (two resamples) changes it
    assert not np.array_equal(np.asarray(person.resize((768, 1024)).resize((384, 512))), np.asarray(person))
    assert not np.array_equal(np.asarray(garment.resize((768, 1024)).resize((384, 512))), np.asarray(garment))

    person_px, masked, garment_px, prepared = _prepare(pipe_hd, monkeypatch, person, garment, mask, (384, 512), fit)
    assert np.array_equal(person_px, np.asarray(person))
    assert np.array_equal(garment_px, np.asarray(garment))
    assert np.array_equal(masked, _gray_where(np.asarray(person), np.asarray(mask)))
    assert np.array_equal(np.asarray(prepared.mask), np.asarray(mask))


def test_vae_tensor_is_the_plain_conversion(pipe_hd, monkeypatch) -> None:  # noqa: ANN001
    person = _checkerboard(384, 512)
    seen = _vae_inputs(pipe_hd, monkeypatch)
    pipe_hd.prepare_garment(person, Category.UPPER, resolution=parse_resolution("384x512"))
    assert torch.allclose(seen[0][0], _expected_tensor(person), atol=1e-6, rtol=0)


def _pad_expected(src: Image.Image, size: tuple[int, int]) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """The content of a pad framing, one resize of the whole source, and where it sits (centred)."""
    width, height = size
    scale = min(width / src.width, height / src.height)
    content = (max(1, round(src.width * scale)), max(1, round(src.height * scale)))
    left, top = (width - content[0]) // 2, (height - content[1]) // 2
    return np.asarray(src.resize(content)), (left, top, left + content[0], top + content[1])


def _crop_box(src: Image.Image, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """The centred region of the source with the target's aspect (what a crop framing keeps)."""
    width, height = size
    scale = max(width / src.width, height / src.height)
    crop_w, crop_h = min(src.width, round(width / scale)), min(src.height, round(height / scale))
    left, top = (src.width - crop_w) // 2, (src.height - crop_h) // 2
    return (left, top, left + crop_w, top + crop_h)


SOURCES = [(192, 256), (600, 300), (250, 700), (501, 667)]
CASES = [(src, (384, 512)) for src in SOURCES] + [((600, 300), (768, 1024))]  # one at the large size (slow VAE)


@pytest.mark.parametrize("fit", ["pad", "crop", "stretch"])
@pytest.mark.parametrize(("src_size", "resolution"), CASES, ids=[f"{s[0]}x{s[1]}-at-{r[0]}x{r[1]}" for s, r in CASES])
def test_other_sizes_are_one_resize(pipe_hd, monkeypatch, fit, src_size, resolution) -> None:  # noqa: ANN001
    """At 768x1024 this pins today's framing (already one resize); at 384x512 it is the fix."""
    person = _stripes(*src_size, seed=2)
    garment = _checkerboard(*src_size)
    mask = Image.new("L", src_size, 0)
    mask.paste(255, (src_size[0] // 4, src_size[1] // 4, src_size[0] // 2, src_size[1] // 2))
    person_px, masked, garment_px, prepared = _prepare(pipe_hd, monkeypatch, person, garment, mask, resolution, fit)

    for src, got in ((person, person_px), (garment, garment_px)):
        assert got.shape == (resolution[1], resolution[0], 3)
        if fit == "stretch":
            assert np.array_equal(got, np.asarray(src.resize(resolution)))
        elif fit == "crop":
            assert np.array_equal(got, np.asarray(src.resize(resolution, box=_crop_box(src, resolution))))
        else:
            content, (left, top, right, bottom) = _pad_expected(src, resolution)
            assert np.array_equal(got[top:bottom, left:right], content)
            outside = np.ones(got.shape[:2], dtype=bool)
            outside[top:bottom, left:right] = False
            if outside.any():  # the padding is flat on each side
                assert len(np.unique(got[outside].reshape(-1, 3), axis=0)) <= 2
    # the user mask is framed once too (NEAREST), and the masked person is built from that
    if fit == "stretch":
        want_mask = np.asarray(mask.resize(resolution, Image.NEAREST))
    elif fit == "crop":
        want_mask = np.asarray(mask.resize(resolution, Image.NEAREST, box=_crop_box(mask, resolution)))
    else:
        want_mask = np.zeros((resolution[1], resolution[0]), dtype=np.uint8)
        content, (left, top, right, bottom) = _pad_expected(mask, resolution)
        small = mask.resize((right - left, bottom - top), Image.NEAREST)
        want_mask[top:bottom, left:right] = np.asarray(small)
    assert np.array_equal(np.asarray(prepared.mask), want_mask)
    assert np.array_equal(masked, _gray_where(person_px, want_mask))


def test_the_double_resample_would_be_caught() -> None:
    """The reference above is sensitive: a detour through 768x1024 differs from one resize at 384x512."""
    src = _stripes(192, 256, seed=2)
    once = np.asarray(src.resize((384, 512)))
    twice = np.asarray(src.resize((768, 1024)).resize((384, 512)))
    assert not np.array_equal(once, twice)


class _FakePose:
    def __init__(self) -> None:
        self.seen: list[Image.Image] = []

    def __call__(self, image: Image.Image) -> np.ndarray:
        self.seen.append(image.copy())
        return np.zeros((18, 2))


class _FakeParser:
    """Upper clothes in a block of the 384x512 frame."""

    def __init__(self) -> None:
        self.seen: list[Image.Image] = []

    def __call__(self, image: Image.Image) -> np.ndarray:
        self.seen.append(image.copy())
        labels = np.zeros((512, 384), dtype=np.uint8)
        labels[150:330, 110:270] = 4
        return labels


@pytest.mark.parametrize("resolution", [(384, 512), (768, 1024)])
def test_pose_and_parsing_see_the_384x512_view(pipe_hd, monkeypatch, resolution) -> None:  # noqa: ANN001
    pose, parser = _FakePose(), _FakeParser()
    monkeypatch.setattr(pipe_hd, "_preprocessor", Preprocessor(pose, parser))
    source = _checkerboard(*resolution)
    prepared = pipe_hd.prepare_person(source, Category.UPPER, resolution=parse_resolution(resolution))
    # what the original feeds them: the framed person at 384x512 (itself at 384x512, one resize at 768x1024)
    want = np.asarray(source.resize((384, 512)))
    for seen in (pose.seen, parser.seen):
        assert len(seen) == 1 and np.array_equal(np.asarray(seen[0]), want)
    # the mask is made at 384x512 and comes out at the working resolution by NEAREST
    small = np.zeros((512, 384), dtype=bool)
    small[150:330, 110:270] = True
    mask = np.asarray(prepared.mask) > 0
    assert mask.shape == (resolution[1], resolution[0])
    scale = resolution[0] // 384
    assert mask[::scale, ::scale][small].all()
    assert np.array_equal(mask, np.asarray(Image.fromarray(mask[::scale, ::scale]).resize(resolution, Image.NEAREST)))


@pytest.mark.parametrize("resolution", [(384, 512), (768, 1024)])
def test_padding_is_cut_away_without_a_resample(pipe_hd, monkeypatch, resolution) -> None:  # noqa: ANN001
    decoded: list[Image.Image] = []
    decode = pipe_hd._decode
    monkeypatch.setattr(pipe_hd, "_decode", lambda lat, prog: (decoded.extend(imgs := decode(lat, prog)), imgs)[1])
    wide = _stripes(900, 600, seed=3)
    result = pipe_hd(wide, _checkerboard(300, 400), "upper", mask=Image.new("L", (900, 600), 255), steps=1,
                     resolution=resolution, fit="pad")
    width, height = resolution
    content_h = round(600 * width / 900)
    top = (height - content_h) // 2
    assert np.array_equal(np.asarray(result.images[0]), np.asarray(decoded[0])[top:top + content_h])


def test_restore_framing_keep_scale_only_crops() -> None:
    info = FitInfo("pad", (900, 600), (384, 512), (0, 128, 384, 384))
    out = _checkerboard(384, 512)
    kept = restore_framing(out, info, keep_scale=True)
    assert np.array_equal(np.asarray(kept), np.asarray(out)[128:384])
    half = restore_framing(out.resize((192, 256), Image.NEAREST), info, keep_scale=True)
    assert half.size == (192, 128)
    for mode in ("crop", "stretch"):
        assert restore_framing(out, FitInfo(mode, (900, 600), (384, 512), (0, 0, 384, 512)), keep_scale=True) is out
