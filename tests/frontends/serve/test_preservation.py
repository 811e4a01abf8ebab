"""`ootd serve` measures what each finished job's pictures changed of the person photo (docs/preservation.md), as
`ootd run` does: the answer's `preservation` (the figures `measure_made` gives for the same pictures, each named as
`names` names it), from the parse the automatic mask came from (one pose + parsing run per job), from a mask's file
when one was uploaded, and a job it cannot measure still succeeds with the reason; the form's `preservation=false`
measures nothing, and the OpenAPI document declares the field and the figures. Pose and parsing are the synthetic
ones (tests/helpers/synthetic.py): the tiny checkpoints' random ones find nobody."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
httpx = pytest.importorskip("httpx")

from ootd.app.tryon.inputs import JobInputs  # noqa: E402
from ootd.app.tryon.preservation import measure_made  # noqa: E402
from ootd.models import ModelSource  # noqa: E402
from ootd.settings import Category  # noqa: E402
from tests.helpers.serving import files_for, live_server, pipes_factory, tiny_config, wait_until  # noqa: E402
from tests.helpers.synthetic import counted_preprocessor, synthetic_preprocessor  # noqa: E402

FAST = {"category": "upper", "steps": "1", "resolution": "384x512", "seed": "3"}


def finished_job(url: str, files: dict, data: dict) -> dict:
    """A job through /api/jobs, polled until it is done: its answer."""
    created = httpx.post(url + "api/jobs", files=files, data=data, timeout=60)
    assert created.status_code == 202, created.text
    job_url = url + f"api/jobs/{created.json()['id']}"
    answer: dict[str, Any] = {}

    def finished() -> bool:
        answer.update(httpx.get(job_url, timeout=10).json())
        return answer["state"] not in ("queued", "running")

    wait_until(finished, 300, "the job to finish", every=0.2)
    assert answer["state"] == "done", answer
    return answer


def measured_again(answer: dict, folder: Path, inputs: JobInputs) -> dict:
    """`measure_made` on the served pictures (downloaded under their names), parsing the photo itself: the
    figures as `ootd run --json` gives them, each picture named by its file name."""
    folder.mkdir()
    paths = []
    for name, url in zip(answer["names"], answer["images"], strict=True):  # data: URLs (/api/tryon) or URLs
        data = base64.b64decode(url.split(",", 1)[1]) if url.startswith("data:") else httpx.get(url, timeout=10).content
        (folder / name).write_bytes(data)
        paths.append(folder / name)
    kept = json.loads(json.dumps(measure_made(paths, inputs, synthetic_preprocessor).to_json()))
    for result in kept["results"]:
        result["result"] = Path(result["result"]).name
    return kept


def test_a_job_answers_the_figures_of_its_automatic_masks_parse_parsed_once(
        tmp_path: Path, tiny_tree: Path, pipe_hd, example_images: dict[str, Path]) -> None:  # noqa: ANN001
    pre, runs = counted_preprocessor()
    person, garment = example_images["person"], example_images["tshirt"]
    with live_server(tiny_config(tiny_tree), models=pipes_factory({"hd": pipe_hd}, pre)) as live:
        answer = finished_job(live.url, files_for({"person": person, "garment": garment}),
                              {**FAST, "samples": "2"})
        assert runs == {"pose": 1, "parsing": 1}  # the automatic mask's parse is the one the figures come from
        kept = answer["preservation"]
        assert [r["result"] for r in kept["results"]] == answer["names"] and len(answer["names"]) == 2
        assert all("regions" in r for r in kept["results"]) and kept["score"] is not None, kept
        assert answer["settings"]["mask"] == "auto" and "preservation" in answer["timings"]
        assert str(live.workdir) not in json.dumps(kept)
        again = measured_again(answer, tmp_path / "served", JobInputs.single(person, garment, Category.UPPER))
    assert again == kept


def test_an_uploaded_masks_job_is_measured_from_the_file(tmp_path: Path, tiny_tree: Path, pipe_hd,  # noqa: ANN001
                                                         example_images: dict[str, Path]) -> None:
    pre, runs = counted_preprocessor()
    person, garment, mask = example_images["person"], example_images["tshirt"], example_images["mask"]
    with live_server(tiny_config(tiny_tree), models=pipes_factory({"hd": pipe_hd}, pre)) as live:
        response = httpx.post(live.url + "api/tryon", files=files_for({"person": person, "garment": garment,
                                                                        "mask": mask}), data=FAST, timeout=300)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert runs == {"pose": 1, "parsing": 1}  # the mask is given: the photo is parsed for the regions only
    kept = answer["preservation"]
    assert answer["settings"]["mask"] == "uploaded" and "regions" in kept["results"][0], kept
    again = measured_again(answer, tmp_path / "served", JobInputs.single(person, garment, Category.UPPER, mask))
    assert again == kept


def test_a_job_asked_not_to_measure_has_none(tiny_tree: Path, pipe_hd,  # noqa: ANN001
                                             example_images: dict[str, Path]) -> None:
    pre, runs = counted_preprocessor()
    files = files_for({"person": example_images["person"], "garment": example_images["tshirt"],
                       "mask": example_images["mask"]})
    with live_server(tiny_config(tiny_tree), models=pipes_factory({"hd": pipe_hd}, pre)) as live:
        answer = finished_job(live.url, files, {**FAST, "preservation": "false"})
        refused = httpx.post(live.url + "api/tryon", files=files, data={**FAST, "preservation": "maybe"}, timeout=60)
    assert answer["preservation"] is None and "preservation" not in answer["timings"], answer
    assert not runs  # the mask is given and nothing is measured: pose and parsing never run
    assert refused.status_code == 422 and "preservation" in refused.json()["error"], refused.text


def failing_parser() -> Any:
    raise RuntimeError("the parser broke")


@pytest.mark.parametrize("parser", [None, failing_parser], ids=["nobody-found", "internal-error"])
def test_a_job_that_cannot_be_measured_succeeds_with_the_reason(tiny_tree: Path, pipe_hd, parser,  # noqa: ANN001
                                                                example_images: dict[str, Path]) -> None:
    """None: the tiny tree's own pose and parsing, whose random pose model finds nobody."""
    files = files_for({"person": example_images["person"], "garment": example_images["tshirt"],
                       "mask": example_images["mask"]})
    with live_server(tiny_config(tiny_tree), models=ModelSource(lambda model_type: pipe_hd, parser)) as live:
        response = httpx.post(live.url + "api/tryon", files=files, data=FAST, timeout=300)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert str(live.workdir) not in json.dumps(answer["preservation"])
    kept = answer["preservation"]
    assert kept["score"] is None and not kept["review"] and len(answer["images"]) == 1
    why = "nobody found in the photo" if parser is None else "internal error: RuntimeError: the parser broke"
    assert kept["summary"] == f"not measured: {kept['results'][0]['problem']}" and why in kept["summary"], kept
    assert kept["results"] == [{"result": answer["names"][0], "problem": kept["results"][0]["problem"]}]


def test_the_document_declares_the_figures(tiny_tree: Path, pipe_hd) -> None:  # noqa: ANN001
    with live_server(tiny_config(tiny_tree), models=pipes_factory({"hd": pipe_hd})) as live:
        document = httpx.get(live.url + "openapi.json", timeout=10).json()
    figures = document["components"]["schemas"]["Preservation"]
    assert {"score", "summary", "review", "results"} <= set(figures["required"]), figures
    assert figures["type"] == ["object", "null"]
    form = document["paths"]["/api/jobs"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert form["properties"]["preservation"]["enum"] == ["0", "1", "false", "no", "off", "on", "true", "yes"]
    ref = {"$ref": "#/components/schemas/Preservation"}
    for path, method in (("/api/tryon", "post"), ("/api/jobs/{job_id}", "get")):
        schema = document["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema["properties"]["preservation"] == ref, (path, schema)
