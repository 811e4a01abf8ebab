"""Chunked attention in pure PyTorch: bounded memory on every device (CPU, MPS, any GPU), no custom kernels.

Queries are processed in chunks; when even a modest query chunk against all keys would exceed the budget,
keys/values are processed in chunks too, merging partial results with a running max and log-sum-exp
(the online-softmax identity), so the full score matrix never exists. Chunk sizes come from a budget in
bytes for the score working set of one step.
"""

from __future__ import annotations

import math

import torch

from ootd.attention.backends import HALF
from ootd.attention.base import default_scale, shape_problem
from ootd.errors import UsageError
from ootd.settings import AttentionName

DEFAULT_BUDGET_BYTES = 1 << 30
MIN_QUERY_CHUNK = 64  # below this many query rows per step, chunk the keys instead (small matmuls are slow)


def score_bytes(dtype: torch.dtype) -> int:
    """Peak bytes per score entry in one step: scores in the input dtype, their fp32 copy for the softmax,
    and for half inputs the probabilities cast back; fp32/fp64 work in place."""
    if dtype in HALF:
        return 4 + 2 * dtype.itemsize
    return dtype.itemsize


def _even(n: int, chunk: int) -> int:
    """Same number of chunks, sizes as equal as possible (no tiny last chunk)."""
    chunk = max(1, min(n, chunk))
    pieces = math.ceil(n / chunk)
    return math.ceil(n / pieces)


