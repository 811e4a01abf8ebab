"""Attention backends, dispatch, selection, the SDPA patch and the diffusers installer (all on CPU)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from ootd.attention import (
    SMALL_MATH_BYTES,
    AttentionProcessor,
    BackendUnavailable,
    ChunkedBackend,
    Dispatcher,
    MathBackend,
    SdpaBackend,
    build_attention,
    check_backend,
    install_attention,
    patch_sdpa,
    plan_chunks,
)
from ootd.attention.chunked import score_bytes
from ootd.errors import DeviceError, UsageError
from ootd.hardware.device import DeviceInfo
from ootd.hardware.profiles import load_profile

CPU = DeviceInfo(type="cpu")
FAKE_GPU = DeviceInfo(type="cuda", index=0, vendor="amd", arch="gfx1100", name="fake", total_memory=24 << 30,
                      free_memory=20 << 30)


@pytest.fixture(autouse=True)
def single_thread() -> Iterator[None]:
    """Tiny tensors: a second OpenMP thread only adds barrier waits (seconds per test on a loaded 2-core box)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def qkv(b: int, h: int, nq: int, nk: int, d: int, dv: int | None = None, dtype: torch.dtype = torch.float32,
        seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=gen).to(dtype)
    k = torch.randn(b, h, nk, d, generator=gen).to(dtype)
    v = torch.randn(b, h, nk, dv or d, generator=gen).to(dtype)
    return q, k, v


# ------------------------------------------------------------------------------------------- equivalence


def _chunked_variants(b: int, h: int, nq: int, nk: int) -> dict[str, ChunkedBackend]:
    bh, bps = b * h, score_bytes(torch.float32)
    return {
        "chunked-whole": ChunkedBackend(budget_bytes=1 << 30),
        "chunked-queries": ChunkedBackend(budget_bytes=bh * nk * bps * 10, min_query_chunk=8),
        "chunked-both": ChunkedBackend(budget_bytes=bh * 8 * bps * 7, min_query_chunk=8),
    }


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("heads", [1, 8])
@pytest.mark.parametrize("head_dim", [40, 80, 160, 512])
@pytest.mark.parametrize("key_factor", [1, 2])
def test_backends_agree_with_math(batch: int, heads: int, head_dim: int, key_factor: int) -> None:
    nq = 37  # odd, not a multiple of any chunk size
    nk = nq * key_factor
    q, k, v = qkv(batch, heads, nq, nk, head_dim)
    expected = MathBackend()(q, k, v, None)
    backends = {"sdpa": SdpaBackend(), **_chunked_variants(batch, heads, nq, nk)}
    for name, backend in backends.items():
        assert backend.supports(q, k, v) is None, name
        got = backend(q, k, v, None)
        assert got.shape == expected.shape, name
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0, msg=name)


def test_chunk_variants_really_chunk() -> None:
    q, k, _ = qkv(8, 8, 37, 74, 40)
    variants = _chunked_variants(8, 8, 37, 74)
    assert variants["chunked-whole"].plan(q, k) == (37, 74)
    q_chunk, k_chunk = variants["chunked-queries"].plan(q, k)
    assert q_chunk < 37 and k_chunk == 74
    q_chunk, k_chunk = variants["chunked-both"].plan(q, k)
    assert q_chunk < 37 and k_chunk < 74


def test_chunked_edge_cases() -> None:
    tiny = ChunkedBackend(budget_bytes=1, min_query_chunk=3)
    for case in [(2, 3, 1, 5, 16), (1, 2, 7, 1, 8), (1, 1, 13, 50, 24, 9)]:  # one query, one key, Dv != D
        q, k, v = qkv(*case)
        torch.testing.assert_close(tiny(q, k, v, 0.3), MathBackend()(q, k, v, 0.3), atol=1e-5, rtol=0)
        torch.testing.assert_close(tiny(q, k, v, None), MathBackend()(q, k, v, None), atol=1e-5, rtol=0)


