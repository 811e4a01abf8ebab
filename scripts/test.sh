#!/usr/bin/env bash
# Install everything into a virtual environment and run the linter and the test suite.
#   bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${OOTD_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
# torch first and pinned: an unpinned torch requirement would pull a multi-GB CUDA build.
python -m pip install -q "torch==${OOTD_TORCH_VERSION:-2.13.0}"
python -m pip install -q -e ".[dev]"
ruff check .
python -m pytest -q "$@"
