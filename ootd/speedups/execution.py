"""Putting the speed options (ootd.hardware.device.SpeedOptions) into effect on the networks and their inputs.

Both options keep the computation: channels_last only changes how convolution activations are laid out in
memory (oneDNN/cuDNN then pick NHWC kernels), torch.compile only fuses and schedules the same operations.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch

from ootd.errors import DeviceError


def memory_format(channels_last: bool) -> torch.memory_format:
    return torch.channels_last if channels_last else torch.contiguous_format


def set_memory_format(modules: Iterable[torch.nn.Module], channels_last: bool) -> None:
    """Lay the 4-D (convolution) weights of `modules` out as channels_last, or back to the default (outside
    inference mode: a quantized weight, a tensor subclass, is swapped for a new tensor; ootd/memory/residency.py)."""
    fmt = memory_format(channels_last)
    with torch.inference_mode(False):
        for module in modules:
            module.to(memory_format=fmt)


def as_memory_format(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """A 4-D image/latent batch in the layout the networks run in (always dense, never a strided view)."""
    if x.dim() != 4:
        return x
    return x.contiguous(memory_format=memory_format(channels_last))


@contextlib.contextmanager
def temporary_memory_format(modules: Iterable[torch.nn.Module], channels_last: bool) -> Iterator[None]:
    """Run something with the modules in another layout (the benchmark's original formulation runs in the
    default layout, as the original does) and restore the layout they had."""
    modules = list(modules)
    before = [_is_channels_last(m) for m in modules]
    set_memory_format(modules, channels_last)
    try:
        yield
    finally:
        for module, was in zip(modules, before, strict=True):
            module.to(memory_format=memory_format(was))


def _is_channels_last(module: torch.nn.Module) -> bool:
    for param in module.parameters():
        if param.dim() == 4 and param.shape[1] > 1 and param.shape[-1] > 1:
            return param.is_contiguous(memory_format=torch.channels_last) and not param.is_contiguous()
    return False


def compile_module(module: torch.nn.Module) -> None:
    """torch.compile the module's forward in place (compiled on its first call, per input shape)."""
    if getattr(module, "_compiled_call_impl", None) is None:
        module.compile(dynamic=False)


@contextlib.contextmanager
def uncompiled(module: torch.nn.Module) -> Iterator[None]:
    """Run a compiled module eagerly for a while (the benchmark's original formulation is not compiled)."""
    saved = getattr(module, "_compiled_call_impl", None)
    module._compiled_call_impl = None
    try:
        yield
    finally:
        module._compiled_call_impl = saved


def is_compile_failure(exc: BaseException) -> bool:
    """Whether an exception comes from torch.compile itself (no C++ compiler, an unsupported operation)."""
    try:
        from torch._dynamo.exc import TorchDynamoException
    except ImportError:  # pragma: no cover - every supported torch has it
        return False
    return isinstance(exc, TorchDynamoException)


def compile_error(exc: BaseException) -> DeviceError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DeviceError(f"torch.compile failed ({first[:200]}); run without --compile")
