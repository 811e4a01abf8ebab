"""LoRA adapters of the two UNets: the file `ootd train run` writes, read and checked here, and merged into loaded
UNets at a scale (`--lora FILE --lora-scale S`, docs/training.md).

The file is safetensors: the peft state dict of each adapted UNet under its name (`unet_vton.<module>.lora_A.weight`,
`unet_garm...`), and a header that says what it is (format, model type, rank, alpha). Merging goes through diffusers'
own LoRA support on the UNets (peft underneath): the adapter is injected, fused into the base weights at the scale
and the peft layers removed, so a try-on with an adapter runs the plain layers at the speed of one without (and
quantization, compile and every speed mode apply to the merged weights). At scale 0, or with an adapter whose
B matrices are still zero (a fresh one), every weight gets exactly zero added: the base model's images, bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ootd.errors import CheckpointError, UsageError, printable
from ootd.settings import ModelType
from ootd.weights.fewstep import SAMPLING_WORDS, FewStep, check_base, notice

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

ADAPTER_FORMAT = "ootd-lora"
ADAPTER_VERSION = "1"
UNET_NAMES = ("unet_vton", "unet_garm")  # the try-on UNet is always adapted, the garment UNet optionally
ADAPTER_NAME = "ootd"  # the peft adapter name while an adapter is being merged
MAX_LORA_SCALE = 4.0  # --lora-scale: 0 (the base model) to this; past 1 the adapter's change is extrapolated
HEADER_KEY = "ootd"  # the safetensors metadata key of the adapter's header (JSON)
MAX_HEADER = 1 << 24  # a safetensors header larger than this is not one of ours


def check_lora_scale(value: float, setting: str = "lora_scale") -> float:
    """The `lora_scale` setting (or another adapter's scale, `setting`): a finite number from 0 to
    MAX_LORA_SCALE."""
    scale = float(value)
    if not math.isfinite(scale) or not 0.0 <= scale <= MAX_LORA_SCALE:
        raise UsageError.about(setting, "{@" + setting + "} must be from 0 to {most:g}, got {value}", value=value,
                               most=MAX_LORA_SCALE)
    return scale


@dataclass(frozen=True)
class LoraChoice:
    """An adapter a user asked for: its file (checked to exist when the choice is made) and scale."""

    path: Path
    scale: float = 1.0
    sha256: str = ""  # of the file when it was chosen: what a resumed batch compares
    few_step: FewStep | None = None  # a distilled adapter's own sampling (ootd/weights/fewstep.py)

    @classmethod
    def parse(cls, path: str | Path | None, scale: float = 1.0, *,
              names: tuple[str, str] = ("lora", "lora_scale")) -> LoraChoice | None:
        """The `lora` and `lora_scale` settings (or another adapter's pair, `names`: a distillation's teacher) ->
        a checked choice, None without a file (a scale alone is an error)."""
        lora, lora_scale = (f"{{@{name}}}" for name in names)
        if path is None or not str(path).strip():
            if float(scale) != 1.0:
                raise UsageError.about(names[1], lora_scale + " needs " + lora + " FILE", value=scale)
            return None
        file = Path(path).expanduser()
        if not file.is_file():
            problem = "is a folder" if file.is_dir() else "not found"
            raise UsageError.about(names[0], lora + " {file}: {problem}", value=file, file=printable(file),
                                   problem=problem)
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise UsageError.about(names[0], lora + " {file}: cannot be read ({why})", value=file,
                                   file=printable(file), why=exc.strerror or exc) from None
        return cls(file, check_lora_scale(scale, names[1]), hashlib.sha256(data).hexdigest(),
                   _few_step_of(file, data))


@dataclass(frozen=True)
class LoraAdapter:
    """A read and checked adapter file: what it adapts, and its tensors per UNet (peft state dict keys)."""

    path: Path
    sha256: str
    model_type: ModelType
    rank: int
    alpha: float
    tensors: Mapping[str, Mapping[str, torch.Tensor]]
    few_step: FewStep | None = None  # a distilled adapter's own sampling and base weights

    @property
    def name(self) -> str:
        return self.path.name

    def targets(self, unet_name: str) -> list[str]:
        """The module names this adapter changes in one UNet."""
        return sorted({key.rsplit(".lora_", 1)[0] for key in self.tensors.get(unet_name, {})})


def adapter_bytes(tensors: Mapping[str, Mapping[str, torch.Tensor]], model_type: ModelType, rank: int,
                  alpha: float, few_step: FewStep | None = None) -> bytes:
    """The adapter file's bytes: every UNet's peft state dict under its name, and the header read back below
    (with a distilled adapter's sampling and base, `few_step`)."""
    from safetensors.torch import save

    unets = sorted(tensors, key=lambda name: UNET_NAMES.index(name) if name in UNET_NAMES else len(UNET_NAMES))
    flat = {f"{unet}.{key}": tensor.detach().to("cpu").contiguous()
            for unet, state in tensors.items() for key, tensor in state.items()}
    # the UNets in one order, whatever the order they came in: the same adapter is the same bytes
    header = {"format": ADAPTER_FORMAT, "version": ADAPTER_VERSION, "model_type": model_type.value,
              "rank": str(rank), "alpha": repr(float(alpha)), "unets": ",".join(unets),
              **(few_step.header() if few_step is not None else {})}
    # one metadata key: safetensors writes several in no fixed order, and the same adapter must hash the same
    return save(flat, metadata={HEADER_KEY: json.dumps(header, sort_keys=True)})


def _damaged(path: Path, problem: str) -> CheckpointError:
    return CheckpointError(f"LoRA adapter {printable(path)} {problem}; use a lora.safetensors that "
                           "`ootd train run` wrote")


def _header(path: Path, data: bytes) -> dict[str, str]:
    if len(data) < 8:
        raise _damaged(path, "is empty or truncated")
    size = int.from_bytes(data[:8], "little")
    if size > MAX_HEADER or 8 + size > len(data):
        raise _damaged(path, "is not a safetensors file or is truncated")
    try:
        header = json.loads(data[8:8 + size])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise _damaged(path, "is not a safetensors file (its header is not JSON)") from None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    try:
        ours = json.loads(metadata[HEADER_KEY]) if isinstance(metadata, dict) else None
    except (KeyError, TypeError, json.JSONDecodeError):
        ours = None
    if not isinstance(ours, dict) or ours.get("format") != ADAPTER_FORMAT:
        raise _damaged(path, "is not an ootd LoRA adapter (its header names no ootd-lora format)")
    return {str(k): str(v) for k, v in ours.items()}


def read_adapter(path: str | Path) -> LoraAdapter:
    """The adapter at `path`, or one CheckpointError naming what is wrong (not safetensors, truncated, not ours,
    another format version, no tensors, non-finite values, tensors that are not LoRA pairs)."""
    import torch
    from safetensors.torch import load

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _damaged(path, f"cannot be read ({exc.strerror or exc})") from None
    metadata = _header(path, data)
    if metadata.get("version") != ADAPTER_VERSION:
        raise _damaged(path, f"has format version {metadata.get('version')!r}, this ootd reads {ADAPTER_VERSION}")
    try:
        flat = load(data)
        model_type = ModelType.parse(metadata.get("model_type", ""))
        rank, alpha = int(metadata["rank"]), float(metadata["alpha"])
        few_step = FewStep.from_header(metadata)
    except (KeyError, ValueError, UsageError) as exc:
        raise _damaged(path, f"has a bad header or tensors ({str(exc).splitlines()[0][:200]})") from None
    except Exception as exc:  # noqa: BLE001 - safetensors' own errors for a damaged body
        raise _damaged(path, f"cannot be read as safetensors ({str(exc).splitlines()[0][:200]})") from None
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in flat.items():
        unet, _, rest = key.partition(".")
        if unet not in UNET_NAMES or not (rest.endswith(".lora_A.weight") or rest.endswith(".lora_B.weight")):
            raise _damaged(path, f"holds {key!r}, which is no LoRA weight of a UNet")
        if not torch.isfinite(tensor).all():
            raise _damaged(path, f"has non-finite values in {key}")
        tensors.setdefault(unet, {})[rest] = tensor
    if "unet_vton" not in tensors or rank < 1:
        raise _damaged(path, "holds no try-on UNet weights")
    sha256 = hashlib.sha256(data).hexdigest()
    return LoraAdapter(path, sha256, model_type, rank, alpha, tensors, few_step)


def _few_step_of(path: Path, data: bytes) -> FewStep | None:
    """A chosen file's few-step entry, if it has a good one; anything wrong with the file is read_adapter's to say
    when the models load (one message for every kind of damage)."""
    try:
        return FewStep.from_header(_header(path, data))
    except (CheckpointError, ValueError):
        return None


def read_choice(choice: LoraChoice | None, checkpoints: Path | None,
                model_type: ModelType | None = None) -> LoraAdapter | None:
    """The chosen adapter read and checked before any model loads; a few-step adapter also against the base
    weights it was distilled from (ootd/weights/fewstep.py; those of `model_type`, None: the adapter's own), and
    its sampling said in one log line. Without a checkpoints folder (models given, not loaded) a few-step adapter
    cannot be checked, and is refused."""
    if choice is None:
        return None
    adapter = read_adapter(choice.path)
    if adapter.few_step is not None:
        if checkpoints is None:
            raise UsageError.about("checkpoints", "LoRA adapter {file} is a few-step adapter, checked against the "
                                   "checkpoints it was distilled from: give {@checkpoints|the checkpoints folder}",
                                   file=printable(adapter.path))
        check_base(adapter.path, adapter.few_step, checkpoints, model_type or adapter.model_type)
        logger.info("%s (unless a call sets them)", notice(adapter.name, adapter.few_step, tuple(SAMPLING_WORDS)))
    return adapter


def check_adapter(adapter: LoraAdapter, unets: Mapping[str, torch.nn.Module], model_type: ModelType) -> None:
    """Refuse, in one line, an adapter made for another model type or whose shapes do not fit these UNets."""
    import torch

    if adapter.model_type is not model_type:
        raise CheckpointError(f"LoRA adapter {printable(adapter.path)} was trained on the {adapter.model_type.value} "
                              f"model, this try-on uses the {model_type.value} model")
    for unet_name, state in adapter.tensors.items():
        modules = dict(unets[unet_name].named_modules())
        for key, tensor in state.items():
            module_name, _, part = key.rpartition(".lora_")
            module = modules.get(module_name)
            if not isinstance(module, torch.nn.Linear):
                raise CheckpointError(f"LoRA adapter {printable(adapter.path)} does not fit this model: "
                                      f"{unet_name} has no linear layer {module_name}")
            want = (adapter.rank, module.in_features) if part == "A.weight" else (module.out_features, adapter.rank)
            if tuple(tensor.shape) != want:
                raise CheckpointError(f"LoRA adapter {printable(adapter.path)} does not fit this model: "
                                      f"{unet_name}.{key} has shape {tuple(tensor.shape)}, this model needs {want}")


def merge_adapter(adapter: LoraAdapter, unets: Mapping[str, torch.nn.Module], model_type: ModelType,
                  scale: float) -> None:
    """Add `scale` times the adapter's change into the UNets' weights (checked first; nothing changes on refusal)."""
    from peft import LoraConfig, set_peft_model_state_dict

    check_adapter(adapter, unets, model_type)
    for unet_name, state in adapter.tensors.items():
        unet = unets[unet_name]
        config = LoraConfig(r=adapter.rank, lora_alpha=adapter.alpha, target_modules=adapter.targets(unet_name))
        unet.add_adapter(config, adapter_name=ADAPTER_NAME)
        result = set_peft_model_state_dict(unet, dict(state), adapter_name=ADAPTER_NAME)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            unet.unload_lora()
            raise CheckpointError(f"LoRA adapter {printable(adapter.path)} does not fit this model: "
                                  f"{unet_name} has no place for {unexpected[0]}")
        unet.fuse_lora(lora_scale=scale, adapter_names=[ADAPTER_NAME])
        unet.unload_lora()  # the fused weights stay; the peft layers go


def apply_lora(components: object, model_type: ModelType, adapter: LoraAdapter | None, scale: float) -> None:
    """Merge an adapter (if any) into loaded components (`ootd.weights.loading.Components`)."""
    if adapter is not None:
        merge_adapter(adapter, {name: getattr(components, name) for name in UNET_NAMES}, model_type, scale)
