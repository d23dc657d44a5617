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

# The helper conformance suite again with every VM call across the
# swift-bridge ABI (serve --through-bridge: the Rust double of the Swift VM
# layer on the namespace driver); about a minute on 2 cores.
echo "== helper conformance through the swift bridge"
if ! SANDBOX_MCP_CONFORMANCE_BRIDGE=1 cargo test --quiet --test helper_conformance; then
    echo "== helper conformance through the swift bridge FAILED"
    status=1
fi

echo "== pytest"
if ! "$venv/bin/python" -m pytest -q -ra -p no:cacheprovider tests/; then
    echo "== pytest FAILED"
    status=1
fi

if [ $status -eq 0 ]; then echo "== all tests passed"; fi
exit $status
