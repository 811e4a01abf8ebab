#!/usr/bin/env python
"""Draw the example inputs that ship in examples/: a person, a T-shirt, trousers and a mask for each garment.

They are simple drawings, made so that a fresh clone has inputs to try the tool on; a real
photo of a person works much better with the real checkpoints.

    python scripts/make_example_images.py [OUT]   (default: examples/)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PIL import Image, ImageDraw

W, H = 768, 1024
SKIN = (224, 172, 140)


def draw_person() -> Image.Image:
    img = Image.new("RGB", (W, H), (236, 236, 240))
    d = ImageDraw.Draw(img)
    d.ellipse((324, 90, 444, 230), fill=SKIN)  # head
    d.pieslice((318, 78, 450, 200), 180, 360, fill=(60, 40, 30))  # hair
    d.rectangle((364, 225, 404, 265), fill=SKIN)  # neck
    d.polygon([(270, 265), (498, 265), (520, 560), (248, 560)], fill=(40, 90, 170))  # shirt
    d.line([(280, 280), (200, 450), (185, 600)], fill=SKIN, width=46, joint="curve")  # right arm
    d.line([(488, 280), (568, 450), (583, 600)], fill=SKIN, width=46, joint="curve")  # left arm
    d.ellipse((165, 585, 210, 640), fill=SKIN)
    d.ellipse((558, 585, 603, 640), fill=SKIN)
    d.polygon([(250, 555), (518, 555), (500, 930), (395, 930), (384, 640), (373, 930), (268, 930)],
              fill=(50, 50, 60))  # trousers
    d.ellipse((255, 915, 345, 960), fill=(20, 20, 20))  # shoes
    d.ellipse((423, 915, 513, 960), fill=(20, 20, 20))
    return img


def draw_tshirt() -> Image.Image:
    img = Image.new("RGB", (W, H), (250, 250, 250))
    d = ImageDraw.Draw(img)
    body = [(200, 220), (310, 180), (384, 215), (458, 180), (568, 220), (660, 380), (580, 420), (560, 360),
            (560, 860), (208, 860), (208, 360), (188, 420), (108, 380)]
    d.polygon(body, fill=(200, 40, 50))
    d.ellipse((330, 170, 438, 250), fill=(250, 250, 250))
    for y in range(420, 820, 80):
        d.rectangle((208, y, 560, y + 30), fill=(240, 200, 60))
    return img


def draw_trousers() -> Image.Image:
    img = Image.new("RGB", (W, H), (250, 250, 250))
    d = ImageDraw.Draw(img)
    d.polygon([(240, 150), (528, 150), (560, 900), (420, 900), (384, 360), (348, 900), (208, 900)],
              fill=(60, 110, 70))
    d.rectangle((240, 150, 528, 190), fill=(40, 80, 50))
    return img


def draw_mask() -> Image.Image:
    """The upper-body region of the drawn person: shirt and arms, white = repaint."""
    img = Image.new("L", (W, H), 0)
    d = ImageDraw.Draw(img)
    d.polygon([(255, 255), (513, 255), (535, 575), (233, 575)], fill=255)
    d.line([(280, 280), (200, 450), (185, 580)], fill=255, width=70, joint="curve")
    d.line([(488, 280), (568, 450), (583, 580)], fill=255, width=70, joint="curve")
    return img


def draw_lower_mask() -> Image.Image:
    """The lower-body region of the drawn person: both legs from the waist to the shoes, white = repaint."""
    img = Image.new("L", (W, H), 0)
    ImageDraw.Draw(img).polygon([(236, 545), (532, 545), (516, 948), (252, 948)], fill=255)
    return img


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, default=Path(__file__).resolve().parents[1] / "examples",
                        help="folder to write them to (default: examples/)")
    out = parser.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    draw_person().save(out / "person.png")
    draw_tshirt().save(out / "tshirt.png")
    draw_trousers().save(out / "trousers.png")
    draw_mask().save(out / "person_mask_upper.png")
    draw_lower_mask().save(out / "person_mask_lower.png")
    print(f"wrote example images to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
