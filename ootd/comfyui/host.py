"""ootd as a guest of ComfyUI: ComfyUI's device, its model management, its Cancel button, its progress bar.

- The device is ComfyUI's (`--cpu` gives the CPU); ootd's per-device profile then chooses precision and attention.
  A device ootd does not run on (XPU, NPU, DirectML) is refused in one line.
- Before ootd loads a model, ComfyUI's model management is asked to free what it holds on that device until the
  model and its working memory fit (`free_memory`, as ComfyUI does before loading its own). Each model ootd holds
  is then counted among ComfyUI's loaded models (a stand-in with the model's size), so ComfyUI sees the memory,
  unloads it when it needs room for its own models, after an out-of-memory error, or when asked to ("free memory",
  `POST /free`), and ootd's model is released then.
- Cancel (`POST /interrupt`) is checked at every denoising step and every stage ootd reports: the run stops there
  with ComfyUI's own interruption, and the node hands nothing on.

Imported only inside ComfyUI (it imports ComfyUI's modules).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import comfy.model_management as mm
import comfy.utils
import torch

from ootd.errors import UnsupportedError

logger = logging.getLogger("ootd.comfyui")

OOTD_DEVICE_TYPES = ("cpu", "cuda", "mps")  # ROCm GPUs are "cuda" in PyTorch


def device_word() -> str:
    """ComfyUI's device as ootd's device word (`cpu`, `cuda:0`, `mps`)."""
    device = mm.get_torch_device()
    if not isinstance(device, torch.device) or device.type not in OOTD_DEVICE_TYPES:
        raise UnsupportedError(f"ComfyUI runs on {device}, which ootd does not run on (CUDA, ROCm, Apple MPS or "
                               f"the CPU): start ComfyUI with --cpu, or on one of those")
    return str(device)


class OotdModel:
    """What ComfyUI's log and its model list name an ootd model by (`Requested to load OotdModel`)."""

    def __init__(self, name: str) -> None:
        self.name = name


class Resident:
    """One model ootd holds, as ComfyUI's model management sees a loaded model: its size on its device, fully
    loaded, never partly unloadable; unloading it (`detach`) releases ootd's model."""

    def __init__(self, name: str, nbytes: int, release: Callable[[], None], device: torch.device) -> None:
        self.model = OotdModel(name)
        self.nbytes = int(nbytes)
        self.release = release
        self.load_device = device
        self.offload_device = torch.device("cpu")
        self.parent = None
        self.loaded = True

    def model_size(self) -> int:
        return self.nbytes

    def loaded_size(self) -> int:
        return self.nbytes if self.loaded else 0

    def current_loaded_device(self) -> torch.device:
        return self.load_device

    def lowvram_patch_counter(self) -> int:
        return 0

    def model_dtype(self) -> None:
        return None

    def model_patches_to(self, device: Any) -> None:
        return None

    def model_patches_models(self) -> list[Any]:
        return []

    def partially_load(self, device: Any, extra_memory: float = 0, force_patch_weights: bool = False) -> int:
        return 0  # loaded whole by ootd already

    def partially_unload(self, device: Any, memory_to_free: float = 0, force_patch_weights: bool = False) -> int:
        return 0  # all or nothing: ComfyUI then unloads it whole

    def is_clone(self, other: Any) -> bool:
        return other is self

    def detach(self, unpatch_all: bool = True) -> None:
        """ComfyUI unloads it: ootd releases the model (once)."""
        if self.loaded:
            self.loaded = False
            logger.info("ootd: ComfyUI unloads %s", self.model.name)
            self.release()


_KEPT: list[Resident] = []


def keep(resident: Resident) -> None:
    """Hold a strong reference to every model ComfyUI lists, and to one it unloaded until it has let go of it.
    ComfyUI keeps only weak ones, with a finalizer that edits its list of loaded models; a stand-in that vanished
    the moment ComfyUI unloaded it would edit that list while ComfyUI walks it."""
    listed = {id(loaded.model) for loaded in mm.current_loaded_models if loaded.model is not None}
    _KEPT[:] = [r for r in _KEPT if id(r) in listed or r.loaded] + [resident]


class ComfyHost:
    """The Host of ootd/comfyui/backend.py inside ComfyUI."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device or mm.get_torch_device()

    def make_room(self, nbytes: int) -> None:
        free = mm.get_free_memory(self.device)
        logger.info("ootd: needs about %.2f GiB on %s (%.2f GiB free); asking ComfyUI to make room", nbytes / 2**30,
                    self.device, free / 2**30)
        mm.free_memory(nbytes + mm.extra_reserved_memory(), self.device)

    def hold(self, name: str, nbytes: int, release: Callable[[], None], device: str | None = None) -> Resident:
        resident = Resident(name, nbytes, release, torch.device(device) if device else self.device)
        mm.load_models_gpu([resident])  # listed among ComfyUI's loaded models from now on
        keep(resident)
        return resident

    def drop(self, token: object) -> None:
        """ootd released a model itself: ComfyUI forgets it. (When ComfyUI unloads one, it is already unloaded
        here and ComfyUI removes it from its own list, which it is walking then: nothing to do.)"""
        if not isinstance(token, Resident) or not token.loaded:
            return
        token.loaded = False
        for loaded in list(mm.current_loaded_models):
            if loaded.model is token:
                mm.current_loaded_models.remove(loaded)
                if loaded.model_finalizer is not None:
                    loaded.model_finalizer.detach()


class Steps:
    """The try-on's progress and step hooks: ComfyUI's progress bar follows the denoising steps, and Cancel stops
    the run at the next step or stage."""

    def __init__(self) -> None:
        self.bar: Any = None

    def progress(self, stage: str, done: int, total: int) -> None:
        mm.throw_exception_if_processing_interrupted()
        if stage == "denoise" and total:
            if self.bar is None or done <= 1:
                self.bar = comfy.utils.ProgressBar(total)
            self.bar.update_absolute(done, total)

    def step(self, step: int, t: Any, latents: Any) -> None:
        mm.throw_exception_if_processing_interrupted()


def interrupted_error() -> type[BaseException]:
    """The exception ComfyUI stops a prompt with when Cancel is pressed (never worded as an ootd error)."""
    return mm.InterruptProcessingException
