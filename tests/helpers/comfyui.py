"""A real ComfyUI for tests: started headless on the CPU on 127.0.0.1 from the install scripts/test_comfyui.sh made
($OOTD_COMFYUI_DIR, its Python: the one running the tests), with every folder it writes in a temporary one, the
tiny checkpoints as its `ootd` models (through an extra_model_paths.yaml), an adapter in its loras, and a synthetic
person's pose + parsing (a test pack beside ootd's: the tiny pose network finds nobody). Prompts go through its
HTTP API; progress and interruptions are heard on its websocket."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers import REPO

COMFYUI_ENV = "OOTD_COMFYUI_DIR"
WORKFLOWS = REPO / "ootd" / "comfyui" / "example_workflows"
# the test pack: pose + parsing of a synthetic person for every model ootd loads in that ComfyUI
# (loaded by its path: ComfyUI's own `tests` package comes first on its sys.path)
SYNTHETIC = REPO / "tests" / "helpers" / "synthetic.py"
TEST_PACK = f'''import importlib.util

from ootd.comfyui import backend

spec = importlib.util.spec_from_file_location("ootd_tests_synthetic", {str(SYNTHETIC)!r})
synthetic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(synthetic)
backend.use_preprocessor(synthetic.synthetic_preprocessor)
NODE_CLASS_MAPPINGS = {{}}
'''
FAST = {"steps": 2, "resolution": "384x512"}  # what every test prompt runs at on the tiny checkpoints


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def api_workflow(name: str) -> dict[str, Any]:
    return json.loads((WORKFLOWS / "api" / f"{name}.json").read_text())


def node_of(prompt: dict[str, Any], class_type: str) -> dict[str, Any]:
    """The inputs of the one node of `class_type` in an API-format prompt."""
    (found,) = [node["inputs"] for node in prompt.values() if node["class_type"] == class_type]
    return found


def for_tests(prompt: dict[str, Any], **tryon: Any) -> dict[str, Any]:
    """An example workflow on the tiny checkpoints, at the tests' size and steps, with `tryon` settings."""
    prompt = copy.deepcopy(prompt)
    node_of(prompt, "OotdLoader").update(checkpoints="tiny", precision="fp32")
    for node in prompt.values():
        if node["class_type"] in ("OotdTryOn", "OotdMask"):
            node["inputs"].update({k: v for k, v in FAST.items() if node["class_type"] == "OotdTryOn" or k != "steps"})
            if node["class_type"] == "OotdTryOn":
                node["inputs"].update(tryon)
    return prompt


@dataclass
class Finished:
    """A prompt's end as /history tells it: its status, messages, outputs, and the seconds it took (from the
    server's own timestamps of its start and end)."""

    prompt_id: str
    status: str
    messages: list[tuple[str, dict[str, Any]]]
    outputs: dict[str, Any]

    def message(self, kind: str) -> dict[str, Any] | None:
        return next((data for name, data in self.messages if name == kind), None)

    @property
    def seconds(self) -> float:
        stamps = {name: data["timestamp"] for name, data in self.messages if "timestamp" in data}
        end = stamps.get("execution_success") or stamps.get("execution_error") or stamps.get("execution_interrupted")
        return (end - stamps["execution_start"]) / 1000

    def text(self, node: str) -> str:
        return self.outputs[node]["text"][0]

    def images(self, node: str) -> list[dict[str, str]]:
        return self.outputs[node]["images"]


