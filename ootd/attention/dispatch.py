"""Dispatcher: an AttentionFn that tries backends in order and records which one served each call."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

import torch

from ootd.attention.base import Backend, BackendUnavailable
from ootd.errors import DeviceError

logger = logging.getLogger(__name__)


class Dispatcher:
    """Calls the first backend in `backends` that can serve a call.

    A backend is passed over when its `supports()` gives a reason or when it raises BackendUnavailable
    (e.g. no fused SDPA kernel took the input). Each (backend, reason) is logged once per dispatcher at
    warning level, so a fallback is visible but does not flood the log. Other exceptions (out of memory,
    shape bugs) propagate: falling back on those would hide real problems or trade them for a slower one.
    `used` counts eager calls served per backend name, for reports (calls inside a torch.compile'd graph are
    decided once, while tracing, and not counted).
    """

    def __init__(self, backends: Sequence[Backend], label: str = "custom") -> None:
        if not backends:
            raise DeviceError("no attention backend to dispatch to")
        self.backends: tuple[Backend, ...] = tuple(backends)
        self.label = label  # what the user asked for (auto, sdpa, ...), for messages
        self.used: Counter[str] = Counter()
        self._reported: set[tuple[str, str]] = set()

    @property
    def order(self) -> list[str]:
        return [b.name for b in self.backends]

    def describe(self) -> str:
        """One line for logs and reports, e.g. 'auto: sdpa > chunked > math (used: sdpa x 32)'."""
        used = ", ".join(f"{name} x {count}" for name, count in self.used.most_common())
        return f"{self.label}: {' > '.join(self.order)}" + (f" (used: {used})" if used else "")

    def _pass_over(self, backend: Backend, reason: str) -> None:
        key = (backend.name, reason)
        if key not in self._reported:
            self._reported.add(key)
            logger.warning("attention backend %s passed over: %s; trying the next one", backend.name, reason)

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
    ) -> torch.Tensor:
        reasons: list[str] = []
        for backend in self.backends:
            reason = backend.supports(q, k, v)
            if reason is None:
                try:
                    out = backend(q, k, v, scale)
                except BackendUnavailable as exc:
                    reason = str(exc)
                else:
                    if not torch.compiler.is_compiling():  # a counter in a compiled graph would recompile it
                        self.used[backend.name] += 1
                    return out
            reasons.append(f"{backend.name}: {reason}")
            self._pass_over(backend, reason)
        raise DeviceError(
            f"no attention backend ({self.label}) can serve q {tuple(q.shape)} k {tuple(k.shape)} "
            f"{q.dtype} on {q.device}: " + "; ".join(reasons)
        )

    def __repr__(self) -> str:
        return f"Dispatcher({self.describe()})"
