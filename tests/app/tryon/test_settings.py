"""Each setting declared once (ootd/app/tryon/settings.py): the declared bounds are the ones its owner checks, the
facts a front end builds an input from are machine-readable, and a setting added to the declarations alone reaches
the CLI's options and help, the server's form and OpenAPI schema, the pictures' record and what resume compares."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ootd.app.tryon.config import RunConfig, build_config, update_config
from ootd.app.tryon.record import PIXEL_SETTINGS, PassRecord, Record
from ootd.app.tryon.settings import API, GROUPS, NODE, SETTINGS
from ootd.errors import UsageError
from ootd.settings import Category, ModelType
from tests.helpers import REPO

# what a setting needs beside it for its bounds to be checked at all (the others it goes with)
WITH = {"feather": {"keep_unmasked": True}}


def _numbers() -> list[str]:
    return [one.name for one in SETTINGS if one.minimum is not None and one.maximum is not None]


@pytest.mark.parametrize("name", _numbers())
def test_each_declared_bound_is_the_one_its_owner_checks(name: str, tmp_path: Path) -> None:
    one = SETTINGS[name]
    words = dict(WITH.get(name, {}))
    if one.group == "lora":  # a scale needs an adapter file (chosen, not read, when the config is built)
        (tmp_path / "a.safetensors").write_bytes(b"x")
        words["lora"] = tmp_path / "a.safetensors"
    step = 1 if one.kind is int else 0.01
    low, high = one.minimum, one.maximum - (step if one.below_maximum else 0)
    for inside in (low, high):
        build_config(checkpoints=tmp_path, **words, **{name: one.kind(inside)})
    for outside in (low - step, one.maximum + (0 if one.below_maximum else step)):
        with pytest.raises(UsageError) as refused:
            build_config(checkpoints=tmp_path, **words, **{name: one.kind(outside)})
        assert refused.value.setting == name, str(refused.value)


def test_choices_are_the_words_their_owner_takes(tmp_path: Path) -> None:
    for one in SETTINGS:
        for word in one.choices:
            words = {"keep_unmasked": False} if one.name == "output_size" else {}
            build_config(checkpoints=tmp_path, **words, **{one.name: word})
        if one.choices:
            with pytest.raises(UsageError, match="no-such-word"):
                build_config(checkpoints=tmp_path, **{one.name: "no-such-word"})


def test_a_front_end_can_build_its_inputs_from_the_declarations() -> None:
    node = [one.describe() for one in SETTINGS.offered_by(NODE)]
    assert {d["name"] for d in node} >= {"samples", "steps", "scale", "seed", "resolution", "scheduler", "fit",
                                         "keep_unmasked", "output_size", "feather", "speed"}
    for described in node:
        assert described["type"] in ("integer", "number", "string", "boolean") and described["help"]
        assert "--" not in described["help"], described  # worded for a node (the API's field names), not the CLI
        if described["type"] in ("integer", "number") and described["name"] != "seed":
            assert described["minimum"] is not None and described["maximum"] is not None, described
    steps = SETTINGS["steps"].describe()
    # left out, the steps are a few-step adapter's own, else 20 (`omitted`: what a front end shows as the default)
    assert (steps["minimum"], steps["maximum"], steps["default"], steps["omitted"], steps["pixels"]) == (
        1, 1000, None, 20, True)
    assert SETTINGS["scheduler"].json_schema()["enum"] == ["unipc", "dpmpp", "ddim", "euler", "lcm", "tcd"]
    assert SETTINGS["category_margin"].json_schema()["exclusiveMaximum"] == 1.0
    for one in SETTINGS:  # where each value lives is one of the places build_config fills
        assert one.home is None or one.group in GROUPS or one.home in RunConfig.__dataclass_fields__, one.name


def test_the_record_and_resume_are_the_declarations(tmp_path: Path) -> None:
    config = build_config(checkpoints=tmp_path, seed=3, steps=4, token_merge=0.5)
    text = Record(PassRecord(ModelType.HD, Category.UPPER, config, "p.png", "g.png", "auto")).text()
    for _, kept in SETTINGS.recorded():
        assert kept.key in text or kept.absent is not None, kept.key  # written, or its absence means a value
        assert (kept.key in PIXEL_SETTINGS) == kept.pixels, kept.key
    assert (text["steps"], text["token_merge"], text["speed"]) == ("4", "0.5", "custom")


def test_a_request_changes_only_what_it_gives(tmp_path: Path) -> None:
    base = build_config(checkpoints=tmp_path, steps=9, fit="crop", keep_unmasked=True, speed="fast")
    given = {one.name: None for one in SETTINGS.offered_by(API)}
    same = update_config(base, {**given, "seed": 5})
    assert (same.sampling.steps, same.fit, same.photo, same.speed) == (9, base.fit, base.photo, base.speed)
    changed = update_config(base, {**given, "steps": 3, "fit": "pad", "keep_unmasked": False})
    assert (changed.sampling.steps, changed.fit.value, changed.photo.at_photo_size) == (3, "pad", False)
    assert update_config(base, given).sampling.seed != base.sampling.seed  # no seed: a fresh one per request


THROWAWAY = """
    import json, sys
    from pathlib import Path

    from ootd.app.tryon.settings import API, BATCH, NODE, RUN, SAMPLING, SERVE, SETTINGS, Setting, recorded

    # the only edit: one more declaration
    SETTINGS.add(Setting("knob", int, 3, "A throwaway knob.", minimum=0, maximum=9, flags=("--knob",),
                         metavar="K", panel=SAMPLING, offered=frozenset({RUN, BATCH, SERVE, API, NODE}),
                         record=recorded("knob", pixels=True)))

    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from ootd import cli
    from ootd.app.tryon.config import build_config
    from ootd.app.tryon.provenance import read_record, setting_changes
    from ootd.app.tryon.record import PIXEL_SETTINGS
    from ootd.serve.app import create_app

    tree, person, garment, mask, out = map(Path, sys.argv[1:6])
    found = {"pixels": "knob" in PIXEL_SETTINGS}
    runner = CliRunner()
    found["help"] = runner.invoke(cli.app, ["run", "--help"], env={"COLUMNS": "300"}).output
    common = ["--checkpoints", tree, "--steps", "1", "--resolution", "384x512", "--device", "cpu", "--seed", "1"]
    ran = runner.invoke(cli.app, [str(a) for a in ["run", "-m", person, "-c", garment, "-k", "upper", "--mask", mask,
                                                   *common, "-o", out, "--json", "--knob", "7"]])
    found["run"] = [ran.exit_code, json.loads(ran.stdout) if ran.exit_code == 0 else ran.output]
    png = out / "person__tshirt__0.png"
    found["record"] = read_record(png) if png.exists() else {}
    found["changes"] = setting_changes(found["record"], {**found["record"], "knob": "8"})
    bad = runner.invoke(cli.app, [str(a) for a in ["run", "-m", person, "-c", garment, "-k", "upper", "--mask", mask,
                                                   *common, "-o", out, "--knob", "12"]])
    found["bad"] = [bad.exit_code, bad.stderr]
    app = create_app(build_config(checkpoints=tree, device="cpu"), out / "serve")
    found["schema"] = app.openapi()["paths"]["/api/tryon"]["post"]["requestBody"]["content"][
        "multipart/form-data"]["schema"]["properties"]
    files = {role: (f"{role}.png", path.read_bytes(), "image/png")
             for role, path in (("person", person), ("garment", garment), ("mask", mask))}
    with TestClient(app, base_url="http://127.0.0.1") as client:
        form = {"category": "upper", "steps": "1", "resolution": "384x512", "seed": "2"}
        answer = client.post("/api/tryon", data={**form, "knob": "5"}, files=files)
        found["api"] = [answer.status_code, answer.json()]
        refused = client.post("/api/tryon", data={**form, "knob": "12"}, files=files)
        found["api_bad"] = [refused.status_code, refused.json()]
    # the try-on node (its inputs as ComfyUI gets them, without ComfyUI: ootd/comfyui/inputs.py)
    from dataclasses import asdict

    from ootd.comfyui.inputs import config_words, node_errors, widgets

    found["node"] = [asdict(one) for one in widgets(NODE) if one.name == "knob"]
    found["node_value"] = build_config(checkpoints=tree, **config_words(NODE, {"knob": 5})).extra("knob")
    try:
        with node_errors():
            build_config(checkpoints=tree, **config_words(NODE, {"knob": 12}))
    except Exception as exc:
        found["node_bad"] = [type(exc).__name__, str(exc)]
    print(json.dumps(found))
