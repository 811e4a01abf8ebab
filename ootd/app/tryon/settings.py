"""Every setting of a try-on, declared once: its type, bounds or choices, default, help, the CLI's flag, the HTTP
API's form field (the name a ComfyUI node's input takes too), where its value lives in a RunConfig, what pictures
record of it (PNG text, `--json`, the API's `settings`), whether it changes the pixels (resume compares those), and
which front ends offer it.

Everything else is derived from these declarations: `build_config` and `update_config` (config.py), the record and
what resume compares (record.py, provenance.py), the CLI's options and `--help` (ootd/cli/options.py), the
server's form and its OpenAPI schema (ootd/serve/forms.py, schema.py), the docs' option tables (checked against
them by tests), and a node's inputs (`Setting.describe()`: name, type, bounds, default, choices, help). A setting's
own checks stay with the code that owns its value (ootd/settings.py, ootd/speedups/modes.py, ...); its errors name
it by `name` (`{@mask_grow}`), and each front end words that name its own way (ootd/errors.py).

No torch here: the CLI reads this at `--help` time. How a declaration is made: declaration.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ootd.app.tryon.declaration import (
    API,
    BATCH,
    BENCH,
    CLASSIFY,
    CLASSIFY_NODE,
    FRONT_ENDS,
    GROUPS,
    HARDWARE,
    INPUTS,
    LOADER_NODE,
    MASK,
    MASK_NODE,
    NODE,
    NODES,
    OUTPUTS,
    RUN,
    SAMPLING,
    SERVE,
    SPEED,
    Recorded,
    Setting,
    Settings,
    recorded,
    value_of,
)
from ootd.app.tryon.naming import DEFAULT_NAME, NAME_FIELDS, check_template
from ootd.app.tryon.sizes import parse_size
from ootd.hardware.spec import ENV_DEVICE
from ootd.settings import (
    CONSISTENCY_GRID,
    DEFAULT_CATEGORY_MARGIN,
    DEFAULT_FEATHER,
    FEATHER_HEIGHT,
    MAX_FEATHER,
    MAX_MASK_GROW,
    MAX_SAMPLES,
    MAX_SCALE,
    MAX_STEPS,
    MAX_THREADS,
    RESOLUTIONS,
    SEED_LIMIT,
    AttentionName,
    FitMode,
    ModelType,
    OutputSize,
    ParsingProvider,
    PrecisionName,
    QuantizeName,
    SamplingSettings,
    SchedulerName,
    SpeedPreset,
    check_category_margin,
    check_mask_grow,
    check_threads,
)
from ootd.speedups.modes import FeatureCache, SpeedModes, TokenMerge
from ootd.weights.lora import MAX_LORA_SCALE, LoraChoice

__all__ = ["API", "BATCH", "BENCH", "CLASSIFY", "CLASSIFY_NODE", "FRONT_ENDS", "GROUPS", "HARDWARE", "INPUTS",
           "LOADER_NODE", "MASK", "MASK_NODE", "NODE", "NODES", "OUTPUTS", "RUN", "SAMPLING", "SERVE", "SETTINGS",
           "SPEED", "Recorded", "Setting", "Settings", "recorded", "value_of"]

def _literal(text: str) -> str:
    """Text put into a help template as it is (its braces are not settings)."""
    return text.replace("{", "{{").replace("}", "}}")


def _optional(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda word: parse(word) if word is not None else None


def _device(word: str | None) -> str | None:
    from ootd.hardware.spec import check_device_spec

    word = None if word is None or not str(word).strip() else str(word).strip()
    word = check_device_spec(word)  # a stale OOTD_DEVICE is named as such
    return None if word in (None, "auto") else word


def _checkpoints(word: str | Path | None) -> Path:
    from ootd.weights.layout import default_checkpoints_dir

    return Path(word) if word is not None else default_checkpoints_dir()


def _threads(word: int | None) -> int:
    """The CPU threads: those asked for, else the count torch uses in this process now (its physical cores, or
    $OMP_NUM_THREADS), fixed where the command starts so that every engine's processes apply the same number."""
    if word is not None:
        return check_threads(word)
    import torch  # not at --help time

    return torch.get_num_threads()


def _sampling(key: str, json: Callable[[SamplingSettings], Any],
              text: Callable[[SamplingSettings], str] | None = None, **facts: Any) -> tuple[Recorded, ...]:
    return (Recorded(key, text or (lambda s: str(json(s))), json, pixels=True, **facts),)


