#!/usr/bin/env bash
# Reliability battery: hostile and damaged inputs against the real `ootd` command on a tiny random-weight tree.
#
#   scripts/reliability_battery.sh                  # every case
#   scripts/reliability_battery.sh nan_weights_vae  # only the named cases (function names without "case_")
#
# Builds everything it needs in a temporary folder (the tree with scripts/make_tiny_checkpoints.py, then one
# damaged copy per case), prints one "PASS name (T s)" or "FAIL name (T s): why" line per case (T: its seconds) and a
# final "N passed, M failed" line, and exits 1 if any case failed. A case passes when ootd refuses with the expected
# exit code and ONE "error: ..." line (no traceback, no "internal error"), writes no picture, and runs no code
# from a weight file (a marker file such a payload would create never appears).
#
# Adding a case: write a function `case_<name>` that returns 0 on pass, or sets WHY and returns 1, and add
# <name> to CASES. Helpers: fresh_tree (a damaged-at-will copy of the tree), run_ootd (ootd with the standard
# one-step try-on arguments plus yours), expect_refusal CODE TEXT (checks the last run), pyrun (inline Python).
# Runs on the CPU; each case loads the tiny tree at most twice (~10-40 s a load on a busy machine). The whole
# battery takes 15-25 minutes on a loaded machine, too long for CI: CI runs the same classes as pytest
# (tests/frontends/cli/test_reliability.py, tests/frontends/cli/test_never_lose_a_file.py,
# tests/frontends/cli/test_full_disk.py, tests/frontends/*/test_image_corpus.py, tests/frontends/serve/test_contract.py);
# run this by hand before a release.
# The full-device and read-only cases mount small tmpfs folders when run as root (else: /dev/full and chmod); the
# colour case needs Debian's ICC profiles (scripts/install_test_packages.sh); the corpus cases use the test suite's
# generator (tests/helpers/corpus.py, with hypothesis from the dev extra); the API contract cases need Schemathesis (the
# serve-test extra).
set -u
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python}"  # this checkout's .venv when there is one (what the quickstart makes)
[ -n "${PYTHON:-}" ] || [ ! -x "$REPO/.venv/bin/python" ] || PY="$REPO/.venv/bin/python"
CASE_TIMEOUT="${CASE_TIMEOUT:-300}"  # seconds: a hang is a failure, not a stuck battery
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ootd-battery.XXXXXX")"
MOUNTS=()
cleanup() {
  local m; for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null; done
  chmod -R u+w "$WORK" 2>/dev/null; rm -rf "$WORK"
}
trap cleanup EXIT
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

# -- cases: batches (data loss, concurrency, budgets, full devices, kills, odd CSVs, shards) -------------------

batch_inputs() {  # $WORK/b/{people,garments,masks}: two people (masks given: no pose/parsing), one garment
  rm -rf "$WORK/b"; mkdir -p "$WORK/b/people" "$WORK/b/garments" "$WORK/b/masks"
  cp "$EX/person.png" "$WORK/b/people/pA.png"; cp "$EX/person.png" "$WORK/b/people/pB.png"
  cp "$EX/person_mask_upper.png" "$WORK/b/masks/pA.png"; cp "$EX/person_mask_upper.png" "$WORK/b/masks/pB.png"
  cp "$EX/tshirt.png" "$WORK/b/garments/g.png"
  printf 'person,garment,category,mask\npeople/pA.png,garments/g.png,upper,masks/pA.png\n' >"$WORK/b/pairs.csv"
}

BATCH_ARGS=(--checkpoints "$WORK/tiny" --steps 1 --resolution 384x512 --seed 1 --device cpu)
run_batch() {  # run_batch OUT [args...]: `ootd batch` in the foreground, ARGS after (over) the standard ones
  OUT="$1"; shift
  timeout "$CASE_TIMEOUT" "$PY" -m ootd batch -o "$OUT" "${BATCH_ARGS[@]}" "$@" \
    >"$WORK/stdout" 2>"$WORK/stderr" </dev/null
  RC=$?
}
folder_batch() {  # folder_batch OUT [args...]: the two people x one garment, with their masks
  local out="$1"; shift
  run_batch "$out" --models "$WORK/b/people" --cloths "$WORK/b/garments" --masks "$WORK/b/masks" \
    --category upper "$@"
}
BG_PID=""
start_batch() {  # start_batch OUT [args...]: in the background with SIGINT at its default; sets BG_PID
  local out="$1"; shift
  "$PY" -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])' \
    -m ootd batch --models "$WORK/b/people" --cloths "$WORK/b/garments" --masks "$WORK/b/masks" --category upper \
    -o "$out" "${BATCH_ARGS[@]}" "$@" >"$WORK/stdout" 2>"$WORK/stderr" </dev/null &
  BG_PID=$!
}
wait_for() {  # wait_for SECONDS COMMAND...: poll until COMMAND succeeds
  local limit=$(( $(date +%s) + $1 )); shift
  until "$@"; do [ "$(date +%s)" -lt "$limit" ] || return 1; sleep 0.2; done
}
report_lines() { [ -f "$1" ] && [ "$(grep -c . "$1")" -ge "$2" ]; }
check_report() {  # check_report FILE [STATUS...]: whole JSON lines, valid UTF-8, statuses in order if given
  pyrun "$@" <<'EOF'
import json, sys
data = open(sys.argv[1], "rb").read()
assert not data or data.endswith(b"\n"), "a torn last line"
rows = [json.loads(line) for line in data.decode("utf-8").splitlines()]
for row in rows:
    for value in (row["person"], row["garment"], *row["outputs"]):
        value.encode("utf-8")
want = sys.argv[2:]
assert not want or [r["status"] for r in rows] == want, [r["status"] for r in rows]
EOF
}
no_temp_files() { [ -z "$(find "$1" -name '.*.tmp' -print -quit 2>/dev/null)" ]; }
pictures_whole() {  # every PNG under $1 decodes completely
  pyrun "$1" <<'EOF'
import pathlib, sys
from PIL import Image
for p in pathlib.Path(sys.argv[1]).glob("*.png"):
    Image.open(p).load()
EOF
}
small_device() {  # small_device DIR SIZE [ro]: a tmpfs of SIZE at DIR (root only); returns 1 if not possible
  mkdir -p "$1"
  [ "$(id -u)" -eq 0 ] || return 1
  mount -t tmpfs -o "size=$2${3:+,$3}" tmpfs "$1" 2>/dev/null || return 1
  MOUNTS+=("$1")
}
fill_up() { cat /dev/zero >"$1/filler" 2>/dev/null; true; }

