#!/usr/bin/env bash
# Runs every test suite, even after one fails, and fails if any failed:
#   scripts/run-tests.sh VENV_DIR
# Expects the environment `make test` exports (binaries, test image store).
set -uo pipefail

venv=$1
status=0

echo "== cargo test"
if ! cargo test --quiet; then
    echo "== cargo test FAILED"
    status=1
fi

echo "== pytest"
if ! "$venv/bin/python" -m pytest -q -ra -p no:cacheprovider tests/; then
    echo "== pytest FAILED"
    status=1
fi

if [ $status -eq 0 ]; then echo "== all tests passed"; fi
exit $status
