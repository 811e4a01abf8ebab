#!/usr/bin/env bash
# Reliability battery: hostile and damaged inputs against the real `ootd` command on a tiny random-weight tree.
#
#   scripts/reliability_battery.sh            # every case
#   scripts/reliability_battery.sh nan_vae    # only the named cases (function names without "case_")
#
# Builds everything it needs in a temporary folder (the tree with scripts/make_tiny_checkpoints.py, then one
# damaged copy per case), prints one "PASS name" or "FAIL name: why" line per case and a final
# "N passed, M failed" line, and exits 1 if any case failed. A case passes when ootd refuses with the expected
# exit code and ONE "error: ..." line (no traceback, no "internal error"), writes no picture, and runs no code
# from a weight file (a marker file such a payload would create never appears).
#
# Adding a case: write a function `case_<name>` that returns 0 on pass, or sets WHY and returns 1, and add
# <name> to CASES. Helpers: fresh_tree (a damaged-at-will copy of the tree), run_ootd (ootd with the standard
# one-step try-on arguments plus yours), expect_refusal CODE TEXT (checks the last run), pyrun (inline Python).
# Runs on the CPU; each case loads the tiny tree once (~10-40 s on a busy machine).
set -u

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python}"
CASE_TIMEOUT="${CASE_TIMEOUT:-300}"  # seconds: a hang is a failure, not a stuck battery
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ootd-battery.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
MARKER="$WORK/PWNED"  # created by the hostile pickles if they ever run
EX="$REPO/examples"
WHY=""
RC=0
OUT=""

pyrun() { "$PY" - "$@"; }

fresh_tree() {  # a private copy of the tiny tree in $WORK/ck (echoes its path)
  rm -rf "$WORK/ck" && cp -r "$WORK/tiny" "$WORK/ck" && echo "$WORK/ck"
}

run_ootd() {  # run_ootd CHECKPOINTS [extra args...]: a one-step try-on with a mask; sets RC and OUT
  local ck="$1"; shift
  OUT="$WORK/out"; rm -rf "$OUT"
  timeout "$CASE_TIMEOUT" "$PY" -m ootd run --model "$EX/person.png" --cloth "$EX/tshirt.png" --category upper \
    --mask "$EX/person_mask_upper.png" --checkpoints "$ck" -o "$OUT" --steps 1 --resolution 384x512 --seed 1 \
    "$@" >"$WORK/stdout" 2>"$WORK/stderr" </dev/null
  RC=$?
}

expect_refusal() {  # expect_refusal CODE TEXT: exit CODE, one "error:" line containing TEXT, no picture, no marker
  local code="$1" text="$2" err lines
  err="$(cat "$WORK/stderr")"
  lines="$(grep -c . "$WORK/stderr")"
  if [ "$RC" -eq 124 ]; then WHY="timed out after ${CASE_TIMEOUT}s"; return 1; fi
  if [ -e "$MARKER" ]; then WHY="a weight file ran code (marker file exists)"; return 1; fi
  if [ "$RC" -ne "$code" ]; then WHY="exit $RC, expected $code: $(tail -c 300 "$WORK/stderr")"; return 1; fi
  if [ "$lines" -ne 1 ] || [ "${err#error: }" = "$err" ]; then WHY="not one 'error:' line: $(head -c 300 "$WORK/stderr")"; return 1; fi
  case "$err" in *"$text"*) ;; *) WHY="message lacks '$text': $err"; return 1 ;; esac
  if [ -d "$OUT" ] && [ -n "$(find "$OUT" -name '*.png' -print -quit)" ]; then WHY="a picture was written"; return 1; fi
  return 0
}