def plan_chunks(batch_heads: int, nq: int, nk: int, bytes_per_score: int, budget_bytes: int,
                min_query_chunk: int = MIN_QUERY_CHUNK) -> tuple[int, int]:
    """(query chunk, key chunk) so that batch_heads * q_chunk * k_chunk * bytes_per_score <= budget.

    The budget can only be exceeded when a single (min_query_chunk x 1) tile per batch-head is already over
    it; then the smallest tiles are used.
    """
    nq, nk = max(nq, 1), max(nk, 1)
    row = batch_heads * nk * bytes_per_score  # one query row against every key
    if row * nq <= budget_bytes:
        return nq, nk
    q_min = min(nq, min_query_chunk)
    if row * q_min <= budget_bytes:
        return _even(nq, budget_bytes // row), nk
    k_chunk = max(1, budget_bytes // (batch_heads * q_min * bytes_per_score))
    return _even(nq, q_min), _even(nk, k_chunk)


class ChunkedBackend:
    """Memory-bounded attention for every device and float dtype; exact up to rounding."""

    name = AttentionName.CHUNKED.value
    supports_mask = False

    def __init__(
        self, budget_bytes: int = DEFAULT_BUDGET_BYTES, min_query_chunk: int = MIN_QUERY_CHUNK
    ) -> None:
        if budget_bytes <= 0 or min_query_chunk <= 0:
            raise UsageError("attention chunk budget and minimum query chunk must be positive")
        self.budget_bytes = int(budget_bytes)
        self.min_query_chunk = int(min_query_chunk)

    def available(self, device_type: str, dtype: torch.dtype) -> str | None:
        return None if dtype.is_floating_point else f"dtype {dtype} is not floating point"

    def supports(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
        return shape_problem(q, k, v)

    def plan(self, q: torch.Tensor, k: torch.Tensor) -> tuple[int, int]:
        """The (query chunk, key chunk) this backend would use for these inputs."""
        lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        return plan_chunks(math.prod(lead), q.shape[-2], k.shape[-2], score_bytes(q.dtype),
                           self.budget_bytes, self.min_query_chunk)

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
    ) -> torch.Tensor:
        scale = default_scale(q, scale)
        nq, nk = q.shape[-2], k.shape[-2]
        lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        out = q.new_empty(*lead, nq, v.shape[-1])
        q_chunk, k_chunk = self.plan(q, k)
        tracking = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        ws = None if tracking else _Workspace(math.prod(lead) * q_chunk * min(k_chunk, nk), q.dtype, q.device)
        kt = k.transpose(-1, -2)
        for start in range(0, nq, q_chunk):
            qs = q[..., start:start + q_chunk, :] * scale
            if k_chunk >= nk:
                out[..., start:start + q_chunk, :] = _one_pass(qs, kt, v, ws)
            else:
                out[..., start:start + q_chunk, :] = _key_chunked(qs, kt, v, k_chunk, ws)
        return out


class _Workspace:
    """Score buffers reused by every chunk of one call: allocating the whole budget afresh per chunk costs
    page faults (CPU) or allocator churn (GPU). Not used when autograd must see the ops."""

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        self.raw = torch.empty(numel, dtype=dtype, device=device)  # q k^T in the input dtype
        self.f32 = torch.empty(numel, dtype=torch.float32, device=device) if dtype in HALF else None

    def scores(self, qs: torch.Tensor, kt: torch.Tensor) -> torch.Tensor:
        shape = (*torch.broadcast_shapes(qs.shape[:-2], kt.shape[:-2]), qs.shape[-2], kt.shape[-1])
        count = math.prod(shape)
        raw = self.raw[:count].view(shape)
        torch.matmul(qs, kt, out=raw)
        return raw if self.f32 is None else self.f32[:count].view(shape).copy_(raw)

    def cast(self, probs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if probs.dtype == dtype:
            return probs
        return self.raw[:probs.numel()].view(probs.shape).copy_(probs)


def _scores(qs: torch.Tensor, kt: torch.Tensor, ws: _Workspace | None) -> torch.Tensor:
    """qs @ kt in the softmax dtype (fp32 for half inputs), a fresh tensor or a workspace view."""
    if ws is not None:
        return ws.scores(qs, kt)
    scores = torch.matmul(qs, kt)
    return scores.float() if scores.dtype in HALF else scores


def _cast(probs: torch.Tensor, dtype: torch.dtype, ws: _Workspace | None) -> torch.Tensor:
    """Probabilities in v's dtype for the second matmul."""
    return ws.cast(probs, dtype) if ws is not None else probs.to(dtype)


def _exp_minus(scores: torch.Tensor, shift: torch.Tensor, inplace: bool) -> torch.Tensor:
    """exp(scores - shift); in place on workspace buffers, out of place when autograd is recording."""
    return scores.sub_(shift).exp_() if inplace else (scores - shift).exp()


def _one_pass(qs: torch.Tensor, kt: torch.Tensor, v: torch.Tensor, ws: _Workspace | None) -> torch.Tensor:
    """softmax(qs kt) v for one query chunk against all keys; softmax statistics in fp32.

    Normalises the (small) output instead of the (large) probabilities: one pass less over the scores.
    """
    scores = _scores(qs, kt, ws)
    scores = _exp_minus(scores, scores.amax(dim=-1, keepdim=True), inplace=ws is not None)
    denom = scores.sum(dim=-1, keepdim=True)
    out = torch.matmul(_cast(scores, v.dtype, ws), v)
    return (out.to(denom.dtype) / denom).to(v.dtype)


def _key_chunked(qs: torch.Tensor, kt: torch.Tensor, v: torch.Tensor, k_chunk: int,
                 ws: _Workspace | None) -> torch.Tensor:
    """Same result as _one_pass, visiting keys in chunks with a running max / normaliser in fp32."""
    running_max: torch.Tensor | None = None
    denom: torch.Tensor | None = None
    acc: torch.Tensor | None = None
    for start in range(0, kt.shape[-1], k_chunk):
        scores = _scores(qs, kt[..., start:start + k_chunk], ws)
        chunk_max = scores.amax(dim=-1, keepdim=True)
        new_max = chunk_max if running_max is None else torch.maximum(running_max, chunk_max)
        scores = _exp_minus(scores, new_max, inplace=ws is not None)
        part_sum = scores.sum(dim=-1, keepdim=True)
        part = torch.matmul(_cast(scores, v.dtype, ws), v[..., start:start + k_chunk, :]).to(part_sum.dtype)
        if acc is None or denom is None or running_max is None:
            acc, denom = part, part_sum
        else:
            correction = torch.exp(running_max - new_max)
            acc = acc * correction + part
            denom = denom * correction + part_sum
        running_max = new_max
    assert acc is not None and denom is not None
    return (acc / denom).to(v.dtype)
