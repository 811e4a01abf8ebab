"""What a try-on changed that it should have kept, without a ground-truth photo: a result against the person photo
it was made from, region by region (face, hair, neck, arms, hands, legs, shoes, background: preprocess/regions.py),
each split into the part outside the repainted mask (`kept`: it should be unchanged) and the part inside it
(`redrawn`: skin, hands or background the model had to paint again). A band of `seam` pixels just outside the mask
is in neither: there the result blends into the photo by design (the latents' resolution, --feather).

Each part has its area (pixels, and its share of the picture), the mean SSIM (ootd/imaging/similarity.py, the
channel-averaged map: 1 = the same structure), the mean CIEDE2000 colour difference (ootd/imaging/colour.py: 0 =
the same colour, about 1 = the smallest difference an eye sees side by side) and the share of its pixels that
`changed`: a colour difference above CHANGED_DELTA_E, plainly visible. A region the parse did not find is
`absent`, never "unchanged". The pair's `score` is the largest changed share of a kept part big enough to matter
(MIN_SCORED_SHARE of the picture): what a reviewer sorts by.

Pure numbers on arrays; the images, the parse and the mask in the result's frame come from the application layer
(ootd/app/tryon/preservation.py). Memory: a strip of rows at a time besides the few uint8 maps the size of the
picture, so a 50-megapixel photo takes a few hundred MB, not gigabytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ootd.imaging.colour import delta_e_2000, srgb_to_lab
from ootd.imaging.framing import FitInfo, restore_framing
from ootd.imaging.similarity import STRIP_PIXELS, ssim_by_region
from preprocess.regions import NO_REGION, REGIONS

CHANGED_DELTA_E = 10.0  # a pixel whose CIEDE2000 difference exceeds this changed
SEAM_LATENT = 8  # working-size pixels per latent pixel: how far a result blends across the mask's edge
MIN_SCORED_SHARE = 0.001  # a kept part smaller than this share of the picture is listed, not scored
SHOWN_SHARE = 0.0005  # the summary names the regions whose kept part changed at least this share (0.1% rounded)
SUMMARY_REGIONS = 3  # the most regions a summary names
PARTS = ("kept", "seam", "redrawn")  # a region's pixels: outside the mask and its seam, the seam, inside the mask
NO_ZONE = 255


@dataclass(frozen=True)
class PartFigures:
    """One part of one region: its pixels, their share of the picture, and (None without pixels) the mean SSIM,
    the mean CIEDE2000 difference and the share of its pixels that changed."""

    pixels: int
    share: float
    ssim: float | None = None
    delta_e: float | None = None
    changed: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"pixels": self.pixels, "share": _round(self.share), "ssim": _round(self.ssim),
                "delta_e": _round(self.delta_e), "changed": _round(self.changed)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartFigures:
        return cls(int(data["pixels"]), float(data["share"]), *(_number(data.get(k)) for k in ("ssim", "delta_e",
                                                                                                  "changed")))


@dataclass(frozen=True)
class RegionFigures:
    name: str
    pixels: int  # all of it, seam included; 0: the parse did not find it
    kept: PartFigures
    redrawn: PartFigures

    @property
    def absent(self) -> bool:
        return self.pixels == 0

    def to_json(self) -> dict[str, Any]:
        if self.absent:
            return {"absent": True}
        return {"absent": False, "pixels": self.pixels, "kept": self.kept.to_json(),
                "redrawn": self.redrawn.to_json()}

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> RegionFigures:
        if data.get("absent"):
            return cls(name, 0, PartFigures(0, 0.0), PartFigures(0, 0.0))
        return cls(name, int(data["pixels"]), PartFigures.from_json(data["kept"]),
                   PartFigures.from_json(data["redrawn"]))


@dataclass(frozen=True)
class Preservation:
    """One result's figures, region by region (REGIONS order)."""

    size: tuple[int, int]  # the picture's (width, height)
    seam: int  # pixels of the band outside the mask left out of `kept`
    regions: tuple[RegionFigures, ...]

    def region(self, name: str) -> RegionFigures:
        return next(r for r in self.regions if r.name == name)

    def scored(self) -> list[RegionFigures]:
        """The regions whose kept part counts towards the score, largest change first."""
        found = [r for r in self.regions if r.kept.changed is not None and r.kept.share >= MIN_SCORED_SHARE]
        return sorted(found, key=lambda r: (-(r.kept.changed or 0.0), REGIONS.index(r.name)))

    @property
    def score(self) -> float:
        """The largest share of a kept part that changed (0 to 1): the worse the higher."""
        scored = self.scored()
        return (scored[0].kept.changed or 0.0) if scored else 0.0

    def summary(self) -> str:
        """`hands 6.1%, face 0.2% changed`: the kept parts that changed most, or `unchanged`."""
        shown = [r for r in self.scored() if (r.kept.changed or 0.0) >= SHOWN_SHARE][:SUMMARY_REGIONS]
        if not shown:
            return "unchanged outside the mask"
        return ", ".join(f"{r.name} {percent(r.kept.changed or 0.0)}" for r in shown) + " changed"

    def to_json(self) -> dict[str, Any]:
        return {"size": f"{self.size[0]}x{self.size[1]}", "seam": self.seam, "changed_delta_e": CHANGED_DELTA_E,
                "score": _round(self.score), "summary": self.summary(),
                "regions": {r.name: r.to_json() for r in self.regions}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Preservation:
        """The figures `to_json` wrote (a batch report's line, preservation.jsonl); a ValueError when they are
        not that."""
        try:
            width, height = (int(v) for v in str(data["size"]).split("x"))
            regions = tuple(RegionFigures.from_json(name, data["regions"][name]) for name in REGIONS)
            return cls((width, height), int(data["seam"]), regions)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not preservation figures ({exc})") from None


def percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _round(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else round(float(value), 6)


def regions_at_working_size(labels: np.ndarray, keypoints: np.ndarray, model_type: str, fit: FitInfo
                            ) -> np.ndarray:
    """The regions of a parse (made on the framed person at 384x512, as the masks are) at the working size with
    the padding cut away: the frame of a result at the working size."""
    from PIL import Image

    from preprocess.regions import body_regions

    regions = Image.fromarray(body_regions(labels, keypoints, model_type)).resize(fit.size, Image.NEAREST)
    return np.asarray(restore_framing(regions, fit, keep_scale=True))


def zone_map(regions: np.ndarray, mask: np.ndarray, seam: int) -> np.ndarray:
    """Each pixel's zone, region * 3 + part (PARTS), NO_ZONE outside every region: the seam is the band of
    `seam` pixels (a square's reach, as a box blur spreads) just outside `mask`."""
    import cv2

    mask = np.asarray(mask, dtype=bool)
    part = np.where(mask, np.uint8(2), np.uint8(0))
    if seam > 0:
        grown = cv2.dilate(mask.astype(np.uint8), np.ones((2 * seam + 1, 2 * seam + 1), np.uint8)) > 0
        part[grown & ~mask] = 1
    regions = np.asarray(regions, dtype=np.uint8)
    return np.where(regions < len(REGIONS), regions * np.uint8(len(PARTS)) + part, np.uint8(NO_ZONE))


def _colour_sums(result: np.ndarray, photo: np.ndarray, zones: np.ndarray, count: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per zone: the sum of the CIEDE2000 differences and the number of pixels above CHANGED_DELTA_E."""
    sums, changed = np.zeros(count), np.zeros(count)
    height, width = zones.shape
    step = max(64, STRIP_PIXELS // max(width, 1))
    for r0 in range(0, height, step):
        where = zones[r0:r0 + step]
        inside = where < count
        if not inside.any():
            continue
        a, b = result[r0:r0 + step][inside], photo[r0:r0 + step][inside]
        differ = (a != b).any(axis=-1)  # equal pixels differ by exactly 0: only the others are converted
        de = np.zeros(len(a), dtype=np.float32)
        if differ.any():
            de[differ] = delta_e_2000(srgb_to_lab(a[differ], np.float32), srgb_to_lab(b[differ], np.float32))
        zone = where[inside]
        sums += np.bincount(zone, weights=de, minlength=count)[:count]
        changed += np.bincount(zone, weights=de > CHANGED_DELTA_E, minlength=count)[:count]
    return sums, changed


def measure_preservation(result: np.ndarray, photo: np.ndarray, regions: np.ndarray, mask: np.ndarray,
                         seam: int) -> Preservation:
    """The figures of `result` against `photo` (H x W x 3 uint8, the same frame), with each pixel's region
    (H x W, index in REGIONS or NO_REGION) and the repainted `mask` (H x W bool) in that frame."""
    if result.shape != photo.shape or result.shape[:2] != regions.shape or regions.shape != np.shape(mask):
        raise ValueError(f"result {result.shape}, photo {photo.shape}, regions {regions.shape} and mask "
                         f"{np.shape(mask)} differ in size")
    count = len(REGIONS) * len(PARTS)
    zones = zone_map(regions, mask, seam)
    pixels = np.bincount(zones[zones < count], minlength=count)[:count]
    ssims = ssim_by_region(result, photo, zones, count)
    colour, changed = _colour_sums(result, photo, zones, count)
    total = zones.size

    def part(zone: int) -> PartFigures:
        n = int(pixels[zone])
        if n == 0:
            return PartFigures(0, 0.0)
        return PartFigures(n, n / total, float(ssims[zone]), float(colour[zone] / n), float(changed[zone] / n))

    figures = []
    for index, name in enumerate(REGIONS):
        first = index * len(PARTS)
        figures.append(RegionFigures(name, int(pixels[first:first + len(PARTS)].sum()), part(first + 0),
                                     part(first + 2)))
    return Preservation((result.shape[1], result.shape[0]), seam, tuple(figures))


__all__ = ["CHANGED_DELTA_E", "NO_REGION", "REGIONS", "PartFigures", "Preservation", "RegionFigures",
           "measure_preservation", "percent"]
