"""An installed wheel (not only an editable install) carries what ootd reads at run time: the device profiles."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # a copy of the sources, so that no build/ folder left in the tree by an earlier build can stand in
    source = out / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "checkpoints",
        ".tiny-checkpoints", "outputs", "images_output", ".comfyui"))
    # no build isolation: the environment's setuptools builds it, without the network
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(source)], capture_output=True, text=True)
    if proc.returncode != 0 and "No module named" in proc.stderr and "setuptools" in proc.stderr:
        pytest.skip("this environment has no setuptools to build a wheel with")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (path,) = out.glob("ootd-*.whl")
    return path


@pytest.mark.slow  # builds the wheel
def test_wheel_carries_every_device_profile(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.name for p in (REPO / "configs" / "profiles").glob("*.toml")}
    assert shipped and {f"ootd/hardware/profile_files/{name}" for name in shipped} <= names


@pytest.mark.slow  # builds and installs the wheel
def test_installed_wheel_finds_its_profiles(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import ootd.hardware.profiles as d; from ootd.hardware.device import DeviceInfo; "
            "from ootd.hardware.profiles import load_profile;"
            "print(d.__file__); print(d.PROFILES_DIR);"
            "print(load_profile(DeviceInfo(type='cpu')).name)")
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    module, profiles, name = proc.stdout.split()
    assert Path(module).is_relative_to(site)  # the installed copy, not the source tree
    assert Path(profiles) == site / "ootd" / "hardware" / "profile_files"
    assert name == "cpu"


def test_wheel_carries_the_serve_page(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    static = REPO / "ootd" / "serve" / "static"
    page = {f"ootd/serve/static/{p.relative_to(static).as_posix()}" for p in static.rglob("*") if p.is_file()}
    assert {"ootd/serve/static/index.html", "ootd/serve/static/examples/person.png"} <= page <= names
    every_package = {f"{p.relative_to(REPO).as_posix()}" for p in REPO.glob("ootd/**/__init__.py")}
    assert every_package <= names, sorted(every_package - names)  # the subpackages the command imports
    assert {"ootd/serve/app.py", "ootd/cli/serve.py", "ootd/app/tryon/job.py"} <= names


def test_wheel_carries_the_comfyui_pack(wheel: Path) -> None:
    """What `ootd comfyui install` copies from the installed package: the example workflows (both formats) and the
    pictures they load."""
    names = set(zipfile.ZipFile(wheel).namelist())
    pack = REPO / "ootd" / "comfyui"
    workflows = {f"ootd/comfyui/{p.relative_to(pack).as_posix()}" for p in (pack / "example_workflows").rglob("*.json")}
    pictures = {f"ootd/comfyui/example_inputs/{p.name}" for p in (REPO / "examples").glob("*.png")}
    assert len(workflows) == 8 and len(pictures) == 5
    assert workflows | pictures | {"ootd/comfyui/nodes.py", "ootd/comfyui/install.py"} <= names
