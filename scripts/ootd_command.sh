# Sourced by the batch scripts: sets the array ootd_cmd to the command that runs ootd, and ootd_python to the
# Python that has ootd (for the scripts' own small checks).
# $OOTD if set (e.g. OOTD="python -m ootd"), else the active virtual environment's ootd, else this checkout's
# .venv (what scripts/quickstart.sh and scripts/test.sh make; $OOTD_VENV names another), else `ootd` on PATH,
# else `python -m ootd` when that python has ootd. Without any of them: one line saying how to install, and
# exit 1 (never a traceback from a Python that lacks ootd).
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then  # run rather than sourced (e.g. with --help): say how to use it
    sed -n '1,/^# exit 1 (never/p' "$0" | sed 's/^# \{0,1\}//'
    echo "Usage: source scripts/ootd_command.sh, then run \"\${ootd_cmd[@]}\" ARGS..."
    [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && exit 0 || exit 2
fi
ootd_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ootd_venv="${OOTD_VENV:-.venv}"
[[ "$ootd_venv" = /* ]] || ootd_venv="$ootd_repo/$ootd_venv"
if [[ -n "${OOTD:-}" ]]; then
    read -r -a ootd_cmd <<< "$OOTD"
    ootd_python=${PYTHON:-python}
elif [[ -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/ootd" ]]; then
    ootd_cmd=("$VIRTUAL_ENV/bin/ootd")
    ootd_python="$VIRTUAL_ENV/bin/python"
elif [[ -x "$ootd_venv/bin/ootd" ]]; then
    ootd_cmd=("$ootd_venv/bin/ootd")
    ootd_python="$ootd_venv/bin/python"
elif command -v ootd > /dev/null 2>&1; then
    ootd_cmd=(ootd)
    ootd_python=$(sed -n '1s/^#! *//p' "$(command -v ootd)" 2> /dev/null)  # the Python its launcher names
    [[ "$ootd_python" != *" "* && -x "$ootd_python" ]] || ootd_python=python
elif ${PYTHON:-python} -c 'import ootd, typer' > /dev/null 2>&1; then
    ootd_python=${PYTHON:-python}
    ootd_cmd=("$ootd_python" -m ootd)
else
    echo "error: ootd is not installed: run \`bash $ootd_repo/scripts/quickstart.sh\` (it makes $ootd_venv)," \
        "or activate the environment that has it, or set OOTD to the command" >&2
    exit 1
fi
