"""One try-on: a request (person, garment, category, optional mask) -> the pipeline's result plus what saving needs.

`run_tryon` is the one place the try-on sequence lives (prepare the person, say plainly when no person is found,
prepare the garment, generate); `ootd run`, `ootd batch`, `run/run_ootd.py` and the service front ends all call
it. Inputs may be file paths, PIL images or encoded image bytes (an HTTP upload has no path), so the names used
for output files and metadata travel in the request.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ootd.app.config import RunConfig
from ootd.config import Category, ModelType
from ootd.errors import NoPersonError
from ootd.images import decode_image

if TYPE_CHECKING:

    from ootd.pipeline import TryOnResult

Progress = Callable[[str, int, int], None]  # (stage, done, total), as the pipeline reports it
ROLES = ("person", "garment", "mask")
PERSON_STAGES = ("preprocess", "encode_person")  # result timings that belong to preparing the person
GARMENT_STAGES = ("conditioning", "encode_garment", "garment_unet")  # ... and to preparing the garment


class InputCache(Protocol):
    """Where prepared inputs may be reused (the batch engine's LRU): value and whether it was computed now."""

    def get(self, key: tuple, compute: Callable[[], Any]) -> tuple[Any, bool]: ...


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
    mask_checked: bool = False  # check_mask_input ran on the mask as given (run_tryon then skips it)

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

    def key(self, role: str) -> str | None:
        """Identity of an input for reuse: the resolved path, a digest of bytes, None for a PIL image."""
        value = self.source(role)
        if value is None:
            return ""
        if isinstance(value, str | Path):
            return str(Path(value).resolve())
        if isinstance(value, bytes | bytearray):
            return "sha256:" + hashlib.sha256(value).hexdigest()
        return None

    def pipeline_input(self, role: str) -> Any:
        """What the pipeline takes: paths and PIL images as they are, bytes decoded here."""
        value = self.source(role)
        if isinstance(value, bytes | bytearray):
            return decode_image(bytes(value), role, self.label(role))
        return value

    def decoded(self) -> TryOnRequest:
        """The same request with every image loaded now (cheap checks before models load); names kept."""
        from ootd.images import load_image

        loaded: dict[str, Any] = {}
        for role in ROLES:
            value = self.source(role)
            if value is None:
                continue
            loaded[f"{role}_name"] = self.label(role)
            loaded[role] = load_image(value, role) if isinstance(value, str | Path) else self.pipeline_input(role)
        return replace(self, **loaded)


@dataclass
class TryOnOutcome:
    """A finished try-on: the pipeline's result, the request it answers and what saving and reports need."""

    request: TryOnRequest
    model_type: ModelType
    result: TryOnResult
    info: dict[str, Any] = field(default_factory=dict)  # describe_pipeline(...) after the call
    reused: dict[str, bool] = field(default_factory=lambda: {"person": False, "garment": False})

    def timings(self) -> dict[str, Any]:
        """Seconds per stage of this try-on, leaving out stages of inputs reused from an earlier one."""
        skip = (PERSON_STAGES if self.reused["person"] else ()) + (GARMENT_STAGES if self.reused["garment"] else ())
        return {k: v for k, v in (self.result.timings or {}).items() if k not in skip and k != "total"}


def no_person_error(person: str | Path) -> NoPersonError:
    """The pose model's error, naming the file and the way around it."""
    return NoPersonError(
        f"no person detected in {person} (pose estimation found nobody; use a photo showing one person, "
        "or give a mask image with --mask)"
    )


def check_person(request: TryOnRequest, config: RunConfig, preprocessor: Any) -> None:
    """Run pose + parsing on the person (framed as the pipeline frames it) before any diffusion model loads:
    "no person detected" in seconds. With a `RememberingPreprocessor` the pipeline reuses this mask."""
    from ootd.framing import fit_to_aspect
    from ootd.images import load_image

    if request.mask is not None:
        return
    person = request.pipeline_input("person")
    if isinstance(person, str | Path):
        person = load_image(person, "person")
    framed, _ = fit_to_aspect(person, config.sampling.resolution.size, str(config.fit), pad_color="edge")
    try:
        preprocessor(framed, request.category, config.model_type_for(request.category), grow=config.mask_grow)
    except NoPersonError:
        raise no_person_error(request.label("person")) from None


def _frame_like_results(result: Any, fit: Any) -> None:
    """Crop the padding off the intermediates (mask, masked person, pose, parsing) as the pipeline crops it off
    the results, so every saved picture of a --fit pad try-on has the photo's framing."""
    from ootd.framing import restore_framing

    intermediates = getattr(result, "intermediates", None)
    if fit is None or not intermediates:
        return
    result.intermediates = {k: restore_framing(v, fit, keep_scale=True) for k, v in intermediates.items()}


def _cached(cache: InputCache | None, key: tuple | None, compute: Callable[[], Any]) -> tuple[Any, bool]:
    if cache is None or key is None:
        return compute(), True
    return cache.get(key, compute)


def run_tryon(
    pipe: Any, request: TryOnRequest, config: RunConfig, progress: Progress | None = None,
    callback: Callable[..., Any] | None = None, *, persons: InputCache | None = None,
    garments: InputCache | None = None,
) -> TryOnOutcome:
    """The try-on sequence: prepare the person (no person found: its error, naming the file), prepare the
    garment, generate. `persons`/`garments` let a batch reuse prepared inputs; `callback` goes to the
    pipeline's per-step hook."""
    from ootd.app.outputs import describe_pipeline

    tick = progress or (lambda stage, done, total: None)
    category = request.category
    model_type = config.model_type_for(category)
    resolution = config.sampling.resolution
    fit = str(config.fit)

    def prepare_person() -> Any:
        from ootd.app.masking import check_mask_input

        tick("person", 0, 1)
        check_mask_input(request, fit=fit)
        mask = request.pipeline_input("mask") if request.mask is not None else None
        try:
            prepared = pipe.prepare_person(request.pipeline_input("person"), category, mask=mask,
                                           resolution=resolution, fit=fit, mask_grow=config.mask_grow)
        except NoPersonError:
            raise no_person_error(request.label("person")) from None
        tick("person", 1, 1)
        return prepared

    def prepare_garment() -> Any:
        tick("garment", 0, 1)
        prepared = pipe.prepare_garment(request.pipeline_input("garment"), category, resolution=resolution, fit=fit)
        tick("garment", 1, 1)
        return prepared

    person_key = request.key("person"), request.key("mask")
    person, person_new = _cached(persons, None if None in person_key else (model_type, category, *person_key),
                                 prepare_person)
    garment_key = request.key("garment")
    garment, garment_new = _cached(garments, None if garment_key is None else (model_type, category, garment_key),
                                   prepare_garment)
    extra = {"callback": callback} if callback is not None else {}

    def staged(stage: str, done: int, total: int) -> None:  # the decode starts when the last step ends
        tick(stage, done, total)
        if stage == "denoise" and done == total:
            tick("decode", 0, config.sampling.num_samples)

    result = pipe.generate(person, garment, config.sampling, progress=staged if progress else None, **extra)
    _frame_like_results(result, getattr(person, "fit", None))
    return TryOnOutcome(request, model_type, result, describe_pipeline(pipe, config),
                        {"person": not person_new, "garment": not garment_new})

