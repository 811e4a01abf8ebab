"""ootd's side of ComfyUI's model management (ootd/comfyui/host.py) against ComfyUI's own code
(comfy.model_management, comfy.model_patcher, in a ComfyUI process of its own, `--cpu`): ootd's models are listed
among ComfyUI's loaded models with their sizes; asking for room unloads ComfyUI's models (and ootd's) the way
ComfyUI makes room for its own; "unload models" releases every ootd model, however many, in one walk of ComfyUI's
list; a model ootd releases itself leaves the list."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.frontends.comfyui.conftest import comfyui_root
from tests.helpers import REPO

pytestmark = pytest.mark.comfyui

SCRIPT = r"""
import sys
sys.argv = ["main.py", "--cpu"]
sys.path.append(REPO)
import comfy.options
comfy.options.enable_args_parsing()  # as main.py does: --cpu read
import torch
import comfy.model_management as mm
import comfy.model_patcher
from ootd.comfyui.host import ComfyHost, Resident

def listed():
    return sorted(m.model.model.name if isinstance(m.model, Resident) else type(m.model.model).__name__
                  for m in mm.current_loaded_models)

theirs = comfy.model_patcher.ModelPatcher(torch.nn.Linear(64, 64), load_device=mm.get_torch_device(),
                                          offload_device=torch.device("cpu"))
mm.load_models_gpu([theirs])
host, released, held = ComfyHost(), [], {}

def hold(*names):
    # as ootd's shared models do: the only reference to each is theirs, dropped (and the host told) on release
    def release(name):
        released.append(name)
        host.drop(held.pop(name))
    for name in names:
        held[name] = host.hold(f"ootd {name}", 2**30, lambda name=name: release(name))

hold("hd", "dc")
print("listed", listed(), [m.model_memory() for m in mm.current_loaded_models if isinstance(m.model, Resident)])

full = mm.get_free_memory
mm.get_free_memory = lambda dev=None, torch_free_too=False: (0, 0) if torch_free_too else 0  # a full device
host.make_room(2**20)
mm.get_free_memory = full
print("after make_room", listed(), sorted(released))

released.clear()
hold("hd", "dc", "x")
mm.unload_all_models()  # ComfyUI's "unload models" (POST /free), walking its list while ootd lets go
print("after unload", listed(), sorted(released))

hold("again")
host.drop(held.pop("again"))  # ootd released it itself
print("after drop", listed(), "again" in released, held)
"""


def test_comfyuis_model_management_sees_makes_room_for_and_releases_ootds_models() -> None:
    root = comfyui_root()
    code = SCRIPT.replace("REPO)", f"{str(REPO)!r})")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(("listed", "after"))]
    assert lines == [
        "listed ['Linear', 'ootd dc', 'ootd hd'] [1073741824, 1073741824]",
        "after make_room [] ['dc', 'hd']",
        "after unload [] ['dc', 'hd', 'x']",
        "after drop [] False {}",
    ], done.stdout
