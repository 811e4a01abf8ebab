#!/usr/bin/env bash
# Install everything into a virtual environment and run the linter and the test suite.
#   bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="[dev]" . scripts/setup_env.sh
ruff check .
python -m pytest -q "$@"