def _photo_words(photo: Any) -> dict[str, Any]:
    """What pictures at the photo's size record (none for the working size: a record without them means it)."""
    if not photo.at_photo_size:
        return {}
    return {"output_size": (photo.size.value, photo.size.value),
            "keep_unmasked": ("yes" if photo.keep_unmasked else "no", photo.keep_unmasked),
            "feather": (str(photo.feather), photo.feather) if photo.keep_unmasked else ("none", None)}


def _photo(key: str) -> tuple[Recorded, ...]:
    absent = {"output_size": "working", "keep_unmasked": "no", "feather": "none"}[key]
    return (Recorded(key, lambda p: _photo_words(p).get(key, (None, None))[0],
                     lambda p: _photo_words(p).get(key, (None, None))[1], absent=absent, pixels=True),)


def _few_step() -> tuple[Recorded, ...]:
    """What pictures record of a few-step adapter's own sampling (`ootd train distill`), beside the steps, scale
    and scheduler they were made with (nothing for a plain adapter, or none)."""
    facts = {"lora_steps": lambda few: few.steps, "lora_scheduler": lambda few: few.scheduler.value,
             "lora_guidance": lambda few: few.guidance}

    def kept(fact: Callable[[Any], Any], text: bool) -> Callable[[Any], Any]:
        def of(lora: Any) -> Any:
            if lora is None or lora.few_step is None:
                return None
            return str(fact(lora.few_step)) if text else fact(lora.few_step)
        return of

    return tuple(Recorded(key, kept(fact, True), kept(fact, False), absent="none") for key, fact in facts.items())


_ALL_RUN = frozenset({RUN, BATCH, SERVE})
_REQUEST = frozenset({API, NODE})
_EXACT = SpeedModes()
_NAME_HELP = ("Output file names (without .png); must hold {i}. Fields: "
              + ", ".join(f"{{{name}}} {meaning}" for name, meaning in NAME_FIELDS.items()) + ".")

