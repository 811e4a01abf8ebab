"""Hostile and damaged inputs end as one line and the right exit code, never as wrong pictures, a crash or a hang.

Each class of defect is checked through `ootd run` on a damaged copy of the tiny tree (the real loader, no
stand-ins) and, where it is cheaper, through the library call that owns the check.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from ootd.errors import CheckpointError, InputImageError, NumericalError, UsageError
from ootd.imaging.files import load_image
from ootd.settings import MAX_MASK_GROW, ModelType, check_mask_grow
from ootd.weights.integrity import require_finite_latents
from ootd.weights.layout import Layout
from ootd.weights.loading import load_components
from tests.helpers.cli import assert_one_line_error, invoke_bounded

FP32 = {k: torch.float32 for k in ("unet", "vae", "text_encoder", "image_encoder")}
HANG_LIMIT_S = 60  # a check that used to hang forever must answer well within this


@pytest.fixture
def tree(tmp_path: Path, tiny_tree: Path) -> Path:
    """A private copy of the tiny tree that a test may damage."""
    return Path(shutil.copytree(tiny_tree, tmp_path / "checkpoints"))


def run_args(images: dict[str, Path], checkpoints: Path, out: Path, **override: object) -> list[str]:
    options = {"--model": images["person"], "--cloth": images["tshirt"], "--mask": images["mask"]}
    options.update({key: value for key, value in override.items() if not key.startswith("_")})
    args = ["run", "--category", "upper", "--checkpoints", checkpoints, "-o", out, "--steps", "1",
            "--resolution", "384x512", "--seed", "3"]
    for key, value in options.items():
        args += [key, value]
    return [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in args]


def invoke(args: list[str], env: dict[str, str] | None = None):  # noqa: ANN201
    """`ootd ...` in a thread, so a hang fails the test instead of stalling the suite."""
    return invoke_bounded(*args, env=env, limit=HANG_LIMIT_S)


def no_pictures(out: Path) -> bool:
    return not out.exists() or not any(out.iterdir())


# -- 1. strict loading: every key of every component matched, both ways ------------------------------------


def _edit_bin(path: Path, edit) -> None:  # noqa: ANN001
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)


def _edit_safetensors(path: Path, edit) -> None:  # noqa: ANN001
    state = load_file(path)
    edit(state)
    save_file({k: v.contiguous() for k, v in state.items()}, path)


def _deeper_text_encoder(state: dict) -> None:
    """The weights of a text encoder with one more layer: another model, same config.json."""
    extra = 1 + max(int(k.split(".layers.")[1].split(".")[0]) for k in state if ".layers." in k)
    for key in [k for k in state if ".layers.0." in k]:
        state[key.replace(".layers.0.", f".layers.{extra}.")] = state[key].clone()


def _drop_first(prefix: str):  # noqa: ANN202
    return lambda state: state.pop(sorted(k for k in state if k.startswith(prefix))[0])


def _rename_all(state: dict) -> None:
    """A header that parses but names other tensors (a different model's naming)."""
    for key in list(state):
        state["model." + key] = state.pop(key)


STRICT_CASES = {
    "text encoder from another model": ("ootd/text_encoder/pytorch_model.bin", _edit_bin, _deeper_text_encoder,
                                        ["text encoder", "unexpected", "layers.2."]),
    "CLIP missing a key": ("clip-vit-large-patch14/model.safetensors", _edit_safetensors,
                           _drop_first("vision_model."), ["CLIP image encoder", "missing"]),
    "VAE missing a key": ("ootd/vae/diffusion_pytorch_model.bin", _edit_bin, _drop_first("decoder."),
                          ["VAE", "missing", "decoder."]),
    "UNet naming other tensors": ("ootd/ootd_hd/checkpoint-36000/unet_garm/diffusion_pytorch_model.safetensors",
                                  _edit_safetensors, _rename_all, ["garment UNet", "missing", "unexpected", "model."]),
}


@pytest.mark.parametrize("case", list(STRICT_CASES))
def test_loading_refuses_missing_or_unexpected_keys(tree: Path, case: str) -> None:
    relative, edit_file, edit, needles = STRICT_CASES[case]
    edit_file(tree / relative, edit)
    with pytest.raises(CheckpointError) as info:
        load_components(tree, "hd", FP32)
    message = str(info.value)
    assert "\n" not in message and str(tree / relative) in message and "replace it" in message
    for needle in needles:
        assert needle in message, message


def test_run_refuses_a_text_encoder_from_another_model(tree: Path, tmp_path: Path, example_images) -> None:  # noqa: ANN001
    weights = tree / "ootd/text_encoder/pytorch_model.bin"
    _edit_bin(weights, _deeper_text_encoder)
    out = tmp_path / "out"
    result = invoke(run_args(example_images, tree, out))
    assert_one_line_error(result, 1, str(weights), "unexpected")
    assert no_pictures(out)


# -- 2. non-finite weights and latents ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("relative", "edit_file", "what"),
    [
        ("ootd/vae/diffusion_pytorch_model.bin", _edit_bin, "VAE"),
        ("ootd/ootd_hd/checkpoint-36000/unet_vton/diffusion_pytorch_model.safetensors", _edit_safetensors,
         "try-on UNet"),
        ("clip-vit-large-patch14/model.safetensors", _edit_safetensors, "CLIP image encoder"),
    ],
)
def test_loading_refuses_nan_or_inf_weights(tree: Path, relative: str, edit_file, what: str) -> None:  # noqa: ANN001
    def poison(state: dict) -> None:
        key = sorted(k for k, v in state.items() if v.is_floating_point() and v.numel() > 1
                     and not k.startswith("text_"))[-1]
        state[key] = state[key].clone()
        state[key].view(-1)[0] = float("nan")
        state[key].view(-1)[-1] = float("inf")

    edit_file(tree / relative, poison)
    with pytest.raises(CheckpointError, match="NaN or infinite") as info:
        load_components(tree, "hd", FP32)
    assert what in str(info.value) and str(tree / relative) in str(info.value)


