#!/usr/bin/env bash
# The tests of the metric networks (torch-fidelity's InceptionV3, lpips's AlexNet: `ootd eval`), in an environment
# of their own: torchvision imports only beside the torch build it was made for, and PyPI has none for the CPU
# torch of the main environment. Installs torch + its torchvision and ootd[dev,eval] into .venv-eval as
# scripts/setup_env.sh does (the build for this machine, the locked versions of constraints.txt), then runs every
# evaluation test with the stack required (a missing stack fails them instead of skipping them).
#   bash scripts/test_eval_stack.sh [pytest args...]
# OOTD_EVAL_VENV: the environment (default .venv-eval); OOTD_EVAL_TORCH: its torch (default 2.14.1; the
# torchvision made for it follows, 0.29.1); OOTD_NO_INSTALL=1: use the environment as it is.
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
cd "$(dirname "$0")/.."
OOTD_VENV=${OOTD_EVAL_VENV:-.venv-eval} OOTD_TORCH_VERSION=${OOTD_EVAL_TORCH:-2.14.1} EXTRAS="[dev,eval]" \
  . scripts/setup_env.sh
OOTD_EVAL_STACK=1 python -m pytest -q tests/library/evaluation tests/app/evaluate tests/frontends/cli/test_eval.py \
  tests/tools/test_measure_scripts.py \
  tests/test_dependencies.py "$@"
