"""The HTTP API with a second garment: the outfit `ootd run` makes with two --cloth, pixel for pixel and record
for record; each garment's mask back in the photo's framing, in the request's order (what the page's editor
takes back); a dress with a second garment, or a mask for one garment only, refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from tests.helpers.cli import invoke  # noqa: E402
from tests.helpers.images import pixels, text  # noqa: E402
from tests.helpers.serving import (  # noqa: E402
    assert_one_line_error,
    decode_data_url,
    files_for,
    live_server,
    pipes_factory,
    tiny_config,
)

FAST = {"steps": "1", "resolution": "384x512", "seed": "5"}


def test_api_outfit_equals_ootd_run(tiny_tree: Path, tmp_path: Path, example_images: dict[str, Path], pipe_hd,  # noqa: ANN001
                                    pipe_dc, models) -> None:  # noqa: ANN001
    size = Image.open(example_images["person"]).size
    legs = np.zeros((size[1], size[0]), np.uint8)
    legs[size[1] // 2:, :] = 255
    Image.fromarray(legs, "L").save(tmp_path / "legs.png")
    person, top, trousers, top_mask = (example_images[k] for k in ("person", "tshirt", "trousers", "mask"))
    pipes = {"hd": pipe_hd, "dc": pipe_dc}
    models.use(lambda model_type: pipes[model_type.value])
    cli = invoke("run", "-m", person, "-c", top, "-c", trousers, "-k", "upper", "-k", "lower", "--mask", top_mask,
                 "--mask", tmp_path / "legs.png", "--checkpoints", tiny_tree, "-o", tmp_path / "cli",
                 "--steps", "1", "--resolution", "384x512", "--seed", "5")
    assert cli.exit_code == 0, cli.output
    written = tmp_path / "cli" / "person__tshirt-with-trousers__0.png"

    files = files_for({"person": person, "garment": top, "mask": top_mask, "garment2": trousers,
                       "mask2": tmp_path / "legs.png"})
    with live_server(tiny_config(tiny_tree), models=pipes_factory(pipes)) as live:
        response = httpx.post(live.url + "api/tryon", files=files,
                              data={"category": "upper", "category2": "lower", **FAST}, timeout=300)
        assert response.status_code == 200, response.text
        body = response.json()
        dress = files_for({"person": person, "garment": top, "garment2": trousers})
        refused = httpx.post(live.url + "api/tryon", files=dress,
                             data={"category": "dress", "category2": "upper", **FAST}, timeout=60)
        one_mask = files_for({"person": person, "garment": top, "garment2": trousers, "mask": top_mask})
        half = httpx.post(live.url + "api/tryon", files=one_mask,
                          data={"category": "upper", "category2": "lower", **FAST}, timeout=60)
    served = decode_data_url(body["images"][0])
    assert np.array_equal(pixels(served), pixels(written))
    record, expected = served.text, text(written)
    for key in ("outfit", "lower_seed", "upper_seed", "lower_model_type", "upper_model_type", "seed", "steps"):
        assert record[key] == expected[key], key
    assert_one_line_error(refused, 400, "is a dress")
    assert_one_line_error(half, 422, "mask2")


def test_an_outfits_answer_has_each_garments_mask_in_the_requests_order(tiny_tree: Path, tmp_path: Path,
                                                                        example_images: dict[str, Path], pipe_hd,  # noqa: ANN001
                                                                        pipe_dc) -> None:  # noqa: ANN001
    """The lower garment sent first: `person_mask` is its mask (the `mask` field's), `person_mask2` the top's."""
    size = Image.open(example_images["person"]).size
    legs = np.zeros((size[1], size[0]), np.uint8)
    legs[size[1] // 2:, size[0] // 4:3 * size[0] // 4] = 255
    Image.fromarray(legs, "L").save(tmp_path / "legs.png")
    top_mask = np.asarray(Image.open(example_images["mask"]).convert("L"))
    files = files_for({"person": example_images["person"], "garment": example_images["trousers"],
                       "mask": tmp_path / "legs.png", "garment2": example_images["tshirt"],
                       "mask2": example_images["mask"]})
    with live_server(tiny_config(tiny_tree), models=pipes_factory({"hd": pipe_hd, "dc": pipe_dc})) as live:
        response = httpx.post(live.url + "api/tryon", files=files,
                              data={"category": "lower", "category2": "upper", **FAST}, timeout=300)
    assert response.status_code == 200, response.text
    body = response.json()
    for field, sent in (("person_mask", legs), ("person_mask2", top_mask)):
        back = np.asarray(decode_data_url(body[field]).convert("L"))
        assert back.shape == sent.shape, field  # the photo's own size
        assert ((back >= 127) != (sent >= 127)).mean() < 0.02, f"{field} is not that garment's mask"


def _header_only_png(path: Path, width: int, height: int) -> Path:
    """A PNG whose header claims width x height (a decompression bomb) with almost no data."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16))
                     + chunk(b"IEND", b""))
    return path


def test_every_input_of_an_outfit_is_checked_before_the_job_is_accepted(tiny_tree: Path, tmp_path: Path,  # noqa: ANN001
                                                                       example_images: dict[str, Path],
                                                                       models) -> None:  # noqa: ANN001
    """A bad second garment or second mask is a 400 when the job is submitted, naming the client's file and no
    folder of the server's, as for the first garment; nothing is queued and no model is loaded."""
    models.forbid()
    person, top, trousers, mask = (example_images[k] for k in ("person", "tshirt", "trousers", "mask"))
    (tmp_path / "notes.png").write_text("not an image")
    wide = tmp_path / "wide_mask.png"
    Image.new("L", (400, 100), 255).save(wide)
    cases = {
        "notes.png": {"garment2": tmp_path / "notes.png"},
        "bomb.png": {"garment2": _header_only_png(tmp_path / "bomb.png", 30000, 30000)},
        "wide_mask.png": {"garment2": trousers, "mask": mask, "mask2": wide},
    }
    with live_server(tiny_config(tiny_tree)) as live:
        for name, extra in cases.items():
            files = files_for({"person": person, "garment": top, **extra})
            response = httpx.post(live.url + "api/jobs", files=files,
                                  data={"category": "upper", "category2": "lower", **FAST}, timeout=60)
            message = assert_one_line_error(response, 400, name)
            for server_words in (str(live.workdir), "inputs/", "ootd-serve-", "/tmp"):
                assert server_words not in message, message
        assert httpx.get(live.url + "api/health", timeout=30).json()["queue"]["completed"] == 0
