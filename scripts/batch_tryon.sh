#!/usr/bin/env bash
# A folder of people x a folder of garments through `ootd batch` (models loaded once, resumable).
#
#   scripts/batch_tryon.sh PEOPLE_DIR GARMENTS_DIR [extra ootd batch options...]
#
# Environment knobs (all optional):
#   OOTD_CHECKPOINTS  checkpoints folder (default ./checkpoints)
#   OOTD_DEVICE       cpu, cuda, cuda:N (also ROCm) or mps (default: the best available)
#   OUT               output folder (default outputs/batch)
#   CATEGORY          upper, lower or dress (default upper)
#   PAIRING           product (everyone x everything, default) or zip (i-th with i-th)
#   STEPS             denoising steps (default 20)
#   SAMPLES           images per pair (default 1)
#   RESOLUTION        768x1024 (default) or 384x512
#   SEED              fixed seed (default: one random seed for the whole batch, printed)
#   MASKS             folder of masks named like the person photos (default: automatic masks)
#   PRECISION, ATTENTION   passed as --precision / --attention (default auto)
#   PYTORCH_HIP_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF   passed through to PyTorch untouched; when unset, ootd's
#                     device policy picks the allocator settings for your GPU.
#   OOTD              the ootd command (default: the active virtual environment's, else this checkout's
#                     .venv/bin/ootd, else `ootd` on PATH; scripts/ootd_command.sh)
#   DRY_RUN=1         print the command instead of running it
#
# Exit code: ootd batch's (0 only if every pair succeeded; docs/commands.md lists them); 2 for missing arguments.
# Rerun the same command to resume.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    usage
    exit 0
fi
if [[ $# -lt 2 ]]; then
    usage
    echo "error: give PEOPLE_DIR and GARMENTS_DIR" >&2
    exit 2
fi

people=$1
garments=$2
shift 2

# shellcheck source=scripts/ootd_command.sh
source "$(dirname "${BASH_SOURCE[0]}")/ootd_command.sh"

cmd=("${ootd_cmd[@]}" batch
    --models "$people" --cloths "$garments"
    --category "${CATEGORY:-upper}" --pairing "${PAIRING:-product}"
    --output "${OUT:-outputs/batch}"
    --steps "${STEPS:-20}" --samples "${SAMPLES:-1}" --resolution "${RESOLUTION:-768x1024}"
    --precision "${PRECISION:-auto}" --attention "${ATTENTION:-auto}")
[[ -n "${OOTD_CHECKPOINTS:-}" ]] && cmd+=(--checkpoints "$OOTD_CHECKPOINTS")
[[ -n "${OOTD_DEVICE:-}" ]] && cmd+=(--device "$OOTD_DEVICE")
[[ -n "${SEED:-}" ]] && cmd+=(--seed "$SEED")
[[ -n "${MASKS:-}" ]] && cmd+=(--masks "$MASKS")
cmd+=("$@")

if [[ "${DRY_RUN:-0}" == "1" ]]; then
    printf '%q ' "${cmd[@]}"
    printf '\n'
    exit 0
fi
exec "${cmd[@]}"