case_report_over_pairs_csv() {
  batch_inputs; local before; before="$(md5sum <"$WORK/b/pairs.csv")"
  run_batch "$WORK/out" "$WORK/b/pairs.csv" --report "$WORK/b/pairs.csv"
  expect_refusal 2 "would replace the input" || return 1
  [ "$(md5sum <"$WORK/b/pairs.csv")" = "$before" ] || { WHY="the pairs CSV changed"; return 1; }
}
case_report_over_person_photo() {
  batch_inputs; local before; before="$(md5sum <"$WORK/b/people/pA.png")"
  run_batch "$WORK/out" "$WORK/b/pairs.csv" --report "$WORK/b/people/pA.png"
  expect_refusal 2 "would replace the input" || return 1
  [ "$(md5sum <"$WORK/b/people/pA.png")" = "$before" ] || { WHY="the person photo changed"; return 1; }
}
case_report_not_ours() {
  batch_inputs; echo "my notes" >"$WORK/notes.txt"
  run_batch "$WORK/out" "$WORK/b/pairs.csv" --report "$WORK/notes.txt"
  expect_refusal 2 "is not a batch report" || return 1
  [ "$(cat "$WORK/notes.txt")" = "my notes" ] || { WHY="the file changed"; return 1; }
}
case_output_is_people_folder() {  # a rerun must not dress its own results
  batch_inputs; local before
  folder_batch "$WORK/b/people"
  [ "$RC" -eq 0 ] || { WHY="first run exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
  before="$(ls -a "$WORK/b/people")"
  folder_batch "$WORK/b/people"
  [ "$RC" -eq 0 ] || { WHY="rerun exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
  check_report "$WORK/b/people/batch_report.jsonl" skipped skipped || { WHY="rerun did not skip both"; return 1; }
  [ "$(ls -a "$WORK/b/people")" = "$before" ] || { WHY="the rerun wrote new files"; return 1; }
}
case_two_batches_same_output() {  # the second stops at once; the first finishes with an intact report
  batch_inputs; rm -rf "$WORK/out2"; local pid first
  start_batch "$WORK/out2"; pid=$BG_PID
  wait_for 120 test -f "$WORK/out2/batch_report.jsonl" || { kill -9 "$pid"; WHY="first batch never started"; return 1; }
  cp "$WORK/stderr" "$WORK/first.err"
  OUT="$WORK/out2"
  timeout "$CASE_TIMEOUT" "$PY" -m ootd batch --models "$WORK/b/people" --cloths "$WORK/b/garments" \
    --masks "$WORK/b/masks" --category upper -o "$WORK/out2" "${BATCH_ARGS[@]}" >/dev/null 2>"$WORK/second.err" </dev/null
  RC=$?
  wait "$pid"; first=$?
  [ "$RC" -eq 1 ] && grep -q "^error: another batch is writing here" "$WORK/second.err" \
    || { WHY="second batch: exit $RC: $(head -c 300 "$WORK/second.err")"; return 1; }
  [ "$first" -eq 0 ] || { WHY="first batch exit $first"; return 1; }
  check_report "$WORK/out2/batch_report.jsonl" ok ok || { WHY="first batch's report damaged"; return 1; }
}
case_max_memory_cannot_fit() {
  run_ootd "$WORK/tiny" --device cpu --max-memory 1GiB --samples 64 --resolution 768x1024
  expect_refusal 2 "what would fit" || return 1
  grep -q -- "--samples" "$WORK/stderr" && grep -q -- "--resolution 384x512" "$WORK/stderr" \
    || { WHY="no smaller request named: $(cat "$WORK/stderr")"; return 1; }
}
case_full_tmpfs_output() {  # the picture does not fit: one line, nothing half-written
  small_device "$WORK/full" 64k || { WHY="cannot mount a tmpfs (needs root)"; return 1; }
  run_ootd "$WORK/tiny" -o "$WORK/full"; OUT="$WORK/full"
  expect_refusal 1 "no space left on device (" || return 1
  no_temp_files "$WORK/full" || { WHY="a temporary file was left"; return 1; }
}
case_full_tmpfs_batch() {  # a batch stops at the first picture that does not fit, report intact
  batch_inputs
  small_device "$WORK/fullb" 64k || { WHY="cannot mount a tmpfs (needs root)"; return 1; }
  folder_batch "$WORK/fullb"
  [ "$RC" -eq 1 ] && [ "$(grep -c . "$WORK/stderr")" -eq 1 ] && grep -q "^error: no space left on device (" "$WORK/stderr" \
    || { WHY="exit $RC: $(head -c 300 "$WORK/stderr")"; return 1; }
  no_temp_files "$WORK/fullb" || { WHY="a temporary file was left"; return 1; }
  check_report "$WORK/fullb/batch_report.jsonl" || { WHY="report damaged"; return 1; }
}
case_full_tmpfs_report() {  # the report's device is full: one line naming it
  batch_inputs; printf 'people/missing.png,garments/g.png,upper\n' >>"$WORK/b/pairs.csv"
  small_device "$WORK/fullr" 64k || { WHY="cannot mount a tmpfs (needs root)"; return 1; }
  fill_up "$WORK/fullr"
  run_batch "$WORK/out" "$WORK/b/pairs.csv" --report "$WORK/fullr/report.jsonl"
  expect_refusal 1 "no space left on device ($WORK/fullr/report.jsonl)"
}
case_full_stdout() {  # stdout on a full device: one line, exit 1 (a batch whose only pair has a missing photo)
  batch_inputs; printf 'people/missing.png,garments/g.png,upper\n' >"$WORK/b/missing.csv"
  local sink=/dev/full
  if small_device "$WORK/fullo" 64k; then fill_up "$WORK/fullo"; sink="$WORK/fullo/stdout.txt"; fi
  OUT="$WORK/out"
  timeout "$CASE_TIMEOUT" "$PY" -m ootd batch "$WORK/b/missing.csv" -o "$WORK/out" "${BATCH_ARGS[@]}" --json \
    >"$sink" 2>"$WORK/stderr" </dev/null
  RC=$?
  [ "$RC" -eq 1 ] && [ "$(tail -1 "$WORK/stderr")" = "error: no space left on device ($sink)" ] \
    && [ "$(grep -c . "$WORK/stderr")" -eq 2 ] || { WHY="exit $RC: $(head -c 300 "$WORK/stderr")"; return 1; }
}
case_readonly_output() {
  if ! small_device "$WORK/ro" 1m ro; then mkdir -p "$WORK/ro"; chmod 555 "$WORK/ro"; fi
  run_ootd "$WORK/tiny" -o "$WORK/ro"; OUT="$WORK/ro"
  expect_refusal 1 "not writable"
}
case_kill9_mid_batch_then_resume() {  # kill -9 once the first pair is done: nothing half-written, rerun resumes
  batch_inputs; rm -rf "$WORK/out3"; local pid
  start_batch "$WORK/out3" --steps 40; pid=$BG_PID  # slow pairs: the kill lands in the second
  wait_for 240 report_lines "$WORK/out3/batch_report.jsonl" 1 || { kill -9 "$pid"; WHY="no pair finished"; return 1; }
  kill -9 "$pid"; wait "$pid" 2>/dev/null
  pictures_whole "$WORK/out3" || { WHY="a picture is half-written"; return 1; }
  check_report "$WORK/out3/batch_report.jsonl" || { WHY="report damaged"; return 1; }
  # what a kill during a write leaves: a stale temporary file of ours (old), which the rerun removes
  : >"$WORK/out3/.pB__g__0.png.0123456789ab.tmp"; touch -d '1 hour ago' "$WORK/out3/.pB__g__0.png.0123456789ab.tmp"
  folder_batch "$WORK/out3" --steps 40  # the same settings: other ones would make the done pair stale, not resumed
  [ "$RC" -eq 0 ] || { WHY="rerun exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
  check_report "$WORK/out3/batch_report.jsonl" skipped ok || { WHY="rerun did not resume"; return 1; }
  no_temp_files "$WORK/out3" || { WHY="the stale temporary file is still there"; return 1; }
}
signal_case() {  # signal_case SIGNAL CODE MESSAGE: stop a batch after its first pair
  batch_inputs; rm -rf "$WORK/out4"; local pid
  start_batch "$WORK/out4" --steps 40; pid=$BG_PID  # slow pairs: the signal lands in the second
  wait_for 240 report_lines "$WORK/out4/batch_report.jsonl" 1 || { kill -9 "$pid"; WHY="no pair finished"; return 1; }
  kill -s "$1" "$pid"; wait "$pid"; RC=$?
  [ "$RC" -eq "$2" ] || { WHY="exit $RC, expected $2: $(tail -c 300 "$WORK/stderr")"; return 1; }
  [ "$(tail -1 "$WORK/stderr")" = "$3" ] || { WHY="last line: $(tail -1 "$WORK/stderr")"; return 1; }
  no_temp_files "$WORK/out4" || { WHY="a temporary file was left"; return 1; }
  pictures_whole "$WORK/out4" || { WHY="a picture is half-written"; return 1; }
  check_report "$WORK/out4/batch_report.jsonl" || { WHY="report damaged"; return 1; }
}
case_ctrl_c_batch() { signal_case INT 130 interrupted; }
case_sigterm_batch() { signal_case TERM 143 terminated; }
case_csv_huge_field() {
  batch_inputs; pyrun "$WORK/b/pairs.csv" <<'EOF'
import sys
open(sys.argv[1], "a").write("people/pA.png," + "x" * 200000 + ",upper\n")
EOF
  run_batch "$WORK/out" "$WORK/b/pairs.csv"; expect_refusal 2 "line 3"
}
case_csv_fifo() {
  rm -f "$WORK/pairs_fifo.csv"; mkfifo "$WORK/pairs_fifo.csv" || { WHY="mkfifo failed"; return 1; }
  run_batch "$WORK/out" "$WORK/pairs_fifo.csv"; expect_refusal 2 "not a regular file"
}
case_csv_not_utf8() {
  batch_inputs; printf 'people/caf\xe9.png,garments/g.png,upper\n' >"$WORK/b/latin1.csv"
  run_batch "$WORK/out" "$WORK/b/latin1.csv"; expect_refusal 2 "UTF-8"
}
case_csv_bad_rows() {  # every row wrong in its own way: each reported, nothing loaded, exit 1
  batch_inputs
  printf 'people/pA.png,garments/g.png,upper,masks/pA.png,extra\npeople/pA.png,garments/g.png,hat\npeople/none.png,garments/g.png,upper\n,garments/g.png,upper\n' \
    >"$WORK/b/bad.csv"
  run_batch "$WORK/out" "$WORK/b/bad.csv"
  [ "$RC" -eq 1 ] && [ "$(grep -c '^error: ' "$WORK/stderr")" -eq 4 ] && ! grep -qi "traceback\|internal error" "$WORK/stderr" \
    || { WHY="exit $RC: $(head -c 400 "$WORK/stderr")"; return 1; }
  check_report "$WORK/out/batch_report.jsonl" error error error error || { WHY="report wrong"; return 1; }
}
case_shards_odd_names() {  # two shards into one folder, one person with a non-UTF-8 name: all pairs, valid reports
  batch_inputs; rm -rf "$WORK/out5"
  mv "$WORK/b/people/pB.png" "$WORK/b/people/$(printf 'caf\xe9')_pB.png"
  mv "$WORK/b/masks/pB.png" "$WORK/b/masks/$(printf 'caf\xe9')_pB.png"
  local k
  for k in 0 1; do
    folder_batch "$WORK/out5" --shard "$k/2"
    [ "$RC" -eq 0 ] || { WHY="shard $k exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
    check_report "$WORK/out5/batch_report.shard${k}of2.jsonl" ok || { WHY="shard $k report"; return 1; }
  done
  [ "$(find "$WORK/out5" -name '*__g__0.png' | wc -l)" -eq 2 ] || { WHY="not one picture per pair"; return 1; }
}

# -- cases: the command line's edges (names, compare, -o, temp files, exit 3, budgets, mask, scripts) ------------

cli_run() {  # cli_run ARGS...: `ootd ARGS` with the standard timeout; sets RC (stdout/stderr in $WORK)
  timeout "$CASE_TIMEOUT" "$PY" -m ootd "$@" >"$WORK/stdout" 2>"$WORK/stderr" </dev/null
  RC=$?
}
png_header() {  # png_header FILE SIDE: a PNG whose header says SIDE x SIDE, with no pixel data (a bomb, undecoded)
  pyrun "$1" "$2" <<'EOF'
import struct, sys, zlib
path, side = sys.argv[1], int(sys.argv[2])
chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
                       + chunk(b"IEND", b""))
EOF
}
case_cli_name_width_billion() {  # refused from the template: no gigabyte string, so the process stays small
  local peak
  read -r RC peak < <(pyrun "$EX" "$WORK" <<'EOF'
import resource, subprocess, sys
ex, work = sys.argv[1:3]
done = subprocess.run([sys.executable, "-m", "ootd", "run", "-m", f"{ex}/person.png", "-c", f"{ex}/tshirt.png",
                       "-k", "upper", "--mask", f"{ex}/person_mask_upper.png", "--checkpoints", f"{work}/tiny", "-o",
                       f"{work}/out", "--name", "{i:1000000000}"], stdin=subprocess.DEVNULL,
                      stdout=open(f"{work}/stdout", "w"), stderr=open(f"{work}/stderr", "w"), timeout=300)
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
EOF
)
  OUT="$WORK/out"
  expect_refusal 2 "more than the 200 a name may have" || return 1
  [ "$peak" -lt 1500 ] || { WHY="the refused run peaked at $peak MiB"; return 1; }
}
case_cli_compare_bombs() {  # two 20000x20000 headers: one line each, never decoded, never an internal error
  rm -rf "$WORK/ca" "$WORK/cb"; mkdir -p "$WORK/ca" "$WORK/cb"
  png_header "$WORK/ca/bomb.png" 20000; png_header "$WORK/cb/bomb.png" 20000
  cp "$EX/person.png" "$WORK/ca/ok.png"; cp "$EX/person.png" "$WORK/cb/ok.png"
  cli_run compare "$WORK/ca" "$WORK/cb"
  [ "$RC" -eq 0 ] || { WHY="exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
  grep -q "^bomb.png: .*too large" "$WORK/stdout" && ! grep -q "internal error" "$WORK/stdout" "$WORK/stderr" \
    || { WHY="$(head -c 300 "$WORK/stdout")"; return 1; }
}
case_cli_compare_fifo() {  # a FIFO named f.png on both sides is reported, not waited on
  rm -rf "$WORK/ca" "$WORK/cb"; mkdir -p "$WORK/ca" "$WORK/cb"
  mkfifo "$WORK/ca/f.png" "$WORK/cb/f.png" || { WHY="mkfifo failed"; return 1; }
  cp "$EX/person.png" "$WORK/ca/ok.png"; cp "$EX/person.png" "$WORK/cb/ok.png"
  CASE_TIMEOUT=120 cli_run compare "$WORK/ca" "$WORK/cb"
  [ "$RC" -ne 124 ] || { WHY="hung on the FIFO"; return 1; }
  [ "$RC" -eq 0 ] && grep -q "^f.png: .*not a regular file" "$WORK/stdout" \
    || { WHY="exit $RC: $(head -c 300 "$WORK/stdout")"; return 1; }
}
case_cli_compare_results_only() {  # identical masks and grids are not averaged in with differing samples
  local seed
  for seed in 1 2; do
    run_ootd "$WORK/tiny" --seed "$seed" --save-intermediates --grid
    [ "$RC" -eq 0 ] || { WHY="run exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
    rm -rf "$WORK/cmp$seed"; mv "$WORK/out" "$WORK/cmp$seed"
  done
  cli_run compare "$WORK/cmp1" "$WORK/cmp2"
  [ "$RC" -eq 0 ] && grep -q "^skipped 3 intermediate" "$WORK/stdout" \
    && grep -q "^overall (1 compared, 0 problem(s)): 0 of 1 identical;" "$WORK/stdout" || { WHY="exit $RC: $(tail -c 300 "$WORK/stdout")"; return 1; }
}
case_cli_run_output_is_a_file() {
  : >"$WORK/afile.png"; run_ootd "$WORK/tiny" -o "$WORK/afile.png"; OUT="$WORK/nothing"
  expect_refusal 2 "is not a folder"
}
case_cli_mask_output_is_a_file() {
  : >"$WORK/afile.png"; OUT="$WORK/nothing"
  cli_run mask -m "$EX/person.png" -k upper --checkpoints "$WORK/tiny" -o "$WORK/afile.png"
  expect_refusal 2 "is not a folder"
}
case_cli_fresh_temp_file_removed() {  # what a kill -9 mid-write leaves, and a rerun a second later: removed
  rm -rf "$WORK/fresh"; mkdir -p "$WORK/fresh"; : >"$WORK/fresh/.person__tshirt__0.png.0123456789ab.tmp"
  timeout "$CASE_TIMEOUT" "$PY" -m ootd run --model "$EX/person.png" --cloth "$EX/tshirt.png" --category upper \
    --mask "$EX/person_mask_upper.png" --checkpoints "$WORK/tiny" -o "$WORK/fresh" --steps 1 --resolution 384x512 \
    --seed 1 >"$WORK/stdout" 2>"$WORK/stderr" </dev/null
  RC=$?
  [ "$RC" -eq 0 ] || { WHY="exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
  no_temp_files "$WORK/fresh" || { WHY="the temporary file is still there"; return 1; }
}
case_cli_unsupported_flash() { run_ootd "$WORK/tiny" --attention flash; expect_refusal 3 "attention flash cannot run here"; }
case_cli_unsupported_fp16_cpu() { run_ootd "$WORK/tiny" --device cpu --precision fp16; expect_refusal 3 "fp16 is not supported"; }
case_cli_unsupported_fp8_cpu() { run_ootd "$WORK/tiny" --device cpu --quantize fp8; expect_refusal 3 "quantization fp8 is not supported"; }
case_cli_unsupported_gpu_index() { run_ootd "$WORK/tiny" --device cuda:7; expect_refusal 3 "device cuda:7 requested"; }
case_cli_unsupported_in_batch() {
  batch_inputs; run_batch "$WORK/out" "$WORK/b/pairs.csv" --attention flash; expect_refusal 3 "attention flash"
}
case_cli_max_memory_in_its_unit() {
  run_ootd "$WORK/tiny" --device cpu --max-memory 10MiB
  expect_refusal 2 "more than --max-memory 10MiB;" || return 1
  ! grep -q "GiB" "$WORK/stderr" || { WHY="echoed in another unit: $(cat "$WORK/stderr")"; return 1; }
}
case_cli_mask_no_person() {  # the tiny tree's pose finds nobody: the remedy is one `ootd mask` can offer
  OUT="$WORK/m"; rm -rf "$OUT"
  cli_run mask -m "$EX/person.png" -k upper --checkpoints "$WORK/tiny" -o "$OUT" --resolution 384x512
  expect_refusal 1 "ootd run --mask" || return 1
  ! grep -q "give a mask image with --mask" "$WORK/stderr" || { WHY="suggests --mask to ootd mask"; return 1; }
}
case_cli_scripts_help() {  # every script's --help exits 0 and makes nothing
  local s dir="$WORK/helpdir"; rm -rf "$dir"; mkdir -p "$dir"
  for s in "$REPO"/scripts/*.sh; do
    (cd "$dir" && bash "$s" --help >/dev/null 2>&1) || { WHY="$(basename "$s") --help exit $?"; return 1; }
  done
  [ -z "$(ls -A "$dir")" ] || { WHY="--help made $(ls -A "$dir")"; return 1; }
}
case_cli_batch_script_without_ootd() {  # no environment and a Python without ootd: one line, no traceback
  (cd "$WORK" && env -u VIRTUAL_ENV -u OOTD PATH=/usr/bin:/bin OOTD_VENV="$WORK/none" PYTHON=/usr/bin/python3 \
    bash "$REPO/scripts/batch_tryon.sh" p g) >"$WORK/stdout" 2>"$WORK/stderr"
  RC=$?; OUT="$WORK/none"
  expect_refusal 1 "ootd is not installed"
}

# -- cases: the server (`ootd serve` against hostile clients and signals) ------------------------------------

SERVE_PID=""
SERVE_URL=""
SERVE_TMP="$WORK/serve-tmp"  # the server's TMPDIR: what it leaves there is visible
TOOK=0
start_serve() {  # start_serve [args...]: `ootd serve` on a free port, its own TMPDIR, SIGINT at its default
  mkdir -p "$SERVE_TMP"
  : >"$WORK/serve.out"; : >"$WORK/serve.err"  # here, not in the child: the wait below must not read the last one's
  TMPDIR="$SERVE_TMP" "$PY" -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])' \
    -m ootd serve --checkpoints "$WORK/tiny" --port 0 --device cpu --resolution 384x512 --steps 1 \
    --max-steps 1000 "$@" >"$WORK/serve.out" 2>"$WORK/serve.err" </dev/null &
  SERVE_PID=$!
  if ! wait_for 90 grep -q "^ootd serve: open" "$WORK/serve.out"; then
    kill -9 "$SERVE_PID" 2>/dev/null; WHY="the server did not start: $(tail -c 300 "$WORK/serve.err")"; return 1
  fi
  SERVE_URL="$(sed -n 's/^ootd serve: open \(http[^ ;]*\).*/\1/p' "$WORK/serve.out")"
}
serve_alive() { kill -0 "$SERVE_PID" 2>/dev/null; }
serve_gone() { ! serve_alive; }
stop_serve() {  # stop_serve SIGNAL: sets RC and TOOK (seconds); kill -9 after 60 s
  local start; start="$(date +%s)"
  kill -s "$1" "$SERVE_PID"
  wait_for 60 serve_gone || kill -9 "$SERVE_PID"
  wait "$SERVE_PID" 2>/dev/null; RC=$?; TOOK=$(( $(date +%s) - start ))
}
serve_http() {  # serve_http METHOD PATH [Header:value | field=value ...]: prints "STATUS BODY" on one line
  # (POST sends the example person, t-shirt and mask, category upper, seed 1); "timeout" after 60 s
  pyrun "$SERVE_URL" "$EX" "$@" <<'PY'
import sys
import httpx
url, ex, method, path, *rest = sys.argv[1:]
headers = dict(a.split(":", 1) for a in rest if "=" not in a)
data = dict(a.split("=", 1) for a in rest if "=" in a)
files = None
if method == "POST":
    files = {role: (f"{name}.png", open(f"{ex}/{name}.png", "rb").read(), "image/png")
             for role, name in (("person", "person"), ("garment", "tshirt"), ("mask", "person_mask_upper"))}
    data = {"category": "upper", "seed": "1", **data}
try:
    answer = httpx.request(method, url.rstrip("/") + path, headers=headers, files=files, data=data or None, timeout=60)
except httpx.TimeoutException:
    print("timeout")
    sys.exit(0)
print(answer.status_code, answer.text.replace("\n", " ")[:600])
PY
}
serve_clean_exit() {  # after stop_serve: exit 0 within 15 s, "stopped", no traceback or abort, folder gone
  local bad="Traceback\|terminate called\|Exception in ASGI\|ERROR"
  if [ "$RC" -ne 0 ]; then WHY="exit $RC: $(tail -c 300 "$WORK/serve.err")"; return 1; fi
  [ "$TOOK" -le 15 ] || { WHY="took ${TOOK}s to stop: $(grep -m1 "did not stop" "$WORK/serve.err")"; return 1; }
  [ "$(tail -1 "$WORK/serve.out")" = "ootd serve: stopped" ] || { WHY="no 'stopped' line"; return 1; }
  if grep -q "$bad" "$WORK/serve.err"; then WHY="$(grep -m1 "$bad" "$WORK/serve.err")"; return 1; fi
  sleep 2
  [ -z "$(ls -A "$SERVE_TMP")" ] || { WHY="left in TMPDIR: $(ls -A "$SERVE_TMP")"; return 1; }
}
expect_status() {  # expect_status ANSWER CODE TEXT: `CODE {"error": "...TEXT..."}`
  case "$1" in "$2 {\"error\":"*"$3"*) return 0 ;; esac
  WHY="expected $2 with '$3', got: $(echo "$1" | head -c 300)"; return 1
}
health_says() { serve_http GET /api/health | grep -q "\"running\": *$1"; }
job_denoising() { serve_http GET "/api/jobs/$1" | grep -q '"stage": *"denoise", *"done": *[1-9]'; }
job_id() { sed -n 's/.*"id": *"\([0-9a-f]*\)".*/\1/p'; }
warm_up() {  # one quick try-on: loads the model (a load has no step to stop at)
  local warm; warm="$(serve_http POST /api/tryon)"
  case "$warm" in "200 "*) return 0 ;; esac
  stop_serve KILL; WHY="warm-up: $warm"; return 1
}

case_serve_dns_rebinding() {
  start_serve || return 1
  local port answer
  port="${SERVE_URL##*:}"; port="${port%/}"
  answer="$(serve_http GET /api/health "Host:evil.example:$port")"
  stop_serve TERM
  expect_status "$answer" 421 "evil.example" && serve_clean_exit
}
case_serve_cross_site_post() {
  start_serve || return 1
  local answer jobs
  answer="$(serve_http POST /api/jobs "Origin:http://evil.example" "Sec-Fetch-Site:cross-site")"
  jobs="$(find "$SERVE_TMP" -mindepth 3 -maxdepth 3 -path '*/jobs/*' | wc -l)"
  stop_serve TERM
  expect_status "$answer" 403 "--allow-origin" || return 1
  [ "$jobs" -eq 0 ] || { WHY="the refused request left $jobs job(s)"; return 1; }
  serve_clean_exit
}
case_serve_request_limits() {  # an anonymous client asking for 1000 steps and 64 samples
  start_serve --max-steps 50 || return 1
  local steps samples
  steps="$(serve_http POST /api/tryon steps=1000)"; samples="$(serve_http POST /api/tryon samples=64)"
  stop_serve TERM
  expect_status "$steps" 422 "steps must be between 1 and 50 (this server's limit), got 1000" \
    && expect_status "$samples" 422 "samples must be between 1 and 4 (this server's limit), got 64" && serve_clean_exit
}
case_serve_no_server_paths() {
  mkdir -p "$WORK/private-ck"
  start_serve --checkpoints "$WORK/private-ck" || return 1
  local answer; answer="$(serve_http POST /api/tryon)"
  stop_serve TERM
  expect_status "$answer" 503 "cannot run this model" || return 1
  case "$answer" in *"$WORK"*|*private-ck*) WHY="a server path in: $answer"; return 1 ;; esac
  serve_clean_exit
}
case_serve_client_leaves_mid_upload() {  # three half uploads: info lines, no traceback, nothing kept
  start_serve || return 1
  pyrun "$SERVE_URL" "$EX" <<'PY'
import socket, sys, time
import httpx
url, ex = sys.argv[1:]
files = {r: (f"{n}.png", open(f"{ex}/{n}.png", "rb").read(), "image/png") for r, n in (("person", "person"), ("garment", "tshirt"))}
request = httpx.Request("POST", url + "api/jobs", files=files, data={"category": "upper"})
body = request.read()
head = "POST /api/jobs HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in request.headers.items()) + "\r\n"
host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
for _ in range(3):
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head.encode() + body[: len(body) // 2])
    time.sleep(0.5)
PY
  local health; health="$(serve_http GET /api/health)"
  stop_serve TERM
  case "$health" in "200 "*) ;; *) WHY="the server stopped answering: $health"; return 1 ;; esac
  serve_clean_exit
}
case_serve_client_gives_up() {  # the abandoned try-on stops: the device is free again within seconds
  start_serve || return 1
  warm_up || return 1
  timeout 5 "$PY" - "$SERVE_URL" "$EX" <<'PY'
import sys
import httpx
url, ex = sys.argv[1:]
files = {r: (n + ".png", open(f"{ex}/{n}.png", "rb").read(), "image/png")
         for r, n in (("person", "person"), ("garment", "tshirt"), ("mask", "person_mask_upper"))}
httpx.post(url + "api/tryon", data={"category": "upper", "steps": "400"}, files=files, timeout=60)
PY
  local left=0
  wait_for 30 health_says false || left=1
  stop_serve TERM
  [ "$left" -eq 0 ] || { WHY="the abandoned try-on still ran 30 s later"; return 1; }
  grep -q '"POST /api/tryon HTTP/1.1" 499' "$WORK/serve.err" || { WHY="no 499 access line"; return 1; }
  serve_clean_exit
}
serve_signal_case() {  # serve_signal_case SIGNAL: stop a server while a job from /api/jobs denoises
  start_serve || return 1
  local id; id="$(serve_http POST /api/jobs steps=400 | job_id)"
  [ -n "$id" ] || { stop_serve KILL; WHY="no job"; return 1; }
  wait_for 180 job_denoising "$id" || { stop_serve KILL; WHY="the job never reached a denoising step"; return 1; }
  stop_serve "$1"
  serve_clean_exit
}
case_serve_sigterm_running_job() { serve_signal_case TERM; }
case_serve_sigint_running_job() { serve_signal_case INT; }
case_serve_sigterm_waiting_client() {  # the client waiting on /api/tryon gets a JSON 503 at once
  start_serve || return 1
  warm_up || return 1
  serve_http POST /api/tryon steps=400 >"$WORK/waiting.txt" &
  local client=$!
  wait_for 30 health_says true
  sleep 1
  stop_serve TERM
  wait "$client"
  expect_status "$(cat "$WORK/waiting.txt")" 503 "shutting down" && serve_clean_exit
}
case_serve_kill9_leftover_removed() {  # a killed server's folder is removed by the next one
  start_serve || return 1
  local left; left="$(ls "$SERVE_TMP")"
  stop_serve KILL
  [ -n "$left" ] && [ -d "$SERVE_TMP/$left" ] || { WHY="no folder left by kill -9"; return 1; }
  start_serve || return 1
  if [ -e "$SERVE_TMP/$left" ]; then stop_serve TERM; WHY="$left is still there after a restart"; return 1; fi
  stop_serve TERM
  serve_clean_exit
}
case_serve_compile_cache_not_in_tmpdir() {  # torch.compile's cache goes to the user's cache folder
  local where shared="$WORK/compile-tmp"
  rm -rf "$shared"; mkdir -p "$shared"
  where="$(TMPDIR="$shared" env -u TORCHINDUCTOR_CACHE_DIR "$PY" -c \
    "import ootd, diffusers, os; print(os.environ.get('TORCHINDUCTOR_CACHE_DIR'))" 2>/dev/null)"
  [ -z "$(ls -A "$shared")" ] || { WHY="left in TMPDIR: $(ls -A "$shared")"; return 1; }
  case "$where" in "$shared"*|/tmp/*|"") WHY="the compile cache is in the temporary folder: $where"; return 1 ;; esac
}

# -- cases: third pass (signals under Ray, flat memory, health without private Ray, ranges, classify, CSV) -------

group_left() {  # group_left PGID: processes of that group still running after up to 20 s (their pids)
  local limit=$(( $(date +%s) + 20 )) left
  while :; do
    left="$(pgrep -g "$1" | tr '\n' ' ')"
    [ -z "$left" ] || [ "$(date +%s)" -ge "$limit" ] && break
    sleep 0.5
  done
  [ -z "$left" ] || kill -9 -- "-$1" 2>/dev/null
  echo "$left"
}
ray_child() { pgrep -P "$1" -f "$2" >/dev/null; }  # ray_child PID NAME: PID has started Ray's NAME
detached() {  # detached ARGS... &: python ARGS in a session (and process group) of its own, SIGINT at its
  # default. Run it in the background only: it execs, so $! is python's pid, its process group's id and the parent
  # of what it starts (Ray's gcs_server)
  exec "$PY" -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.setsid(); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])' "$@"
}
stopped_cleanly() {  # stopped_cleanly CODE LAST: the last run ($RC, $WORK/stderr) ended as a signal should
  if [ "$RC" -ne "$1" ]; then WHY="exit $RC, expected $1: $(tail -c 300 "$WORK/stderr")"; return 1; fi
  [ "$(tail -1 "$WORK/stderr")" = "$2" ] || { WHY="last line: $(tail -1 "$WORK/stderr")"; return 1; }
  if grep -q "Traceback\|SIGTERM received\|internal error" "$WORK/stderr"; then
    WHY="$(grep -m1 "Traceback\|SIGTERM received\|internal error" "$WORK/stderr")"; return 1
  fi
}
ray_batch_signal_case() {  # ray_batch_signal_case SIGNAL CODE LAST WHEN: SIGNAL while Ray starts, or to the
  # whole process group (as Ctrl-C at a terminal) once the first pair is in the report
  batch_inputs; rm -rf "$WORK/outr"; local pid left
  detached -m ootd batch --models "$WORK/b/people" --cloths "$WORK/b/garments" --masks "$WORK/b/masks" \
    --category upper -o "$WORK/outr" "${BATCH_ARGS[@]}" --steps 40 --engine ray --workers 1 --gpus-per-worker 0 \
    >"$WORK/stdout" 2>"$WORK/stderr" </dev/null &
  pid=$!
  if [ "$4" = starting ]; then
    wait_for 120 ray_child "$pid" gcs_server || { kill -9 -- "-$pid"; WHY="Ray never started"; return 1; }
    kill -s "$1" "$pid"
  else
    wait_for 240 report_lines "$WORK/outr/batch_report.jsonl" 1 || { kill -9 -- "-$pid"; WHY="no pair finished"; return 1; }
    kill -s "$1" -- "-$pid"
  fi
  timeout 120 tail --pid="$pid" -f /dev/null; wait "$pid"; RC=$?
  left="$(group_left "$pid")"
  stopped_cleanly "$2" "$3" || return 1
  [ -z "$left" ] || { WHY="processes left: $left"; return 1; }
  if [ "$4" = starting ]; then
    [ ! -e "$WORK/outr" ] || { WHY="something was written before Ray started"; return 1; }
  else
    grep -q "^stopped after 1 of 2 pairs; .*rerun the same command" "$WORK/stderr" || { WHY="no resume line"; return 1; }
    grep -q 'class="state interrupted"' "$WORK/outr/index.html" || { WHY="the page does not say interrupted"; return 1; }
    no_temp_files "$WORK/outr" && pictures_whole "$WORK/outr" || { WHY="a half-written file"; return 1; }
  fi
}
case_ray_batch_sigterm_while_ray_starts() { ray_batch_signal_case TERM 143 terminated starting; }
case_ray_batch_sigint_while_ray_starts() { ray_batch_signal_case INT 130 interrupted starting; }
case_ray_batch_ctrl_c_group_mid_pair() { ray_batch_signal_case INT 130 interrupted mid-pair; }
case_ray_batch_sigterm_group_mid_pair() { ray_batch_signal_case TERM 143 terminated mid-pair; }
case_serve_ray_sigterm_while_starting() {  # before it serves: 143, the deployment, Ray and every folder gone
  mkdir -p "$SERVE_TMP"; rm -rf "${SERVE_TMP:?}"/*; local pid left
  TMPDIR="$SERVE_TMP" detached -m ootd serve --engine ray --replicas 1 --checkpoints "$WORK/tiny" --port 0 \
    --device cpu >"$WORK/stdout" 2>"$WORK/stderr" </dev/null &
  pid=$!
  wait_for 120 ray_child "$pid" gcs_server || { kill -9 -- "-$pid"; WHY="Ray never started"; return 1; }
  sleep 2  # ray.init, then the replicas starting
  kill -s TERM "$pid"
  timeout 120 tail --pid="$pid" -f /dev/null; wait "$pid"; RC=$?
  left="$(group_left "$pid")"
  stopped_cleanly 143 terminated || return 1
  [ -z "$left" ] || { WHY="processes left: $left"; return 1; }
  [ -z "$(ls -A "$SERVE_TMP")" ] || { WHY="left in TMPDIR: $(ls -A "$SERVE_TMP")"; return 1; }
}
case_cli_run_sigint_mid_denoise() {  # a real Ctrl-C while denoising: 130 within seconds, no picture, no temp file
  rm -rf "$WORK/outs"; local pid start
  "$PY" -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])' \
    -m ootd run --model "$EX/person.png" --cloth "$EX/tshirt.png" --category upper --mask "$EX/person_mask_upper.png" \
    --checkpoints "$WORK/tiny" -o "$WORK/outs" --steps 1000 --resolution 384x512 --seed 1 \
    >"$WORK/stdout" 2>"$WORK/stderr" </dev/null &
  pid=$!
  sleep 30  # the tiny pipeline loads in seconds; 1000 steps take minutes
  kill -0 "$pid" 2>/dev/null || { wait "$pid"; WHY="it ended before the signal: $(tail -c 300 "$WORK/stderr")"; return 1; }
  start="$(date +%s)"; kill -s INT "$pid"; wait "$pid"; RC=$?
  stopped_cleanly 130 interrupted || return 1
  [ $(( $(date +%s) - start )) -le 15 ] || { WHY="took over 15 s to stop"; return 1; }
  [ -z "$(ls -A "$WORK/outs" 2>/dev/null)" ] || { WHY="left: $(ls -A "$WORK/outs")"; return 1; }
}
case_batch_json_errors_bounded() {  # 10^4 failing rows: --json lists the first 100, counts the rest; the report has all
  batch_inputs
  pyrun "$WORK/b/many.csv" <<'EOF'
import sys
open(sys.argv[1], "w").write("".join(f"people/missing{i}.png,garments/g.png,upper\n" for i in range(10000)))
EOF
  run_batch "$WORK/outj" "$WORK/b/many.csv" --json
  [ "$RC" -eq 1 ] || { WHY="exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
  pyrun "$WORK/stdout" "$WORK/outj/batch_report.jsonl" <<'EOF' || { WHY="summary or report wrong"; return 1; }
import json, sys
summary = json.load(open(sys.argv[1]))
assert summary["error"] == 10000 and len(summary["errors"]) == 100 and summary["errors_not_listed"] == 9900, summary
assert [e["index"] for e in summary["errors"]] == list(range(100))
assert sum(1 for _ in open(sys.argv[2])) == 10000
EOF
}
case_serve_ray_health_without_private_ray() {  # Ray Serve's private client gone: health still lists the replica
  mkdir -p "$SERVE_TMP"; rm -rf "${SERVE_TMP:?}"/*; : >"$WORK/serve.out"
  TMPDIR="$SERVE_TMP" detached -c '
import sys
from ootd.app.signals import ray_for_a_driver
ray_for_a_driver()
import ray.serve._private.api as private, ray.serve.api as public
def gone(*a, **k): raise ImportError("no private Serve client in this Ray")
import ootd.serve.ray_engine as engine
real_deploy = engine.deploy
def deploy(*args, **kwargs):  # Ray Serve itself needs its client to deploy: take it away once the replica runs
    handle = real_deploy(*args, **kwargs)
    private._get_global_client = public._get_global_client = gone
    return handle
engine.deploy = deploy
from ootd.cli import main
sys.exit(main(sys.argv[1:]))' serve --engine ray --replicas 1 --checkpoints "$WORK/tiny" --port 0 --device cpu \
    >"$WORK/serve.out" 2>"$WORK/serve.err" </dev/null &
  SERVE_PID=$!
  if ! wait_for 240 grep -q "^ootd serve: open" "$WORK/serve.out"; then
    kill -9 -- "-$SERVE_PID" 2>/dev/null; WHY="the server did not start: $(tail -c 300 "$WORK/serve.err")"; return 1
  fi
  SERVE_URL="$(sed -n 's/^ootd serve: open \(http[^ ;]*\).*/\1/p' "$WORK/serve.out")"
  local answer
  answer="$(pyrun "$SERVE_URL" <<'PY'
import sys, time
import httpx
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    replicas = httpx.get(sys.argv[1] + "api/health", timeout=10).json()["replicas"]
    if len(replicas) == 1 and replicas[0]["alive"] and replicas[0]["id"]:
        print("ok")
        break
    time.sleep(1)
else:
    print(f"health lists {replicas}")
PY
)"
  stop_serve TERM
  [ "$answer" = ok ] || { WHY="$answer"; return 1; }
  [ "$RC" -eq 0 ] || { WHY="exit $RC after SIGTERM: $(tail -c 300 "$WORK/serve.err")"; return 1; }
}
serve_range_case() {  # serve_range_case RANGE STATUS TEXT: a result file asked for with a Range it refuses
  start_serve || return 1
  local answer
  answer="$(pyrun "$SERVE_URL" "$EX" "$1" <<'PY'
import sys, time
import httpx
url, ex, asked = sys.argv[1:]
files = {r: (f"{n}.png", open(f"{ex}/{n}.png", "rb").read(), "image/png")
         for r, n in (("person", "person"), ("garment", "tshirt"), ("mask", "person_mask_upper"))}
jobs = httpx.post(url + "api/jobs", data={"category": "upper", "seed": "1"}, files=files, timeout=60).json()
while (status := httpx.get(url + f"api/jobs/{jobs['id']}", timeout=10).json())["state"] not in ("done", "failed"):
    time.sleep(0.2)
size = len(httpx.get(status["images"][0], timeout=10).content)
answer = httpx.get(status["images"][0], headers={"Range": asked.replace("SIZE", str(size + 5))}, timeout=10)
print(answer.status_code, answer.headers.get("content-type"), answer.text.replace("\n", " ")[:300])
PY
)"
  stop_serve TERM
  case "$answer" in "$2 application/json {\"error\":"*"$3"*) ;; *) WHY="got: $answer"; return 1 ;; esac
  serve_clean_exit
}
case_serve_range_unsatisfiable() { serve_range_case "bytes=SIZE-" 416 "range not satisfiable"; }
case_serve_range_malformed() { serve_range_case "bytes=9-2" 400 "bad Range header"; }
case_serve_range_not_bytes() { serve_range_case "lines=0-1" 400 "bad Range header"; }
case_classify_unreadable_entries() {  # a link loop, a dangling link, a FIFO: each its own failed line, counted
  rm -rf "$WORK/cl"; mkdir -p "$WORK/cl"
  cp "$EX/tshirt.png" "$WORK/cl/a.png"; ln -s loop.png "$WORK/cl/loop.png"; ln -s none.png "$WORK/cl/dangling.png"
  mkfifo "$WORK/cl/fifo.png" || { WHY="mkfifo failed"; return 1; }
  CASE_TIMEOUT=180 cli_run classify "$WORK/cl" --checkpoints "$WORK/tiny"
  [ "$RC" -ne 124 ] || { WHY="hung"; return 1; }
  [ "$RC" -eq 0 ] && [ "$(grep -c ': error: ' "$WORK/stdout")" -eq 3 ] && grep -q "^4 garments: .* 3 failed" "$WORK/stdout" \
    || { WHY="exit $RC: $(head -c 400 "$WORK/stdout")"; return 1; }
}
case_classify_name_forging_a_line() {  # a newline and an ANSI escape in a name: escaped, one line per garment
  rm -rf "$WORK/cl"; mkdir -p "$WORK/cl"
  cp "$EX/tshirt.png" "$WORK/cl/$(printf 'a\nz.png: dress 0.99 (dress 0.99)\033[2J')x.png"
  cli_run classify "$WORK/cl" --checkpoints "$WORK/tiny"
  [ "$RC" -eq 0 ] && [ "$(wc -l <"$WORK/stdout")" -eq 2 ] && ! grep -q "$(printf '\033')" "$WORK/stdout" \
    && grep -q 'a\\nz.png' "$WORK/stdout" || { WHY="exit $RC: $(head -c 400 "$WORK/stdout" | cat -v)"; return 1; }
}
case_batch_name_with_control_characters() {  # per-pair and error lines escape them; stderr never gets an ESC
  batch_inputs
  cp "$EX/person.png" "$WORK/b/people/$(printf 'p\033[31mred')C.png"
  cp "$EX/person_mask_upper.png" "$WORK/b/masks/$(printf 'p\033[31mred')C.png"
  folder_batch "$WORK/outc"
  [ "$RC" -eq 0 ] || { WHY="exit $RC: $(tail -c 300 "$WORK/stderr" | cat -v)"; return 1; }
  ! grep -q "$(printf '\033')" "$WORK/stderr" "$WORK/stdout" && grep -q 'p\\x1b\[31mredC.png' "$WORK/stderr" \
    || { WHY="raw or missing: $(cat -v "$WORK/stderr" | head -c 300)"; return 1; }
}
csv_case() {  # csv_case CONTENT (printf format): a batch of it; RC and stderr as run_batch sets them
  batch_inputs; rm -rf "$WORK/outv"; printf "$1" >"$WORK/b/odd.csv"
  run_batch "$WORK/outv" "$WORK/b/odd.csv"
}
case_csv_quoted_newline_is_one_cell() {  # "people/pA.png\npeople/pB.png" never dresses pB
  csv_case 'person,garment,category,mask\n"people/pA.png\npeople/pB.png",garments/g.png,upper,masks/pA.png\n'
  [ "$RC" -eq 1 ] && [ "$(grep -c '^error: ' "$WORK/stderr")" -eq 1 ] && grep -q "odd.csv line 2 " "$WORK/stderr" \
    && [ -z "$(find "$WORK/outv" -name '*.png')" ] || { WHY="exit $RC: $(head -c 300 "$WORK/stderr")"; return 1; }
}
case_csv_unicode_line_separator_splits_nothing() {
  csv_case 'people/pA.png,garments/g.png,upper,masks/pA.png\xe2\x80\xa8people/pB.png,garments/g.png,upper\n'
  [ "$RC" -eq 1 ] && [ "$(grep -c '^error: ' "$WORK/stderr")" -eq 1 ] && [ -z "$(find "$WORK/outv" -name 'pB*.png')" ] \
    || { WHY="exit $RC: $(head -c 300 "$WORK/stderr")"; return 1; }
}
case_csv_nul_byte() { csv_case 'people/pA.png,garments/g.png,upper\npeople/p\x00B.png,garments/g.png,upper\n'; OUT="$WORK/outv"; expect_refusal 2 "line 2"; }
case_csv_extra_columns_end_and_middle() {  # one rule: a column the header names that ootd does not use is ignored
  local where
  for where in 'person,garment,category,mask,notes\npeople/pA.png,garments/g.png,upper,masks/pA.png,hi\n' \
               'person,notes,garment,category,mask\npeople/pA.png,hi,garments/g.png,upper,masks/pA.png\n'; do
    csv_case "$where"
    [ "$RC" -eq 0 ] && check_report "$WORK/outv/batch_report.jsonl" ok || { WHY="exit $RC: $(head -c 300 "$WORK/stderr")"; return 1; }
  done
}

