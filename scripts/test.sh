#!/usr/bin/env bash
# Install everything into a virtual environment and run the linter and the test suite.
#   bash scripts/test.sh [pytest args...]
# (the environment knobs of scripts/setup_env.sh apply: OOTD_VENV, OOTD_NO_INSTALL=1, ...)
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
cd "$(dirname "$0")/.."
# dev: pytest + ruff; ray: the Ray engine's tests; ray-serve: ootd serve --engine ray (Ray Serve);
# serve-test: ootd serve and what its tests drive it with; quant: torchao, for the quantization tests; eval-math:
# torchmetrics, for the metric math (the metric networks' tests: scripts/test_eval_stack.sh); ray-train: ootd train
# --engine ray (Ray Train) and the loss plot
EXTRAS="[dev,ray,ray-serve,serve-test,quant,eval-math,ray-train]" . scripts/setup_env.sh
bash scripts/install_browser.sh  # Debian's chromium + chromium-driver for the page test (as root, when missing)
ruff check .
python -m pytest -q "$@"
