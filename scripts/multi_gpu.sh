#!/usr/bin/env bash
# One `ootd batch` process per GPU over one pairs CSV (or a folder of people x a folder of garments), each
# taking its shard (--shard K/N).
#
#   scripts/multi_gpu.sh PAIRS.csv [extra ootd batch options...]
#   scripts/multi_gpu.sh PEOPLE_DIR GARMENTS_DIR [extra ootd batch options...]
#
# Shards are contiguous blocks of the batch's run order (grouped by garment, so each garment is prepared once
# or twice in total), near-equal in size, and stable: rerunning the same command resumes every shard.
# Each process sees exactly one GPU through HIP_VISIBLE_DEVICES (ROCm) or CUDA_VISIBLE_DEVICES (NVIDIA) and
# runs on DEVICE of its view (cuda:0); logs (one line per finished pair) go to OUT/shard<K>.log, reports to OUT/batch_report.shard<K>of<N>.jsonl and
# are concatenated into OUT/batch_report.jsonl at the end.
#
# Environment knobs (all optional):
#   GPUS              GPU indices to use, e.g. "0,1,2,3" (default: every visible GPU)
#   GPU_VAR           HIP_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES (default: HIP on ROCm, CUDA otherwise)
#   DEVICE            the device each process uses within its one-GPU view (default cuda:0)
#   OUT               output folder shared by all shards (default outputs/batch)
#   CATEGORY          upper, lower or dress: folder mode, and CSV rows without a category
#   PAIRING, MASKS    folder mode: product or zip; a folder of masks named like the person photos
#   OOTD_CHECKPOINTS, STEPS, SAMPLES, RESOLUTION, SEED, PRECISION, ATTENTION   as in batch_tryon.sh
#   PYTORCH_HIP_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF   passed through untouched
#   OOTD              the ootd command (default: as in batch_tryon.sh, this checkout's .venv/bin/ootd first)
#   DRY_RUN=1         print the commands instead of running them
#
# Exit code: 0 only if every shard succeeded. Set SEED so all shards use the same seed (else each draws one).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    usage
    exit 0
fi
if [[ $# -lt 1 ]]; then
    usage
    echo "error: give PAIRS.csv, or PEOPLE_DIR GARMENTS_DIR" >&2
    exit 2
fi

if [[ -d "$1" ]]; then  # folder mode: PEOPLE_DIR GARMENTS_DIR
    if [[ $# -lt 2 || ! -d "$2" ]]; then
        echo "error: folder mode takes PEOPLE_DIR GARMENTS_DIR" >&2
        exit 2
    fi
    inputs=(--models "$1" --cloths "$2" --pairing "${PAIRING:-product}")
    shift 2
else
    inputs=("$1")
    shift
fi
out=${OUT:-outputs/batch}

# shellcheck source=scripts/ootd_command.sh
source "$(dirname "${BASH_SOURCE[0]}")/ootd_command.sh"

if [[ -z "${GPU_VAR:-}" ]]; then
    if [[ -e /dev/kfd ]] || command -v rocm-smi > /dev/null 2>&1; then
        GPU_VAR=HIP_VISIBLE_DEVICES
    else
        GPU_VAR=CUDA_VISIBLE_DEVICES
    fi
fi

if [[ -n "${GPUS:-}" ]]; then
    IFS=',' read -r -a gpus <<< "$GPUS"
else
    count=$("$ootd_python" -c 'import torch; print(torch.cuda.device_count())' 2> /dev/null || echo 0)
    if [[ "$count" -lt 1 ]]; then
        echo "error: no GPU visible to PyTorch; set GPUS=0,1,... or use scripts/batch_tryon.sh" >&2
        exit 1
    fi
    gpus=()
    for ((i = 0; i < count; i++)); do gpus+=("$i"); done
fi
n=${#gpus[@]}

common=(--output "$out" --steps "${STEPS:-20}" --samples "${SAMPLES:-1}" --resolution "${RESOLUTION:-768x1024}"
    --precision "${PRECISION:-auto}" --attention "${ATTENTION:-auto}" --device "${DEVICE:-cuda:0}")
[[ -n "${OOTD_CHECKPOINTS:-}" ]] && common+=(--checkpoints "$OOTD_CHECKPOINTS")
[[ -n "${SEED:-}" ]] && common+=(--seed "$SEED")
[[ -n "${CATEGORY:-}" ]] && common+=(--category "$CATEGORY")
[[ -n "${MASKS:-}" ]] && common+=(--masks "$MASKS")

if [[ "${DRY_RUN:-0}" != "1" ]]; then
    mkdir -p "$out"
fi
pids=()
for ((k = 0; k < n; k++)); do
    cmd=("${ootd_cmd[@]}" batch "${inputs[@]}" --shard "$k/$n" "${common[@]}"
        --report "$out/batch_report.shard${k}of${n}.jsonl" "$@")
    if [[ "${DRY_RUN:-0}" == "1" ]]; then
        printf '%s=%s ' "$GPU_VAR" "${gpus[$k]}"
        printf '%q ' "${cmd[@]}"
        printf '\n'
        continue
    fi
    # exactly one visibility variable per child: both set would filter twice
    (
        unset HIP_VISIBLE_DEVICES CUDA_VISIBLE_DEVICES
        export "$GPU_VAR=${gpus[$k]}"
        exec "${cmd[@]}"
    ) > "$out/shard${k}.log" 2>&1 &
    pids+=($!)
    echo "shard $k/$n on GPU ${gpus[$k]}: pid $!, log $out/shard${k}.log"
done
[[ "${DRY_RUN:-0}" == "1" ]] && exit 0

status=0
for ((k = 0; k < n; k++)); do
    if wait "${pids[$k]}"; then
        echo "shard $k/$n: done"
    else
        code=$?
        echo "shard $k/$n: exit $code (see $out/shard${k}.log)" >&2
        status=1
    fi
done
cat "$out"/batch_report.shard*of"${n}".jsonl > "$out/batch_report.jsonl" 2> /dev/null || true
echo "report: $out/batch_report.jsonl"
exit $status