def test_chunked_gradients() -> None:
    for budget in (64, 1 << 20):  # key-chunked and single pass
        q, k, v = qkv(1, 2, 20, 30, 8)
        q.requires_grad_(True)
        ChunkedBackend(budget_bytes=budget, min_query_chunk=4)(q, k, v, None).sum().backward()
        q_ref = q.detach().clone().requires_grad_(True)
        MathBackend()(q_ref, k, v, None).sum().backward()
        torch.testing.assert_close(q.grad, q_ref.grad, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype,atol", [(torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_half_precision_backends(dtype: torch.dtype, atol: float) -> None:
    q, k, v = qkv(2, 4, 33, 66, 40, dtype=dtype)
    reference = MathBackend()(q.double(), k.double(), v.double(), None)
    chunked = ChunkedBackend(budget_bytes=8 * 8 * score_bytes(dtype) * 22, min_query_chunk=8)  # 8 x 22 tiles
    assert chunked.plan(q, k) == (7, 22)
    for backend in (MathBackend(), SdpaBackend(), chunked):
        got = backend(q, k, v, None)
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), reference, atol=atol, rtol=0, msg=backend.name)


def test_plan_chunks_respects_budget() -> None:
    cases = [(64, 12288, 24576, 1 << 30), (8, 12288, 24576, 1 << 30), (8, 100, 200, 10_000)]
    for bh, nq, nk, budget in cases:
        q_chunk, k_chunk = plan_chunks(bh, nq, nk, 4, budget)
        assert bh * q_chunk * k_chunk * 4 <= budget
        assert 1 <= q_chunk <= nq and 1 <= k_chunk <= nk
    assert plan_chunks(8, 12288, 24576, 4, 1 << 30)[1] == 24576  # the real shape needs only query chunks


# ------------------------------------------------------------------------------------------- dispatch


class Refuses:
    name = "refuses"
    supports_mask = False

    def supports(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
        return "never supported (test)"

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, scale: float | None = None) -> Tensor:
        raise AssertionError("must not be called")


class Wrong:
    """Claims support and returns garbage: what a broken fused kernel looks like."""

    name = "wrong"
    supports_mask = False

    def available(self, device_type: str, dtype: torch.dtype) -> str | None:
        return None

    def supports(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
        return None

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, scale: float | None = None) -> Tensor:
        return torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype) + 1.0


class Raises(Wrong):
    name = "raises"

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, scale: float | None = None) -> Tensor:
        raise RuntimeError("HIP error: invalid device function")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.filterwarnings("ignore:.*[Ff]lash attention")
def test_forced_sdpa_falls_through_on_unfused_input(caplog: pytest.LogCaptureFixture) -> None:
    # CPU's fused SDPA kernel needs equal q/k and v head dims: with restricted kernels this raises.
    attention = build_attention("sdpa", CPU, torch.float32)
    assert attention.order == ["sdpa", "chunked"]
    q, k, v = qkv(1, 2, 16, 32, 40, dv=64)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            out = attention(q, k, v, None)
    torch.testing.assert_close(out, MathBackend()(q, k, v, None), atol=1e-5, rtol=0)
    assert attention.used == {"chunked": 3}
    messages = _warnings(caplog)
    assert len(messages) == 1 and "sdpa" in messages[0] and "fused" in messages[0]
    q, k, v = qkv(1, 2, 16, 32, 40)  # a normal input still goes to sdpa
    attention(q, k, v, None)
    assert attention.used["sdpa"] == 1


@pytest.mark.filterwarnings("ignore:.*[Ff]lash attention")
def test_sdpa_raises_unavailable_instead_of_math() -> None:
    q, k, v = qkv(1, 2, 8, 8, 40, dv=24)
    with pytest.raises(BackendUnavailable):
        SdpaBackend()(q, k, v, None)


def test_declared_unsupported_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    attention = Dispatcher([Refuses(), ChunkedBackend()])
    q, k, v = qkv(1, 2, 8, 8, 40)
    with caplog.at_level(logging.WARNING):
        for _ in range(4):
            attention(q, k, v, None)
    assert attention.used == {"chunked": 4}
    assert len(_warnings(caplog)) == 1
    assert "refuses" in attention.describe() and "chunked x 4" in attention.describe()


def test_other_errors_propagate() -> None:
    attention = Dispatcher([Raises(), ChunkedBackend()])
    q, k, v = qkv(1, 2, 8, 8, 40)
    with pytest.raises(RuntimeError, match="invalid device function"):
        attention(q, k, v, None)


