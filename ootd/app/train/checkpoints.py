"""A training run's folder and its checkpoints, every file complete or absent (docs/training.md):

    RUN/run.json                       the settings, the cache and the base model the run trains on
    RUN/lora.safetensors               the adapter of the latest checkpoint: what `--lora` takes
    RUN/checkpoints/step-00000100/     one checkpoint: the adapter (lora.safetensors) and the optimizer's state
                                       (optimizer.safetensors, state.json); written in a hidden folder and renamed
                                       into place, so a checkpoint folder is always whole
    RUN/loss.jsonl, RUN/loss.png       one line per optimizer step; the curve
    RUN/validation/step-00000100.png   the contact sheet of the held-out pairs (validation.jsonl: their SSIM)

A checkpoint holds all a resume needs to continue as if never stopped: the adapter and AdamW's moments exactly,
the step count (the data order and every random draw are functions of the seed and the step: ootd/training/data.py,
ootd/training/objective.py), and the learning-rate schedule is rebuilt by stepping it to the step.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ootd.errors import NoSpaceError, UsageError, no_space, printable
from ootd.imaging.atomic import write_atomic
from ootd.settings import ModelType
from ootd.training.settings import TrainSettings
from ootd.weights.fewstep import FewStep
from ootd.weights.lora import adapter_bytes, read_adapter

STEP_DIGITS = 8
ADAPTER_FILE = "lora.safetensors"


def step_name(step: int) -> str:
    return f"step-{step:0{STEP_DIGITS}d}"


@dataclass(frozen=True)
class Checkpoint:
    step: int
    folder: Path


def checkpoints(run: Path) -> list[Checkpoint]:
    """The run's whole checkpoints, oldest first (hidden temporary folders are not checkpoints)."""
    folder = run / "checkpoints"
    found = []
    for path in folder.glob("step-*") if folder.is_dir() else ():
        digits = path.name.removeprefix("step-")
        if path.is_dir() and digits.isdigit() and (path / "state.json").is_file():
            found.append(Checkpoint(int(digits), path))
    return sorted(found, key=lambda c: c.step)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done (a checkpoint being written is finished, then the signal
    acts as it would have)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in received[:1]:
            handler = previous[signum]
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL and signum == signal.SIGINT:
                raise KeyboardInterrupt


def _optimizer_files(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """AdamW's state dict as safetensors tensors plus JSON (its param groups, the tensor names)."""
    tensors = {f"state.{index}.{name}": value.detach().cpu().contiguous()
               for index, entry in state["state"].items() for name, value in entry.items()}
    return tensors, {"param_groups": state["param_groups"]}


def _optimizer_state(tensors: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(run: Path, step: int, adapter: dict[str, dict[str, Any]], model_type: ModelType,
                    settings: TrainSettings, optimizer_state: dict[str, Any], extra: dict[str, Any], *,
                    few_step: FewStep | None = None, files: Mapping[str, bytes] | None = None,
                    published: bytes | None = None) -> Checkpoint:
    """Write checkpoint `step` whole (hidden folder, renamed into place) and point RUN/lora.safetensors at it.
    A distillation adds its adapter's sampling (`few_step`), its own files (the target network) and, when
    RUN/lora.safetensors is not the checkpoint's adapter alone (a teacher adapter folded in), its bytes."""
    from safetensors.torch import save

    root = run / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_name(step)
    tmp = root / f".{step_name(step)}.{os.getpid()}.tmp"
    lora = adapter_bytes(adapter, model_type, settings.rank, settings.alpha, few_step)
    tensors, meta = _optimizer_files(optimizer_state)
    state = {"step": step, "settings": settings.to_json(), "optimizer": meta, **extra}
    with signals_deferred():
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _make_folder(tmp, final)
            _write_file(tmp, final, ADAPTER_FILE, lora)
            _write_file(tmp, final, "optimizer.safetensors", save(tensors))
            _write_file(tmp, final, "state.json", (json.dumps(state, indent=1) + "\n").encode())
            for name, data in (files or {}).items():
                _write_file(tmp, final, name, data)
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        write_atomic(run / ADAPTER_FILE, lambda handle: handle.write(published or lora), overwrite=True)
    return Checkpoint(step, final)


def _make_folder(tmp: Path, final: Path) -> None:
    """A checkpoint's hidden folder; a full device is named as the checkpoint (the hidden folder never stays)."""
    try:
        tmp.mkdir()
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise no_space(final) from None
        raise


def _write_file(tmp: Path, final: Path, name: str, data: bytes) -> None:
    """One file of a checkpoint, into its hidden folder; a full device is named as the checkpoint's file."""
    try:
        write_atomic(tmp / name, lambda handle: handle.write(data), overwrite=True)
    except NoSpaceError:
        raise no_space(final / name) from None


def adapter_of(run: Path, checkpoint: Checkpoint, published: bytes | None = None) -> Path:
    """RUN/lora.safetensors made what the checkpoint publishes when it is not (a resume: a full device or a kill
    may have stopped its write after the checkpoint was whole): the checkpoint's adapter, or `published` (as
    save_checkpoint's: a distillation's with a teacher adapter folded in)."""
    lora = published or (checkpoint.folder / ADAPTER_FILE).read_bytes()
    target = run / ADAPTER_FILE
    if not target.is_file() or target.read_bytes() != lora:
        write_atomic(target, lambda handle: handle.write(lora), overwrite=True)
    return target


@dataclass(frozen=True)
class Restored:
    step: int
    adapter: dict[str, dict[str, Any]]
    optimizer_state: dict[str, Any]
    state: dict[str, Any]


def load_checkpoint(checkpoint: Checkpoint) -> Restored:
    """A checkpoint's contents (its adapter read through the same checks as `--lora`)."""
    from safetensors.torch import load_file

    folder = checkpoint.folder
    try:
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        tensors = load_file(str(folder / "optimizer.safetensors"))
    except Exception as exc:  # noqa: BLE001 - a damaged checkpoint folder
        raise UsageError(f"checkpoint {printable(folder)} cannot be read ({str(exc).splitlines()[0]}); remove it "
                         "to resume from the one before") from None
    adapter = read_adapter(folder / ADAPTER_FILE)
    return Restored(int(state["step"]), {k: dict(v) for k, v in adapter.tensors.items()},
                    _optimizer_state(tensors, state["optimizer"]), state)


def check_resumable(restored: Restored, settings: TrainSettings) -> None:
    """A resume continues the same run: the settings that shape its numbers must not change."""
    saved = restored.state.get("settings", {})
    changed = [name for name in type(settings).RESUME_FIXED if saved.get(name) != getattr(settings, name)]
    if changed:
        shown = ", ".join(f"{{@{name}}} {{was_{name}}} (now {{now_{name}}})" for name in changed[:3])
        values = {f"{when}_{name}": value for name in changed[:3]
                  for when, value in (("was", saved.get(name)), ("now", getattr(settings, name)))}
        raise UsageError.about("resume", "{@resume} continues a run with other settings: " + shown + "; start a "
                               "new run (another {@output}) to change them", **values)
