"""RunConfig: everything a try-on needs besides its inputs, and build_config: user words -> a validated config.

Every run default lives here (sampling defaults in `ootd.settings.SamplingSettings`, speed defaults in
`ootd.speedups.modes`); front ends read their option defaults from these classes rather than restating them.
Each word is parsed once, by the owner of its setting, and travels down typed. Validation is cheap and runs
before anything is loaded, so a bad option fails in one line at once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ootd.app.tryon.naming import DEFAULT_NAME, check_template
from ootd.errors import UsageError
from ootd.settings import (
    DEFAULT_CATEGORY_MARGIN,
    AttentionName,
    Category,
    FitMode,
    ModelType,
    ParsingProvider,
    PhotoOutput,
    PrecisionName,
    SamplingSettings,
    check_category_margin,
    check_mask_grow,
    check_model_category,
    check_threads,
    default_model_type,
)
from ootd.speedups.modes import SpeedModes, resolve_speed
from ootd.weights.fewstep import fill_sampling, notice
from ootd.weights.lora import LoraChoice

if TYPE_CHECKING:
    from ootd.runtime import RuntimeRequest


@dataclass(frozen=True)
class RunConfig:
    """Everything a try-on needs besides its inputs (the defaults here are the defaults of every front end)."""

    checkpoints: Path  # the released layout (docs/upstream.md §1)
    output: Path = Path("outputs")  # folder for results, created if needed
    sampling: SamplingSettings = field(default_factory=SamplingSettings)  # seed drawn before the work starts
    speed: SpeedModes = field(default_factory=SpeedModes)  # exact unless asked (ootd/speedups/modes.py)
    model_type: ModelType | None = None  # None: hd for upper-body garments, dc otherwise
    device: str | None = None  # None: the best available
    precision: PrecisionName = PrecisionName.AUTO  # auto follows the device profile
    attention: AttentionName = AttentionName.AUTO
    parsing_provider: ParsingProvider = ParsingProvider.CPU  # ONNX Runtime provider for human parsing
    max_memory: ByteSize | None = None  # bytes the memory plan may use; None: free device memory less a margin
    fit: FitMode = FitMode.PAD  # how non-3:4 inputs are framed
    mask_grow: int = 0  # extra pixels (at 512 px height) added around the mask, 0..settings.MAX_MASK_GROW
    save_intermediates: bool = False  # pose, parsing, mask, masked person next to the outputs
    overwrite: bool = False  # replace existing outputs (else: run refuses, batch skips/keeps them)
    name_template: str = DEFAULT_NAME  # output names (fields: ootd.app.tryon.naming.NAME_FIELDS)
    grid: bool = False  # also write a contact sheet (person | garment | mask | samples) per try-on
    category_margin: float = DEFAULT_CATEGORY_MARGIN  # `auto`: the lead over the 2nd category it needs, 0..1
    seed_random: bool = False  # the seed was drawn, not given: a resumed batch keeps the seed its files record
    lora: LoraChoice | None = None  # an adapter `ootd train` wrote, merged at its scale when the models load
    # -- few-step adapters (`ootd train distill`): the sampling settings taken from the adapter, not given ------
    lora_sampling: tuple[str, ...] = ()
    photo: PhotoOutput = field(default_factory=PhotoOutput)  # working-size pictures, or the photo's (--keep-unmasked)
    # CPU threads of torch and ONNX Runtime. build_config fixes the number where the command starts, and every
    # engine's processes apply it, so a Ray worker sums floats in the same order as a local run (same bytes).
    # None: leave the process as it is (library use).
    threads: int | None = None

    @property
    def runtime_request(self) -> RuntimeRequest:
        """Where and how to run, as this config asks it (resolved by ootd/runtime.py, once per model owner)."""
        from ootd.runtime import RuntimeRequest  # imports torch: not at --help time

        speed = self.speed
        return RuntimeRequest(device=self.device, precision=self.precision, attention=self.attention,
                              quantize=speed.quantize, channels_last=speed.channels_last, compile=speed.compile,
                              threads=self.threads)

    def lora_notice(self) -> str | None:
        """The one line a front end says when a few-step adapter's own sampling applies (None otherwise)."""
        if self.lora is None or self.lora.few_step is None:
            return None
        return notice(self.lora.path.name, self.lora.few_step, self.lora_sampling)

    def model_type_for(self, category: Category) -> ModelType:
        """The model for a category: the forced one (if compatible) or the default (hd upper, dc otherwise)."""
        model_type = self.model_type or default_model_type(category)
        check_model_category(model_type, category)
        return model_type


_SCALES = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_AUTO_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


class ByteSize(int):
    """A number of bytes that remembers how it was given (`10MiB` -> 10485760, text "10MiB", unit "MiB"), so
    messages about it speak the user's unit; everywhere else it is the int it equals."""

    text: str
    unit: str

    def __new__(cls, value: int, text: str = "", unit: str = "") -> ByteSize:
        size = super().__new__(cls, value)
        size.text, size.unit = text or str(int(value)), unit
        return size

    def __getnewargs__(self) -> tuple[int, str, str]:  # pickling and copying keep the words
        return int(self), self.text, self.unit

    def format(self, n: int) -> str:
        """`n` bytes in this size's unit (a plain byte count: the largest binary unit under `n`), rounded up to
        three digits, as an option value (`481MiB`, `0.5GiB`): a suggested budget never falls short of `n`."""
        letter = self.unit[:1].lower()
        unit, per = (self.unit, _SCALES[letter]) if letter else next(
            ((u, size) for u, size in _AUTO_UNITS if n >= size), ("", 1))
        value = n / per
        digits = max(0, 2 - math.floor(math.log10(value))) if value > 0 else 0
        rounded = math.ceil(value * 10**digits - 1e-9) / 10**digits
        return f"{rounded:g}{unit}"


