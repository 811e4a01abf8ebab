#!/usr/bin/env bash
# Debian's ICC colour profiles, for the colour-management tests (tests/library/imaging/test_icc.py and the
# tests that feed colour-managed photos through the commands): colord-data and icc-profiles-free (RGB and grey
# profiles: Adobe RGB, ProPhoto RGB, ...) and libgs-common (Ghostscript's CMYK profiles), under /usr/share/color/icc.
# Idempotent and quiet: nothing to do when they are there; installs them with apt-get when running as root;
# otherwise says once that the tests needing them will be skipped.
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
PACKAGES=(colord-data icc-profiles-free libgs-common)
missing=()
for package in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    echo "note: ${missing[*]} missing and this is not root: the tests that need their ICC profiles will be skipped" >&2
fi
