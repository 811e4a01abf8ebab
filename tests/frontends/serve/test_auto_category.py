"""The HTTP API with `category=auto`: classified with the server's checkpoints' CLIP, recorded in the result's
PNG; under the margin a 400 with one line naming the way out."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from ootd.settings import Category  # noqa: E402
from tests.helpers.clip import controlled_tree  # noqa: E402
from tests.helpers.serving import (  # noqa: E402
    assert_one_line_error,
    decode_data_url,
    files_for,
    live_server,
    pipes_factory,
    tiny_config,
)

FAST = {"steps": "1", "resolution": "384x512", "seed": "3"}


def test_api_auto_category(tiny_tree: Path, tmp_path: Path, example_images: dict[str, Path], pipe_hd,  # noqa: ANN001
                           pipe_dc) -> None:  # noqa: ANN001
    tree, expected = controlled_tree(tiny_tree, tmp_path / "tree", example_images["tshirt"],
                                     {Category.DRESS: 3.0, Category.UPPER: 1.0})
    files = files_for({"person": example_images["person"], "garment": example_images["tshirt"],
                       "mask": example_images["mask"]})
    pipes = pipes_factory({"hd": pipe_hd, "dc": pipe_dc})
    with live_server(tiny_config(tree), models=pipes) as live:
        response = httpx.post(live.url + "api/tryon", files=files, data={"category": "auto", **FAST}, timeout=300)
        assert response.status_code == 200, response.text
        body = response.json()
        options = httpx.get(live.url + "api/options", timeout=10).json()
    assert body["model_type"] == "dc" and body["settings"]["category"] == "dress"
    record = decode_data_url(body["images"][0]).text
    assert record["category_source"] == "auto"
    assert float(record["category_p"]) == pytest.approx(expected[Category.DRESS], abs=1e-4)
    assert "auto" in options["categories"]

    with live_server(tiny_config(tree, category_margin=0.99), models=pipes) as live:
        response = httpx.post(live.url + "api/tryon", files=files, data={"category": "auto", **FAST}, timeout=300)
    message = assert_one_line_error(response, 400, "cannot tell the category", "tshirt.png", "give it with `category`")
    assert "--" not in message  # the API's field, not the CLI's flag
