"""Doctor items about the checkpoints tree: which files are bad and which model types can run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ootd.settings import ModelType
from ootd.tools.doctor.report import FAIL, OK, WARN, Item
from ootd.weights.verify import FileCheck


def _model_of(check: FileCheck) -> str | None:
    for model in ModelType:
        if f"ootd_{model.value}" in check.path.parts:
            return model.value
    return None


def checkpoint_items(
    checks: Sequence[FileCheck], root: Path, models: Sequence[str] = ("hd", "dc")
) -> tuple[list[Item], list[str]]:
    """One item per bad file, a summary, and the model types that can run (one bad beside one ok: warn)."""
    if not root.is_dir() or not any(c.present for c in checks):
        what = "does not exist" if not root.exists() else "holds none of the checkpoint files"
        fix = f"run `ootd download --dest {root}` (or point --checkpoints / OOTD_CHECKPOINTS to them)"
        return [Item("checkpoints", "folder", FAIL, f"{root} {what}", fix, True)], []
    common_bad = [c for c in checks if not c.ok and _model_of(c) is None]
    bad_by_model = {m: [c for c in checks if not c.ok and _model_of(c) == m] for m in models}
    available = [] if common_bad else [m for m in models if not bad_by_model[m]]
    blocking = not available
    items = []
    for check in common_bad:
        items.append(
            Item("checkpoints", check.component, FAIL, f"{check.path}: {check.problem}", check.fix, True)
        )
    for model, bad in bad_by_model.items():
        for check in bad:
            status = FAIL if blocking else WARN
            detail = f"{check.path}: {check.problem}" + (
                "" if blocking else f" (the {model} model cannot run)"
            )
            items.append(Item("checkpoints", check.component, status, detail, check.fix, blocking))
    good = sum(c.ok for c in checks)
    summary = f"{root}: {good}/{len(checks)} files ok; models available: {', '.join(available) or 'none'}"
    items.insert(
        0,
        Item(
            "checkpoints",
            "summary",
            FAIL if blocking else (OK if good == len(checks) else WARN),
            summary,
            None if not blocking else f"run `ootd download --dest {root}`",
            blocking,
        ),
    )
    return items, available


def architecture_items(root: Path, models: Sequence[str], count_params: bool = True) -> list[Item]:
    """A warning when the tree loads but is not the released models (tiny random test weights make noise)."""
    from ootd.weights.architecture import compare_to_released, summary

    if not root.is_dir():
        return []
    diffs = compare_to_released(root, models, count_params=count_params)
    if not diffs:
        return [Item("checkpoints", "architecture", OK, "the released OOTDiffusion architectures")]
    return [Item("checkpoints", "architecture", WARN, f"{summary(diffs)}: try-ons run, but their pictures are noise",
                 f"run `ootd download --dest {root}` for the released weights (test trees are fine for tests)")]


def cpu_memory_items(info: object | None = None) -> list[Item]:
    """On the CPU: does RAM hold a 768x1024 try-on by the memory planner's estimate (released models, fp32)?"""
    import torch

    from ootd.hardware.device import detect_device
    from ootd.hardware.units import size_text
    from ootd.memory.estimate import PlanRequest
    from ootd.memory.planner import make_plan
    from ootd.memory.sizes import RELEASED_SIZES

    info = info if info is not None else detect_device("cpu")
    if getattr(info, "free_memory", None) is None:
        return [Item("memory", "RAM", WARN, "available memory unknown (no /proc/meminfo)")]

    def peak(size: tuple[int, int]) -> int:
        return make_plan(PlanRequest(info, size, 1, True, torch.float32, "sdpa", RELEASED_SIZES)).estimate["peak"]

    full, small = peak((768, 1024)), peak((384, 512))
    free, total = info.free_memory, info.total_memory
    detail = (f"a 768x1024 try-on on the CPU needs about {size_text(full)} (the memory planner's estimate); "
              f"{size_text(free)} of {size_text(total or free)} available")
    if full <= free:
        return [Item("memory", "RAM", OK, detail)]
    fix = (f"close other programs, or use --resolution 384x512 (about {size_text(small)}) or --max-memory "
           "(slower: the plan trades speed for memory)")
    return [Item("memory", "RAM", WARN, detail, fix)]
