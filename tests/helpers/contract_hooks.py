"""Schemathesis hooks for the API's contract tests (SCHEMATHESIS_HOOKS=tests.helpers.contract_hooks): the form's
file parts, declared as images (their `encoding` in /openapi.json), are drawn as real pictures here: grey (a mask
must be), 3:4 like the working resolutions (so any of them is a mask of any photo's shape), small but above the
smallest side the server takes. What they show is no schema's business: the server may refuse them with its
documented 400 (no person found), never with a 422 or a 5xx."""

from __future__ import annotations

import io

import schemathesis
from hypothesis import strategies as st
from PIL import Image, ImageDraw

WIDTHS = (96, 120, 192)  # x 4/3: 128, 160, 256 px high


@st.composite
def pictures(draw: st.DrawFn, kind: str = "PNG") -> bytes:
    width = draw(st.sampled_from(WIDTHS))
    height = width * 4 // 3
    background, foreground = draw(st.integers(0, 255)), draw(st.integers(0, 255))
    mode = draw(st.sampled_from(("L", "RGB")))
    image = Image.new("L", (width, height), background)
    box = sorted(draw(st.integers(0, width - 1)) for _ in range(2)) + sorted(
        draw(st.integers(0, height - 1)) for _ in range(2))
    ImageDraw.Draw(image).rectangle((box[0], box[2], box[1], box[3]), fill=foreground)
    out = io.BytesIO()
    image.convert(mode).save(out, format=kind, **({"quality": 95} if kind == "JPEG" else {}))
    return out.getvalue()


schemathesis.openapi.media_type("image/png", pictures("PNG"))
schemathesis.openapi.media_type("image/jpeg", pictures("JPEG"))
