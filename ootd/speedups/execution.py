"""Putting the speed options (ootd.hardware.policy.SpeedOptions) into effect on the networks and their inputs.

Both options keep the computation: channels_last only changes how convolution activations are laid out in
memory (oneDNN/cuDNN then pick NHWC kernels), torch.compile only fuses and schedules the same operations.

One kernel does not keep it: PyTorch's CPU GroupNorm for channels-last input sums x and x^2 in one float32
pass, which loses the variance of a group whose mean is large against its spread (errors up to ~1e-2 where the
NCHW kernel stays at ~1e-6). `set_memory_format(..., True)` therefore gives the networks' GroupNorm modules a
forward (`ChannelsLastGroupNorm`) that computes the statistics of channels-last CPU input in two passes
(per-channel mean and variance, combined per group exactly) and normalises with the same per-channel affine
formula the NCHW kernel uses: the NCHW kernel's precision in either layout. In the default layout the modules
keep PyTorch's own GroupNorm, and compute exactly what they did (in diffusers' VAE the residual stream after
the mid-block attention is a channels-last view even then, and its GroupNorms take the NHWC kernel, as in the
original).
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
    inference mode: a quantized weight, a tensor subclass, is swapped for a new tensor; ootd/memory/residency.py);
    their GroupNorm modules get the channels-last forward that keeps NCHW's precision, or PyTorch's own back."""
    fmt = memory_format(channels_last)
    with torch.inference_mode(False):
        for module in modules:
            module.to(memory_format=fmt)
            precise_group_norms(module, channels_last)


def precise_group_norms(module: torch.nn.Module, on: bool = True) -> None:
    """Every nn.GroupNorm in `module` becomes a ChannelsLastGroupNorm (on) or PyTorch's own again (off): the
    same parameters and state dict either way."""
    for norm in module.modules():
        if isinstance(norm, torch.nn.GroupNorm) and type(norm) in (torch.nn.GroupNorm, ChannelsLastGroupNorm):
            norm.__class__ = ChannelsLastGroupNorm if on else torch.nn.GroupNorm


class ChannelsLastGroupNorm(torch.nn.GroupNorm):
    """nn.GroupNorm with NCHW's precision for channels-last input on the CPU (see the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _channels_last_on_cpu(x) and not torch.compiler.is_compiling():  # inductor lowers GroupNorm itself
            return group_norm_channels_last(x, self.num_groups, self.weight, self.bias, self.eps)
        return super().forward(x)


def _channels_last_on_cpu(x: torch.Tensor) -> bool:
    """NHWC on the CPU in a dtype the two-pass path takes; a tensor that is both layouts (1x1 images, one
    channel) is NCHW to the stock kernel too."""
    return (x.device.type == "cpu" and x.dim() == 4 and x.dtype in (torch.float32, torch.bfloat16)
            and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous())


def group_norm_channels_last(x: torch.Tensor, groups: int, weight: torch.Tensor | None, bias: torch.Tensor | None,
                             eps: float) -> torch.Tensor:
    """GroupNorm of a channels-last (N, C, H, W) CPU tensor, as precise as the NCHW kernel, in x's layout.

    Per image, each channel's mean and (biased) variance: for bf16, batch norm's statistics kernel (two passes,
    in float32 when its running buffers are float32; its float32 sums are ~1e-4 off at a million pixels, far
    below bf16's step); for fp32, PyTorch's cascaded sums of x and of (x - mean)^2 (~1e-7). A group's variance is
    the mean of its channels' variances plus the variance of their means (exact for equal-sized parts); batch
    norm's inference kernel then computes x * (w / std) + (b - mean * w / std) in float32, the NCHW GroupNorm
    kernel's formula, and rounds once.
    """
    n, c = x.shape[:2]
    out = torch.empty_like(x)
    running_mean = torch.zeros(c, dtype=torch.float32, device=x.device)  # float32 buffers: float32 statistics
    running_var = torch.ones(c, dtype=torch.float32, device=x.device)
    w = weight.float() if weight is not None else None  # bf16 input takes float32 parameters
    b = bias.float() if bias is not None else None
    unused = torch.empty(0, dtype=torch.float32, device=x.device)
    for i in range(n):
        image = x[i: i + 1]
        if x.dtype is torch.float32:
            rows = image.permute(0, 2, 3, 1).reshape(-1, c)  # (H*W, C): a view of the NHWC memory
            mean_c = rows.sum(0) / rows.shape[0]
            var_c = (rows - mean_c).square_().sum(0) / rows.shape[0]
        else:
            mean_c, var_c = torch.batch_norm_update_stats(image, running_mean, running_var, 0.0)
        mean_c, var_c = mean_c.view(groups, -1), var_c.view(groups, -1)
        mean_g = mean_c.mean(1, keepdim=True)
        var_g = (var_c + (mean_c - mean_g).square()).mean(1, keepdim=True)
        torch.ops.aten.native_batch_norm.out(image, w, b, mean_g.expand_as(mean_c).reshape(c),
                                             var_g.expand_as(var_c).reshape(c), False, 0.0, eps,
                                             out=out[i: i + 1], save_mean=unused, save_invstd=unused)
    return out


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
            set_memory_format([module], was)


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
    return DeviceError.about("compile", "torch.compile failed ({first}); run without {@compile}", value=True,
                             first=first[:200])