@dataclass
class Comfy:
    """A running ComfyUI: its address, its folders, and the process."""

    url: str
    root: Path  # the ComfyUI install
    work: Path  # input/, output/, temp/, user/, models/ of this run
    process: subprocess.Popen
    log: Path
    events: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)
    client_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def output(self) -> Path:
        return self.work / "output"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=60) as answer:
            return json.loads(answer.read())

    def post_json(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                data = answer.read()
                return answer.status, json.loads(data) if data else None
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def submit(self, prompt: dict[str, Any]) -> str:
        status, answer = self.post_json("/prompt", {"prompt": prompt, "client_id": self.client_id})
        assert status == 200, answer
        return answer["prompt_id"]

    def wait(self, prompt_id: str, timeout: float = 600) -> Finished:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.get(f"/history/{prompt_id}").get(prompt_id)
            if found and found["status"].get("status_str") in ("success", "error"):
                status = found["status"]
                return Finished(prompt_id, status["status_str"], [tuple(m) for m in status["messages"]],
                                found["outputs"])
            assert self.process.poll() is None, f"ComfyUI stopped: {self.tail()}"
            assert "Exception in thread" not in self.log.read_text(errors="replace"), (
                f"ComfyUI's prompt worker died:\n{self.tail()}")
            time.sleep(0.2)
        raise AssertionError(f"prompt {prompt_id} did not finish in {timeout} s")

    def run(self, prompt: dict[str, Any], timeout: float = 600) -> Finished:
        return self.wait(self.submit(prompt), timeout)

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def listen(self) -> None:
        """Record every websocket event for this client (in a thread, until the process ends)."""
        import aiohttp

        async def receive() -> None:
            address = self.url.replace("http://", "ws://") + f"/ws?clientId={self.client_id}"
            async with aiohttp.ClientSession() as session, session.ws_connect(address, heartbeat=20) as ws:
                async for message in ws:
                    if message.type == aiohttp.WSMsgType.TEXT:
                        data = json.loads(message.data)
                        self.events.append((time.monotonic(), data["type"], data.get("data") or {}))

        threading.Thread(target=lambda: asyncio.run(receive()), daemon=True).start()
        deadline = time.monotonic() + 20
        while not any(kind == "status" for _, kind, _ in self.events):  # the server greets each client
            assert time.monotonic() < deadline, "no websocket greeting from ComfyUI"
            time.sleep(0.05)


def prepare_work(work: Path, tiny_tree: Path, adapter: Path) -> Path:
    """The run's folders, the example pictures in its input folder, and the yaml that adds the tiny checkpoints
    (models/ootd/tiny), the adapter (models/loras) and the test pack (custom_nodes) to ComfyUI's paths."""
    from ootd.comfyui.install import example_inputs

    for name in ("input", "output", "temp", "user", "models/ootd", "models/loras", "custom_nodes/ootd_test_models"):
        (work / name).mkdir(parents=True, exist_ok=True)
    os.symlink(tiny_tree, work / "models" / "ootd" / "tiny")
    shutil.copyfile(adapter, work / "models" / "loras" / "ootd_adapter.safetensors")
    (work / "custom_nodes" / "ootd_test_models" / "__init__.py").write_text(TEST_PACK)
    example_inputs(work / "input")
    paths = work / "extra_model_paths.yaml"
    paths.write_text(f"ootd_tests:\n  base_path: {work}\n  ootd: models/ootd\n  loras: models/loras\n"
                     f"  custom_nodes: custom_nodes\n")
    return paths


def start_comfyui(root: Path, work: Path, paths: Path, timeout: float = 240) -> Comfy:
    """ComfyUI headless on the CPU, on 127.0.0.1, ready once it lists ootd's nodes."""
    port = free_port()
    log = work / "comfyui.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OOTD_CPU_BF16": os.environ.get("OOTD_CPU_BF16", "0")}
    command = [sys.executable, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
               "--disable-auto-launch", "--extra-model-paths-config", str(paths),
               "--input-directory", str(work / "input"), "--output-directory", str(work / "output"),
               "--temp-directory", str(work / "temp"), "--user-directory", str(work / "user"),
               "--database-url", "sqlite:///:memory:"]
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    comfy = Comfy(f"http://127.0.0.1:{port}", root, work, process, log)
    deadline = time.monotonic() + timeout
    while True:
        assert process.poll() is None, f"ComfyUI exited with {process.returncode}:\n{comfy.tail()}"
        try:
            if "OotdTryOn" in comfy.get("/object_info/OotdTryOn"):
                return comfy
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        assert time.monotonic() < deadline, f"ComfyUI did not list ootd's nodes in {timeout} s:\n{comfy.tail()}"
        time.sleep(1)


def stop_comfyui(comfy: Comfy) -> None:
    comfy.process.terminate()
    try:
        comfy.process.wait(30)
    except subprocess.TimeoutExpired:
        comfy.process.kill()
        comfy.process.wait(30)
