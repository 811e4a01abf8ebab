#!/usr/bin/env bash
# Sourced by quickstart.sh and test.sh: make/enter the virtual environment and install ootd into it.
#   EXTRAS="[dev]" . scripts/setup_env.sh
VENV=${OOTD_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
# torch first and pinned: an unpinned torch requirement would pull a multi-GB CUDA build.
python -m pip install -q "torch==${OOTD_TORCH_VERSION:-2.13.0}"
python -m pip install -q -e ".${EXTRAS:-}"
