"""Contact sheets: pictures side by side at one height, to look at rather than read about."""

from __future__ import annotations

from collections.abc import Sequence

from PIL import Image

GAP = 8  # pixels between the tiles of a contact sheet
MAX_TILE_HEIGHT = 512


def contact_sheet(tiles: Sequence[Image.Image], height: int | None = None) -> Image.Image:
    """The images side by side at one height (each keeps its aspect), on white with a small gap."""
    height = height or min(MAX_TILE_HEIGHT, max(t.height for t in tiles))
    scaled = [t.convert("RGB").resize((max(1, round(t.width * height / t.height)), height), Image.LANCZOS)
              for t in tiles]
    sheet = Image.new("RGB", (sum(t.width for t in scaled) + GAP * (len(scaled) - 1), height), (255, 255, 255))
    x = 0
    for tile in scaled:
        sheet.paste(tile, (x, 0))
        x += tile.width + GAP
    return sheet


