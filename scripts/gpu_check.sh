#!/usr/bin/env bash
# GPU measurements for docs/benchmarks.md, in one run of under 8 minutes, written to ONE JSON file.
#
#   scripts/gpu_check.sh [OUT.json]        (default: $OUT/gpu_check.json if $OUT is set, else ./gpu_check.json)
#
# What it measures, with the released architectures built in memory with random weights (no download):
# 768x1024, 4 samples, guidance on, bf16 and fp16: s/it, whole call and peak memory
# (torch.cuda.max_memory_allocated, per stage too) for each attention backend that can run here
# (flash needs flash-attn installed; it is skipped otherwise), the same for the original formulation
# (once per dtype), the memory planner's estimate next to each measured peak, FLOPs per step, and per dtype
# the first backend again with channels_last and then with torch.compile (time limit permitting).
#
# It installs nothing: it uses the Python environment it is started in (the repo is put on PYTHONPATH).
# Works on NVIDIA (CUDA) and AMD (ROCm) builds of PyTorch.
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
DEFAULT_OUT="${OUT:-.}/gpu_check.json"
RESULT="${1:-$DEFAULT_OUT}"
PYTHON="${PYTHON:-python}"
TIME_LIMIT="${TIME_LIMIT:-360}"   # no new run starts after this many seconds (each run takes ~10-40 s)
STEPS="${STEPS:-4}"               # the first step is warm-up; s/it is the median of the others

export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
export PYTORCH_HIP_ALLOC_CONF="${PYTORCH_HIP_ALLOC_CONF:-expandable_segments:True}"

if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: this PyTorch sees no CUDA/ROCm GPU; nothing to measure" >&2
    exit 1
fi

mkdir -p "$(dirname "$RESULT")"
{
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    command -v rocm-smi >/dev/null && rocm-smi --showproductname || true
} >&2

timeout --signal=INT 470 "$PYTHON" "$REPO/scripts/bench_pipeline.py" --matrix --random-weights full \
    --dtypes bf16,fp16 --attentions flash,sdpa,chunked --resolution 768x1024 --samples 4 --steps "$STEPS" \
    --speed-variants channels_last,compile --flops --time-limit "$TIME_LIMIT" --out "$RESULT"

echo "gpu_check: wrote $RESULT" >&2
