"""Checkpoint verification on small fake trees: every expected file, cheap loadability checks, fixes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ootd.settings import ModelType
from ootd.weights.verify import FileCheck, verify_checkpoints
from tests.helpers.trees import make_tree, write_safetensors, write_torch


def _by_path(checks: list[FileCheck], path: Path) -> FileCheck:
    matches = [c for c in checks if c.path == path]
    assert len(matches) == 1, (path, [c.path for c in checks])
    return matches[0]


def _bad(checks: list[FileCheck]) -> list[FileCheck]:
    return [c for c in checks if not c.ok]


def test_complete_tree_is_ok(tmp_path: Path) -> None:
    layout = make_tree(tmp_path)
    checks = verify_checkpoints(tmp_path, ("hd", "dc"))
    assert _bad(checks) == []
    assert len(checks) == 8 + 2 * 4 + 6
    assert all(c.present and c.size and c.problem is None and c.fix is None for c in checks)
    paths = {c.path for c in checks}
    assert layout.text_encoder / "pytorch_model.bin" in paths  # the released .bin is found
    assert layout.body_pose in paths and layout.parsing_lip in paths


def test_only_the_chosen_models_are_checked(tmp_path: Path) -> None:
    make_tree(tmp_path, models=("hd",))
    assert _bad(verify_checkpoints(tmp_path, ["hd"])) == []
    bad = _bad(verify_checkpoints(tmp_path, ["hd", "dc"]))
    assert bad and all("ootd_dc" in c.path.parts for c in bad)


def test_missing_file(tmp_path: Path) -> None:
    layout = make_tree(tmp_path)
    (layout.vae / "config.json").unlink()
    layout.body_pose.unlink()
    bad = _bad(verify_checkpoints(tmp_path))
    assert {c.path for c in bad} == {layout.vae / "config.json", layout.body_pose}
    check = _by_path(bad, layout.body_pose)
    assert not check.present and check.size is None and check.problem == "missing"
    assert f"ootd download --dest {tmp_path}" in check.fix
    assert (
        "levihsu/OOTDiffusion" in check.fix and "checkpoints/openpose/ckpts/body_pose_model.pth" in check.fix
    )


def test_missing_weights_lists_accepted_names(tmp_path: Path) -> None:
    layout = make_tree(tmp_path)
    (layout.clip / "model.safetensors").unlink()
    (bad,) = _bad(verify_checkpoints(tmp_path))
    assert bad.component == "CLIP image encoder weights" and not bad.present
    assert "model.safetensors" in bad.problem and "pytorch_model.bin" in bad.problem
    assert "openai/clip-vit-large-patch14" in bad.fix


def test_weight_variants_are_accepted(tmp_path: Path) -> None:
    layout = make_tree(tmp_path, models=("hd",))
    folder = layout.unet_vton(ModelType.HD)
    (folder / "diffusion_pytorch_model.safetensors").unlink()
    write_safetensors(folder / "diffusion_pytorch_model.fp16.safetensors")
    write_safetensors(layout.vae / "diffusion_pytorch_model.safetensors")  # preferred over the .bin
    checks = verify_checkpoints(tmp_path, ["hd"])
    assert _bad(checks) == []
    assert folder / "diffusion_pytorch_model.fp16.safetensors" in {c.path for c in checks}
    assert layout.vae / "diffusion_pytorch_model.safetensors" in {c.path for c in checks}


def test_truncated_safetensors(tmp_path: Path) -> None:
    layout = make_tree(tmp_path, models=("hd",))
    path = layout.unet_garm(ModelType.HD) / "diffusion_pytorch_model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    (bad,) = _bad(verify_checkpoints(tmp_path, ["hd"]))
    assert bad.path == path and bad.present and bad.size == len(data) - 1000
    assert "truncated" in bad.problem
    assert bad.fix.startswith("delete it and run `ootd download")


def test_truncated_torch_file(tmp_path: Path) -> None:
    layout = make_tree(tmp_path, models=("hd",))
    data = layout.body_pose.read_bytes()
    layout.body_pose.write_bytes(data[: len(data) // 2])
    (bad,) = _bad(verify_checkpoints(tmp_path, ["hd"]))
    assert bad.path == layout.body_pose and "state dict" in bad.problem


def test_legacy_torch_format_is_ok_and_non_tensors_are_not(tmp_path: Path) -> None:
    layout = make_tree(tmp_path, models=("hd",))
    write_torch(layout.body_pose, legacy=True)  # cannot be memory-mapped: falls back to a plain load
    assert _bad(verify_checkpoints(tmp_path, ["hd"])) == []
    torch.save({"weight": torch.zeros(2), "epoch": 3}, layout.text_encoder / "pytorch_model.bin")
    (bad,) = _bad(verify_checkpoints(tmp_path, ["hd"]))
    assert "not tensors" in bad.problem


def test_lfs_pointer_onnx(tmp_path: Path) -> None:
    layout = make_tree(tmp_path, models=("hd",))
    layout.parsing_atr.write_text(
        "version https://git-lfs.github.com/spec/v1\n"
        "oid sha256:4a5e1c7f0b2a9d3e6c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d\n"
        "size 266859305\n"
    )
    (bad,) = _bad(verify_checkpoints(tmp_path, ["hd"]))
    assert bad.path == layout.parsing_atr and "Git LFS pointer" in bad.problem
    assert "git lfs pull" in bad.fix and "checkpoints/humanparsing/parsing_atr.onnx" in bad.fix


def test_truncated_onnx(tmp_path: Path) -> None:
    layout = make_tree(tmp_path, models=("hd",))
    data = layout.parsing_lip.read_bytes()
    layout.parsing_lip.write_bytes(data[: len(data) // 2])
    (bad,) = _bad(verify_checkpoints(tmp_path, ["hd"]))
    assert bad.path == layout.parsing_lip and "not a valid ONNX model" in bad.problem


def test_bad_json(tmp_path: Path) -> None:
    layout = make_tree(tmp_path, models=("hd",))
    (layout.scheduler / "scheduler_config.json").write_text('{"num_train_timesteps": 1000,')
    (layout.clip / "preprocessor_config.json").write_text("[1, 2]")
    bad = _bad(verify_checkpoints(tmp_path, ["hd"]))
    assert [c.component for c in bad] == ["scheduler config", "CLIP image processor config"]
    assert "not valid JSON (line 1" in bad[0].problem and "expected an object" in bad[1].problem
    assert all(c.fix for c in bad)


def test_empty_file_and_presence_only_mode(tmp_path: Path) -> None:
    layout = make_tree(tmp_path, models=("hd",))
    layout.model_index.write_text("")
    (layout.vae / "config.json").write_text("not json")
    bad = _bad(verify_checkpoints(tmp_path, ["hd"], load=False))
    assert [(c.path, c.problem) for c in bad] == [(layout.model_index, "empty file")]


def test_unknown_model_type(tmp_path: Path) -> None:
    from ootd.errors import UsageError

    with pytest.raises(UsageError):
        verify_checkpoints(tmp_path, ["sdxl"])