CASES=(
  pickle_zip_text_encoder pickle_raw_text_encoder pickle_zip_vae pickle_raw_vae pickle_zip_openpose
  pickle_raw_openpose lfs_pointer_unet lfs_pointer_vae truncated_onnx empty_onnx missing_key_vae missing_key_clip
  unexpected_key_text_encoder wrong_tensor_names_unet nan_weights_vae nan_weights_unet overflowing_latents
  utf16_model_index utf16_vae_config fifo_person fifo_mask non_utf8_person_name mask_grow_20000 mask_grow_100000
  mask_grow_negative unknown_device bad_ootd_device
  report_over_pairs_csv report_over_person_photo report_not_ours output_is_people_folder two_batches_same_output
  max_memory_cannot_fit full_tmpfs_output full_tmpfs_batch full_tmpfs_report full_stdout readonly_output
  kill9_mid_batch_then_resume ctrl_c_batch sigterm_batch csv_huge_field csv_fifo csv_not_utf8 csv_bad_rows
  shards_odd_names
)
CASES+=(
  cli_name_width_billion cli_compare_bombs cli_compare_fifo cli_compare_results_only cli_run_output_is_a_file
  cli_mask_output_is_a_file cli_fresh_temp_file_removed cli_unsupported_flash cli_unsupported_fp16_cpu
  cli_unsupported_fp8_cpu cli_unsupported_gpu_index cli_unsupported_in_batch cli_max_memory_in_its_unit
  cli_mask_no_person cli_scripts_help cli_batch_script_without_ootd
  serve_dns_rebinding serve_cross_site_post serve_request_limits serve_no_server_paths
  serve_client_leaves_mid_upload serve_client_gives_up serve_sigterm_running_job serve_sigint_running_job
  serve_sigterm_waiting_client serve_kill9_leftover_removed serve_compile_cache_not_in_tmpdir
)

