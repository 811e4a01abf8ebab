"""`ootd comfyui install|uninstall COMFYUI_DIR` on a ComfyUI-shaped folder: the shim and the example workflows in
custom_nodes/ootd, the example pictures in input/, reinstalling over its own pack, never over another's, the
Python it expects ComfyUI to run with, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ootd.comfyui.install import INPUT_PREFIX, MARKER, PACK, install, uninstall
from ootd.errors import OutputError, UsageError
from tests.helpers import EXAMPLES, REPO
from tests.helpers.cli import assert_one_line_error, invoke

WORKFLOWS = {"tryon.json", "outfit.json", "mask_editing.json", "lora.json"}


@pytest.fixture
def comfyui(tmp_path: Path) -> Path:
    root = tmp_path / "ComfyUI"
    (root / "custom_nodes").mkdir(parents=True)
    (root / "input").mkdir()
    (root / "main.py").write_text("# ComfyUI\n")
    return root


def test_install_writes_the_shim_the_workflows_and_the_example_pictures(comfyui: Path) -> None:
    done = install(comfyui)
    pack = comfyui / "custom_nodes" / PACK
    assert done.folder == pack.resolve()
    assert MARKER in (pack / "__init__.py").read_text()
    assert {p.name for p in (pack / "example_workflows").glob("*.json")} == WORKFLOWS
    assert {p.name for p in (pack / "example_workflows" / "api").glob("*.json")} == WORKFLOWS
    for workflow in (pack / "example_workflows").rglob("*.json"):
        json.loads(workflow.read_text())
    pictures = {p.name for p in EXAMPLES.glob("*.png")}
    assert {p.name for p in done.inputs} == {INPUT_PREFIX + name for name in pictures}
    assert done.python is None and done.python_has_ootd is None  # no venv beside this ComfyUI
    assert sorted(p.name for p in comfyui.iterdir() if p.name.startswith(".")) == []  # nothing left beside it


def test_install_again_replaces_its_own_pack_and_keeps_the_users_pictures(comfyui: Path) -> None:
    install(comfyui)
    stale = comfyui / "custom_nodes" / PACK / "example_workflows" / "old.json"
    stale.write_text("{}")
    edited = comfyui / "input" / f"{INPUT_PREFIX}person.png"
    edited.write_bytes(b"the user's own")
    done = install(comfyui)
    assert not stale.exists() and done.inputs == []
    assert edited.read_bytes() == b"the user's own"
    assert [p.name for p in (comfyui / "custom_nodes").iterdir()] == [PACK]


def test_install_never_replaces_another_pack_of_that_name(comfyui: Path) -> None:
    other = comfyui / "custom_nodes" / PACK
    other.mkdir()
    (other / "__init__.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    with pytest.raises(OutputError, match="was not written by `ootd comfyui install`"):
        install(comfyui)
    with pytest.raises(OutputError, match="left as it is"):
        uninstall(comfyui)
    assert (other / "__init__.py").read_text() == "NODE_CLASS_MAPPINGS = {}\n"


def test_uninstall_removes_the_pack_and_the_unchanged_pictures(comfyui: Path) -> None:
    install(comfyui)
    edited = comfyui / "input" / f"{INPUT_PREFIX}tshirt.png"
    edited.write_bytes(b"changed")
    assert uninstall(comfyui) == (comfyui / "custom_nodes" / PACK).resolve()
    assert list((comfyui / "custom_nodes").iterdir()) == []
    assert [p.name for p in (comfyui / "input").iterdir()] == [edited.name]
    assert uninstall(comfyui) is None


def test_a_folder_that_is_not_comfyui_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is not a ComfyUI folder"):
        install(tmp_path)
    with pytest.raises(UsageError, match="is not a folder"):
        uninstall(tmp_path / "nowhere")


def test_the_command_says_which_python_comfyui_needs(comfyui: Path) -> None:
    python = comfyui / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 1\n")  # a Python that cannot import ootd
    python.chmod(0o755)
    result = invoke("comfyui", "install", comfyui)
    assert result.exit_code == 0, result.output
    assert "installed ootd's nodes in" in result.output
    assert f"warning: ComfyUI's Python {python.resolve()} cannot import ootd; install it there: " \
           f"{python.resolve()} -m pip install -e {REPO}" in " ".join(result.output.split())
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    assert f"ComfyUI's Python {python.resolve()} has ootd" in invoke("comfyui", "install", comfyui).output
    result = invoke("comfyui", "uninstall", comfyui)
    assert result.exit_code == 0 and "removed" in result.output
    assert_one_line_error(invoke("comfyui", "install", comfyui / "nowhere"), 2, "is not a folder")


def test_the_shim_names_the_fix_when_comfyuis_python_lacks_ootd(comfyui: Path) -> None:
    install(comfyui)
    shim = comfyui / "custom_nodes" / PACK / "__init__.py"
    # -S -I: no site-packages, no PYTHONPATH: a Python without ootd
    done = subprocess.run([sys.executable, "-S", "-I", str(shim)], capture_output=True, text=True, cwd=comfyui)
    assert done.returncode == 1
    assert "ImportError: ootd's nodes need the ootd package in the Python that runs ComfyUI" in done.stderr
    assert f"{sys.executable} -m pip install -e PATH_TO_OOTD" in done.stderr
    assert REPO.exists()
