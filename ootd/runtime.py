"""Where and how a pipeline runs, resolved once per process from typed choices: device, profile, precision,
quantization, attention backend, speed options.

`RuntimeRequest` is what a user chose (words parsed at the edge: ootd/app/tryon/config.py, or the library's
`TryOnPipeline.from_pretrained`). `choose_hardware` says what it means on this machine without initialising a GPU
(the device as far as it can be seen from outside, its profile, precision, quantization): the pre-flight checks and
the memory budget read it before anything loads. `resolve_runtime` then applies the runtime environment (allocator,
kernels: before torch initialises the device), detects the device and makes the same choices on what it found. The
application layer resolves each once and hands the result to everything it loads (ootd/app/tryon/loader.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ootd.attention import AttentionFn, build_attention
from ootd.hardware.device import DeviceInfo, detect_device, peek_device
from ootd.hardware.policy import (
    Precision,
    SpeedOptions,
    apply_environment,
    choose_precision,
    choose_quantization,
    choose_speed,
    keep_freed_memory,
    malloc_heap_bytes,
    runtime_environment,
)
from ootd.hardware.profiles import DeviceProfile, load_profile
from ootd.hardware.torch_builds import require_usable_torchvision
from ootd.settings import AttentionName, PrecisionName, QuantizeName


@dataclass(frozen=True)
class RuntimeRequest:
    """Where and how to run, as chosen: each field typed, checked where it was parsed."""

    device: str | None = None  # a checked device word (ootd/hardware/spec.py); None: the best available
    precision: PrecisionName = PrecisionName.AUTO  # auto: the device profile's choice
    attention: AttentionName = AttentionName.AUTO
    quantize: QuantizeName = QuantizeName.NONE
    channels_last: bool | None = None  # None: the device profile's choice
    compile: bool | None = None
    profile: Path | None = None  # a TOML file over the device's profile (configs/profiles/)
    threads: int | None = None  # torch's CPU threads (and ONNX Runtime's); None: as the process has them


@dataclass(frozen=True)
class HardwareChoice:
    """What a request means on this machine, known without initialising a GPU."""

    device: DeviceInfo  # as seen from outside: no memory figures
    profile: DeviceProfile
    precision: Precision
    quantize: QuantizeName


@dataclass(frozen=True)
class Runtime:
    """Everything a pipeline needs to know about where and how it runs. `attention` is the backend chosen (each
    pipeline builds its own dispatcher: `attention_fn`), or a function a library user handed in."""

    device: DeviceInfo
    profile: DeviceProfile
    precision: Precision
    attention: AttentionName | AttentionFn
    speed: SpeedOptions
    quantize: QuantizeName = QuantizeName.NONE
    threads: int | None = None  # the CPU threads applied (None: the process's, untouched)

    def attention_fn(self) -> AttentionFn:
        """A new attention dispatcher of the chosen backend (its own call counts), or the given function."""
        if isinstance(self.attention, AttentionName):
            return build_attention(self.attention, self.device, self.precision.unet, profile=self.profile)
        return self.attention


def choose_hardware(request: RuntimeRequest) -> HardwareChoice:
    """The device (peeked), its profile, precision and quantization for `request`; an UnsupportedError when this
    machine cannot run them (fp16 on the CPU, fp8 without float8 units) or when an installed torchvision does not
    fit torch (transformers and diffusers import it whenever it is there: every model would fail)."""
    require_usable_torchvision()
    info = peek_device(request.device)
    profile = load_profile(info, request.profile)
    precision = choose_precision(info, request.precision, profile)
    return HardwareChoice(info, profile, precision, choose_quantization(info, request.quantize, precision.unet))


def resolve_runtime(request: RuntimeRequest, attention: AttentionFn | None = None) -> Runtime:
    """The runtime of `request`: environment applied, device detected, the choices made on it. `attention`: a
    function to run instead of the chosen backend (tests, experiments)."""
    require_usable_torchvision()
    # runtime settings (allocator, kernels) must be in place before torch initialises the device
    apply_environment(runtime_environment(peek_device(request.device), torch.__version__))
    info = detect_device(request.device)
    profile = load_profile(info, request.profile)
    precision = choose_precision(info, request.precision, profile)
    quantization = choose_quantization(info, request.quantize, precision.unet)
    options = choose_speed(info, profile, channels_last=request.channels_last, compile=request.compile,
                           vae_dtype=precision.vae)
    keep_freed_memory(malloc_heap_bytes(info, profile))  # CPU: no page faults per new tensor
    if request.threads is not None and torch.get_num_threads() != request.threads:
        torch.set_num_threads(request.threads)  # a float sum's last bit depends on how many threads share it
    return Runtime(info, profile, precision, attention or request.attention, options, quantization, request.threads)
