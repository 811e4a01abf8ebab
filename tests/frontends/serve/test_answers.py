"""What the API answers, against a live server on 127.0.0.1: the mask framed like the result (a photo that is not
3:4) and the editor's mask lined up with the photo, typed settings, a header that does not grow, the notice for
checkpoints that are not the released ones, the favicon and the OpenAPI schema."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
httpx = pytest.importorskip("httpx")

from PIL import Image  # noqa: E402

from ootd.serve.limits import Limits  # noqa: E402
from tests.helpers.serving import decode_data_url, files_for, live_server, pipes_factory, tiny_config  # noqa: E402

FAST = {"category": "upper", "steps": "1", "resolution": "384x512", "seed": "3"}


@pytest.fixture(scope="module")
def server(tiny_tree: Path, pipe_hd, pipe_dc):  # noqa: ANN001, ANN201
    with live_server(tiny_config(tiny_tree), models=pipes_factory({"hd": pipe_hd, "dc": pipe_dc})) as live:
        yield live


def wide_inputs(tmp_path: Path, example_images: dict[str, Path]) -> tuple[dict, Image.Image]:
    """The example person cut to 768x700 (wider than 3:4: padded top and bottom) and its mask cut the same."""
    box = (0, 120, 768, 820)
    person, mask = tmp_path / "wide.png", tmp_path / "wide_mask.png"
    Image.open(example_images["person"]).crop(box).save(person)
    cut = Image.open(example_images["mask"]).convert("L").crop(box)
    cut.save(mask)
    return files_for({"person": person, "garment": example_images["tshirt"], "mask": mask}), cut


def test_mask_is_framed_like_the_result_and_the_editors_mask_like_the_photo(server, tmp_path: Path,  # noqa: ANN001
                                                                            example_images: dict[str, Path]) -> None:
    files, mask = wide_inputs(tmp_path, example_images)
    response = httpx.post(server.url + "api/tryon", files=files, data={**FAST, "fit": "pad"}, timeout=120)
    assert response.status_code == 200, response.text
    body = response.json()
    result = decode_data_url(body["images"][0])
    assert result.size[0] == 384 and result.size[1] < 512  # the padding is cut off the result
    for kind in ("mask", "masked_person"):
        assert decode_data_url(body[kind]).size == result.size, kind  # ... and off the mask: they line up
    editable = decode_data_url(body["person_mask"]).convert("L")
    assert editable.size == mask.size  # the photo's own size and framing, ready to paint over the photo
    sent, back = np.asarray(mask) >= 127, np.asarray(editable) >= 127
    assert (sent != back).mean() < 0.02, "the editor's mask does not line up with the photo"


def test_settings_are_typed_and_urls_absolute(server, example_images: dict[str, Path]) -> None:  # noqa: ANN001
    files = files_for({"person": example_images["person"], "garment": example_images["tshirt"],
                       "mask": example_images["mask"]})
    job = httpx.post(server.url + "api/jobs", files=files, data=FAST, timeout=30).json()
    while (status := httpx.get(server.url + f"api/jobs/{job['id']}", timeout=10).json())["state"] != "done":
        assert status["state"] in ("queued", "running"), status
    settings = status["settings"]
    assert settings["steps"] == 1 and settings["samples"] == 1 and settings["seed"] == 3
    assert isinstance(settings["scale"], float) and settings["resolution"] == "384x512"
    for url in (*status["images"], status["mask"], status["masked_person"], status["person_mask"]):
        assert url.startswith(server.url + f"api/jobs/{job['id']}/files/"), url
        assert httpx.get(url, timeout=10).headers["content-type"] == "image/png"


def test_range_requests_on_result_files_answer_in_the_apis_format(server,  # noqa: ANN001
                                                                  example_images: dict[str, Path]) -> None:
    """A range the file can serve is served; one it cannot (outside the file, malformed, another unit) is
    {"error": "one line"} with 416 (and the file's size) or 400, like every other failure."""
    files = files_for({"person": example_images["person"], "garment": example_images["tshirt"],
                       "mask": example_images["mask"]})
    job = httpx.post(server.url + "api/jobs", files=files, data=FAST, timeout=30).json()
    while (status := httpx.get(server.url + f"api/jobs/{job['id']}", timeout=10).json())["state"] != "done":
        assert status["state"] in ("queued", "running"), status
    url = status["images"][0]
    whole = httpx.get(url, timeout=10).content
    part = httpx.get(url, headers={"Range": "bytes=0-7"}, timeout=10)
    assert part.status_code == 206 and part.content == whole[:8] == b"\x89PNG\r\n\x1a\n"
    for header, code in ((f"bytes={len(whole) + 10}-", 416), ("bytes=5-2", 400), ("lines=0-1", 400),
                         ("nonsense", 400), ("bytes=", 400)):
        answer = httpx.get(url, headers={"Range": header}, timeout=10)
        assert answer.status_code == code, (header, answer.status_code, answer.text)
        assert answer.headers["content-type"] == "application/json", (header, answer.headers)
        body = answer.json()
        assert list(body) == ["error"] and body["error"] and "\n" not in body["error"], (header, body)
        if code == 416:
            assert answer.headers["content-range"] == f"bytes */{len(whole)}"
            assert str(len(whole)) in body["error"]


def test_health_names_the_backend_and_says_the_checkpoints_are_not_released(server,  # noqa: ANN001
                                                                             example_images: dict[str, Path]) -> None:
    files = files_for({"person": example_images["person"], "garment": example_images["tshirt"],
                       "mask": example_images["mask"]})
    seen = []
    for _ in range(2):
        assert httpx.post(server.url + "api/tryon", files=files, data=FAST, timeout=120).status_code == 200
        seen.append(httpx.get(server.url + "api/health", timeout=10).json())
    assert seen[0]["attention"] == seen[1]["attention"] and " x " not in seen[1]["attention"], seen[1]["attention"]
    notice = seen[1]["checkpoints"]
    assert notice["released"] is False and notice["note"].startswith("not the released OOTDiffusion models")


def test_favicon_and_openapi_schema(server) -> None:  # noqa: ANN001
    icon = httpx.get(server.url + "favicon.ico", timeout=10)
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert 'rel="icon"' in httpx.get(server.url, timeout=10).text
    schema = httpx.get(server.url + "openapi.json", timeout=10).json()
    paths = schema["paths"]
    assert {"/api/health", "/api/options", "/api/tryon", "/api/jobs", "/api/jobs/{job_id}",
            "/api/jobs/{job_id}/files/{name}"} <= set(paths)
    form = paths["/api/tryon"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert set(form["required"]) == {"person", "garment", "category"}
    assert form["properties"]["person"]["format"] == "binary" and form["properties"]["steps"]["type"] == "integer"
    assert form["properties"]["scale"]["type"] == "number"
    # the settings' fields from their declarations: bounds and choices stated, the server's own limits where narrower
    fields = form["properties"]
    assert (fields["steps"]["minimum"], fields["steps"]["maximum"]) == (1, Limits.max_steps)
    assert fields["scale"]["maximum"] == 50 and fields["feather"]["maximum"] == 64
    assert fields["scheduler"]["enum"] == ["unipc", "dpmpp", "ddim", "euler", "lcm", "tcd"]
    assert {"true", "false"} <= set(fields["keep_unmasked"]["enum"])  # a form's words for a switch
    assert "--" not in fields["feather"]["description"]
    assert "delete" in paths["/api/jobs/{job_id}"]
    example = paths["/api/tryon"]["post"]["responses"]["200"]["content"]["application/json"]["example"]
    assert isinstance(example["settings"]["steps"], int)
    assert "/" not in schema["paths"] and "/static" not in str(list(paths))
