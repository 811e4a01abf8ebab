"""The session's ComfyUI (tests/helpers/comfyui.py), for the tests marked `comfyui`: started once, used by every
such test, stopped at the end. Without $OOTD_COMFYUI_DIR (set by scripts/test_comfyui.sh) they are skipped; with
it, a ComfyUI that does not start or lacks ootd's nodes fails them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.comfyui import COMFYUI_ENV, Comfy, prepare_work, start_comfyui, stop_comfyui


def comfyui_root() -> Path:
    root = os.environ.get(COMFYUI_ENV)
    if not root:
        pytest.skip(f"no ComfyUI to test against: scripts/test_comfyui.sh installs one and sets ${COMFYUI_ENV}")
    from ootd.comfyui.install import PACK, is_ours

    path = Path(root)
    assert is_ours(path / "custom_nodes" / PACK), f"ootd's nodes are not installed in {path}: ootd comfyui install"
    return path


@pytest.fixture(scope="session")
def adapter(tiny_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained stand-in adapter of the tiny hd model (random B: it changes the pictures at scale 1)."""
    from tests.helpers.training import write_adapter

    return write_adapter(tiny_tree, tmp_path_factory.mktemp("adapter") / "ootd_adapter.safetensors", trained=True)


@pytest.fixture(scope="session")
def comfy(tiny_tree: Path, adapter: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Comfy]:
    root = comfyui_root()
    work = tmp_path_factory.mktemp("comfyui")
    server = start_comfyui(root, work, prepare_work(work, tiny_tree, adapter))
    server.listen()
    try:
        yield server
    finally:
        stop_comfyui(server)
