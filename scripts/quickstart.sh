#!/usr/bin/env bash
# Install ootd and run one try-on on the example images that ship in examples/.
# With the released checkpoints in ./checkpoints (see checkpoints/README.md) the result is a real
# try-on; without them, tiny random-weight checkpoints are generated and the picture is NOISE:
# that only shows that the whole chain runs.
#   bash scripts/quickstart.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup_env.sh

CKPT=${OOTD_CHECKPOINTS:-checkpoints}
if ootd checkpoints verify "$CKPT" --models hd --quiet >/dev/null 2>&1; then
  echo "Using the checkpoints in $CKPT."
  ootd run --model examples/person.png --cloth examples/tshirt.png --category upper \
    --checkpoints "$CKPT" --output outputs/quickstart --seed 1 --overwrite
else
  CKPT=.tiny-checkpoints
  echo "No complete checkpoints in ${OOTD_CHECKPOINTS:-checkpoints} (run 'ootd download' to fetch them)."
  echo "Generating tiny RANDOM-WEIGHT checkpoints in $CKPT: the picture will be noise, not a try-on."
  [ -f "$CKPT/ootd/model_index.json" ] || python scripts/make_tiny_checkpoints.py "$CKPT"
  # random pose weights find no person, so the example's own mask is given
  ootd run --model examples/person.png --cloth examples/tshirt.png --category upper \
    --mask examples/person_mask_upper.png --checkpoints "$CKPT" --output outputs/quickstart \
    --resolution 384x512 --steps 4 --seed 1 --overwrite
  echo "Done. outputs/quickstart/ holds a NOISE picture made with random weights."
fi
