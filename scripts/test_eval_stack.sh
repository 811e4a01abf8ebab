#!/usr/bin/env bash
# The tests of the metric networks (torch-fidelity's InceptionV3, lpips's AlexNet: `ootd eval`), in an environment
# of their own: torchvision imports only beside the torch build it was made for, and PyPI has none for the CPU
# torch of the main environment. Installs torch + torchvision and ootd[dev,eval] into .venv-eval, then runs every
# evaluation test with the stack required (a missing stack fails them instead of skipping them).
#   bash scripts/test_eval_stack.sh [pytest args...]
# OOTD_EVAL_VENV: the environment (default .venv-eval); OOTD_EVAL_TORCH, OOTD_EVAL_TORCHVISION: the pair to install
# (default 2.14.1 and 0.29.1, a matching pair); OOTD_NO_INSTALL=1: use the environment as it is.
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
cd "$(dirname "$0")/.."
install=${OOTD_NO_INSTALL:-0}
OOTD_VENV=${OOTD_EVAL_VENV:-.venv-eval} OOTD_NO_INSTALL=1 . scripts/setup_env.sh  # make and enter it only
if [ "$install" != "1" ]; then
  python -m pip install -q --upgrade pip
  python -m pip install -q "torch==${OOTD_EVAL_TORCH:-2.14.1}" "torchvision==${OOTD_EVAL_TORCHVISION:-0.29.1}"
  python -m pip install -q -e ".[dev,eval]"
fi
OOTD_EVAL_STACK=1 python -m pytest -q tests/library/evaluation tests/app/evaluate tests/frontends/cli/test_eval.py "$@"