def test_math_never_serves_large_calls_under_auto() -> None:
    refusing = {"sdpa": Refuses(), "chunked": Refuses()}
    attention = build_attention("auto", CPU, torch.float32, backends=refusing)
    assert attention.order[-1] == "math"
    small = qkv(1, 2, 8, 8, 40)
    attention(*small, None)
    assert attention.used == {"math": 1}
    big = [torch.empty(8, 8, n, 40, device="meta") for n in (12288, 24576, 24576)]  # shapes only
    assert MathBackend(max_score_bytes=SMALL_MATH_BYTES).supports(*big) is not None
    with pytest.raises(DeviceError, match="no attention backend"):
        attention(*big, None)


def test_explicit_names() -> None:
    assert build_attention("chunked", CPU, torch.float32).order == ["chunked"]
    assert build_attention("math", CPU, torch.float32).order == ["math"]
    assert build_attention("auto", CPU, torch.float32).order == ["sdpa", "chunked", "math"]
    assert "math" not in build_attention("sdpa", CPU, torch.float32).order
    with pytest.raises(DeviceError, match="flash"):
        build_attention("flash", CPU, torch.float32)
    with pytest.raises(UsageError):
        build_attention("xformers", CPU, torch.float32)
    mps = DeviceInfo(type="mps", vendor="apple", arch="mps")
    with pytest.raises(DeviceError):
        build_attention("sdpa", mps, torch.float16)
    chunked = build_attention("chunked", CPU, torch.float32, budget_bytes=12345).backends[0]
    assert isinstance(chunked, ChunkedBackend) and chunked.budget_bytes == 12345


# ------------------------------------------------------------------------------------------- self-check


def test_check_backend() -> None:
    cpu = torch.device("cpu")
    assert check_backend(ChunkedBackend(budget_bytes=4096), cpu, torch.float32) is None
    assert check_backend(SdpaBackend(), cpu, torch.float32) is None
    assert "differs" in (check_backend(Wrong(), cpu, torch.float32) or "")
    assert "raised" in (check_backend(Raises(), cpu, torch.float32) or "")
    assert "none" in (check_backend(Refuses(), cpu, torch.float32) or "")


def test_auto_self_check_drops_wrong_backend(caplog: pytest.LogCaptureFixture) -> None:
    profile = load_profile(FAKE_GPU)
    with caplog.at_level(logging.WARNING):
        attention = build_attention("auto", FAKE_GPU, torch.float32, profile=profile,
                                    backends={"sdpa": Wrong()}, check_device=torch.device("cpu"))
    assert attention.order[0] == "chunked" and "wrong" not in attention.order
    assert any("self-check" in m and "wrong" in m for m in _warnings(caplog))
    q, k, v = qkv(1, 2, 8, 8, 40)
    torch.testing.assert_close(attention(q, k, v, None), MathBackend()(q, k, v, None), atol=1e-5, rtol=0)
    assert attention.used == {"chunked": 1}


def test_auto_self_check_keeps_good_backend(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        attention = build_attention("auto", FAKE_GPU, torch.float32, check_device=torch.device("cpu"))
    assert attention.order[0] == "sdpa"  # flash is not installed here; sdpa passed its check on CPU
    assert not any("self-check" in m for m in _warnings(caplog))


# ------------------------------------------------------------------------------------------- patch_sdpa


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, scale: float | None = None) -> Tensor:
        self.calls += 1
        return MathBackend()(q, k, v, scale)


def test_patch_sdpa_routes_and_restores() -> None:
    original = F.scaled_dot_product_attention
    counting = Counting()
    q, k, v = qkv(1, 2, 8, 8, 16)
    with patch_sdpa(counting):
        assert F.scaled_dot_product_attention is not original
        assert torch.nn.functional.scaled_dot_product_attention is F.scaled_dot_product_attention
        out = F.scaled_dot_product_attention(q, k, v)
        assert counting.calls == 1
        torch.testing.assert_close(out, original(q, k, v), atol=1e-5, rtol=0)
        F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool))
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, scale=0.5)
        assert counting.calls == 2  # mask and causal went to the original
    assert F.scaled_dot_product_attention is original


