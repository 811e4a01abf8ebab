"""Choosing attention backends: from a user's name and the device profile to a Dispatcher.

- `auto`: the profile's order, minus what cannot run here (flash not installed, sdpa on MPS, ...), then
  chunked if missing, then a size-limited math as last resort (see SMALL_MATH_BYTES; unlimited only if a
  user profile puts math in the order). On a GPU the first backend is checked once
  against math on a small random case; one that raises or disagrees is dropped with a warning.
- an explicit name: that backend (an error if it cannot run on this device/dtype at all), then chunked.
  math is never added unless it is the name.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch

from ootd.attention.backends import FlashBackend, MathBackend, SdpaBackend
from ootd.attention.base import Backend, BackendUnavailable
from ootd.attention.chunked import ChunkedBackend
from ootd.attention.dispatch import Dispatcher
from ootd.errors import UnsupportedError, UsageError
from ootd.hardware.device import DeviceInfo
from ootd.hardware.policy import attention_budget_for, free_memory
from ootd.hardware.profiles import DeviceProfile, load_profile
from ootd.settings import AttentionName

logger = logging.getLogger(__name__)

# Under auto, math may serve a call only if its fp32 score matrix is at most this big (e.g. 8 heads x
# 512 x 1024 tokens). Such calls are cheap either way; anything larger must go to a memory-efficient backend
# or fail loudly.
SMALL_MATH_BYTES = 16 << 20

# Self-check tolerance (max abs difference against math in fp32 on unit-variance inputs), by dtype: loose
# enough for rounding and TF32, tight enough to catch wrong kernels (errors of order 1, NaN).
CHECK_ATOL = {torch.float32: 2e-3, torch.float64: 1e-6, torch.float16: 1e-2, torch.bfloat16: 5e-2}
# Small cases shaped like the try-on UNet's attention (heads 8, head dims 40/80/160, queries vs 2x keys)
# and the CLIP vision tower (head dim 64).
CHECK_CASES = ((2, 8, 96, 192, 40), (1, 8, 64, 128, 80), (1, 8, 48, 96, 160), (1, 16, 65, 65, 64))


def make_backend(name: str, *, budget_bytes: int, profile: DeviceProfile | None = None,
                 math_limit: int | None = None) -> Backend:
    """One backend by name, configured from the profile (head-dim caps) and the chunk budget."""
    if name == AttentionName.MATH:
        return MathBackend(max_score_bytes=math_limit)
    if name == AttentionName.SDPA:
        return SdpaBackend(max_head_dim=profile.attention_sdpa_max_head_dim if profile else None)
    if name == AttentionName.FLASH:
        return FlashBackend()
    if name == AttentionName.CHUNKED:
        return ChunkedBackend(budget_bytes=budget_bytes)
    raise UsageError(f"unknown attention backend {name!r}: use one of {', '.join(AttentionName.words())}")


def check_backend(backend: Backend, device: torch.device | DeviceInfo, dtype: torch.dtype,
                  cases: Sequence[tuple[int, int, int, int, int]] = CHECK_CASES) -> str | None:
    """Run `backend` on small random cases on `device` and compare with math: None if it agrees, else why not.

    Cases the backend declares unsupported are skipped; if it supports none of them, the check says so.
    """
    torch_device = device.torch_device if isinstance(device, DeviceInfo) else torch.device(device)
    reference = MathBackend()
    atol = CHECK_ATOL.get(dtype, 1e-2)
    gen = torch.Generator().manual_seed(0)
    ran = 0
    for b, h, nq, nk, d in cases:
        q, k, v = (torch.randn(b, h, n, d, generator=gen).to(torch_device, dtype) for n in (nq, nk, nk))
        if backend.supports(q, k, v) is not None:
            continue
        try:
            out = backend(q, k, v, None)
        except BackendUnavailable as exc:
            return f"unavailable on the check case ({exc})"
        except Exception as exc:  # a broken kernel may fail in any way; that is what we are checking
            return f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
        expected = reference(q.float(), k.float(), v.float(), None)
        got = out.float()
        if got.shape != expected.shape:
            return f"wrong output shape {tuple(got.shape)}"
        if not torch.isfinite(got).all():
            return f"non-finite output at head dim {d}"
        err = (got - expected).abs().max().item()
        if err > atol:
            return f"differs from math by {err:.3g} (> {atol:g}) at head dim {d}"
        ran += 1
    return None if ran else "supports none of the check cases"


def build_attention(name: str, device: DeviceInfo, dtype: torch.dtype, budget_bytes: int | None = None, *,
                    profile: DeviceProfile | None = None, backends: Mapping[str, Backend] | None = None,
                    check_device: torch.device | None = None) -> Dispatcher:
    """The attention function for `--attention name` on `device` computing in `dtype`.

    `budget_bytes` bounds one chunked-attention step (default: from the profile and free memory).
    `backends` replaces or adds backends by name (tests, experiments); `check_device` is where the auto
    self-check runs (default: the device itself).
    """
    if name not in AttentionName.words() and (backends is None or name not in backends):
        raise UsageError(f"unknown attention {name!r}: use one of {', '.join(AttentionName.words())}")
    profile = profile or load_profile(device)
    budget = budget_bytes if budget_bytes is not None else attention_budget_for(free_memory(device), device, profile)
    extra = dict(backends or {})

    def get(backend_name: str, math_limit: int | None = None) -> Backend:
        if backend_name in extra:
            return extra[backend_name]
        return make_backend(backend_name, budget_bytes=budget, profile=profile, math_limit=math_limit)

    if name != AttentionName.AUTO:
        first = get(name)
        problem = _available(first, device, dtype)
        if problem is not None:
            raise unsupported_attention(name, problem)
        chosen = [first] if name in (AttentionName.CHUNKED, AttentionName.MATH) else [first, get(AttentionName.CHUNKED)]
        dispatcher = Dispatcher(chosen, label=name)
        logger.info("attention %s", dispatcher.describe())
        return dispatcher

    chosen = []
    for backend_name in profile.attention_order:
        backend = get(backend_name)  # math only if a (user) profile names it: then unlimited, as chosen
        problem = _available(backend, device, dtype)
        if problem is None:
            chosen.append(backend)
        else:
            logger.info("attention backend %s not used: %s", backend_name, problem)
    if device.is_gpu and profile.attention_self_check:
        chosen = _self_checked(chosen, check_device or device.torch_device, dtype)
    names = [b.name for b in chosen]
    if AttentionName.CHUNKED not in names:
        chosen.append(get(AttentionName.CHUNKED))
    if AttentionName.MATH not in names:
        chosen.append(get(AttentionName.MATH, math_limit=SMALL_MATH_BYTES))
    dispatcher = Dispatcher(chosen, label=AttentionName.AUTO.value)
    logger.info("attention %s", dispatcher.describe())
    return dispatcher


def unsupported_attention(name: str, problem: str) -> UnsupportedError:
    return UnsupportedError(f"attention {name} cannot run here: {problem}")


def check_attention(name: str, device: DeviceInfo, dtype: torch.dtype, profile: DeviceProfile | None = None) -> None:
    """An explicitly named backend that cannot run on this device and dtype (flash without flash-attn, or off a
    GPU): the UnsupportedError `build_attention` would raise, said before anything is loaded. Builds nothing."""
    if name == AttentionName.AUTO:
        return
    problem = _available(make_backend(name, budget_bytes=1, profile=profile), device, dtype)
    if problem is not None:
        raise unsupported_attention(name, problem)


def _available(backend: Backend, device: DeviceInfo, dtype: torch.dtype) -> str | None:
    check = getattr(backend, "available", None)
    return check(device.type, dtype) if check is not None else None


def _self_checked(chosen: list[Backend], device: torch.device, dtype: torch.dtype) -> list[Backend]:
    """Drop leading backends that fail the check, until one passes (checked once, at selection)."""
    while chosen:
        problem = check_backend(chosen[0], device, dtype)
        if problem is None:
            logger.info("attention backend %s passed the self-check on %s (%s)",
                        chosen[0].name, device, dtype)
            return chosen
        logger.warning("attention backend %s failed the self-check on %s (%s): %s; not using it",
                       chosen[0].name, device, dtype, problem)
        chosen = chosen[1:]
    return chosen