SETTINGS = Settings(
    Setting("model_type", str, None, "hd (half-body, upper only) or dc (full-body). Default: hd for upper, dc "
            "otherwise.", label="model type", choices=ModelType.words(), flags=("--model-type",), panel=INPUTS,
            offered=_ALL_RUN | {MASK, LOADER_NODE}, home="model_type", parse=_optional(ModelType.parse),
            default_text="hd for upper, dc otherwise"),
    Setting("checkpoints", Path, None, "Checkpoints folder. Default: $OOTD_CHECKPOINTS, else ./checkpoints if it "
            "exists, else the per-user folder `ootd download` fills.", label="checkpoints folder",
            flags=("--checkpoints",), metavar="DIR", panel=INPUTS,
            offered=_ALL_RUN | {MASK, BENCH, CLASSIFY, LOADER_NODE}, home="checkpoints", parse=_checkpoints,
            default_text="the default folder"),
    Setting("samples", int, SamplingSettings.num_samples, "Images per pair, each from its own noise.", minimum=1,
            maximum=MAX_SAMPLES, flags=("--samples", "-n"), metavar="N", panel=SAMPLING,
            offered=_ALL_RUN | _REQUEST | {BENCH}, home="sampling.num_samples",
            record=_sampling("samples", lambda s: s.num_samples, per_pass=True)),
    # steps, scale and scheduler left out: a few-step adapter's own ({@lora}; ootd/weights/fewstep.py), else these
    Setting("steps", int, None, f"Denoising steps. Default: {SamplingSettings.steps}, or a few-step adapter's own "
            "({@lora}).", minimum=1, maximum=MAX_STEPS, flags=("--steps",), metavar="N", panel=SAMPLING,
            offered=_ALL_RUN | _REQUEST | {BENCH}, home="sampling.steps", omitted=SamplingSettings.steps,
            default_text=f"{SamplingSettings.steps}, or a few-step adapter's own",
            record=_sampling("steps", lambda s: s.steps)),
    Setting("scale", float, None, f"Image guidance scale (off below 1.0). Default: "
            f"{SamplingSettings.guidance_scale}, or a few-step adapter's own (guidance off).",
            label="guidance scale", minimum=0.0, maximum=MAX_SCALE, flags=("--scale",), panel=SAMPLING,
            offered=_ALL_RUN | _REQUEST | {BENCH}, home="sampling.guidance_scale",
            omitted=SamplingSettings.guidance_scale,
            default_text=f"{SamplingSettings.guidance_scale}, or a few-step adapter's own",
            record=_sampling("scale", lambda s: float(s.guidance_scale), lambda s: str(s.guidance_scale))),
    Setting("seed", int, SamplingSettings.seed, "Random seed; drawn at random (and printed) when absent.",
            minimum=0, maximum=SEED_LIMIT - 1, flags=("--seed",), metavar="N", panel=SAMPLING,
            offered=frozenset({RUN, BATCH}) | _REQUEST, home="sampling.seed",
            record=_sampling("seed", lambda s: s.seed, per_pass=True), default_text="random",
            range_text="0 to 2^63 - 1"),
    Setting("resolution", str, str(SamplingSettings.resolution), "Working resolution, width x height: 384x512 or "
            "768x1024.", choices=tuple(RESOLUTIONS), flags=("--resolution",), metavar="WxH", panel=SAMPLING,
            offered=_ALL_RUN | _REQUEST | {MASK, BENCH, MASK_NODE}, home="sampling.resolution",
            record=_sampling("resolution", lambda s: str(s.resolution))),
    Setting("scheduler", str, None, f"Sampler. Default: {SamplingSettings.scheduler.value} (the original's), or a "
            f"few-step adapter's own (lcm or tcd: consistency sampling, 1 to {CONSISTENCY_GRID} steps).",
            choices=SchedulerName.words(), flags=("--scheduler",), panel=SAMPLING,
            offered=_ALL_RUN | _REQUEST | {BENCH}, home="sampling.scheduler",
            omitted=SamplingSettings.scheduler.value,
            default_text=f"{SamplingSettings.scheduler.value}, or a few-step adapter's own",
            record=_sampling("scheduler", lambda s: s.scheduler.value)),
    Setting("speed", str, None, "exact (default): the method as published. fast: token merging 0.5 and feature "
            "caching every 3rd step (each option below overrides it). Precision is separate: see {@precision}.",
            label="speed preset", choices=SpeedPreset.words(), flags=("--speed",), panel=SPEED,
            offered=_ALL_RUN | {BENCH, NODE}, home="speed.preset", omitted=SpeedPreset.EXACT.value,
            default_text="exact", record=(Recorded("speed", lambda m: m.label(), lambda m: m.label()),)),
    Setting("token_merge", float, None, "Merge this fraction of the person tokens in the finest self-attention "
            f"level (ToMe), 0 to {TokenMerge.MAX}; the garment tokens stay whole. 0 = exact.",
            label="token merge ratio", minimum=0.0, maximum=TokenMerge.MAX, flags=("--token-merge",),
            metavar="RATIO", panel=SPEED, offered=_ALL_RUN | {BENCH}, home="speed.token_merge",
            omitted=_EXACT.token_merge.ratio, default_text="0 (exact)",
            record=(Recorded("token_merge", lambda m: str(m.token_merge.ratio), lambda m: m.token_merge.ratio,
                             absent=str(_EXACT.token_merge.ratio), pixels=True),)),
    Setting("cache_interval", int, None, "Recompute the try-on UNet's deep levels only every N-th step and reuse "
            f"them in between (DeepCache-style feature caching), 1 to {FeatureCache.MAX}. 1 = exact.",
            minimum=1, maximum=FeatureCache.MAX, flags=("--cache-interval",), metavar="N", panel=SPEED,
            offered=_ALL_RUN | {BENCH}, home="speed.cache_interval", omitted=_EXACT.feature_cache.interval,
            default_text="1 (exact)",
            record=(Recorded("cache_interval", lambda m: str(m.feature_cache.interval),
                             lambda m: m.feature_cache.interval, absent=str(_EXACT.feature_cache.interval),
                             pixels=True),)),
    Setting("quantize", str, None, "Quantize the UNets' linear layers (needs the `quant` extra): int8-dynamic on "
            "CPUs, int8-weight or fp8 on GPUs that have them. none = exact.", label="quantization",
            choices=QuantizeName.words(), flags=("--quantize",), panel=SPEED, offered=_ALL_RUN | {BENCH},
            home="speed.quantize", omitted=_EXACT.quantize.value, default_text="none (exact)",
            record=(Recorded("quantize", lambda m: m.quantize.value, lambda m: m.quantize.value,
                             absent=_EXACT.quantize.value, pixels=True),)),
    Setting("precision", str, PrecisionName.AUTO.value, "auto: fp32 on CPU (bf16 on CPUs with bf16 matrix units: "
            "AVX512-BF16, AMX, Arm BF16), the device profile's choice on GPUs.", choices=PrecisionName.words(),
            flags=("--precision",), panel=HARDWARE, offered=_ALL_RUN | {BENCH, LOADER_NODE}, home="precision",
            parse=PrecisionName.parse),
    Setting("attention", str, AttentionName.AUTO.value, "Attention backend.", label="attention backend",
            choices=AttentionName.words(), flags=("--attention",), panel=HARDWARE,
            offered=_ALL_RUN | {BENCH, LOADER_NODE}, home="attention", parse=AttentionName.parse),
    Setting("device", str, None, "cpu, cuda, cuda:N (also ROCm) or mps. Default: the best available.",
            flags=("--device",), metavar="DEVICE", panel=HARDWARE, envvar=ENV_DEVICE,
            offered=_ALL_RUN | {MASK, BENCH}, home="device", parse=_device, default_text="best available"),
    Setting("max_memory", str, None, "Memory a try-on may use, e.g. 20GiB (default: free device memory less a "
            "margin).", flags=("--max-memory",), metavar="SIZE", panel=HARDWARE, offered=_ALL_RUN | {BENCH},
            home="max_memory", parse=parse_size, default_text="free memory less a margin"),
    Setting("channels_last", bool, None, "Run the UNets and the VAE in channels_last memory layout: 4-5% faster "
            "steps on the CPU, slightly less precise (default: the device profile's choice, off everywhere).",
            flags=("--channels-last/--no-channels-last",), panel=HARDWARE, offered=_ALL_RUN | {BENCH},
            home="speed.channels_last", default_text="device profile (off)"),
    Setting("compile", bool, None, "torch.compile the try-on UNet: the first call compiles for minutes; then each "
            "step may be faster (measure with ootd bench). Default: the device profile's choice, off everywhere.",
            flags=("--compile/--no-compile",), panel=HARDWARE, offered=_ALL_RUN | {BENCH},
            home="speed.compile", default_text="device profile (off)"),
    Setting("parsing_provider", str, ParsingProvider.CPU.value, "ONNX Runtime provider for human parsing: cpu (as "
            "the original) or auto (MIGraphX, ROCm, CUDA, then CPU).", label="parsing provider",
            choices=ParsingProvider.words(), flags=("--parsing-provider",), panel=HARDWARE,
            offered=_ALL_RUN | {MASK}, home="parsing_provider", parse=ParsingProvider.parse),
    Setting("threads", int, None, f"CPU threads of torch and ONNX Runtime, 1 to {MAX_THREADS}. Default: this "
            "machine's as torch counts them (physical cores, or $OMP_NUM_THREADS), fixed when the command starts "
            "and applied by every engine's processes (Ray workers too), so the same command gives the same bytes "
            "on either engine.", minimum=1, maximum=MAX_THREADS, flags=("--threads",), metavar="N",
            panel=HARDWARE, offered=_ALL_RUN | {MASK}, home="threads", parse=_threads,
            default_text="this machine's"),
    Setting("output", Path, Path("outputs"), "Output folder (created if needed).", label="output folder",
            flags=("--output", "-o"), metavar="DIR", panel=OUTPUTS, offered=frozenset({RUN, BATCH, MASK}),
            home="output", parse=Path),
    Setting("save_intermediates", bool, False, "Also save the pose skeleton, parsing colour map, mask and masked "
            "person.", flags=("--save-intermediates",), panel=OUTPUTS, offered=frozenset({RUN, BATCH}),
            home="save_intermediates", parse=bool),
    Setting("overwrite", bool, False, "Replace existing output files.", flags=("--overwrite",), panel=OUTPUTS,
            offered=frozenset({RUN, BATCH, MASK}), home="overwrite", parse=bool),
    Setting("name", str, DEFAULT_NAME, _literal(_NAME_HELP), label="name template", flags=("--name",),
            metavar="TEMPLATE", panel=OUTPUTS, offered=_ALL_RUN, home="name_template",
            parse=check_template),
    Setting("grid", bool, False, "Also write a contact sheet: person | garment | mask | samples in one PNG "
            "({{i}} = grid in {@name}).", flags=("--grid",), panel=OUTPUTS, offered=frozenset({RUN}), home="grid",
            parse=bool),
    Setting("category_margin", float, DEFAULT_CATEGORY_MARGIN, "{@category} auto refuses a garment whose likeliest "
            "category leads the second by less than this probability (0 to 1; docs/categories.md).",
            label="category margin", minimum=0.0, maximum=1.0, below_maximum=True, flags=("--category-margin",),
            metavar="P", panel=INPUTS, offered=_ALL_RUN | {CLASSIFY, CLASSIFY_NODE}, home="category_margin",
            parse=check_category_margin),
    Setting("lora", Path, None, "A LoRA adapter `ootd train run` wrote (RUN/lora.safetensors), merged into the "
            "models.", label="LoRA adapter", flags=("--lora",), metavar="FILE", panel=INPUTS,
            offered=_ALL_RUN | {LOADER_NODE}, home="lora.path", default_text="none",
            record=(Recorded("lora", lambda lora: lora.path.name if lora else None,
                             lambda lora: lora.path.name if lora else None, absent="none", compared=True),
                    Recorded("lora_sha256", lambda lora: lora.sha256 if lora else None,
                             lambda lora: lora.sha256 if lora else None, absent="none", pixels=True),
                    *_few_step())),
    Setting("lora_scale", float, LoraChoice.scale, f"How much of the adapter: 0 (the base model) to "
            f"{MAX_LORA_SCALE:g}.", label="LoRA scale", minimum=0.0, maximum=MAX_LORA_SCALE,
            flags=("--lora-scale",), metavar="S", panel=INPUTS, offered=_ALL_RUN | {LOADER_NODE},
            home="lora.scale",
            record=(Recorded("lora_scale", lambda lora: f"{lora.scale:g}" if lora else None,
                             lambda lora: lora.scale if lora else None, absent="none", pixels=True),)),
    Setting("fit", str, FitMode.PAD.value, "Framing of non-3:4 photos.", label="fit mode", choices=FitMode.words(),
            flags=("--fit",), panel=INPUTS, offered=_ALL_RUN | _REQUEST | {MASK, MASK_NODE}, home="fit",
            parse=FitMode.parse,
            record=(Recorded("fit", lambda fit: fit.value, pixels=True),)),
    Setting("mask_grow", int, 0, "Grow the mask by N pixels (at 512 px height).", minimum=0,
            maximum=MAX_MASK_GROW, flags=("--mask-grow",), metavar="N", panel=INPUTS,
            offered=_ALL_RUN | {MASK, MASK_NODE},
            home="mask_grow", parse=check_mask_grow,
            record=(Recorded("mask_grow", str, pixels=True, per_pass=True),)),
    Setting("output_size", str, None, "working (default): the pictures at {@resolution}, as the method makes them; "
            "photo: the whole generated picture at the photo's own size and framing.", label="output size",
            choices=OutputSize.words(), flags=("--output-size",), panel=OUTPUTS, offered=_ALL_RUN | _REQUEST,
            home="photo.size", omitted=OutputSize.WORKING.value, default_text="working",
            record=_photo("output_size")),
    Setting("keep_unmasked", bool, False, "Give back the photo itself, at its own size, with only the garment's "
            "region replaced: every pixel outside the feathered mask is the photo's (docs/commands.md).",
            flags=("--keep-unmasked",), panel=OUTPUTS, offered=_ALL_RUN | _REQUEST, home="photo.keep_unmasked",
            record=_photo("keep_unmasked")),
    Setting("feather", int, None, f"{{@keep_unmasked}}: blend over N pixels (of a {FEATHER_HEIGHT} px high "
            f"picture, scaled to the photo) on each side of the mask's edge, 0 to {MAX_FEATHER}. Default "
            f"{DEFAULT_FEATHER}.", minimum=0, maximum=MAX_FEATHER, flags=("--feather",), metavar="N",
            panel=OUTPUTS, offered=_ALL_RUN | _REQUEST, home="photo.feather", omitted=DEFAULT_FEATHER,
            default_text=str(DEFAULT_FEATHER), record=_photo("feather")),
    # what each try-on changed of its photo (docs/preservation.md): measured by the front ends after the job, never
    # changing its pictures (so neither recorded nor compared); `ootd run` and `ootd batch` also take --review-above
    Setting("preservation", bool, True, "Measure what each try-on changed of its person photo, region by region "
            "(face, hands, ...: docs/preservation.md), and report it with the results (a batch: in each pair's "
            "report line and on the contact sheet, worst first); needs the pose and parsing models, no network.",
            flags=("--preservation/--no-preservation",), panel=OUTPUTS, offered=frozenset({RUN, BATCH, API}),
            home="preservation", parse=bool),
)