damage() {  # damage KIND FILE [ARG]: rewrite a weight/config file in place (see the Python below)
  pyrun "$@" <<'EOF'
import os, pickle, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file

kind, path = sys.argv[1], Path(sys.argv[2])
arg = sys.argv[3] if len(sys.argv) > 3 else ""

def load(p):
    return load_file(p) if p.suffix == ".safetensors" else torch.load(p, weights_only=True)

def save(state, p):
    if p.suffix == ".safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, p)
    else:
        torch.save(state, p)

class Payload:  # unpickling this runs `touch MARKER`
    def __reduce__(self):
        return (os.system, (f"touch {arg}",))

if kind == "pickle-zip":  # a torch.save zip whose data.pkl carries the payload
    torch.save({"weight": Payload()}, path)
elif kind == "pickle-raw":  # a bare (legacy-format) pickle
    path.write_bytes(pickle.dumps({"weight": Payload()}))
elif kind == "lfs":
    path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 12345\n")
elif kind == "truncate":
    data = path.read_bytes(); path.write_bytes(data[: len(data) // 2])
elif kind == "empty":
    path.write_bytes(b"")
elif kind == "drop-key":
    state = load(path); state.pop(sorted(k for k in state if k.startswith(arg))[0]); save(state, path)
elif kind == "extra-key":
    state = load(path); state["unrelated.extra.weight"] = torch.zeros(4); save(state, path)
elif kind == "rename-keys":
    state = load(path); save({"model." + k: v for k, v in state.items()}, path)
elif kind == "nan":
    state = load(path)
    key = sorted(k for k, v in state.items() if v.is_floating_point() and v.numel() > 1)[-1]
    state[key] = state[key].clone(); state[key].view(-1)[0] = float("nan"); save(state, path)
elif kind == "overflow":  # finite but so large that the network's output overflows
    state = load(path); state[arg] = torch.full_like(state[arg], 3e38); save(state, path)
elif kind == "utf16":
    path.write_bytes(path.read_text().encode("utf-16"))
else:
    sys.exit(f"unknown damage {kind}")
EOF
}

# -- cases: hostile pickles ----------------------------------------------------------------------------------

pickle_case() {  # pickle_case FORMAT RELATIVE_FILE RUNNER: the payload must never run; the file is named
  local ck; ck="$(fresh_tree)"; rm -f "$MARKER"
  damage "$1" "$ck/$2" "$MARKER" || { WHY="could not build the input"; return 1; }
  "$3" "$ck"
  expect_refusal 1 "$(basename "$2")"
}
case_pickle_zip_text_encoder() { pickle_case pickle-zip ootd/text_encoder/pytorch_model.bin run_ootd; }
case_pickle_raw_text_encoder() { pickle_case pickle-raw ootd/text_encoder/pytorch_model.bin run_ootd; }
case_pickle_zip_vae() { pickle_case pickle-zip ootd/vae/diffusion_pytorch_model.bin run_ootd; }
case_pickle_raw_vae() { pickle_case pickle-raw ootd/vae/diffusion_pytorch_model.bin run_ootd; }
# no --mask, so the pose model is loaded
case_pickle_zip_openpose() { pickle_case pickle-zip openpose/ckpts/body_pose_model.pth automask_run; }
case_pickle_raw_openpose() { pickle_case pickle-raw openpose/ckpts/body_pose_model.pth automask_run; }

automask_run() {  # a try-on without --mask: pose and parsing are loaded
  OUT="$WORK/out"; rm -rf "$OUT"
  timeout "$CASE_TIMEOUT" "$PY" -m ootd run --model "$EX/person.png" --cloth "$EX/tshirt.png" --category upper \
    --checkpoints "$1" -o "$OUT" --steps 1 --resolution 384x512 --seed 1 >"$WORK/stdout" 2>"$WORK/stderr" </dev/null
  RC=$?
}

# -- cases: damaged files ------------------------------------------------------------------------------------

UNET_GARM=ootd/ootd_hd/checkpoint-36000/unet_garm/diffusion_pytorch_model.safetensors
UNET_VTON=ootd/ootd_hd/checkpoint-36000/unet_vton/diffusion_pytorch_model.safetensors
damaged_run() {  # damaged_run KIND FILE ARG CODE TEXT
  local ck; ck="$(fresh_tree)"
  damage "$1" "$ck/$2" "$3" || { WHY="could not build the input"; return 1; }
  run_ootd "$ck"
  expect_refusal "$4" "$5"
}
case_lfs_pointer_unet() { damaged_run lfs "$UNET_GARM" "" 1 "diffusion_pytorch_model.safetensors"; }
case_lfs_pointer_vae() { damaged_run lfs ootd/vae/diffusion_pytorch_model.bin "" 1 "diffusion_pytorch_model.bin"; }
case_truncated_onnx() {
  local ck; ck="$(fresh_tree)"; damage truncate "$ck/humanparsing/parsing_atr.onnx"
  automask_run "$ck"; expect_refusal 1 "parsing_atr.onnx"
}
case_empty_onnx() {
  local ck; ck="$(fresh_tree)"; damage empty "$ck/humanparsing/parsing_lip.onnx"
  automask_run "$ck"; expect_refusal 1 "parsing_lip.onnx"
}
case_missing_key_vae() { damaged_run drop-key ootd/vae/diffusion_pytorch_model.bin decoder. 1 "missing"; }
case_missing_key_clip() { damaged_run drop-key clip-vit-large-patch14/model.safetensors vision_model. 1 "missing"; }
case_unexpected_key_text_encoder() { damaged_run extra-key ootd/text_encoder/pytorch_model.bin "" 1 "unexpected"; }
case_wrong_tensor_names_unet() { damaged_run rename-keys "$UNET_GARM" "" 1 "do not fit the model"; }
case_nan_weights_vae() { damaged_run nan ootd/vae/diffusion_pytorch_model.bin "" 1 "NaN or infinite"; }
case_nan_weights_unet() { damaged_run nan "$UNET_VTON" "" 1 "NaN or infinite"; }
case_overflowing_latents() { damaged_run overflow "$UNET_VTON" conv_out.weight 1 "nothing was saved"; }
case_utf16_model_index() { damaged_run utf16 ootd/model_index.json "" 1 "not UTF-8"; }
case_utf16_vae_config() { damaged_run utf16 ootd/vae/config.json "" 1 "not UTF-8"; }

# -- cases: odd arguments and input files --------------------------------------------------------------------

case_fifo_person() {
  rm -f "$WORK/fifo.png"; mkfifo "$WORK/fifo.png" || { WHY="mkfifo failed"; return 1; }
  run_ootd "$WORK/tiny" --model "$WORK/fifo.png"
  expect_refusal 2 "not a regular file"
}
case_fifo_mask() {
  rm -f "$WORK/fifo.png"; mkfifo "$WORK/fifo.png" || { WHY="mkfifo failed"; return 1; }
  run_ootd "$WORK/tiny" --mask "$WORK/fifo.png"
  expect_refusal 2 "not a regular file"
}
case_non_utf8_person_name() {  # must work: exit 0, one picture
  local odd; odd="$WORK/$(printf 'caf\xe9')_person.png"; cp "$EX/person.png" "$odd"
  run_ootd "$WORK/tiny" --model "$odd"
  if [ "$RC" -ne 0 ]; then WHY="exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; fi
  [ -n "$(find "$OUT" -name '*.png' -print -quit)" ] || { WHY="no picture written"; return 1; }
}
case_mask_grow_20000() { run_ootd "$WORK/tiny" --mask-grow 20000; expect_refusal 2 "--mask-grow"; }
case_mask_grow_100000() { run_ootd "$WORK/tiny" --mask-grow 100000; expect_refusal 2 "--mask-grow"; }
case_mask_grow_negative() { run_ootd "$WORK/tiny" --mask-grow -1; expect_refusal 2 "--mask-grow"; }
case_unknown_device() { run_ootd "$WORK/tiny" --device tpu; expect_refusal 2 "unknown device 'tpu'"; }
case_bad_ootd_device() { OOTD_DEVICE=cuda:x run_ootd "$WORK/tiny"; expect_refusal 2 "OOTD_DEVICE"; }

CASES=(
  pickle_zip_text_encoder pickle_raw_text_encoder pickle_zip_vae pickle_raw_vae pickle_zip_openpose
  pickle_raw_openpose lfs_pointer_unet lfs_pointer_vae truncated_onnx empty_onnx missing_key_vae missing_key_clip
  unexpected_key_text_encoder wrong_tensor_names_unet nan_weights_vae nan_weights_unet overflowing_latents
  utf16_model_index utf16_vae_config fifo_person fifo_mask non_utf8_person_name mask_grow_20000 mask_grow_100000
  mask_grow_negative unknown_device bad_ootd_device
)

main() {
  local selected=("$@") passed=0 failed=0 name
  [ ${#selected[@]} -gt 0 ] || selected=("${CASES[@]}")
  cd "$REPO" || exit 1
  if ! "$PY" scripts/make_tiny_checkpoints.py "$WORK/tiny" >"$WORK/make.log" 2>&1; then
    echo "cannot build the tiny tree:"; tail -5 "$WORK/make.log"; exit 1
  fi
  for name in "${selected[@]}"; do
    WHY=""
    if ! declare -F "case_$name" >/dev/null; then
      echo "FAIL $name: no such case"; failed=$((failed + 1)); continue
    fi
    if "case_$name" && [ ! -e "$MARKER" ]; then
      echo "PASS $name"; passed=$((passed + 1))
    else
      [ -e "$MARKER" ] && WHY="a weight file ran code (marker file exists)${WHY:+; $WHY}"
      echo "FAIL $name: ${WHY:-failed}" | tr '\n' ' ' | cut -c1-400; echo
      failed=$((failed + 1))
    fi
  done
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}

main "$@"
