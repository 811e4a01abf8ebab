"""Checkpoint download: which hub files, where they land, and the offline/unreachable errors (no network)."""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

import huggingface_hub
import huggingface_hub.constants
import pytest
from huggingface_hub.utils import filter_repo_objects

from ootd.errors import CheckpointError, UsageError
from ootd.settings import ModelType
from ootd.weights import download
from ootd.weights.download import (
    allow_patterns,
    download_checkpoints,
    layout_path_to_repo_path,
    repo_path_to_layout_path,
)
from ootd.weights.layout import CLIP_REPO, HUB_REPO, Layout

# The repos' file lists as published (ECOSYSTEM.md), plus the files we must NOT fetch.
OOTD_REPO_FILES = [
    ".gitattributes",
    "README.md",
    "run/run_ootd.py",
    "checkpoints/ootd/model_index.json",
    "checkpoints/ootd/scheduler/scheduler_config.json",
    "checkpoints/ootd/feature_extractor/preprocessor_config.json",
    "checkpoints/ootd/text_encoder/config.json",
    "checkpoints/ootd/text_encoder/pytorch_model.bin",
    "checkpoints/ootd/tokenizer/merges.txt",
    "checkpoints/ootd/tokenizer/special_tokens_map.json",
    "checkpoints/ootd/tokenizer/tokenizer_config.json",
    "checkpoints/ootd/tokenizer/vocab.json",
    "checkpoints/ootd/vae/config.json",
    "checkpoints/ootd/vae/diffusion_pytorch_model.bin",
    *[
        f"checkpoints/ootd/ootd_{m}/checkpoint-36000/{u}/{f}"
        for m in ("hd", "dc")
        for u in ("unet_garm", "unet_vton")
        for f in ("config.json", "diffusion_pytorch_model.safetensors")
    ],
    "checkpoints/humanparsing/parsing_atr.onnx",
    "checkpoints/humanparsing/parsing_lip.onnx",
    "checkpoints/humanparsing/exp-schp-201908261155-lip.pth",
    "checkpoints/humanparsing/exp-schp-201908301523-atr.pth",
    "checkpoints/openpose/ckpts/body_pose_model.pth",
]
CLIP_REPO_FILES = [
    ".gitattributes",
    "README.md",
    "config.json",
    "flax_model.msgpack",
    "merges.txt",
    "model.safetensors",
    "preprocessor_config.json",
    "pytorch_model.bin",
    "special_tokens_map.json",
    "tf_model.h5",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
]
REPO_FILES = {HUB_REPO: OOTD_REPO_FILES, CLIP_REPO: CLIP_REPO_FILES}


def _selected(repo: str, models: list[str]) -> set[str]:
    """What the hub client would download with our patterns (its own filter function)."""
    return set(filter_repo_objects(REPO_FILES[repo], allow_patterns=allow_patterns(models)[repo]))


@pytest.mark.parametrize("models", [["hd"], ["dc"], ["hd", "dc"]])
def test_allow_patterns_select_exactly_the_needed_files(models: list[str]) -> None:
    ootd = _selected(HUB_REPO, models)
    unets = {p for p in ootd if "/ootd_" in p}
    assert {p.split("/")[2] for p in unets} == {f"ootd_{m}" for m in models}
    assert len(unets) == 4 * len(models)
    assert not any(p.endswith(".pth") and "schp" in p for p in ootd)
    assert "checkpoints/openpose/ckpts/body_pose_model.pth" in ootd
    assert {"checkpoints/humanparsing/parsing_atr.onnx", "checkpoints/humanparsing/parsing_lip.onnx"} <= ootd
    assert "README.md" not in ootd and "run/run_ootd.py" not in ootd
    common = {p for p in OOTD_REPO_FILES if p.startswith("checkpoints/") and "/ootd_" not in p}
    common = {p for p in common if "schp" not in p}
    assert common <= ootd
    assert _selected(CLIP_REPO, models) == {
        "config.json",
        "merges.txt",
        "model.safetensors",
        "preprocessor_config.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.json",
    }


def test_patterns_are_full_repo_paths() -> None:
    patterns = allow_patterns(["hd"])[HUB_REPO]
    assert "checkpoints/humanparsing/*.onnx" in patterns
    assert all(p.startswith("checkpoints/") for p in patterns)
    assert not any(fnmatchcase("humanparsing/parsing_atr.onnx", p) for p in patterns)


def test_bad_model_type() -> None:
    with pytest.raises(UsageError):
        allow_patterns(["xl"])
    assert allow_patterns([ModelType.HD]) == allow_patterns(["hd"])


def test_layout_mapping() -> None:
    root = Path("/ck")
    layout = Layout(root)
    cases = {
        (HUB_REPO, "checkpoints/ootd/model_index.json"): layout.model_index,
        (HUB_REPO, "checkpoints/ootd/ootd_dc/checkpoint-36000/unet_vton/config.json"): layout.unet_vton(
            ModelType.DC
        )
        / "config.json",
        (HUB_REPO, "checkpoints/humanparsing/parsing_lip.onnx"): layout.parsing_lip,
        (HUB_REPO, "checkpoints/openpose/ckpts/body_pose_model.pth"): layout.body_pose,
        (CLIP_REPO, "model.safetensors"): layout.clip / "model.safetensors",
    }
    for (repo, repo_path), expected in cases.items():
        rel = repo_path_to_layout_path(repo, repo_path)
        assert root / rel == expected
        assert layout_path_to_repo_path(rel) == (repo, repo_path)
    assert repo_path_to_layout_path(HUB_REPO, "README.md") is None
    assert repo_path_to_layout_path(HUB_REPO, "checkpoints/../etc/passwd") is None
    assert repo_path_to_layout_path("someone/else", "x.json") is None
    assert layout_path_to_repo_path(PurePosixPath("outputs/a.png")) is None


