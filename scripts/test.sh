#!/usr/bin/env bash
# Install everything into a virtual environment and run the linter and the test suite.
#   bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
# dev: pytest + ruff; ray: the Ray engine's tests; serve-test: ootd serve and what its tests drive it with;
# quant: torchao, for the quantization tests
EXTRAS="[dev,ray,serve-test,quant]" . scripts/setup_env.sh
bash scripts/install_browser.sh  # Debian's chromium + chromium-driver for the page test (as root, when missing)
ruff check .
python -m pytest -q "$@"