def parse_size(value: str | None) -> ByteSize | None:
    """'20GiB', '20GB', '512MiB', '2e10' -> bytes (GB and GiB both mean 2**30: what users mean), keeping the
    words as typed for messages (and the unit, its case normalised: 10mib -> MiB)."""
    if value is None:
        return None
    text = value.strip().replace(" ", "")
    match = re.fullmatch(r"(?P<number>[0-9.eE+-]+)(?P<unit>[kKmMgGtT]?)(?P<i>[iI]?)(?P<b>[bB]?)", text)
    if match is None or (match["i"] and not match["unit"]):
        raise UsageError(f"bad memory size {value!r}: use e.g. 20GiB or 512MiB")
    letter = match["unit"].lower()
    try:
        size = int(float(match["number"]) * _SCALES[letter])
    except (ValueError, OverflowError):
        raise UsageError(f"bad memory size {value!r}: use e.g. 20GiB or 512MiB") from None
    if size <= 0:
        raise UsageError(f"memory size must be positive, got {value!r}")
    unit = "" if not letter else letter.upper() + ("iB" if match["i"] or not match["b"] else "B")
    return ByteSize(size, text, unit)


def build_config(
    *, checkpoints: Path | str | None = None, output: Path | str = RunConfig.output, model_type: str | None = None,
    samples: int = SamplingSettings.num_samples, steps: int | None = None, scale: float | None = None,
    seed: int | None = None, resolution: str = str(SamplingSettings.resolution), scheduler: str | None = None,
    speed: str | None = None, token_merge: float | None = None, cache_interval: int | None = None,
    quantize: str | None = None,
    precision: str = RunConfig.precision, attention: str = RunConfig.attention, device: str | None = None,
    parsing_provider: str = RunConfig.parsing_provider, max_memory: str | None = None, fit: str = RunConfig.fit,
    mask_grow: int = RunConfig.mask_grow, save_intermediates: bool = RunConfig.save_intermediates,
    overwrite: bool = RunConfig.overwrite, channels_last: bool | None = None, compile: bool | None = None,
    name: str = RunConfig.name_template, grid: bool = RunConfig.grid,
    category_margin: float = DEFAULT_CATEGORY_MARGIN, lora: str | Path | None = None,
    lora_scale: float = LoraChoice.scale, output_size: str | None = None, keep_unmasked: bool = False,
    feather: int | None = None, threads: int | None = None,
) -> RunConfig:
    """Validate every option (cheap, before anything is loaded) into one RunConfig; a random seed is drawn here.

    Takes the words a user typed (as front ends receive them); each bad one is a one-line UsageError. The speed
    options left as None follow the `speed` preset (ootd/speedups/modes.py; None: exact). `steps`, `scale` and
    `scheduler` None: a few-step adapter's own (ootd/weights/fewstep.py), else SamplingSettings'. `threads` None: the
    CPU threads torch uses in this process now (its physical cores, or $OMP_NUM_THREADS), fixed here so that
    the processes of every engine apply the same number.
    """
    import torch  # not at --help time

    from ootd.hardware.spec import check_device_spec
    from ootd.weights.layout import default_checkpoints_dir

    device = None if device is None or not str(device).strip() else str(device).strip()
    device = check_device_spec(device)  # a stale OOTD_DEVICE is named as such
    forced = ModelType.parse(model_type) if model_type is not None else None
    modes = resolve_speed(speed, token_merge=token_merge, cache_interval=cache_interval, quantize=quantize,
                          channels_last=channels_last, compile=compile)
    lora_choice = LoraChoice.parse(lora, lora_scale)
    words, taken = fill_sampling(lora_choice.few_step if lora_choice is not None else None,
                                 {"steps": steps, "scale": scale, "scheduler": scheduler})
    sampling = SamplingSettings.from_words(num_samples=samples, steps=words["steps"], guidance_scale=words["scale"],
                                           seed=seed, resolution=resolution, scheduler=words["scheduler"])
    return RunConfig(
        checkpoints=Path(checkpoints) if checkpoints is not None else default_checkpoints_dir(),
        output=Path(output), sampling=sampling, speed=modes,
        model_type=forced,
        device=None if device in (None, "auto") else device,
        precision=PrecisionName.parse(precision, "precision"),
        attention=AttentionName.parse(attention, "attention backend"),
        parsing_provider=ParsingProvider.parse(parsing_provider, "parsing provider"),
        max_memory=parse_size(max_memory), fit=FitMode.parse(fit, "fit mode"), mask_grow=check_mask_grow(mask_grow),
        save_intermediates=save_intermediates, overwrite=overwrite,
        name_template=check_template(name), grid=grid, seed_random=seed is None,
        category_margin=check_category_margin(category_margin), lora=lora_choice, lora_sampling=taken,
        photo=PhotoOutput.from_words(output_size, keep_unmasked, feather),
        threads=check_threads(threads) if threads is not None else torch.get_num_threads(),
    )
