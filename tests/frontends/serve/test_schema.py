"""The try-on form in /openapi.json (the contract Schemathesis checks the server against) states each setting as
declared (ootd/app/tryon/settings.py): change the declarations the form takes, nothing else, and the published
form schema follows, narrowed only by this server's own limits."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")

from ootd.app.tryon.config import build_config  # noqa: E402
from ootd.app.tryon.settings import Setting  # noqa: E402
from ootd.serve import forms  # noqa: E402
from ootd.serve.app import create_app  # noqa: E402
from ootd.serve.limits import Limits  # noqa: E402

# the server's own limits: steps narrower than any declaration below, samples wider
LIMITS = Limits(max_steps=7, max_samples=10**6)
TYPES = {int: "integer", float: "number", str: "string", bool: "string"}  # a switch: the form's words


def changed(one: Setting) -> Setting:
    """The declaration with another upper bound, and one choice fewer."""
    if one.maximum is not None:
        one = replace(one, maximum=one.maximum - 1 if one.kind is int else one.maximum / 2)
    if len(one.choices) > 1:
        one = replace(one, choices=one.choices[1:])
    return one


def form_of(tmp_path: Path) -> dict[str, Any]:
    app = create_app(build_config(checkpoints=tmp_path, device="cpu"), tmp_path / "serve", LIMITS)
    paths = app.openapi()["paths"]
    forms_seen = [paths[route]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
                  for route in ("/api/tryon", "/api/jobs")]
    assert forms_seen[0] == forms_seen[1]
    return forms_seen[0]


def test_the_contract_states_each_setting_as_declared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    declared = tuple(changed(one) for one in forms.API_SETTINGS)
    assert declared != forms.API_SETTINGS
    monkeypatch.setattr(forms, "API_SETTINGS", declared)
    form = form_of(tmp_path)
    fields = form["properties"]
    assert set(fields) == {*forms.FILES, "category", "category2", *(one.name for one in declared)}
    assert form["maxProperties"] == len(fields) and form["additionalProperties"] is False
    for one in declared:
        field = fields[one.name]
        assert field["type"] == TYPES[one.kind], one.name
        assert field.get("minimum") == one.minimum, one.name
        top = one.maximum if one.name != "steps" else LIMITS.max_steps
        assert field.get("maximum") == top, (one.name, field)
        if one.kind is int:  # exact: not a float's 2^63 for the seed's 2^63 - 1
            assert all(isinstance(field[end], int) for end in ("minimum", "maximum")), (one.name, field)
        if one.choices:
            assert field["enum"] == list(one.choices), one.name
        if one.kind is bool:
            assert set(field["enum"]) == set(forms.FLAGS), one.name
    assert fields["scale"]["maximum"] == 25 and fields["feather"]["maximum"] == 63  # the changed ones
    assert fields["samples"]["maximum"] < LIMITS.max_samples  # the declaration's, this server allowing more


def test_a_setting_added_to_the_form_is_in_the_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    knob = Setting("knob", float, 0.5, "A throwaway knob, see {@steps}.", minimum=0.25, maximum=0.75)
    monkeypatch.setattr(forms, "API_SETTINGS", (*forms.API_SETTINGS, knob))
    field = form_of(tmp_path)["properties"]["knob"]
    assert field == {"type": "number", "description": "A throwaway knob, see `steps`.", "minimum": 0.25,
                     "maximum": 0.75}


def test_the_forms_descriptions_name_fields_not_command_line_flags(tmp_path: Path) -> None:
    """A setting's help names other settings as `{@name}`, which the API words as its fields: a command-line flag
    written into a help text would reach the client's document as words it cannot use."""
    import re

    fields = form_of(tmp_path)["properties"]
    flags = {name: re.findall(r"(?<![\w-])--[a-z][\w-]*", field.get("description", ""))
             for name, field in fields.items()}
    assert not {name: found for name, found in flags.items() if found}