def test_patch_sdpa_restores_after_exception() -> None:
    original = F.scaled_dot_product_attention
    with pytest.raises(ValueError), patch_sdpa(Counting()):
        raise ValueError("boom")
    assert F.scaled_dot_product_attention is original


def test_patch_sdpa_with_sdpa_backends_does_not_recurse() -> None:
    original = F.scaled_dot_product_attention
    q, k, v = qkv(1, 2, 8, 8, 16)
    attention = build_attention("auto", CPU, torch.float32)
    with patch_sdpa(attention), patch_sdpa(attention):  # nested, and sdpa inside calls the real function
        out = F.scaled_dot_product_attention(q, k, v)
    assert F.scaled_dot_product_attention is original
    assert attention.used == {"sdpa": 1}
    torch.testing.assert_close(out, original(q, k, v), atol=1e-5, rtol=0)


def test_import_patches_nothing() -> None:
    code = textwrap.dedent("""
        import os
        import torch.nn.functional as F
        before, env = F.scaled_dot_product_attention, dict(os.environ)
        import ootd, ootd.attention, ootd.hardware.device
        assert F.scaled_dot_product_attention is before, "import patched SDPA"
        assert dict(os.environ) == env, "import changed the environment"
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_patch_routes_transformers_clip() -> None:
    from transformers import CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(0)
    config = CLIPVisionConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                              num_attention_heads=4, image_size=30, patch_size=10, attn_implementation="sdpa")
    model = CLIPVisionModel(config).eval()
    pixels = torch.randn(2, 3, 30, 30)
    with torch.no_grad():
        expected = model(pixels).last_hidden_state
        attention = build_attention("chunked", CPU, torch.float32, budget_bytes=2048)
        with patch_sdpa(attention):
            got = model(pixels).last_hidden_state
    assert attention.used["chunked"] == 2  # one call per layer
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------- diffusers


def _tiny_unet() -> torch.nn.Module:
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=32,
    ).eval()


def _tiny_vae() -> torch.nn.Module:
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(
        block_out_channels=(32, 64), in_channels=3, out_channels=3, latent_channels=4, norm_num_groups=32,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
    ).eval()


def _attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    from diffusers.models.attention_processor import Attention

    return [m for m in model.modules() if isinstance(m, Attention)]


@pytest.mark.parametrize("name", ["auto", "chunked", "math"])
def test_install_attention_matches_stock(name: str) -> None:
    unet, vae = _tiny_unet(), _tiny_vae()
    torch.manual_seed(1)
    sample, context, image = torch.randn(2, 4, 16, 16), torch.randn(2, 7, 32), torch.randn(1, 3, 32, 32)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0, 1], [1, 1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        stock_unet = unet(sample, 10, encoder_hidden_states=context).sample
        stock_masked = unet(sample, 10, encoder_hidden_states=context, encoder_attention_mask=mask).sample
        stock_vae = vae(image).sample
        attention = build_attention(name, CPU, torch.float32, budget_bytes=64 << 10)
        install_attention([unet, vae], attention)
        modules = _attention_modules(unet) + _attention_modules(vae)
        assert len(modules) >= 5 and all(isinstance(m.processor, AttentionProcessor) for m in modules)
        ours_unet = unet(sample, 10, encoder_hidden_states=context).sample
        ours_masked = unet(sample, 10, encoder_hidden_states=context, encoder_attention_mask=mask).sample
        ours_vae = vae(image).sample
    torch.testing.assert_close(ours_unet, stock_unet, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours_masked, stock_masked, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours_vae, stock_vae, atol=1e-5, rtol=0)
    assert sum(attention.used.values()) > 0


def test_install_attention_keeps_fusion_processors() -> None:
    class FusionLike:
        def __init__(self) -> None:
            self.attention = None

        def __call__(self, attn: torch.nn.Module, hidden_states: torch.Tensor, *args: object,
                     **kwargs: object) -> torch.Tensor:
            return hidden_states

    unet = _tiny_unet()
    modules = _attention_modules(unet)
    special = FusionLike()
    modules[0].set_processor(special)
    attention = build_attention("chunked", CPU, torch.float32)
    install_attention([unet], attention)
    assert modules[0].processor is special and special.attention is attention
    assert all(isinstance(m.processor, AttentionProcessor) for m in modules[1:])
    assert all(m.processor.attention is attention for m in modules[1:])


# ------------------------------------------------------------------------------ folded cross-attention


def _cross_attention(bias: bool, heads: int = 4, dim_head: int = 16) -> torch.nn.Module:
    from diffusers.models.attention_processor import Attention

    torch.manual_seed(3)
    return Attention(query_dim=64, cross_attention_dim=32, heads=heads, dim_head=dim_head, bias=bias,
                     out_bias=True).eval()


@pytest.mark.parametrize("tokens", [1, 2, 4])
@pytest.mark.parametrize("bias", [False, True])
def test_folded_cross_attention_matches_stock(tokens: int, bias: bool) -> None:
    from diffusers.models.attention_processor import AttnProcessor2_0

    from ootd.attention.processor import folds

    attn = _cross_attention(bias)
    gen = torch.Generator().manual_seed(tokens)
    x, context = torch.randn(3, 50, 64, generator=gen), torch.randn(3, tokens, 32, generator=gen) * 3
    calls: list[int] = []

    def counting(q: Tensor, k: Tensor, v: Tensor, scale: float | None = None) -> Tensor:
        calls.append(1)
        return F.scaled_dot_product_attention(q, k, v, scale=scale)

    with torch.no_grad():
        stock = AttnProcessor2_0()(attn, x, context)
        assert folds(attn, x, context, None)
        ours = AttentionProcessor(counting)(attn, x, context)
    torch.testing.assert_close(ours, stock, atol=2e-6, rtol=1e-5)
    assert not calls  # the fold, not the attention function, served it
    # a control: dropping a key changes the result, so the comparison above can fail
    with torch.no_grad():
        fewer = AttentionProcessor(counting)(attn, x, context[:, :-1]) if tokens > 1 else stock + 1
    assert (fewer - stock).abs().max() > 1e-3


def test_folded_cross_attention_in_half_precision() -> None:
    from diffusers.models.attention_processor import AttnProcessor2_0

    attn = _cross_attention(False)
    gen = torch.Generator().manual_seed(0)
    x, context = torch.randn(2, 40, 64, generator=gen), torch.randn(2, 2, 32, generator=gen)
    with torch.no_grad():
        reference = AttnProcessor2_0()(attn, x, context)
        attn = attn.to(torch.bfloat16)
        ours = AttentionProcessor()(attn, x.bfloat16(), context.bfloat16())
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), reference, atol=3e-2, rtol=3e-2)


def test_fold_only_where_it_applies_and_pays() -> None:
    from ootd.attention.processor import folds

    attn = _cross_attention(False)  # 4 heads x 16 = 64 inner: at most 4 context tokens
    x = torch.randn(1, 10, 64)
    assert folds(attn, x, torch.randn(1, 4, 32), None)
    assert not folds(attn, x, torch.randn(1, 5, 32), None)  # long context: the projections are cheaper
    assert not folds(attn, x, torch.randn(1, 2, 32), torch.ones(1, 2, dtype=torch.bool))  # masked
    assert not folds(attn, x, None, None)  # self-attention
    assert not folds(attn, x.view(1, 64, 10, 1), torch.randn(1, 2, 32), None)  # 4-D input (VAE style)

    class Wrapped(torch.nn.Module):  # an adapter around the projection (LoRA-style): its weight is not all
        def __init__(self, inner: torch.nn.Linear) -> None:
            super().__init__()
            self.inner, self.weight, self.bias = inner, inner.weight, inner.bias

        def forward(self, t: Tensor) -> Tensor:
            return self.inner(t) * 2

    wrapped = _cross_attention(False)
    wrapped.to_q = Wrapped(wrapped.to_q)
    assert not folds(wrapped, x, torch.randn(1, 2, 32), None)
    calls: list[int] = []

    def counting(q: Tensor, k: Tensor, v: Tensor, scale: float | None = None) -> Tensor:
        calls.append(1)
        return F.scaled_dot_product_attention(q, k, v, scale=scale)

    with torch.no_grad():
        AttentionProcessor(counting)(attn, x, torch.randn(1, 7, 32))
    assert calls  # a long context goes through the attention function