def test_huge_but_finite_weights_load() -> None:
    """The cheap sum-first check must not call an overflowing sum of finite values damage."""
    from ootd.weights.integrity import nonfinite_names

    big = torch.full((1000,), 3e38)
    assert nonfinite_names([("big", big)]) == []
    assert nonfinite_names([("nan", torch.tensor([1.0, float("nan")])), ("ints", torch.arange(3))]) == ["nan"]


def test_run_saves_nothing_when_denoising_overflows(tree: Path, tmp_path: Path, example_images) -> None:  # noqa: ANN001
    """Finite weights so large the try-on UNet's output overflows: one line, exit 1, no picture."""
    weights = Layout(tree).unet_vton(ModelType.HD) / "diffusion_pytorch_model.safetensors"
    _edit_safetensors(weights, lambda state: state.update({"conv_out.weight": torch.full_like(
        state["conv_out.weight"], 3e38)}))  # the largest float32 is 3.4e38
    out = tmp_path / "out"
    result = invoke(run_args(example_images, tree, out))
    assert_one_line_error(result, 1, "NaN or infinite", "nothing was saved")
    assert not list(out.glob("*.png")) and not list(out.glob(".*"))


def test_finite_latents_pass_and_fp16_overflow_names_the_fix() -> None:
    require_finite_latents(torch.zeros(1, 4, 8, 8))
    with pytest.raises(NumericalError, match="fp32"):
        require_finite_latents(torch.tensor([float("inf")], dtype=torch.float16), torch.float16)


# -- 3. configs that are not UTF-8 JSON ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "relative",
    ["ootd/model_index.json", "ootd/vae/config.json", "ootd/scheduler/scheduler_config.json",
     "clip-vit-large-patch14/config.json"],
)
def test_config_that_is_not_utf8_is_a_checkpoint_error(tree: Path, relative: str) -> None:
    path = tree / relative
    path.write_bytes(path.read_text().encode("utf-16"))  # what some editors save
    with pytest.raises(CheckpointError, match="not UTF-8") as info:
        load_components(tree, "hd", FP32)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_run_with_a_latin1_model_index(tree: Path, tmp_path: Path, example_images) -> None:  # noqa: ANN001
    index = tree / "ootd/model_index.json"
    index.write_bytes(index.read_bytes().replace(b'"OotdPipeline"', b'"OotdPipeline\xe9"'))
    result = invoke(run_args(example_images, tree, tmp_path / "out"))
    assert_one_line_error(result, 1, str(index), "not UTF-8")


# -- 4. --mask-grow bounded ---------------------------------------------------------------------------------