CASES+=(
  ray_batch_sigterm_while_ray_starts ray_batch_sigint_while_ray_starts ray_batch_ctrl_c_group_mid_pair
  ray_batch_sigterm_group_mid_pair serve_ray_sigterm_while_starting cli_run_sigint_mid_denoise
  batch_json_errors_bounded serve_ray_health_without_private_ray serve_range_unsatisfiable serve_range_malformed
  serve_range_not_bytes classify_unreadable_entries classify_name_forging_a_line batch_name_with_control_characters
  csv_quoted_newline_is_one_cell csv_unicode_line_separator_splits_nothing csv_nul_byte
  csv_extra_columns_end_and_middle
)

# -- cases: colours, the generated image corpus, full disks under every writer, a worker killed mid-write ------

ICC=/usr/share/color/icc
profiles_here() {  # Debian's ICC profiles (scripts/install_test_packages.sh installs them as root)
  [ -f "$ICC/colord/AdobeRGB1998.icc" ] && [ -f "$ICC/ghostscript/default_cmyk.icc" ] \
    || { WHY="ICC profiles missing: run scripts/install_test_packages.sh as root"; return 1; }
}
case_colour_managed_inputs() {  # Adobe RGB photo, CMYK garment: a picture; --keep-unmasked in the photo's profile
  profiles_here || return 1
  rm -rf "$WORK/col"; mkdir -p "$WORK/col"
  pyrun "$EX" "$WORK/col" "$ICC" <<'EOF' || { WHY="could not build the inputs"; return 1; }
import sys
from PIL import Image
ex, out, icc = sys.argv[1:]
Image.open(f"{ex}/person.png").convert("RGB").save(f"{out}/adobe.png", icc_profile=open(f"{icc}/colord/AdobeRGB1998.icc", "rb").read())
Image.open(f"{ex}/tshirt.png").convert("CMYK").save(f"{out}/cmyk.jpg", quality=95, icc_profile=open(f"{icc}/ghostscript/default_cmyk.icc", "rb").read())
EOF
  OUT="$WORK/col/out"
  cli_run run -m "$WORK/col/adobe.png" -c "$WORK/col/cmyk.jpg" -k upper --mask "$EX/person_mask_upper.png" \
    --checkpoints "$WORK/tiny" -o "$OUT" --steps 1 --resolution 384x512 --seed 1 --keep-unmasked --save-intermediates
  [ "$RC" -eq 0 ] || { WHY="exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
  pyrun "$WORK/col" <<'EOF' || { WHY="the picture is not in the photo's profile, or changed outside the mask"; return 1; }
import sys
import numpy as np
from PIL import Image
col = sys.argv[1]
photo, kept = Image.open(f"{col}/adobe.png"), Image.open(f"{col}/out/adobe__cmyk__0.png")
weight = np.asarray(Image.open(f"{col}/out/adobe__cmyk__photo_mask.png"))
assert kept.info["icc_profile"] == photo.info["icc_profile"] and kept.text["colour"].startswith("sRGB")
assert np.array_equal(np.asarray(kept)[weight == 0], np.asarray(photo)[weight == 0])
EOF
}

corpus() {  # corpus DIR COUNT SUFFIX: the generated corpus (tests/helpers/corpus.py) written into DIR
  rm -rf "$1"; mkdir -p "$1"
  pyrun "$1" "$2" "$3" <<'EOF'
import sys
from pathlib import Path
from tests.helpers.corpus import drawn, mutated, written
folder, count, suffix = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
written(folder, [*mutated(7, flips=1, cuts=1, fields=1), *drawn(count)], suffix)
EOF
}
clean_output() {  # clean_output FILE...: no traceback, no internal error in any of them
  if grep -l "Traceback\|internal error" "$@" >/dev/null 2>&1; then
    WHY="$(grep -h -m1 "Traceback\|internal error" "$@" | head -c 300)"; return 1
  fi
}
case_corpus_batch() {  # each file as a person, a mask or (every ninth: a try-on each) a garment: a picture or a line
  corpus "$WORK/corp" 10 "" || { WHY="could not build the corpus"; return 1; }
  local n=0 f
  { echo "person,garment,category,mask"
    for f in "$WORK"/corp/*; do
      case $(( n % 9 )) in
        0) echo "$EX/person.png,$f,upper,$EX/person_mask_upper.png" ;;
        1|3|5|7) echo "$f,$EX/tshirt.png,upper," ;;
        *) echo "$EX/person.png,$EX/tshirt.png,upper,$f" ;;
      esac
      n=$(( n + 1 ))
    done; } >"$WORK/corp.csv"
  CASE_TIMEOUT=1200 run_batch "$WORK/outc" "$WORK/corp.csv"
  { [ "$RC" -eq 0 ] || [ "$RC" -eq 1 ]; } || { WHY="exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
  clean_output "$WORK/stderr" "$WORK/outc/batch_report.jsonl" || return 1
  check_report "$WORK/outc/batch_report.jsonl" || { WHY="report damaged"; return 1; }
  [ "$(grep -c . "$WORK/outc/batch_report.jsonl")" -eq "$(ls "$WORK/corp" | wc -l)" ] || { WHY="a pair is missing"; return 1; }
}
case_corpus_classify_and_prepare() {  # ootd classify and ootd train prepare over the corpus: lines, no traceback
  corpus "$WORK/corp" 10 ".png" || { WHY="could not build the corpus"; return 1; }
  CASE_TIMEOUT=600 cli_run classify "$WORK/corp" --checkpoints "$WORK/tiny"
  { [ "$RC" -eq 0 ] || [ "$RC" -eq 1 ]; } || { WHY="classify exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
  clean_output "$WORK/stdout" "$WORK/stderr" || return 1
  # each file as a person (masked by pose + parsing) and as a garment (on the example person with its mask: a pose
  # run per row costs ~2 s of CPU, and the tiny tree's pose finds nobody in the example, so no garment got further)
  { echo "person,garment,category,mask"
    for f in "$WORK"/corp/*; do
      echo "$f,$EX/tshirt.png,upper,"; echo "$EX/person.png,$f,upper,$EX/person_mask_upper.png"
    done; } >"$WORK/corp.csv"
  CASE_TIMEOUT=600 cli_run train prepare "$WORK/corp.csv" -o "$WORK/corp-cache" --checkpoints "$WORK/tiny" --resolution 384x512
  [ "$RC" -ne 124 ] || { WHY="train prepare hung"; return 1; }
  clean_output "$WORK/stdout" "$WORK/stderr"
}
eval_with_stand_ins() {  # eval_with_stand_ins ARGS...: `ootd eval ARGS` with the test suite's stand-in networks
  timeout "$CASE_TIMEOUT" "$PY" - "$@" >"$WORK/stdout" 2>"$WORK/stderr" </dev/null <<'EOF'
import sys
from ootd.cli import main
from tests.helpers.evaluation import stand_ins
with stand_ins():
    sys.exit(main(["eval", *sys.argv[1:]]))
EOF
  RC=$?
}
case_corpus_eval() {  # the corpus as results, good photos as the truth: each unusable result skipped with its reason
  corpus "$WORK/corp" 10 ".png" || { WHY="could not build the corpus"; return 1; }
  rm -rf "$WORK/truth"; mkdir -p "$WORK/truth"
  for f in "$WORK"/corp/*; do cp "$EX/person.png" "$WORK/truth/$(basename "$f")"; done
  eval_with_stand_ins "$WORK/corp" --truth "$WORK/truth"
  { [ "$RC" -eq 0 ] || [ "$RC" -eq 1 ]; } || { WHY="exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
  clean_output "$WORK/stdout" "$WORK/stderr"
}
case_corpus_serve() {  # the corpus uploaded as person, garment and mask: never a 5xx, the server stays up
  corpus "$WORK/corp" 10 "" || { WHY="could not build the corpus"; return 1; }
  start_serve || return 1
  local answer
  answer="$(pyrun "$SERVE_URL" "$EX" "$WORK/corp" <<'PY'
import sys
from pathlib import Path
import httpx
url, ex, corp = sys.argv[1:]
good = {r: open(f"{ex}/{n}.png", "rb").read() for r, n in (("person", "person"), ("garment", "tshirt"), ("mask", "person_mask_upper"))}
bad = []
for number, path in enumerate(sorted(Path(corp).iterdir())):
    role = ("person", "garment", "mask")[number % 3]
    files = {r: (f"{r}.png", data, "image/png") for r, data in good.items()}
    files[role] = (path.name, path.read_bytes(), "application/octet-stream")
    answer = httpx.post(url + "api/tryon", files=files, data={"category": "upper", "seed": "1"}, timeout=300)
    if answer.status_code >= 500 or (answer.status_code >= 400 and "\n" in answer.json()["error"]):
        bad.append(f"{path.name} as {role}: {answer.status_code} {answer.text[:200]}")
health = httpx.get(url + "api/health", timeout=10).json()["status"]
print("ok" if not bad and health == "ok" else (bad + [f"health {health}"])[0])
PY
)"
  stop_serve TERM
  [ "$answer" = ok ] || { WHY="$answer"; return 1; }
  serve_clean_exit
}

fill_leaving() {  # fill_leaving DIR BYTES: the filesystem of DIR full but for BYTES (a filler file in DIR)
  pyrun "$1" "$2" <<'EOF'
import os, sys
folder, free = sys.argv[1], int(sys.argv[2])
stats = os.statvfs(folder)
size = stats.f_bavail * stats.f_frsize - free
with open(os.path.join(folder, ".filler"), "wb") as handle:
    while size > 0:
        handle.write(b"\0" * min(size, 1 << 20)); size -= 1 << 20
EOF
}
one_full_line() {  # one_full_line: the last run ($RC, $WORK/stderr) ended with one "no space left" line, exit 1
  [ "$RC" -eq 1 ] && [ "$(grep -c '^error: ' "$WORK/stderr")" -eq 1 ] \
    && tail -1 "$WORK/stderr" | grep -q "^error: no space left on device (" \
    || { WHY="exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
  clean_output "$WORK/stderr"
}
case_full_tmpfs_run_partial() {  # some files fit, then one does not: those written are whole; freed, a rerun ends
  small_device "$WORK/fullp" 4m || { WHY="cannot mount a tmpfs (needs root)"; return 1; }
  mkdir -p "$WORK/fullp/out"; fill_leaving "$WORK/fullp" 400000
  run_ootd "$WORK/tiny" -o "$WORK/fullp/out" --samples 2 --save-intermediates; OUT="$WORK/fullp/out"
  one_full_line || return 1
  no_temp_files "$OUT" && pictures_whole "$OUT" || { WHY="a half-written file"; return 1; }
  rm -f "$WORK/fullp/.filler"
  run_ootd "$WORK/tiny" -o "$WORK/fullp/out" --samples 2 --save-intermediates --overwrite
  [ "$RC" -eq 0 ] || { WHY="after freeing: exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
}
train_cache() {  # a prepared cache of two pairs (masks given) in $WORK/tc, one person held out
  [ -f "$WORK/tc/cache/index.json" ] && return 0
  rm -rf "$WORK/tc"; mkdir -p "$WORK/tc"
  pyrun "$EX" "$WORK/tc" <<'EOF'
import shutil, sys
from PIL import Image, ImageOps
ex, root = sys.argv[1:]
shutil.copy(f"{ex}/person.png", f"{root}/p1.png"); shutil.copy(f"{ex}/person_mask_upper.png", f"{root}/m1.png")
ImageOps.mirror(Image.open(f"{ex}/person.png")).save(f"{root}/p2.png")
ImageOps.mirror(Image.open(f"{ex}/person_mask_upper.png")).save(f"{root}/m2.png")
shutil.copy(f"{ex}/tshirt.png", f"{root}/g1.png")
open(f"{root}/pairs.csv", "w").write("person,garment,category,mask\np1.png,g1.png,upper,m1.png\np2.png,g1.png,upper,m2.png\n")
EOF
  cli_run train prepare "$WORK/tc/pairs.csv" -o "$WORK/tc/cache" --checkpoints "$WORK/tiny" --resolution 384x512 --split 0.5
}
case_full_tmpfs_train_prepare() {  # the cache's device is full: one line; freed, the rerun finishes it
  train_cache || { WHY="cannot prepare the reference cache"; return 1; }
  small_device "$WORK/fullt" 4m || { WHY="cannot mount a tmpfs (needs root)"; return 1; }
  fill_leaving "$WORK/fullt" 0
  cli_run train prepare "$WORK/tc/pairs.csv" -o "$WORK/fullt/cache" --checkpoints "$WORK/tiny" --resolution 384x512 --split 0.5
  one_full_line || return 1
  no_temp_files "$WORK/fullt/cache" || { WHY="a temporary file was left"; return 1; }
  rm -f "$WORK/fullt/.filler"
  cli_run train prepare "$WORK/tc/pairs.csv" -o "$WORK/fullt/cache" --checkpoints "$WORK/tiny" --resolution 384x512 --split 0.5
  [ "$RC" -eq 0 ] && cmp -s "$WORK/fullt/cache/index.json" "$WORK/tc/cache/index.json" \
    || { WHY="after freeing: exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
}
TRAIN_ARGS=(--checkpoints "$WORK/tiny" --steps 4 --checkpoint-every 2 --validation-pairs 0 --device cpu --seed 3 --batch-size 1)
case_full_tmpfs_train_run_resume() {  # room for the first checkpoint only: one line; freed, --resume ends bitwise
  train_cache || { WHY="cannot prepare the cache"; return 1; }
  rm -rf "$WORK/whole"
  cli_run train run "$WORK/tc/cache" -o "$WORK/whole" "${TRAIN_ARGS[@]}"
  [ "$RC" -eq 0 ] || { WHY="the uninterrupted run: exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
  small_device "$WORK/fullr2" 64m || { WHY="cannot mount a tmpfs (needs root)"; return 1; }
  local before after checkpoint
  before="$(df -B1 --output=used "$WORK/fullr2" | tail -1)"
  cli_run train run "$WORK/tc/cache" -o "$WORK/fullr2/probe" "${TRAIN_ARGS[@]}" --steps 2
  after="$(df -B1 --output=used "$WORK/fullr2" | tail -1)"
  checkpoint="$(du -sb "$WORK/whole/checkpoints/step-00000002" | cut -f1)"
  rm -rf "$WORK/fullr2/probe"
  fill_leaving "$WORK/fullr2" $(( after - before + checkpoint / 2 ))
  cli_run train run "$WORK/tc/cache" -o "$WORK/fullr2/run" "${TRAIN_ARGS[@]}"
  one_full_line || return 1
  [ -d "$WORK/fullr2/run/checkpoints/step-00000002" ] && [ -z "$(find "$WORK/fullr2/run" -name '.*tmp*' -print -quit)" ] \
    || { WHY="no whole first checkpoint, or a temporary file or folder left"; return 1; }
  rm -f "$WORK/fullr2/.filler"
  cli_run train run "$WORK/tc/cache" -o "$WORK/fullr2/run" "${TRAIN_ARGS[@]}" --resume
  [ "$RC" -eq 0 ] || { WHY="--resume: exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
  cmp -s "$WORK/fullr2/run/lora.safetensors" "$WORK/whole/lora.safetensors" \
    || { WHY="the resumed adapter differs from the uninterrupted run's"; return 1; }
}
case_full_tmpfs_eval() {  # eval's files do not fit beside a batch's results: one line, the page unchanged
  batch_inputs
  small_device "$WORK/fulle" 8m || { WHY="cannot mount a tmpfs (needs root)"; return 1; }
  folder_batch "$WORK/fulle/out"
  [ "$RC" -eq 0 ] || { WHY="the batch: exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
  mkdir -p "$WORK/etruth"; cp "$EX/person.png" "$WORK/etruth/pA.png"; cp "$EX/person.png" "$WORK/etruth/pB.png"
  local page; page="$(md5sum <"$WORK/fulle/out/index.html")"
  fill_leaving "$WORK/fulle" 0
  eval_with_stand_ins "$WORK/fulle/out" --truth "$WORK/etruth"
  one_full_line || return 1
  [ "$(md5sum <"$WORK/fulle/out/index.html")" = "$page" ] && no_temp_files "$WORK/fulle/out" \
    || { WHY="the page changed or a temporary file was left"; return 1; }
  rm -f "$WORK/fulle/.filler"
  eval_with_stand_ins "$WORK/fulle/out" --truth "$WORK/etruth"
  [ "$RC" -eq 0 ] && [ -f "$WORK/fulle/out/eval.json" ] || { WHY="after freeing: exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
}
case_full_tmpfs_serve_job() {  # the server's folder is full: 507 and one line; freed, the next job is done
  local keep="$SERVE_TMP" full first second
  SERVE_TMP="$WORK/fulls"
  small_device "$SERVE_TMP" 16m || { SERVE_TMP="$keep"; WHY="cannot mount a tmpfs (needs root)"; return 1; }
  start_serve || { SERVE_TMP="$keep"; return 1; }
  warm_up || { SERVE_TMP="$keep"; return 1; }
  fill_leaving "$SERVE_TMP" 0
  first="$(serve_http POST /api/tryon)"
  rm -f "$SERVE_TMP/.filler"
  second="$(serve_http POST /api/tryon)"
  stop_serve TERM
  full="$(ls -A "$SERVE_TMP")"; SERVE_TMP="$keep"
  expect_status "$first" 507 "no space left on device (" || return 1
  case "$second" in "200 "*) ;; *) WHY="after freeing: $(echo "$second" | head -c 300)"; return 1 ;; esac
  [ -z "$full" ] || { WHY="left in its folder: $full"; return 1; }
}
case_ray_worker_killed_in_write() {  # a Ray worker SIGKILLed inside its write of a picture: swept once settled
  batch_inputs; rm -rf "$WORK/outk" "$WORK/killed"; mkdir -p "$WORK/outk"
  timeout "$CASE_TIMEOUT" "$PY" - "$WORK/killed" "$WORK/outk" "$REPO" --models "$WORK/b/people" \
    --cloths "$WORK/b/garments" --masks "$WORK/b/masks" --category upper "${BATCH_ARGS[@]}" \
    >"$WORK/stdout" 2>"$WORK/stderr" </dev/null <<'EOF'
import os, sys
import ray
from ootd.cli import main
from tests.helpers.kill_in_write import KILL_IN_WRITE, KILL_PERSON
marker, out, repo, *args = sys.argv[1:]
env = {KILL_IN_WRITE: marker, KILL_PERSON: "pA__", "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
         runtime_env={"env_vars": env, "worker_process_setup_hook": "tests.helpers.kill_in_write.arm"})
code = main(["batch", *args, "-o", out, "--engine", "ray", "--workers", "1", "--gpus-per-worker", "0"])
ray.shutdown()
sys.exit(code)
EOF
  RC=$?
  [ "$RC" -eq 0 ] || { WHY="exit $RC: $(tail -c 300 "$WORK/stderr")"; return 1; }
  [ -e "$WORK/killed" ] || { WHY="the worker was not killed inside its write"; return 1; }
  check_report "$WORK/outk/batch_report.jsonl" ok ok || { WHY="report: $(head -c 300 "$WORK/outk/batch_report.jsonl")"; return 1; }
  no_temp_files "$WORK/outk" && pictures_whole "$WORK/outk" || { WHY="the dead worker's temporary file is still there"; return 1; }
}

CASES+=(
  colour_managed_inputs corpus_batch corpus_classify_and_prepare corpus_eval corpus_serve full_tmpfs_run_partial
  full_tmpfs_train_prepare full_tmpfs_train_run_resume full_tmpfs_eval full_tmpfs_serve_job ray_worker_killed_in_write
)

# -- cases: the API keeps the contract it publishes (/openapi.json) ------------------------------------------------

case_serve_contract_schemathesis() {  # every check, every phase (stateful too): 0 failures, the server still up
  start_serve --max-steps 1 --max-samples 1 --max-queue 64 || return 1
  # in $WORK: Schemathesis keeps its cache (.schemathesis/) in the folder it runs in, never in the checkout
  ( cd "$WORK" && SCHEMATHESIS_HOOKS=tests.helpers.contract_hooks NO_COLOR=1 timeout 900 "$PY" -m schemathesis.cli \
    --config-file "$REPO/tests/frontends/serve/schemathesis.toml" run "${SERVE_URL}openapi.json" --checks all \
    --max-examples 20 --seed 1 --workers 1 --request-timeout 300 --max-response-time 600 --warnings off \
    >"$WORK/schemathesis.log" 2>&1 </dev/null )
  RC=$?
  local alive; alive="$(serve_http GET /api/health)"
  stop_serve TERM
  [ "$RC" -eq 0 ] || { WHY="schemathesis exit $RC: $(grep -m3 -E "ST[0-9]+ |Error" "$WORK/schemathesis.log")"; return 1; }
  case "$alive" in "200 "*) ;; *) WHY="the server after the run: $alive"; return 1 ;; esac
  # requests without a mask load the parsing model: ONNX Runtime (1.32) writes its telemetry session file, $TMPDIR/.ses
  # (51 bytes, the same file every run, `ootd run` too), which is not the server's; everything else must be gone
  rm -f "$SERVE_TMP/.ses"
  serve_clean_exit
}
case_serve_contract_findings() {  # what the first runs found: each answered as the document says
  start_serve --max-steps 1 || return 1
  local empty; empty="$(serve_http POST /api/jobs category=)"
  pyrun "$SERVE_URL" "$EX" >"$WORK/contract.out" 2>&1 <<'PY'
import sys
import httpx
url, ex = sys.argv[1].rstrip("/"), sys.argv[2]
files = {role: (f"{name}.png", open(f"{ex}/{name}.png", "rb").read(), "image/png")
         for role, name in (("person", "person"), ("garment", "tshirt"), ("mask", "person_mask_upper"))}
many = httpx.post(url + "/api/jobs", files=files, data={"category": "upper", "seed": [str(n) for n in range(40)]})
assert many.status_code == 422 and set(many.json()) == {"error"}, ("too many fields", many.status_code, many.text)
plain = httpx.post(url + "/api/jobs", json={"category": "upper"})
assert plain.status_code == 415 and set(plain.json()) == {"error"}, ("not multipart", plain.status_code, plain.text)
options = httpx.request("OPTIONS", url + "/api/jobs/abc")
allow = {m.strip() for m in options.headers.get("allow", "").split(",")}
assert options.status_code == 405 and {"GET", "DELETE"} <= allow, ("Allow", options.headers)
job = httpx.post(url + "/api/jobs", files=files, data={"category": "upper"}, timeout=60).json()
assert httpx.delete(url + f"/api/jobs/{job['id']}").status_code == 202
gone = httpx.get(url + f"/api/jobs/{job['id']}")
assert gone.status_code == 410 and set(gone.json()) == {"error"}, ("deleted job", gone.status_code, gone.text)
doc = httpx.get(url + "/openapi.json").json()
codes = set(doc["paths"]["/api/jobs/{job_id}"]["delete"]["responses"])
assert {"202", "404", "410"} <= codes, ("DELETE's statuses", codes)
print("ok")
PY
  RC=$?
  stop_serve TERM
  [ "$RC" -eq 0 ] || { WHY="$(tail -c 300 "$WORK/contract.out")"; return 1; }
  case "$empty" in 202*|400*) ;; *) WHY="empty category: $empty"; return 1 ;; esac
  serve_clean_exit
}

CASES+=(serve_contract_schemathesis serve_contract_findings)

main() {
  local selected=("$@") passed=0 failed=0 name start
  [ ${#selected[@]} -gt 0 ] || selected=("${CASES[@]}")
  echo "${#selected[@]} case(s) of ${#CASES[@]}"
  cd "$REPO" || exit 1
  if ! "$PY" scripts/make_tiny_checkpoints.py "$WORK/tiny" >"$WORK/make.log" 2>&1; then
    echo "cannot build the tiny tree:"; tail -5 "$WORK/make.log"; exit 1
  fi
  for name in "${selected[@]}"; do
    WHY=""
    if ! declare -F "case_$name" >/dev/null; then
      echo "FAIL $name: no such case"; failed=$((failed + 1)); continue
    fi
    start=$SECONDS
    if "case_$name" && [ ! -e "$MARKER" ]; then
      echo "PASS $name ($((SECONDS - start)) s)"; passed=$((passed + 1))
    else
      [ -e "$MARKER" ] && WHY="a weight file ran code (marker file exists)${WHY:+; $WHY}"
      echo "FAIL $name ($((SECONDS - start)) s): ${WHY:-failed}" | tr '\n' ' ' | cut -c1-400; echo
      failed=$((failed + 1))
    fi
  done
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}

main "$@"
