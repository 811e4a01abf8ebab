"""Refuse weights that would load "successfully" and then produce garbage.

transformers and diffusers initialise missing weights randomly, drop unexpected ones and only log a warning
(a VAE with a missing key even fails later with an internal meta-tensor error), and nothing in them notices a
NaN. Every component is therefore loaded with the libraries' own loading report (`output_loading_info=True`)
and checked here, once per load: any missing, unexpected or mismatched key, or any non-finite value, is a
one-line CheckpointError naming the component, the file and the fix. The same rule stops a run whose denoised
latents are not finite before anything is decoded or saved.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path

import torch

from ootd.errors import CheckpointError, NumericalError, printable

KEYS_SHOWN = 3  # keys named in a message; the count says how many more there are


def _first(keys: Iterable[str]) -> str:
    ordered = sorted(str(key) for key in keys)
    shown = ", ".join(ordered[:KEYS_SHOWN])
    more = len(ordered) - KEYS_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def check_loading_info(
    what: str, weights: Path, info: Mapping[str, Collection[str]], fix: str, allowed_unexpected: str | None = None
) -> None:
    """Raise unless the loader matched every key of the file to the model and back.

    `info` is the loading report of transformers/diffusers `from_pretrained(..., output_loading_info=True)`;
    `allowed_unexpected` is a regex for keys a shared file legitimately holds for another model (the CLIP
    checkpoint carries the text tower, which the image encoder does not use).
    """
    allowed = re.compile(allowed_unexpected) if allowed_unexpected else None
    missing = list(info.get("missing_keys") or ())
    unexpected = [key for key in info.get("unexpected_keys") or () if not (allowed and allowed.match(key))]
    mismatched = [key[0] if isinstance(key, tuple) else key for key in info.get("mismatched_keys") or ()]
    problems = []
    if missing:
        problems.append(f"{len(missing)} weights missing ({_first(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected weights ({_first(unexpected)})")
    if mismatched:
        problems.append(f"{len(mismatched)} weights of the wrong shape ({_first(mismatched)})")
    if problems:
        raise CheckpointError(
            f"the {what} weights in {printable(weights)} do not fit the model its config.json describes: "
            f"{'; '.join(problems)}; the file is damaged or belongs to another model: replace it ({fix})"
        )


def nonfinite_names(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """Names of the floating-point tensors holding a NaN or an infinity.

    One float32 sum per tensor (NaN and inf propagate into it); only a tensor whose sum is not finite is
    looked at element by element, so a huge but finite sum (an overflow) is not mistaken for damage.
    """
    bad = []
    for name, tensor in named_tensors:
        if not tensor.is_floating_point() or tensor.device.type == "meta":
            continue
        if torch.isfinite(tensor.sum(dtype=torch.float32)) or bool(torch.isfinite(tensor).all()):
            continue
        bad.append(name)
    return bad


def check_finite_weights(what: str, weights: Path, module: torch.nn.Module, fix: str) -> None:
    """Raise if any parameter or buffer of a freshly loaded component is NaN or infinite."""
    with torch.no_grad():
        bad = nonfinite_names(module.state_dict().items())
    if bad:
        raise CheckpointError(
            f"the {what} weights in {printable(weights)} contain NaN or infinite values "
            f"({len(bad)} tensors: {_first(bad)}); the file is damaged: replace it ({fix})"
        )


def require_finite_latents(latents: torch.Tensor, precision: object = None) -> None:
    """Stop before decoding when denoising produced NaN/inf: the picture would be black or noise."""
    if bool(torch.isfinite(latents).all()):
        return
    if precision in (torch.float16, "fp16"):
        raise NumericalError.about("precision", "denoising produced NaN or infinite values, nothing was saved; half "
                                   "precision overflowed: try {@precision} fp32 (or bf16)", value="fp16",
                                   otherwise="denoising produced NaN or infinite values, nothing was saved; half "
                                             "precision overflowed (fp32 or bf16 would not)")
    raise NumericalError("denoising produced NaN or infinite values, nothing was saved; the weights or the inputs "
                         "drive the model out of range")
