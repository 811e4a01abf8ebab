"""Model residency: the one owner of a pipeline's memory: the plan of each call, where the models live, and
recovering when memory runs out.

A `Residency` makes the plan of a call (`make_plan`: ootd/memory/planner.py decides it, from the request this
pipeline's models, precision and attention make) and puts it into effect (`apply`): the chunked attention budget,
the VAE's slicing/tiling, and the placement of every model for its offload mode. Stages run through `run`, which
retries once with half the budget after a device out-of-memory error and turns a torch.compile failure into a
one-line error; `visit` brings an offloaded model to the device for its stage. Nothing is global: each pipeline
owns one.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import torch

from ootd.attention import ChunkedBackend
from ootd.errors import OutOfMemoryError
from ootd.hardware.device import DeviceInfo
from ootd.hardware.profiles import DeviceProfile
from ootd.hardware.units import size_text
from ootd.memory.estimate import PlanRequest
from ootd.memory.planner import Plan, apply_plan_to_vae, make_plan
from ootd.memory.sizes import ModelSizes
from ootd.speedups.execution import compile_error, is_compile_failure

logger = logging.getLogger(__name__)

T = TypeVar("T")


def move(module: torch.nn.Module, device: torch.device) -> None:
    """`module.to(device)` unless it is all there already, outside inference mode: torch swaps a quantized weight
    (a tensor subclass, ootd/speedups/quantize.py) for a new tensor even on a same-device move, and an inference-mode
    tensor cannot take part in that swap."""
    tensors = [*module.parameters(), *module.buffers()]
    if tensors and all(_same_device(t.device, device) for t in tensors):
        return
    with torch.inference_mode(False):
        module.to(device)


def _same_device(have: torch.device, want: torch.device) -> bool:
    return have.type == want.type and (want.index is None or have.index == want.index)


class Residency:
    """Placement of `modules` on `device` per offload mode; `stays` never leaves the device (it runs every step).

    none: everything on the device. model: only `stays` lives there, the others visit for their stage.
    sequential: accelerate streams each layer's weights to the device as it runs.
    """

    def __init__(self, modules: Sequence[torch.nn.Module], stays: torch.nn.Module, device: DeviceInfo,
                 attention: object, vae: torch.nn.Module, *, sizes: Callable[[], ModelSizes],
                 dtype: torch.dtype, vae_dtype: torch.dtype, profile: DeviceProfile | None = None,
                 max_memory: int | None = None) -> None:
        self.modules = list(modules)
        self.stays = stays
        self.device = device
        self.attention = attention  # its ChunkedBackends take the plan's chunk budget
        self.vae = vae
        self.offload = "none"
        self.plan: Plan | None = None  # the plan of the latest call
        self.max_memory = max_memory  # bytes a call may use; None: the device's free memory less a margin
        self.profile = profile
        self._size_models = sizes  # measured once, when the first plan is made
        self._sizes: ModelSizes | None = None
        self._dtypes = (dtype, vae_dtype)
        for module in self.modules:
            module.eval().requires_grad_(False)
        self.place("none")

    def request(self, resolution: tuple[int, int], num_samples: int, guidance: bool,
                max_memory: int | None = None, photo_pixels: int = 0) -> PlanRequest:
        """What a call of this pipeline asks of memory (`max_memory` None: this residency's budget;
        `photo_pixels`: its results are then brought back to a photo this large)."""
        if self._sizes is None:
            self._sizes = self._size_models()
        dtype, vae_dtype = self._dtypes
        return PlanRequest(self.device, resolution, num_samples, guidance, dtype,
                           str(getattr(self.attention, "label", "custom")), self._sizes,
                           max_memory if max_memory is not None else self.max_memory, vae_dtype=vae_dtype,
                           profile=self.profile, photo_pixels=photo_pixels)

    def make_plan(self, resolution: tuple[int, int], num_samples: int, guidance: bool,
                  max_memory: int | None = None, photo_pixels: int = 0) -> Plan:
        """The memory plan of a call (nothing is put into effect)."""
        return make_plan(self.request(resolution, num_samples, guidance, max_memory, photo_pixels))

    def plan_for_encodes(self, resolution: tuple[int, int], guidance: bool = True) -> None:
        """The plan of the encodes before a call: one image at `resolution`, whatever the latest call was (a plan
        made for more samples or another budget would batch or tile the encodes differently). `guidance`: whether
        the call guides, which the garment UNet's pass after the garment's encode follows (two garment items with
        guidance, one without); the person's encodes, which do not depend on it, plan as if it did."""
        request = self.plan.request if self.plan is not None else None
        wanted = (tuple(resolution), 1, guidance, self.max_memory)
        if request is None or (request.resolution, request.num_samples, request.guidance, request.max_memory) != wanted:
            self.apply(self.make_plan(resolution, 1, guidance))

    def apply(self, plan: Plan) -> None:
        """Put the plan's choices into effect: chunk budget, VAE slicing/tiling, where the models live."""
        for backend in getattr(self.attention, "backends", ()):
            if isinstance(backend, ChunkedBackend):
                backend.budget_bytes = plan.attention_budget_bytes
        apply_plan_to_vae(self.vae, plan)
        self.place(plan.offload)
        self.plan = plan

    def place(self, offload: str) -> None:
        """Move every model where `offload` wants it between stages."""
        device = self.device.torch_device
        if offload == self.offload and offload != "none":
            return
        if offload == "sequential":
            from accelerate import cpu_offload

            for module in self.modules:
                move(module, torch.device("cpu"))
                cpu_offload(module, execution_device=device)
        else:
            for module in self.modules:
                move(module, device if offload == "none" or module is self.stays else torch.device("cpu"))
        self.offload = offload

    @contextlib.contextmanager
    def visit(self, *modules: torch.nn.Module) -> Iterator[None]:
        """Bring offloaded models to the device for one stage, and send them back after it."""
        visiting = [m for m in modules if self.offload == "model" and m is not self.stays]
        for module in visiting:
            move(module, self.device.torch_device)
        try:
            yield
        finally:
            for module in visiting:
                move(module, torch.device("cpu"))

    def run(self, stage: str, fn: Callable[[], T]) -> T:
        """Run a stage; on a device out-of-memory error free what can be freed, re-plan with half the budget
        and try once more. A second one is a clear error that shows the plan that failed. A torch.compile
        failure becomes a one-line error too."""
        try:
            return fn()
        except torch.OutOfMemoryError as first:
            return self._retry_smaller(stage, fn, first)
        except Exception as exc:
            if is_compile_failure(exc):
                raise compile_error(exc) from exc
            raise

    def _retry_smaller(self, stage: str, fn: Callable[[], T], first: torch.OutOfMemoryError) -> T:
        plan = self.plan
        self.free()
        if plan is None:
            raise OutOfMemoryError(f"out of memory during {stage}: {str(first).splitlines()[0]}") from first
        smaller = plan.halved()
        logger.warning("out of memory during %s; retrying once with half the memory budget (%s)",
                       stage, size_text(smaller.budget_bytes))
        self.apply(smaller)
        try:
            return fn()
        except torch.OutOfMemoryError as second:
            self.free()
            raise OutOfMemoryError.about(
                "max_memory", "out of memory during {stage} again after re-planning with half the budget; plan "
                "that failed: {plan}; try {@max_memory} lower, fewer {@samples} or {@resolution} 384x512",
                stage=stage, plan=smaller.to_dict()) from second

    def free(self) -> None:
        """Return cached device memory to the driver (after an out-of-memory error)."""
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        elif self.device.type == "mps":
            torch.mps.empty_cache()
