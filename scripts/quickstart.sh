#!/usr/bin/env bash
# Install ootd and run one try-on on the example images that ship in examples/, then print the exact commands
# to type next (the environment to activate, a try-on on the checkpoints it used).
# With the released checkpoints in ./checkpoints (see checkpoints/README.md) the result is a real
# try-on; without them, tiny random-weight checkpoints are generated in .tiny-checkpoints and the picture is
# NOISE: that only shows that the whole chain runs. It then says what needs the released weights (automatic
# masks, `ootd mask`, --category auto) and prints an outfit's command with the examples' masks too.
#
#   bash scripts/quickstart.sh
#
# Environment knobs (all optional):
#   OOTD_CHECKPOINTS  the released checkpoints folder to look for (default ./checkpoints)
#   OOTD_VENV         the virtual environment to make or use (default ./.venv)
#   OOTD_NO_INSTALL=1 use that environment as it is: no pip (offline, or installed already)
#   OOTD_TORCH        cpu, cuda or rocm: that PyTorch build, whatever GPU the machine has (scripts/setup_env.sh)
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
if [[ $# -gt 0 ]]; then
    echo "error: quickstart.sh takes no arguments (see --help)" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
. scripts/setup_env.sh

CKPT=${OOTD_CHECKPOINTS:-checkpoints}
if ootd checkpoints verify "$CKPT" --models hd --quiet >/dev/null 2>&1; then
  echo "Using the checkpoints in $CKPT."
  ootd run --model examples/person.png --cloth examples/tshirt.png --category upper \
    --checkpoints "$CKPT" --output outputs/quickstart --seed 1 --overwrite
  NEXT="ootd run --model examples/person.png --cloth examples/tshirt.png --category upper --checkpoints $CKPT -o outputs/mine"
else
  CKPT=.tiny-checkpoints
  echo "No complete checkpoints in ${OOTD_CHECKPOINTS:-checkpoints} (run 'ootd download' to fetch them)."
  if [ -f "$CKPT/ootd/model_index.json" ]; then
    echo "Using the tiny RANDOM-WEIGHT checkpoints in $CKPT (made by an earlier run): the picture will be noise, not a try-on."
  else
    echo "Generating tiny RANDOM-WEIGHT checkpoints in $CKPT: the picture will be noise, not a try-on."
    python scripts/make_tiny_checkpoints.py "$CKPT"
  fi
  # random pose weights find no person, so the example's own mask is given
  ootd run --model examples/person.png --cloth examples/tshirt.png --category upper \
    --mask examples/person_mask_upper.png --checkpoints "$CKPT" --output outputs/quickstart \
    --resolution 384x512 --steps 4 --seed 1 --overwrite
  echo "Done. outputs/quickstart/ holds a NOISE picture made with random weights."
  cat <<TINY

What needs the released weights (on these random ones each stops with one line; that is expected):
  automatic masks (ootd run without --mask, ootd mask, the page's "Automatic mask"): "no person detected";
    give the examples' masks: examples/person_mask_upper.png (the T-shirt), examples/person_mask_lower.png
  --category auto and ootd classify: every category p 0.33, refused; give --category upper or lower
  a real picture: these weights give noise
TINY
  NEXT="ootd run --model examples/person.png --cloth examples/tshirt.png --category upper --mask examples/person_mask_upper.png --checkpoints $CKPT --resolution 384x512 --steps 4 -o outputs/mine"
  OUTFIT="ootd run --model examples/person.png --cloth examples/tshirt.png --cloth examples/trousers.png --category upper --category lower --mask examples/person_mask_upper.png --mask examples/person_mask_lower.png --checkpoints $CKPT --resolution 384x512 --steps 4 -o outputs/outfit"
fi
cat <<NEXT_STEPS

Next, in this folder ($PWD):
  . $VENV/bin/activate
  $NEXT
${OUTFIT:+  $OUTFIT
}(the first line puts \`ootd\` on PATH in this shell; \`ootd run --help\` lists every option)
NEXT_STEPS