def test_mask_grow_bound() -> None:
    assert check_mask_grow(0) == 0 and check_mask_grow(MAX_MASK_GROW) == MAX_MASK_GROW
    for bad in (-1, MAX_MASK_GROW + 1, 20000, 100000):
        with pytest.raises(UsageError, match=f"0 to {MAX_MASK_GROW}"):
            check_mask_grow(bad)


def test_mask_grow_refused_where_masks_are_grown(pipe_hd, example_images) -> None:  # noqa: ANN001
    from preprocess.errors import UsageError as PreprocessUsageError
    from preprocess.masking import inpaint_mask

    with pytest.raises(PreprocessUsageError, match="mask grow must be 0 to 512"):
        inpaint_mask(np.zeros((512, 384), np.uint8), np.zeros((18, 2)), "upper_body", "hd", grow=100000)
    with pytest.raises(UsageError, match="^mask_grow must be"):  # the library's edge, in its keyword's name
        pipe_hd(example_images["person"], example_images["tshirt"], "upper", mask=example_images["mask"],
                mask_grow=20000)


@pytest.mark.parametrize("grow", ["20000", "100000"])
def test_run_mask_grow_too_large_is_a_usage_error(tiny_tree: Path, tmp_path: Path, example_images,  # noqa: ANN001
                                                  grow: str) -> None:
    out = tmp_path / "out"
    result = invoke(run_args(example_images, tiny_tree, out, **{"--mask-grow": grow}))
    assert_one_line_error(result, 2, "--mask-grow", grow)
    assert no_pictures(out)


# -- 5. odd input files: names that are not UTF-8, FIFOs ----------------------------------------------------


@pytest.mark.skipif(os.name != "posix", reason="byte file names are a POSIX thing")
def test_run_with_a_person_file_name_that_is_not_utf8(tiny_tree: Path, tmp_path: Path, example_images) -> None:  # noqa: ANN001
    person = os.path.join(os.fsencode(tmp_path), b"caf\xe9 person.png")  # Latin-1 name from an old archive
    shutil.copyfile(example_images["person"], person)
    out = tmp_path / "out"
    result = invoke(run_args(example_images, tiny_tree, out, **{"--model": person}))
    assert result.exit_code == 0, result.output
    (saved,) = out.glob("*.png")
    with Image.open(saved) as im:
        assert im.text["person"] == "caf\\xe9 person.png"  # the odd byte kept visible, as text


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
@pytest.mark.parametrize("role", ["--model", "--cloth", "--mask"])
def test_run_refuses_a_fifo_as_an_image(tiny_tree: Path, tmp_path: Path, example_images, role: str) -> None:  # noqa: ANN001
    fifo = tmp_path / "photo.png"
    os.mkfifo(fifo)
    result = invoke(run_args(example_images, tiny_tree, tmp_path / "out", **{role: fifo}))
    assert_one_line_error(result, 2, str(fifo), "FIFO", "not a regular file")


def test_load_image_refuses_devices_and_names_odd_bytes(tmp_path: Path) -> None:
    with pytest.raises(InputImageError, match="is a device, not a regular file"):
        load_image("/dev/zero", "person")  # would read forever
    missing = os.path.join(os.fsencode(tmp_path), b"\xff.png")
    with pytest.raises(InputImageError, match=r"\\xff\.png: file not found") as info:
        load_image(os.fsdecode(missing), "garment")
    str(info.value).encode("utf-8")  # printable as it is


# -- 6. device names ----------------------------------------------------------------------------------------


def test_run_unknown_device_is_a_usage_error(tiny_tree: Path, tmp_path: Path, example_images) -> None:  # noqa: ANN001
    result = invoke(run_args(example_images, tiny_tree, tmp_path / "out", **{"--device": "tpu"}))
    line = assert_one_line_error(result, 2, "unknown device 'tpu'", "cuda:N")
    assert "OOTD_DEVICE" not in line


@pytest.mark.parametrize("value", ["cuda:x", "meta", "CPU"])
def test_run_bad_ootd_device_names_the_variable(tiny_tree: Path, tmp_path: Path, example_images,  # noqa: ANN001
                                                value: str) -> None:
    result = invoke(run_args(example_images, tiny_tree, tmp_path / "out"), env={"OOTD_DEVICE": value})
    assert_one_line_error(result, 2, repr(value), "OOTD_DEVICE")


def test_device_words_still_accepted() -> None:
    from ootd.hardware.device import peek_device

    assert peek_device("cpu").type == "cpu" and peek_device(None) is not None and peek_device("auto") is not None
