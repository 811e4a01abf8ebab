"""`ootd serve --lora` with a few-step adapter: the server's defaults are the adapter's steps, scheduler and
guidance (GET /api/options says so), a request without them samples with those, a request's own fields win, and
the answer records both what was used and what the adapter carries."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
httpx = pytest.importorskip("httpx")

from tests.helpers.serving import files_for, live_server, tiny_config  # noqa: E402
from tests.helpers.training import few_step, write_adapter  # noqa: E402


def test_the_server_samples_with_the_adapters_settings_unless_asked(tmp_path: Path, tiny_tree: Path,
                                                                     example_images: dict[str, Path]) -> None:
    adapter = write_adapter(tiny_tree, tmp_path / "few.safetensors", True, sampling=few_step(tiny_tree, steps=2))
    files = files_for({"person": example_images["person"], "garment": example_images["tshirt"],
                       "mask": example_images["mask"]})
    form = {"category": "upper", "resolution": "384x512", "seed": "3"}
    with live_server(tiny_config(tiny_tree, model_type="hd", lora=str(adapter))) as live:
        defaults = httpx.get(live.url + "api/options", timeout=10).json()["defaults"]
        own = httpx.post(live.url + "api/tryon", files=files, data=form, timeout=300)
        told = httpx.post(live.url + "api/tryon", files=files, data={**form, "steps": "1"}, timeout=300)
    assert (defaults["steps"], defaults["scheduler"], defaults["scale"]) == (2, "lcm", 0.0)
    assert own.status_code == 200 and told.status_code == 200, own.text + told.text
    settings, overridden = own.json()["settings"], told.json()["settings"]
    assert (settings["steps"], settings["scheduler"], settings["scale"]) == (2, "lcm", 0.0)
    assert (settings["lora_steps"], settings["lora_scheduler"], settings["lora_guidance"]) == (2, "lcm", 0.0)
    assert (overridden["steps"], overridden["scheduler"], overridden["lora_steps"]) == (1, "lcm", 2)
