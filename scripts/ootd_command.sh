# Sourced by the batch scripts: sets the array ootd_cmd to the command that runs ootd.
# $OOTD if set (e.g. OOTD="python -m ootd"), else `ootd` on PATH, else `python -m ootd`.
if [[ -n "${OOTD:-}" ]]; then
    read -r -a ootd_cmd <<< "$OOTD"
elif command -v ootd > /dev/null 2>&1; then
    ootd_cmd=(ootd)
else
    ootd_cmd=(python -m ootd)
fi
