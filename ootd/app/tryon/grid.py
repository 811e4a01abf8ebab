"""The contact sheet of one try-on (`--grid`): person | garment | mask | samples in one PNG."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PIL import Image

from ootd.imaging.contact_sheet import contact_sheet
from ootd.imaging.files import load_image

if TYPE_CHECKING:
    from ootd.app.tryon.outcome import TryOnOutcome


def grid_image(outcome: TryOnOutcome) -> Image.Image:
    """The inputs as given, the mask the try-on used and every sample, side by side."""

    def picture(role: str) -> Image.Image:
        value = outcome.request.pipeline_input(role)
        return value if isinstance(value, Image.Image) else load_image(value, role)

    result = outcome.result
    mask = (getattr(result, "intermediates", None) or {}).get("mask") or getattr(result, "mask", None)
    tiles = [picture("person"), picture("garment"), *([mask] if isinstance(mask, Image.Image) else []),
             *result.images]
    return contact_sheet(tiles)
