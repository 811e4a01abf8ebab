#!/usr/bin/env bash
# Install everything into a virtual environment and run the linter and the test suite.
#   bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="[dev]" . scripts/setup_env.sh
python -m pip install -q -e ".[ray]"  # the ray extra, so the Ray engine's tests run too
ruff check .
python -m pytest -q "$@"
