"""Doctor items about kernels and runtimes: flash-attn, PyTorch SDPA kernels, ONNX Runtime.

On a GPU each kernel is run once on small cases and compared with the math attention by the same
self-check the attention selection uses (ootd.attention.check_backend).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from ootd.tools.doctor.report import FAIL, OK, WARN, Item


def flash_attn_items(
    import_module: Callable[[str], Any] = importlib.import_module,
    kernel_probe: Callable[[Any], str | None] | None = None,
    gpu: bool = False,
) -> list[Item]:
    """flash-attn is optional; when present on a GPU, a tiny kernel run proves it works with this torch."""
    try:
        module = import_module("flash_attn")
    except ImportError:
        if gpu:
            return [
                Item(
                    "attention",
                    "flash-attn",
                    WARN,
                    "not installed (optional: SDPA or chunked attention is used)",
                    "pip install flash-attn --no-build-isolation (ROCm: see the README)",
                )
            ]
        return [Item("attention", "flash-attn", OK, "not installed (only used on GPUs)")]
    except Exception as exc:
        return [
            Item(
                "attention",
                "flash-attn",
                WARN,
                f"installed but fails to import ({type(exc).__name__}: {exc})",
                "rebuild flash-attn against this PyTorch, or uninstall it",
            )
        ]
    version = getattr(module, "__version__", "?")
    if not gpu or kernel_probe is None:
        return [
            Item("attention", "flash-attn", OK, f"flash-attn {version} importable (kernel not run: no GPU)")
        ]
    problem = kernel_probe(module)
    if problem:
        return [
            Item(
                "attention",
                "flash-attn",
                WARN,
                f"flash-attn {version}: kernel test failed ({problem})",
                "rebuild flash-attn for this GPU "
                "(ROCm Triton backend: FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE)",
            )
        ]
    return [Item("attention", "flash-attn", OK, f"flash-attn {version}: kernel test passed")]


def flash_attn_probe(module: Any) -> str | None:
    """Run flash-attn's kernel on small fp16 cases on the GPU and compare with the math attention."""
    import torch

    from ootd.attention import FlashBackend, check_backend

    return check_backend(FlashBackend(), torch.device("cuda"), torch.float16)


def sdpa_flags() -> dict[str, bool]:
    import torch

    b = torch.backends.cuda
    flags = {
        "flash": b.flash_sdp_enabled(),
        "mem_efficient": b.mem_efficient_sdp_enabled(),
        "math": b.math_sdp_enabled(),
    }
    if hasattr(b, "cudnn_sdp_enabled"):
        flags["cudnn"] = b.cudnn_sdp_enabled()
    return flags


class _OneSdpaKernel:
    """PyTorch SDPA restricted to one kernel, shaped as an attention backend for the self-check."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def supports(self, q: Any, k: Any, v: Any) -> str | None:
        return None

    def __call__(self, q: Any, k: Any, v: Any, scale: float | None) -> Any:
        import torch
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel([self.kernel]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)


def sdpa_probe() -> dict[str, str | None]:
    """Run the flash and memory-efficient SDPA kernels on the GPU: None = works, else why not."""
    import torch
    from torch.nn.attention import SDPBackend

    from ootd.attention import check_backend

    kernels = {"flash": SDPBackend.FLASH_ATTENTION, "mem_efficient": SDPBackend.EFFICIENT_ATTENTION}
    case = ((1, 2, 128, 128, 64),)  # one common shape: the question is whether the kernel runs at all
    return {name: check_backend(_OneSdpaKernel(kernel), torch.device("cuda"), torch.float16, case)
            for name, kernel in kernels.items()}


def sdpa_items(
    flags: Mapping[str, bool], probe: Mapping[str, str | None] | None, hip: bool, environ: Mapping[str, str]
) -> list[Item]:
    """SDPA switches, and on a GPU whether a memory-efficient kernel runs (else memory is quadratic)."""
    detail = ", ".join(f"{name}={'on' if on else 'off'}" for name, on in flags.items())
    items = [Item("attention", "sdpa backends", OK, detail)]
    if probe is None:
        return items
    working = [name for name, problem in probe.items() if problem is None]
    if working:
        items.append(Item("attention", "sdpa kernels", OK, f"working on the GPU: {', '.join(working)}"))
        return items
    why = "; ".join(f"{name}: {problem}" for name, problem in probe.items())
    fix = "--attention auto falls back to chunked attention (slower); flash-attn, if it builds here, is faster"
    if hip and environ.get("TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL") != "1":
        fix = (
            "export TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1 before starting (experimental arch); else "
            + fix
        )
    items.append(
        Item("attention", "sdpa kernels", WARN, f"no memory-efficient SDPA kernel runs ({why})", fix)
    )
    return items


# ----------------------------------------------------------------------------------------------- ONNX Runtime


def onnxruntime_items(import_module: Callable[[str], Any] = importlib.import_module) -> list[Item]:
    try:
        ort = import_module("onnxruntime")
    except Exception as exc:
        return [
            Item(
                "onnxruntime",
                "version",
                FAIL,
                f"not importable ({type(exc).__name__}: {exc})",
                "pip install onnxruntime (exactly one of onnxruntime/-gpu/-rocm/-migraphx)",
                blocking=True,
            )
        ]
    providers = list(ort.get_available_providers())
    items = [Item("onnxruntime", "version", OK, f"ONNX Runtime {getattr(ort, '__version__', '?')}")]
    if "CPUExecutionProvider" not in providers:
        items.append(
            Item(
                "onnxruntime",
                "providers",
                FAIL,
                f"no CPU provider in {providers}",
                "reinstall onnxruntime",
                blocking=True,
            )
        )
    else:
        items.append(Item("onnxruntime", "providers", OK, ", ".join(providers)))
    return items
