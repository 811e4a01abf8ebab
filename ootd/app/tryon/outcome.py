"""A finished pass of a try-on (TryOnOutcome) and what the passes hand around: the caches of prepared inputs a
batch passes in, and which timings belong to preparing which input."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ootd.app.tryon.request import TryOnRequest
from ootd.pipeline_types import Timings
from ootd.settings import ModelType

if TYPE_CHECKING:
    from ootd.app.tryon.config import RunConfig
    from ootd.pipeline_types import RunInfo, TryOnResult
    from ootd.preprocessing import PhotoParse

PERSON_STAGES = ("preprocess", "encode_person")  # result timings that belong to preparing the person
GARMENT_STAGES = ("conditioning", "encode_garment", "garment_unet")  # ... and to preparing the garment


class InputCache(Protocol):
    """Where prepared inputs may be reused (the batch engine's LRU): value and whether it was computed now."""

    def get(self, key: tuple, compute: Callable[[], Any]) -> tuple[Any, bool]: ...


@dataclass
class TryOnOutcome:
    """A finished pass: the pipeline's result, the request and config it ran and what saving and reports need."""

    request: TryOnRequest
    model_type: ModelType
    result: TryOnResult
    ran: RunInfo  # where and how the call ran (the result's, or a stand-in's attributes)
    reused: dict[str, bool] = field(default_factory=lambda: {"person": False, "garment": False})
    config: RunConfig | None = None
    parse: PhotoParse | None = None  # the photo's pose + parsing its automatic mask came from (prepared person's)

    def timings(self) -> Timings:
        """Seconds per stage of this try-on, leaving out stages of inputs reused from an earlier one."""
        skip = (PERSON_STAGES if self.reused["person"] else ()) + (GARMENT_STAGES if self.reused["garment"] else ())
        own = Timings()
        own.extend(self.result.timings, leave_out=skip)
        return own
