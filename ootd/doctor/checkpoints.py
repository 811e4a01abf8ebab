"""Doctor items about the checkpoints tree: which files are bad and which model types can run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ootd.config import ModelType
from ootd.doctor.report import FAIL, OK, WARN, Item
from ootd.verify import FileCheck


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
