"""Feature caching across denoising steps (DeepCache-style): an opt-in speed mode that changes the output.

Adjacent denoising steps change the deep, low-resolution features of a UNet little. On a refresh step (every
`interval`-th, starting with the first) the try-on UNet runs whole and the feature that enters its shallowest up
block (the output of the up block before it) is kept. On the steps in between only the shallow path runs: the
input convolution, the first down block (without its downsampler), the last up block and the output layers; the
deeper down blocks, the mid block and the deeper up blocks are skipped, and the kept feature stands in for what
they would have produced. The shallow blocks run as always, with their fusion self-attention over the garment
tokens (ootd/method/fusion.py).

This works on the stock diffusers UNet2DConditionModel through hooks and per-instance `forward` replacements
of its sub-modules for the duration of one call, never a copy of its forward. The step index comes from the
sampling loop's per-step callback (`FeatureCacheHook.on_step`, ootd/method/sampling.py). A call of the UNet
within a step (guidance split into two halves calls it twice per step) reuses the feature kept by the same call
of the refresh step. Interval 1 is today's exact path: the pipeline installs nothing then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ootd.errors import UsageError
from ootd.speedups.modes import FeatureCache


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


class FeatureCacheHook:
    """Reuse the deep part of `unet`'s computation for `interval - 1` steps after each refresh step."""

    def __init__(self, unet: torch.nn.Module, interval: int) -> None:
        if len(unet.down_blocks) < 2 or len(unet.up_blocks) < 2:
            raise UsageError("feature caching needs a UNet with at least two levels")
        self.unet = unet
        self.interval = interval
        self.step = 0  # the step the next UNet calls belong to
        self.call = 0  # UNet calls so far within this step
        self.kept: list[torch.Tensor] = []  # per call within a refresh step: the input of the last up block
        self.cached_calls = 0  # UNet calls that reused the kept feature (for tests and reports)
        self._replaced: list[tuple[torch.nn.Module, Any]] = []  # (module, its own instance forward or None)
        first = unet.down_blocks[0]
        self._skipped: list[tuple[torch.nn.Module, Any]] = [
            *((m, self._down_stub(m)) for m in list(unet.down_blocks)[1:]),
            *((m, lambda *a, **k: _hidden(a, k)) for m in (first.downsamplers or [])),
            *((m, lambda *a, **k: _hidden(a, k)) for m in [unet.mid_block] if m is not None),
            *((m, lambda *a, **k: _hidden(a, k)) for m in list(unet.up_blocks)[:-2]),
            (unet.up_blocks[-2], self._kept_feature),
        ]

    @staticmethod
    def _down_stub(block: torch.nn.Module) -> Any:
        """A skipped down block returns as many skip tensors as the real one (the UNet slices them per up
        block); the skipped up blocks are the only ones that would read them."""
        count = len(block.resnets) + (1 if getattr(block, "downsamplers", None) else 0)

        def stub(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
            hidden = _hidden(args, kwargs)
            return hidden, (hidden,) * count

        return stub

    def _kept_feature(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.call >= len(self.kept):
            raise RuntimeError("feature cache: no feature kept for this call (the calls per step changed)")
        return self.kept[self.call]

    def refreshing(self) -> bool:
        return self.step % self.interval == 0

    def on_step(self, step: int, t: torch.Tensor, latents: torch.Tensor) -> None:
        """The sampling loop's step callback: the next calls belong to step `step + 1`."""
        self.step, self.call = step + 1, 0

    def _before(self, _module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if self.refreshing():
            if self.call == 0:
                self.kept = []
            return
        for module, stub in self._skipped:
            # an instance attribute: nn.Module.__call__ runs it instead of the class's (or accelerate's wrapper)
            self._replaced.append((module, module.__dict__.get("forward")))
            module.forward = stub

    def _restore(self) -> None:
        for module, own in self._replaced:
            if own is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = own
        self._replaced = []

    def _after(self, _module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if not self.refreshing():
            self.cached_calls += 1
        self._restore()
        self.call += 1

    def _keep(self, _module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        if self.refreshing():
            self.kept.append(output)

    @contextlib.contextmanager
    def installed(self) -> Iterator[FeatureCacheHook]:
        """The hooks, for one denoising run (a fresh instance per run: the step count starts at 0)."""
        handles = [
            self.unet.register_forward_pre_hook(self._before, with_kwargs=True),
            self.unet.register_forward_hook(self._after, with_kwargs=True, always_call=True),
            self.unet.up_blocks[-2].register_forward_hook(self._keep),
        ]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()
            self._restore()
            self.kept = []


@contextlib.contextmanager
def feature_cache(unet: torch.nn.Module, caching: FeatureCache) -> Iterator[FeatureCacheHook | None]:
    """The hook installed on `unet` for one denoising run, or None (nothing installed) for interval 1."""
    if not caching.on:
        yield None
        return
    with FeatureCacheHook(unet, caching.interval).installed() as cache:
        yield cache
