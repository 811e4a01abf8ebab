#!/usr/bin/env bash
# Install everything into a virtual environment, then run the linter and the test suite's everyday group: every
# test not marked slow. The install is scripts/setup_env.sh's: the PyTorch build for this machine, then the extras
# below at the tested versions of constraints.txt (OOTD_DEPS=newest: the newest releases instead, to try an
# upgrade), nothing when nothing changed since the last one; the tests take under 10 minutes on a quiet 2-core
# machine. As root it also installs Debian's chromium and chromium-driver when they are missing
# (scripts/install_browser.sh), for the page's browser tests, and Debian's ICC profiles for the colour-management
# tests (scripts/install_test_packages.sh).
#   bash scripts/test.sh [pytest args...]           # the everyday group (the README's test command)
#   bash scripts/test.sh --slow [pytest args...]    # the slow group: Ray instances, the browser, signals to real
#                                                   # processes, whole scripts (CI runs it too: .ci/run)
#   bash scripts/test.sh --all [pytest args...]     # both
# (the environment knobs of scripts/setup_env.sh apply: OOTD_VENV, OOTD_NO_INSTALL=1, ...)
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
marks="not slow"
case "${1:-}" in
    --slow) marks="slow"; shift ;;
    --all) marks=""; shift ;;
esac
cd "$(dirname "$0")/.."
# dev: pytest + ruff; ray: the Ray engine's tests; ray-serve: ootd serve --engine ray (Ray Serve);
# serve-test: ootd serve and what its tests drive it with; quant: torchao, for the quantization tests; eval-math:
# torchmetrics, for the metric math (the metric networks' tests: scripts/test_eval_stack.sh); ray-train: ootd train
# --engine ray (Ray Train) and the loss plot
EXTRAS="[dev,ray,ray-serve,serve-test,quant,eval-math,ray-train]" . scripts/setup_env.sh
bash scripts/install_browser.sh  # Debian's chromium + chromium-driver for the page test (as root, when missing)
bash scripts/install_test_packages.sh  # Debian's ICC profiles for the colour tests (as root, when missing)
ruff check .
# the slowest tests are listed at the end, so growth shows
python -m pytest -q ${marks:+-m "$marks"} --durations=15 "$@"
