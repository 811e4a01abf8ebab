#!/usr/bin/env bash
# Sourced by quickstart.sh and test.sh: make/enter the virtual environment and install ootd into it.
#   EXTRAS="[dev]" . scripts/setup_env.sh
# OOTD_VENV: the environment (default .venv); OOTD_NO_INSTALL=1: use it as it is, without pip;
# OOTD_TORCH_VERSION: the torch to pin (default 2.13.0); PYTHON: the interpreter that makes the environment.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then  # run rather than sourced (e.g. with --help): say how to use it
    sed -n '2,/^# OOTD_TORCH/p' "$0" | sed 's/^# \{0,1\}//'
    [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && exit 0 || exit 2
fi
VENV=${OOTD_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
if [ "${OOTD_NO_INSTALL:-0}" != "1" ]; then
  python -m pip install -q --upgrade pip
  # torch first and pinned: an unpinned torch requirement would pull a multi-GB CUDA build.
  python -m pip install -q "torch==${OOTD_TORCH_VERSION:-2.13.0}"
  python -m pip install -q -e ".${EXTRAS:-}"
fi