# ------------------------------------------------------------------------------------------- offline


def test_offline_gives_one_line_checkpoint_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    called = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: called.append(1))
    with pytest.raises(CheckpointError) as info:
        download_checkpoints(tmp_path / "ck", ["hd"])
    message = str(info.value)
    assert "\n" not in message
    assert "offline" in message and HUB_REPO in message and str(tmp_path / "ck") in message
    assert "ootd download --list" in message and len(message) < 300  # the file list is one command away
    assert not called
    assert not (tmp_path / "ck").exists()  # no empty folder left behind


def test_offline_through_the_real_hub_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip our own pre-check: the hub client's offline refusal must still become a CheckpointError."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(download, "_offline", lambda: False)
    with pytest.raises(CheckpointError, match=rf"cannot download {HUB_REPO}: offline mode is on") as info:
        download_checkpoints(tmp_path / "ck", ["hd"], progress=False)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("error", [ConnectionError("Network is unreachable"), TimeoutError("timed out")])
def test_unreachable_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    with pytest.raises(CheckpointError, match="could not be reached") as info:
        download_checkpoints(tmp_path / "ck", ["dc"])
    assert "ootd download --list" in str(info.value) and len(str(info.value)) < 400


def test_programming_errors_are_not_hidden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def bug(*args, **kwargs):
        raise KeyError("bug")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", bug)
    with pytest.raises(KeyError):
        download_checkpoints(tmp_path / "ck", ["dc"])


# ------------------------------------------------------------------------------------------- mocked hub


class FakeHub:
    """snapshot_download stand-in: writes the files the patterns select into local_dir, like the client."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(
        self, repo_id, *, allow_patterns=None, ignore_patterns=None, local_dir=None, revision=None, **kw
    ):
        self.calls.append(
            {"repo": repo_id, "allow": allow_patterns, "ignore": ignore_patterns, "revision": revision}
        )
        local_dir = Path(local_dir)
        (local_dir / ".cache" / "huggingface").mkdir(parents=True, exist_ok=True)
        (local_dir / ".cache" / "huggingface" / ".gitignore").write_text("*")
        chosen = filter_repo_objects(
            REPO_FILES[repo_id], allow_patterns=allow_patterns, ignore_patterns=ignore_patterns
        )
        for repo_path in chosen:
            target = local_dir / repo_path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f"{repo_id}:{repo_path}")
        return str(local_dir)


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub = FakeHub()
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    return hub


def test_download_places_files_in_the_layout(tmp_path: Path, fake_hub: FakeHub) -> None:
    dest = tmp_path / "checkpoints"
    files = download_checkpoints(dest, ["hd"], revision="a" * 40, progress=False)
    layout = Layout(dest)
    assert layout.model_index.read_text() == f"{HUB_REPO}:checkpoints/ootd/model_index.json"
    assert (layout.unet_garm(ModelType.HD) / "diffusion_pytorch_model.safetensors").is_file()
    assert not layout.unet_garm(ModelType.DC).exists()
    assert layout.parsing_atr.is_file() and layout.parsing_lip.is_file() and layout.body_pose.is_file()
    assert not list((dest / "humanparsing").glob("*.pth"))
    assert (layout.clip / "model.safetensors").read_text() == f"{CLIP_REPO}:model.safetensors"
    assert not (layout.clip / "pytorch_model.bin").exists()
    assert not (dest / "checkpoints").exists() and not (dest / ".download").exists()
    assert not list(dest.rglob(".cache"))
    assert sorted(files) == files and layout.model_index in files and len(files) == len(set(files))
    assert all(f.is_file() for f in files)
    assert [c["revision"] for c in fake_hub.calls] == ["a" * 40, None]


def test_second_download_fetches_only_what_is_missing(tmp_path: Path, fake_hub: FakeHub) -> None:
    dest = tmp_path / "checkpoints"
    download_checkpoints(dest, ["hd"], progress=False)
    fake_hub.calls.clear()
    assert download_checkpoints(dest, ["hd"], progress=False)  # everything present: no hub call
    assert fake_hub.calls == []

    layout = Layout(dest)
    (layout.vae / "diffusion_pytorch_model.bin").unlink()
    download_checkpoints(dest, ["hd", "dc"], progress=False)
    assert [c["repo"] for c in fake_hub.calls] == [HUB_REPO]  # CLIP complete: not asked again
    ignored = fake_hub.calls[0]["ignore"]
    assert "checkpoints/ootd/model_index.json" in ignored
    assert "checkpoints/ootd/vae/diffusion_pytorch_model.bin" not in ignored
    assert (layout.vae / "diffusion_pytorch_model.bin").is_file()
    assert (layout.unet_vton(ModelType.DC) / "config.json").is_file()


def test_incomplete_download_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: str(k["local_dir"]))
    with pytest.raises(CheckpointError, match="incomplete: missing"):
        download_checkpoints(tmp_path / "ck", ["hd"])
