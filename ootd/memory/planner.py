"""Memory planner: pick the cheapest memory savings whose estimated peak fits a budget.

Everything here is a pure function of its arguments (a DeviceInfo is passed in, never probed), so plans can
be tested with fake devices and printed before a single weight is loaded. The per-stage estimate is
ootd/memory/estimate.py, the model sizes it reads ootd/memory/sizes.py (measured by ootd/memory/trace.py),
the chunked-attention budget policy ootd/hardware/policy.py. Model residency (putting a plan into effect,
retrying after out-of-memory) is ootd/memory/residency.py.

Savings, in the order they are switched on as the budget shrinks:

1. attention chunk budget (a fraction of the budget, capped; only the chunked backend uses it)
2. guidance as two half batches instead of one (`guidance_split`)
3. VAE slicing: encode and decode one image at a time
4. VAE tiling (diffusers' `enable_tiling`; only changes anything above the VAE's tile size)
5. model offload: the garment UNet and the text/image encoders wait on the CPU until their stage
6. sequential offload: every layer streams from the CPU (slow; the last resort)

A smaller budget never switches a saving off again (tests check it).
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from ootd.hardware.device import DeviceInfo
from ootd.hardware.policy import attention_budget_for, free_memory
from ootd.hardware.units import size_text
from ootd.memory.estimate import GIB, MIB, OFFLOAD_LEVELS, STAGES, PlanRequest, estimate

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """Memory choices for one call, the per-stage estimate they give, and whether that fits the budget."""

    budget_bytes: int
    attention_budget_bytes: int
    guidance_split: bool
    vae_encode_batched: bool
    vae_slicing: bool
    vae_tiling: bool
    offload: str  # "none" | "model" | "sequential"
    estimate: dict[str, int] = field(hash=False)  # follows from the choices above; a dict cannot be hashed
    fits: bool
    request: PlanRequest | None = field(default=None, repr=False, compare=False)

    @property
    def level(self) -> int:
        """How many savings are on (0 = none); larger is more frugal, for comparing plans."""
        return (int(self.guidance_split) + int(self.vae_slicing) + int(self.vae_tiling)
                + OFFLOAD_LEVELS.index(self.offload))

    def halved(self) -> Plan:
        """The plan for half this budget: what to retry with after an out-of-memory error."""
        base = self.budget_bytes or self.estimate["peak"]  # an unknown budget: half of what was estimated
        return with_budget(self, max(1, base // 2))

    def to_dict(self) -> dict[str, Any]:
        """Plain data for --json."""
        data = {k: v for k, v in asdict(self).items() if k != "request"}
        data["estimate"] = dict(self.estimate)
        if self.request is not None:
            r = self.request
            data["request"] = {
                "device": r.device.name, "device_type": r.device.type, "resolution": list(r.resolution),
                "num_samples": r.num_samples, "guidance": r.guidance, "dtype": r.dtype, "attention": r.attention,
                "max_memory": r.max_memory, "vae_dtype": r.vae_dtype,
            }
        return data

    def explain(self) -> str:
        """A table of the choices and the per-stage estimates, for people."""
        lines = []
        if self.request is not None:
            r = self.request
            width, height = r.resolution
            lines.append(
                f"memory plan: {width}x{height}, {r.num_samples} sample(s), guidance {'on' if r.guidance else 'off'}"
                f", {r.dtype}{' (UNet linear layers quantized)' if r.sizes.unets_quantized else ''}"
                f", attention {r.attention}, on {r.device.name} ({r.device.type})")
        source = "--max-memory" if self.request is not None and self.request.max_memory else "free memory - margin"
        lines.append(f"  budget                 {size_text(self.budget_bytes):>11}  ({source})")
        lines.append(f"  attention chunk budget {size_text(self.attention_budget_bytes):>11}")
        batch = ""
        if self.request is not None:
            r = self.request
            full = r.num_samples * (2 if r.guidance else 1)
            batch = f" (UNet batch {full // 2 if self.guidance_split else full})"
        lines.append(f"  guidance               {'two halves' if self.guidance_split else 'one batch':>11}{batch}")
        lines.append(f"  VAE encode             {'batched' if self.vae_encode_batched else 'one by one':>11}")
        lines.append(f"  VAE slicing            {'on' if self.vae_slicing else 'off':>11}")
        lines.append(f"  VAE tiling             {'on' if self.vae_tiling else 'off':>11}")
        lines.append(f"  offload                {self.offload:>11}")
        lines.append("  stage                     estimate")
        for stage in (*STAGES, *(["photo"] if "photo" in self.estimate else []), "peak"):
            lines.append(f"    {stage:<20} {size_text(self.estimate[stage]):>11}")
        parts = ("weights_resident", "garment_features", "unet_activations", "attention_workspace")
        lines.append("    (" + ", ".join(f"{p} {size_text(self.estimate[p])}" for p in parts) + ")")
        verdict = "fits" if self.fits else "DOES NOT FIT even with every saving on"
        lines.append(f"  peak {size_text(self.estimate['peak'])} of {size_text(self.budget_bytes)}: {verdict}")
        return "\n".join(lines)


def safety_margin(device: DeviceInfo) -> int:
    """Memory kept free: for the allocator, other processes and (CPU) the operating system."""
    total = device.total_memory or device.free_memory or 0
    if device.type == "cpu":
        return max(1 * GIB, total // 10)
    if device.unified_memory:
        return max(2 * GIB, total // 10)
    return max(512 * MIB, total // 20)


def memory_budget(device: DeviceInfo, max_memory: int | None = None) -> int | None:
    """Bytes a call may use: `max_memory` when given, else free (or total) memory minus the safety margin;
    None when the device does not say (e.g. MPS)."""
    if max_memory is not None:
        return int(max_memory)
    memory = free_memory(device)
    if memory is None:
        return None
    return max(0, int(memory) - safety_margin(device))


UNLIMITED = 1 << 62
LOCAL_SAVINGS = {"guidance_split": False, "vae_slicing": False, "vae_tiling": False}


def _offload_levels(device: DeviceInfo) -> tuple[str, ...]:
    """Offloading to the CPU from the CPU saves nothing."""
    return ("none",) if device.type == "cpu" else OFFLOAD_LEVELS


def _choose_local(fits: Any, guidance: bool) -> dict[str, bool]:
    """At offload "none": each stage-local saving only if its own stage needs it.

    Guidance split only changes the denoising stage and VAE slicing/tiling only the VAE stages, so each is
    decided by its stages alone (slicing before tiling), and none is switched on that another stage needed.
    """
    chosen = dict(LOCAL_SAVINGS)
    if guidance and not fits(chosen, ("denoise",)):
        chosen["guidance_split"] = True
    if not fits(chosen, ("encode", "decode")):
        chosen["vae_slicing"] = True
        if not fits(chosen, ("encode", "decode")):
            chosen["vae_tiling"] = True
    return chosen


def make_plan(request: PlanRequest) -> Plan:
    """The cheapest settings whose estimated peak fits the budget (see the module docstring for the order).

    The budget is the request's `max_memory`, else the device's free memory minus a safety margin (pass a
    DeviceInfo measured before the models are loaded). The attention chunk budget is a fraction of the budget.
    With everything resident, guidance split and VAE slicing/tiling are switched on only for the stages that
    need them; offloading comes only after all of them are on. When nothing fits, every saving is on and
    `fits` is False. A smaller budget never gives a plan with fewer savings.
    """
    device, guidance, profile = request.device, request.guidance, request.profile
    budget = memory_budget(device, request.max_memory)
    budget_bytes = budget if budget is not None else UNLIMITED
    weights = sum(request.sizes.weight_bytes(request.dtype, request.vae_dtype).values())
    attention_budget = attention_budget_for(budget if budget is not None else weights + 16 * GIB, device, profile,
                                            reserved=weights)

    # the profile may prefer one image at a time even where a batch fits (faster on the CPU)
    batch_encodes = profile.vae_encode_batched if profile is not None else True

    def numbers_for(settings: dict[str, Any]) -> dict[str, int]:
        return estimate(request, attention_budget_bytes=attention_budget, vae_encode_batched=batch_encodes,
                        **settings)

    every = {"guidance_split": guidance, "vae_slicing": True, "vae_tiling": True}
    settings: dict[str, Any] = {}
    numbers: dict[str, int] = {}
    for offload in _offload_levels(device):
        if offload == "none":
            def fits(local: dict[str, bool], stages: tuple[str, ...]) -> bool:
                found = numbers_for({**local, "offload": "none"})
                return all(found[s] <= budget_bytes for s in stages)

            settings = {**_choose_local(fits, guidance), "offload": "none"}
        else:
            settings = {**every, "offload": offload}
        numbers = numbers_for(settings)
        if numbers["peak"] <= budget_bytes:
            break
    else:
        settings = {**every, "offload": _offload_levels(device)[-1]}
        numbers = numbers_for(settings)
    fits_budget = numbers["peak"] <= budget_bytes
    plan = Plan(
        budget_bytes=budget if budget is not None else 0, attention_budget_bytes=attention_budget,
        guidance_split=settings["guidance_split"], vae_encode_batched=batch_encodes and not settings["vae_slicing"],
        vae_slicing=settings["vae_slicing"], vae_tiling=settings["vae_tiling"], offload=settings["offload"],
        estimate=numbers, fits=fits_budget, request=request,
    )
    if not fits_budget:
        logger.warning("estimated peak %s exceeds the memory budget %s even with every saving on",
                       size_text(numbers["peak"]), size_text(budget_bytes))
    return plan


def with_budget(plan: Plan, budget_bytes: int) -> Plan:
    """The same request planned for another budget."""
    if plan.request is None:
        raise ValueError("this plan does not know what it was made for")
    return make_plan(plan.request.with_budget(budget_bytes))


def apply_plan_to_vae(vae: Any, plan: Plan) -> None:
    """Switch the VAE's own slicing and tiling on or off as the plan says (diffusers AutoencoderKL)."""
    if plan.vae_slicing:
        vae.enable_slicing()
    else:
        vae.disable_slicing()
    if plan.vae_tiling:
        vae.enable_tiling()
    else:
        vae.disable_tiling()
