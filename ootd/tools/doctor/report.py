"""The doctor's report: items with a status and a fix, and the report they make up."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Status = Literal["ok", "warn", "fail"]
OK: Status = "ok"
WARN: Status = "warn"
FAIL: Status = "fail"


@dataclass(frozen=True)
class Item:
    """One line of the report. `blocking` fails make `Report.can_run` false."""

    section: str
    item: str
    status: Status
    detail: str
    fix: str | None = None
    blocking: bool = False


@dataclass
class Report:
    items: list[Item] = field(default_factory=list)
    models_available: list[str] = field(default_factory=list)

    @property
    def can_run(self) -> bool:
        """False when no try-on can run at all (e.g. missing checkpoints, no ONNX Runtime)."""
        return not any(item.status == FAIL and item.blocking for item in self.items)

    @property
    def worst(self) -> Status:
        statuses = {item.status for item in self.items}
        return FAIL if FAIL in statuses else WARN if WARN in statuses else OK

    def section(self, name: str) -> list[Item]:
        return [item for item in self.items if item.section == name]
