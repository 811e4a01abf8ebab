#!/usr/bin/env bash
# Sourced by quickstart.sh and test.sh: make/enter the virtual environment and install ootd into it: the PyTorch
# build for this machine first (ROCm for an AMD GPU, CUDA for NVIDIA, else the CPU build; one line says which and
# why), then ootd and its extras at the tested versions of constraints.txt (scripts/dependencies.py).
#   EXTRAS="[dev]" . scripts/setup_env.sh
# An install with nothing changed since the last one (pyproject.toml, constraints.txt, the extras, torch) does
# nothing. Knobs: OOTD_VENV: the environment (default .venv); OOTD_NO_INSTALL=1: use it as it is, without pip;
# OOTD_TORCH=cpu|cuda|rocm: that build, whatever the machine has; OOTD_TORCH_VERSION: another torch than the
# lock's (its torchvision follows); OOTD_TORCH_INDEX_ROOT: a mirror of https://download.pytorch.org/whl;
# OOTD_DEPS=newest: the newest releases instead of the locked ones; OOTD_REINSTALL=1: install even if nothing
# changed; PYTHON: the interpreter that makes the environment.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then  # run rather than sourced (e.g. with --help): say how to use it
    sed -n '2,/^# changed; PYTHON/p' "$0" | sed 's/^# \{0,1\}//'
    [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && exit 0 || exit 2
fi
VENV=${OOTD_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
if [ "${OOTD_NO_INSTALL:-0}" != "1" ]; then
  python scripts/dependencies.py install --extras "${EXTRAS:-}"
fi