"""


def test_a_setting_declared_once_reaches_every_front_end(tmp_path: Path, tiny_tree: Path,
                                                         example_images: dict[str, Path]) -> None:
    """A throwaway setting, added to the declarations in a process of its own (nothing else edited): `ootd run`
    offers it (--help, its bounds checked in the CLI's words), the pictures record it and resume compares it, the
    HTTP API's form takes it (its OpenAPI schema states its type and bounds, its errors name the field), and the
    ComfyUI try-on node has it as an input (its bounds, default and tooltip; its value reaches the config; its
    errors name the input)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OOTD_CPU_BF16": "0"}
    args = [tiny_tree, example_images["person"], example_images["tshirt"], example_images["mask"], tmp_path / "out"]
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(THROWAWAY), *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert "--knob" in found["help"] and "A throwaway knob." in found["help"]
    code, summary = found["run"]
    assert code == 0, summary
    assert summary["settings"]["knob"] == 7 and found["record"]["knob"] == "7"
    assert found["pixels"] and found["changes"] == {"knob": ["7", "8"]}  # resume and `ootd compare` see it
    assert found["bad"][0] == 2 and "--knob must be 0 to 9, got 12" in found["bad"][1]
    assert found["schema"]["knob"] == {"type": "integer", "description": "A throwaway knob.", "minimum": 0,
                                       "maximum": 9}
    status, answer = found["api"]
    assert status == 200, answer
    assert answer["settings"]["knob"] == 5
    assert found["api_bad"] == [422, {"error": "`knob` must be 0 to 9, got 12"}]
    assert found["node"] == [{"name": "knob", "kind": "int", "default": 3, "tooltip": "A throwaway knob.", "low": 0,
                              "high": 9, "step": None, "choices": [], "left_out": None}]
    assert found["node_value"] == 5
    assert found["node_bad"] == ["UsageError", "input knob must be 0 to 9, got 12"]


def test_each_speed_setting_is_one_entry_of_the_modes_table() -> None:
    """A speed mode is its declaration (`home="speed.<name>"`) plus its implementation: its field of SpeedModes and
    its entry in speedups/modes.py's MODES (the field, the check, how a message tells its value), the table that
    build_config, update_config and `speed` exact's refusal read; neither side has one the other lacks."""
    from dataclasses import fields

    from ootd.speedups.modes import MODES, SpeedModes

    declared = {one.key for one in SETTINGS if one.group == "speed"} - {"preset"}
    assert declared == set(MODES)
    assert {field for field, _, _ in MODES.values()} == {f.name for f in fields(SpeedModes)}
    for name in MODES:
        assert name in SETTINGS and SETTINGS[name].home == f"speed.{name}", name
