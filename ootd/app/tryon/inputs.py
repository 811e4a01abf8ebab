"""What a job tries on: one person photo and one garment, or two (an outfit: an upper and a lower garment), each
with its category, an optional mask of the person photo, and the names outputs and messages use. Every front end
builds these from what its user gave (files, uploads, a batch row); images are paths, PIL images or encoded bytes.

A garment's category may still be `auto` here: `ootd.app.tryon.autocategory.resolve_inputs` classifies it, once,
before a job is planned from the inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ootd.app.tryon.masking import check_mask_input
from ootd.app.tryon.request import TryOnRequest, load_input
from ootd.settings import AUTO_CATEGORY, Category, CategoryWord, FitMode


@dataclass(frozen=True)
class GarmentInput:
    """One garment: its image, its category (or `auto`), its mask of the person photo (None: made from pose and
    parsing), the names messages and outputs use, and the probability `auto` gave its category."""

    image: Any
    category: CategoryWord
    mask: Any = None
    name: str | None = None
    mask_name: str | None = None
    category_p: float | None = None

    @property
    def resolved(self) -> bool:
        return self.category != AUTO_CATEGORY

    def label(self) -> str:
        """How messages name the garment: its given name, else its path, else `garment`."""
        return self.name or (str(self.image) if isinstance(self.image, str | Path) else "garment")

    def mask_label(self) -> str:
        return self.mask_name or (str(self.mask) if isinstance(self.mask, str | Path) else "mask")


@dataclass(frozen=True)
class JobInputs:
    """The person photo and its garments. `checked`: every image has been decoded and checked (step 2 of the
    pre-flight, ootd/app/tryon/preflight.py): the images are in memory under their names."""

    person: Any
    garments: tuple[GarmentInput, ...]
    person_name: str | None = None
    checked: bool = False
    files: tuple[Path, ...] = ()  # once checked: the inputs that were given as files
    photo: Any = None  # once checked: the person photo as given (results that are the photo start from it)

    @classmethod
    def of(cls, person: Any, garments: Sequence[GarmentInput], person_name: str | None = None) -> JobInputs:
        return cls(person, tuple(garments), person_name)

    @classmethod
    def single(cls, person: Any, garment: Any, category: CategoryWord, mask: Any = None, *,
               person_name: str | None = None, garment_name: str | None = None, mask_name: str | None = None,
               category_p: float | None = None) -> JobInputs:
        """One garment on one person."""
        return cls(person, (GarmentInput(garment, category, mask, garment_name, mask_name, category_p),),
                   person_name)

    def request(self, garment: GarmentInput) -> TryOnRequest:
        """The try-on of one garment on the photo (its category resolved)."""
        if not isinstance(garment.category, Category):
            raise ValueError("a garment's category is resolved before its try-on is planned")
        return TryOnRequest(self.person, garment.image, garment.category, garment.mask, person_name=self.person_name,
                            garment_name=garment.name, mask_name=garment.mask_name, mask_checked=self.checked,
                            category_p=garment.category_p)

    def person_label(self) -> str:
        return self.person_name or (str(self.person) if isinstance(self.person, str | Path) else "person")

    def paths(self) -> list[Path]:
        """The inputs given as files (what no output may replace)."""
        if self.checked:
            return list(self.files)
        values = [self.person, *(v for g in self.garments for v in (g.image, g.mask))]
        return [Path(v) for v in values if isinstance(v, str | Path)]

    def with_garments(self, garments: Sequence[GarmentInput]) -> JobInputs:
        return replace(self, garments=tuple(garments))

    def decoded(self, fit: FitMode, order: Sequence[GarmentInput] | None = None) -> JobInputs:
        """Every image loaded and checked now - not an image, truncated, too small or large, a mask of another
        aspect than the photo - with the names they had (step 2 of the pre-flight), the garments in `order` (the
        order their passes run) when given. Already checked: as it is."""
        if self.checked:
            return self
        person_label = self.person_label()
        person = load_input(self.person, "person", person_label)
        garments = list(self.garments)  # decoded in `order`, kept in the order given
        for garment in order or self.garments:
            label = garment.label()
            image = load_input(garment.image, "garment", label)
            mask_label, mask = None, None
            if garment.mask is not None:
                mask_label = garment.mask_label()
                mask = load_input(garment.mask, "mask", mask_label)
                check_mask_input(TryOnRequest(person, image, garment.category, mask, person_name=person_label,
                                              garment_name=label, mask_name=mask_label),
                                 raw_mask=garment.mask, fit=fit)
            garments[self.garments.index(garment)] = replace(garment, image=image, name=label, mask=mask,
                                                             mask_name=mask_label)
        return replace(self, person=person, person_name=person_label, garments=tuple(garments), checked=True,
                       files=tuple(self.paths()), photo=self.person)

    @property
    def photo_source(self) -> Any:
        """The person photo as the user gave it (a path, bytes or an image), before any decoding."""
        return self.photo if self.checked else self.person
