"""What to try on: person, garment, category and an optional mask, each a file path, a PIL image or encoded bytes
(an HTTP upload has no path), with the names that outputs and messages use."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ootd.imaging.files import decode_image, load_image
from ootd.settings import Category

ROLES = ("person", "garment", "mask")


@dataclass(frozen=True)
class TryOnRequest:
    """What to try on. Each image is a path, a PIL image or encoded bytes. A `*_name` (a file name or path, e.g.
    an upload's file name) names an input in messages, output names and PNG metadata; without one, a path input
    is named by its path and an in-memory one by its role."""

    person: Any  # str | Path | bytes | PIL.Image.Image
    garment: Any
    category: Category
    mask: Any = None  # None: computed from pose + parsing
    person_name: str | None = None
    garment_name: str | None = None
    mask_name: str | None = None
    mask_checked: bool = False  # check_mask_input ran on the mask as given (the try-on then skips it)
    category_p: float | None = None  # the category came from `--category auto` with this probability

    def source(self, role: str) -> Any:
        return {"person": self.person, "garment": self.garment, "mask": self.mask}[role]

    def label(self, role: str) -> str:
        """How messages name an input: the given name, else the path as given, else the role."""
        given = {"person": self.person_name, "garment": self.garment_name, "mask": self.mask_name}[role]
        if given:
            return given
        value = self.source(role)
        return str(value) if isinstance(value, str | Path) else role

    def name(self, role: str) -> str:
        """The input's file name, used for output names and metadata (`alice.jpg`)."""
        return Path(self.label(role)).name or role

    def paths(self) -> list[Path]:
        """The inputs given as files (what no output may replace)."""
        return [Path(v) for v in (self.person, self.garment, self.mask) if isinstance(v, str | Path)]

    def key(self, role: str) -> str | None:
        """Identity of an input for reuse across pairs: the resolved path ("" without a mask); None for an
        image in memory, which is never reused (nothing is hashed to find out)."""
        value = self.source(role)
        if value is None:
            return ""
        if isinstance(value, str | Path):
            return str(Path(value).resolve())
        return None

    def pipeline_input(self, role: str) -> Any:
        """What the pipeline takes: paths and PIL images as they are, bytes decoded here."""
        value = self.source(role)
        if isinstance(value, bytes | bytearray):
            return decode_image(bytes(value), role, self.label(role))
        return value

    def decoded(self) -> TryOnRequest:
        """The same request with every image loaded now (cheap checks before models load); names kept."""
        loaded: dict[str, Any] = {}
        for role in ROLES:
            value = self.source(role)
            if value is None:
                continue
            loaded[f"{role}_name"] = self.label(role)
            loaded[role] = load_input(value, role, self.label(role))
        return replace(self, **loaded)


def load_input(value: Any, role: str, label: str) -> Any:
    """An input image loaded and checked: a path read, bytes decoded (`label` names them in errors), a PIL image
    as it is."""
    if isinstance(value, str | Path):
        return load_image(value, role)
    if isinstance(value, bytes | bytearray):
        return decode_image(bytes(value), role, label)
    return value
