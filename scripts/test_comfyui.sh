#!/usr/bin/env bash
# ootd's ComfyUI nodes against a real ComfyUI. Installs ComfyUI from a release tarball or a folder into
# .comfyui/ComfyUI, and an environment of its own (.venv-comfyui: torch 2.14.1 + torchvision 0.29.1, the pair
# ComfyUI needs and the only one PyPI has a torchvision for, ootd with its dev and serve-test extras under the
# lock, ComfyUI's requirements and requests); runs `ootd comfyui install`; then runs the tests marked `comfyui`
# (tests/frontends/comfyui), which start that ComfyUI headless on 127.0.0.1 on the CPU, on the tiny checkpoints,
# and test its HTTP API and its page in headless Chromium. About 4 minutes to install (warm pip cache) and 10 of
# tests on a quiet 2-core machine.
#   bash scripts/test_comfyui.sh [pytest args...]
# OOTD_COMFYUI_SOURCE: ComfyUI's tarball or folder (default ../shared/vendor/comfyui-0.8.0.tar.gz, relative to
# the repository, or ../../shared/... from a worktree; a user: a checkout of ComfyUI's v0.8.0 tag); OOTD_COMFYUI_HOME: where it is installed (default
# .comfyui/ComfyUI); OOTD_COMFYUI_VENV: the environment (default .venv-comfyui); OOTD_COMFYUI_TORCH: its torch
# (default 2.14.1, torchvision 0.29.1 beside it); OOTD_NO_INSTALL=1: use both as they are.
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
cd "$(dirname "$0")/.."
repo=$PWD
vendored=shared/vendor/comfyui-0.8.0.tar.gz  # beside the repository (a worktree: beside its parent)
default=$repo/../$vendored
[ -f "$default" ] || [ ! -f "$repo/../../$vendored" ] || default=$repo/../../$vendored
source=${OOTD_COMFYUI_SOURCE:-$default}
home=${OOTD_COMFYUI_HOME:-$repo/.comfyui/ComfyUI}
torch_version=${OOTD_COMFYUI_TORCH:-2.14.1}  # its torchvision follows (0.29.1): the pair ComfyUI needs
install=${OOTD_NO_INSTALL:-0}

install_comfyui() {  # the tarball unpacked, or the folder copied (without its git history), into $home
    local staging
    staging=$(mktemp -d "$(dirname "$home")/.comfyui-XXXXXX")
    if [ -f "$source" ]; then
        tar -xzf "$source" -C "$staging"
        local top
        top=$(find "$staging" -mindepth 1 -maxdepth 1 -type d)  # ComfyUI-0.8.0/ in the release tarball
        [ "$top" = "$staging/ComfyUI" ] || mv "$top" "$staging/ComfyUI"
    elif [ -d "$source" ] && [ -f "$source/main.py" ]; then
        (cd "$source" && tar --exclude=.git --exclude=custom_nodes/ootd -cf - .) | (mkdir "$staging/ComfyUI" && \
            cd "$staging/ComfyUI" && tar -xf -)
    else
        echo "error: no ComfyUI at $source: set OOTD_COMFYUI_SOURCE to its release tarball or a checkout of its" \
             "v0.8.0 tag" >&2
        rm -rf "$staging"
        exit 2
    fi
    rm -rf "$home"
    mv "$staging/ComfyUI" "$home"
    rmdir "$staging"
    echo "$source" > "$home/.ootd-source"
}

mkdir -p "$(dirname "$home")"
if [ "$install" != "1" ]; then
    if [ ! -f "$home/.ootd-source" ] || [ "$(cat "$home/.ootd-source")" != "$source" ] || [ "$source" -nt "$home/.ootd-source" ]; then
        install_comfyui
    fi
fi
[ -f "$home/main.py" ] || { echo "error: no ComfyUI installed at $home (run without OOTD_NO_INSTALL=1)" >&2; exit 2; }
# ootd as every environment of ours gets it (scripts/setup_env.sh: the torch pair, then the extras under the lock,
# as scripts/test_eval_stack.sh makes its own), then ComfyUI's requirements under that environment's constraints
venv=${OOTD_COMFYUI_VENV:-.venv-comfyui}
OOTD_VENV=$venv OOTD_TORCH_VERSION=$torch_version EXTRAS="[dev,serve-test]" . scripts/setup_env.sh
if [ "$install" != "1" ]; then
    # all but its torch (the environment's pair) and torchaudio (no release beside torch 2.14 on PyPI: only some
    # of ComfyUI's audio nodes need it, and they say so when it is missing); `requests`, which it imports unlisted
    grep -vE '^(torch|torchvision|torchaudio)[[:space:]]*$' "$home/requirements.txt" > "$home/.ootd-requirements.txt"
    python -m pip install -q -c "$venv/ootd-constraints.txt" -r "$home/.ootd-requirements.txt" requests
fi
bash scripts/install_browser.sh  # Debian's chromium + chromium-driver for the page test (as root, when missing)
ootd comfyui install "$home"
OOTD_COMFYUI_DIR="$home" python -m pytest -q -m comfyui --durations=10 tests/frontends/comfyui "$@"
