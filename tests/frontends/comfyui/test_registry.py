"""pyproject.toml's section for the Comfy registry, read by ComfyUI's own parser of a node pack's pyproject.toml
(comfy_config, which the registry's tooling mirrors): the accelerators the nodes run on all survive (one unknown
classifier would void the list), the operating systems, the ComfyUI it needs, the name it is shown by."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.frontends.comfyui.conftest import comfyui_root
from tests.helpers import REPO

pytestmark = pytest.mark.comfyui

READ = """
import json, sys
from comfy_config import config_parser
config = config_parser.extract_node_configuration(sys.argv[1])
print(json.dumps({"accelerators": config.project.supported_accelerators, "os": config.project.supported_os,
                  "comfyui": config.project.supported_comfyui_version, "name": config.project.name,
                  "shown": config.tool_comfy.display_name, "publisher": config.tool_comfy.publisher_id}))
"""


def test_comfyuis_parser_reads_the_registry_section() -> None:
    root = comfyui_root()
    done = subprocess.run([sys.executable, "-c", READ, str(REPO)], capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr
    read = json.loads(done.stdout.splitlines()[-1])
    assert set(read["accelerators"]) == {"GPU :: NVIDIA CUDA", "GPU :: AMD ROCm", "GPU :: Apple Metal"}
    assert read["os"] == ["OS Independent"]
    assert read["comfyui"] == ">=0.8.0" and read["name"] == "ootd"
    assert "ROCm" in read["shown"] and "CPU" in read["shown"]
