#!/usr/bin/env bash
# Debian's chromium + chromium-driver, for the headless-browser test of `ootd serve` (tests/frontends/serve/test_page.py).
# Idempotent and quiet: nothing to do when both are there; installs them with apt-get when running as root;
# otherwise says once that the browser test will be skipped.
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
else
    echo "note: chromium and chromium-driver are missing and this is not root: the browser test will be skipped" >&2
fi
