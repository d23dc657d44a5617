#!/usr/bin/env bash
# Creates (or refreshes) the Python venv for tests and benchmarks:
#   scripts/venv.sh VENV_DIR REQUIREMENTS
# Reinstalls only when the requirements file changed since the last install.
set -euo pipefail

venv=$1
req=$2
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$req" | cut -d' ' -f1)

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    echo "venv: $venv up to date"
    exit 0
fi

start=$SECONDS
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { [ -x "$venv/bin/python" ] || python3 -m venv "$venv"; } >"$log" 2>&1 \
    || ! "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req" >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "venv: creating $venv failed" >&2
    exit 1
fi
echo "$want" >"$stamp"
echo "venv: $venv ready ($(( SECONDS - start )) s)"
