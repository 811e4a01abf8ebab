"""`ootd comfyui install COMFYUI_DIR` / `uninstall`: the node pack in ComfyUI's custom_nodes folder.

The pack ComfyUI loads is a folder `custom_nodes/ootd` holding a shim (`__init__.py`, a few lines that import the
nodes from the ootd package installed in ComfyUI's Python) and the example workflows (`example_workflows/`, which
ComfyUI lists among its templates; their API format under `example_workflows/api/`). Nothing of ootd's code is
copied: upgrading ootd upgrades the nodes (run `install` again to refresh the examples).

The folder is built beside ComfyUI and renamed into place, so ComfyUI never finds half a pack; a folder named
`ootd` that this command did not write is left alone. Nothing here imports ComfyUI.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ootd.errors import OutputError, UsageError, printable
from ootd.imaging.atomic import write_bytes_atomic

PACK = "ootd"
MARKER = "# written by `ootd comfyui install`"
SHIM = f'''"""ootd's try-on nodes for ComfyUI. The nodes are the ootd package installed in the Python that runs ComfyUI
(ootd/comfyui/nodes.py); this folder only points ComfyUI at them. Remove it with `ootd comfyui uninstall`."""
{MARKER}

import sys

try:
    from ootd.comfyui.nodes import comfy_entrypoint  # noqa: F401 - what ComfyUI calls
except ModuleNotFoundError as exc:
    if exc.name not in ("ootd", "ootd.comfyui"):
        raise
    raise ImportError(
        f"ootd's nodes need the ootd package in the Python that runs ComfyUI ({{sys.executable}}): install it "
        f"there from a checkout of ootd (`{{sys.executable}} -m pip install -e PATH_TO_OOTD`)"
    ) from None
'''
EXAMPLES = Path(__file__).with_name("example_workflows")
INPUTS = Path(__file__).with_name("example_inputs")  # the repository's examples/ (a link in the source tree)
INPUT_PREFIX = "ootd_"  # the example workflows' LoadImage files: ootd_person.png, ...


@dataclass(frozen=True)
class Installed:
    """What `install` did, and whether the Python ComfyUI will run with can import ootd."""

    folder: Path
    workflows: list[str]
    inputs: list[Path]  # example pictures written into ComfyUI's input folder (those already there are kept)
    python: Path | None  # the Python found beside ComfyUI (None: none found, this one assumed)
    python_has_ootd: bool | None  # None: not checked (no Python found beside ComfyUI)


def check_comfyui(root: Path) -> Path:
    """`root` as a ComfyUI folder (its main.py and custom_nodes/), else a one-line usage error."""
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise UsageError(f"{printable(root)} is not a folder: give the ComfyUI folder (the one with main.py)")
    if not (root / "main.py").is_file() or not (root / "custom_nodes").is_dir():
        raise UsageError(f"{printable(root)} is not a ComfyUI folder (no main.py and custom_nodes/ in it): give the "
                         "folder of a ComfyUI checkout, e.g. ~/ComfyUI")
    return root


def is_ours(folder: Path) -> bool:
    shim = folder / "__init__.py"
    try:
        return shim.is_file() and MARKER in shim.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def workflow_files() -> list[Path]:
    """The example workflows shipped with the package (UI format; API format under api/)."""
    return sorted(EXAMPLES.glob("*.json")) + sorted((EXAMPLES / "api").glob("*.json"))


def install(comfyui: Path) -> Installed:
    """Write (or rewrite) the pack into `comfyui`/custom_nodes/ootd."""
    root = check_comfyui(comfyui)
    target = root / "custom_nodes" / PACK
    if target.exists() and not is_ours(target):
        raise OutputError(f"{printable(target)} exists and was not written by `ootd comfyui install`: move it away "
                          "first (another pack of that name?)")
    staging = root / f".ootd-install-{secrets.token_hex(6)}"
    try:
        (staging / "example_workflows" / "api").mkdir(parents=True)
        (staging / "__init__.py").write_text(SHIM, encoding="utf-8")
        names = []
        for source in workflow_files():
            relative = source.relative_to(EXAMPLES)
            shutil.copyfile(source, staging / "example_workflows" / relative)
            names.append(str(relative))
        _replace(staging, target)
    except OSError as exc:
        raise OutputError(f"cannot write {printable(target)}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    inputs = example_inputs(root / "input")
    python = comfyui_python(root)
    return Installed(target, names, inputs, python, python_imports_ootd(python) if python is not None else None)


def example_inputs(folder: Path) -> list[Path]:
    """The example workflows' pictures (`ootd_person.png`, ...) in ComfyUI's input folder; a file of that name
    already there is left as it is. The ones written."""
    written = []
    folder.mkdir(parents=True, exist_ok=True)
    for source in sorted(INPUTS.glob("*.png")):
        target = folder / f"{INPUT_PREFIX}{source.name}"
        if not target.exists():
            write_bytes_atomic(target, source.read_bytes())
            written.append(target)
    return written


def _replace(staging: Path, target: Path) -> None:
    """Put `staging` where `target` is, the old pack (ours) moved aside first and removed after."""
    old = None
    if target.exists():
        old = target.with_name(f".{PACK}-old-{secrets.token_hex(6)}")
        os.replace(target, old)
    try:
        os.replace(staging, target)
    except OSError:
        if old is not None:
            os.replace(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def uninstall(comfyui: Path) -> Path | None:
    """Remove the pack (and the example pictures install put in ComfyUI's input folder, unless they were changed);
    the folder removed, or None when it was not there."""
    root = check_comfyui(comfyui)
    target = root / "custom_nodes" / PACK
    if not target.exists():
        return None
    if not is_ours(target):
        raise OutputError(f"{printable(target)} was not written by `ootd comfyui install`: left as it is")
    aside = target.with_name(f".{PACK}-old-{secrets.token_hex(6)}")
    os.replace(target, aside)  # gone from ComfyUI's view at once, whatever stops the removal
    shutil.rmtree(aside, ignore_errors=True)
    for source in INPUTS.glob("*.png"):  # the example pictures, unless changed since
        copy = root / "input" / f"{INPUT_PREFIX}{source.name}"
        if copy.is_file() and copy.read_bytes() == source.read_bytes():
            copy.unlink()
    return target


def comfyui_python(root: Path) -> Path | None:
    """The Python ComfyUI is likely run with: a virtual environment in its folder (venv/, .venv/), or the
    portable Windows build's python_embeded beside it; None when there is none (it then runs with whatever
    Python starts main.py)."""
    names = ("Scripts/python.exe", "bin/python") if sys.platform == "win32" else ("bin/python",)
    candidates = [root / env / name for env in ("venv", ".venv") for name in names]
    candidates.append(root.parent / "python_embeded" / "python.exe")
    return next((path for path in candidates if path.is_file()), None)


def python_imports_ootd(python: Path) -> bool:
    """Whether `python` can import ootd's nodes' dependencies (ootd itself)."""
    try:
        done = subprocess.run([str(python), "-c", "import ootd.comfyui.backend"], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
