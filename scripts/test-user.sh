#!/usr/bin/env bash
# Runs the helper conformance tests and pytest as an unprivileged user, the
# way people run the server (issue 10):
#   scripts/test-user.sh USER PACKAGES TEST_PATH...
# As root: creates USER (useradd -m) if missing, runs `sandbox-mcp host-setup`
# for it, builds the test image AS USER into a store of its own, then runs
# the tests AS USER (runuser) with its own HOME, XDG and TMP dirs and the
# environment `make test` exports (SANDBOX_MCP_BIN, SANDBOX_VM_HELPER_BIN,
# SANDBOX_MCP_TEST_IMAGE). The venv is made from the system python in a path
# every user can read (root's pyenv is not).
# With SMCP_USER_PYTEST_ONLY=1 only pytest runs (`make test-faults`: the helper
# conformance suite and the vm driver's tests already ran in `make test`'s pass).
set -uo pipefail

user=$1
packages=$2
shift 2
venv=${SMCP_USER_VENV:-/var/tmp/smcp-test-venv}
: "${SANDBOX_MCP_BIN:?run through make test-user}" "${SANDBOX_VM_HELPER_BIN:?}" "${SANDBOX_MCP_TEST_IMAGE:?}"

if [ "$(id -u)" -ne 0 ]; then
    echo "== test-user: skipped (creating the test user needs root)"
    exit 0
fi
set -e
if ! id -u "$user" >/dev/null 2>&1; then
    useradd -m "$user"
    echo "test-user: created $user"
fi
"$SANDBOX_MCP_BIN" host-setup --user "$user" | { grep -v '^ok ' || true; }
PATH=/usr/bin:/bin:$PATH scripts/venv.sh "$venv" tests/requirements.txt

home=$(getent passwd "$user" | cut -d: -f6)
store=$home/test-images
run=$(mktemp -d /tmp/smcp-test-user.XXXXXX)
chown "$user:" "$run"
trap 'rm -rf "$run"' EXIT
# CI's clone may sit where the user cannot reach (under /root): the user runs
# a copy of the tracked tree and of the binaries (sandbox-ctl beside
# sandbox-mcp, which copies it into sandboxes).
bin_dir=$(dirname "$SANDBOX_MCP_BIN")
mkdir -p "$run/repo/target/bin"
git ls-files -z | xargs -0 cp --parents -t "$run/repo"
cp -a .git "$run/repo/"  # tests that ask git about the checkout
for b in sandbox-mcp sandbox-vm-helper sandbox-ctl; do cp "$bin_dir/$b" "$run/repo/target/bin/"; done
only_pytest=${SMCP_USER_PYTEST_ONLY:-0}
# The helper conformance tests too (the attack tests on the helper itself),
# and the vm driver's qemu tests, on the user's own kernel and initramfs.
test_binary() {
    cargo test --quiet --no-run --test "$1" --message-format=json 2>/dev/null |
        sed -n "s/.*\"executable\":\"\([^\"]*\/$1-[^\"]*\)\".*/\1/p" | tail -n 1
}
if [ "$only_pytest" != 1 ]; then
    cp "$(test_binary helper_conformance)" "$run/repo/target/bin/helper-conformance"
    cp "$(test_binary vm_qemu)" "$run/repo/target/bin/vm-qemu"
fi
chown -R "$user:" "$run/repo"
SANDBOX_MCP_BIN=$run/repo/target/bin/sandbox-mcp
SANDBOX_VM_HELPER_BIN=$run/repo/target/bin/sandbox-vm-helper
cd "$run/repo"
as_user=(runuser -u "$user" -- env -i PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin HOME="$home"
    USER="$user" LOGNAME="$user" TMPDIR="$run" XDG_RUNTIME_DIR="$run" XDG_DATA_HOME="$home/.local/share"
    XDG_STATE_HOME="$home/.local/state" XDG_CONFIG_HOME="$home/.config" XDG_CACHE_HOME="$home/.cache"
    PYTHONDONTWRITEBYTECODE=1 RUST_LOG="${RUST_LOG:-info}"
    SANDBOX_MCP_BIN="$SANDBOX_MCP_BIN" SANDBOX_VM_HELPER_BIN="$SANDBOX_VM_HELPER_BIN"
    SANDBOX_MCP_TEST_IMAGE="$SANDBOX_MCP_TEST_IMAGE" SANDBOX_MCP_TEST_IMAGE_STORE="$store"
    SANDBOX_MCP_FAULT_SEED="${SANDBOX_MCP_FAULT_SEED:-}" SANDBOX_MCP_FAULT_ROUNDS="${SANDBOX_MCP_FAULT_ROUNDS:-}"
    SANDBOX_MCP_VM_DIR="$home/.local/share/sandbox-mcp/vm"
    SANDBOX_MCP_CONFORMANCE_DRIVER="${SANDBOX_MCP_CONFORMANCE_DRIVER:-}"
    SANDBOX_MCP_TEST_ISOLATION="${SANDBOX_MCP_TEST_ISOLATION:-}")
set +e

status=0
echo "== test image as $user"
if ! "${as_user[@]}" scripts/test-image.sh "$SANDBOX_MCP_BIN" "$store" "$SANDBOX_MCP_TEST_IMAGE" "$packages"; then
    echo "== test image as $user FAILED"
    status=1
fi
# The user's own guest kernel and initramfs, before any test that boots a vm.
echo "== vm assets as $user"
if ! { "${as_user[@]}" scripts/vm-kernel.sh && "${as_user[@]}" scripts/vm-initramfs.sh "$SANDBOX_VM_HELPER_BIN"; }; then
    echo "== vm assets as $user FAILED"
    status=1
fi
if [ "$only_pytest" = 1 ]; then
    echo "== helper conformance and vm driver as $user: skipped (SMCP_USER_PYTEST_ONLY=1)"
else
    echo "== helper conformance as $user${SANDBOX_MCP_CONFORMANCE_DRIVER:+ (driver ${SANDBOX_MCP_CONFORMANCE_DRIVER})}"
    if ! "${as_user[@]}" target/bin/helper-conformance -q; then
        echo "== helper conformance as $user FAILED"
        status=1
    fi
    # Through the swift bridge's ABI once, in `make test`'s pass (the vm matrix
    # names other drivers; the bridge's layer is the namespace driver's double).
    if [ -z "${SANDBOX_MCP_TEST_ISOLATION:-}" ] && [ -z "${SANDBOX_MCP_CONFORMANCE_DRIVER:-}" ]; then
        echo "== helper conformance through the swift bridge as $user"
        if ! "${as_user[@]}" SANDBOX_MCP_CONFORMANCE_BRIDGE=1 target/bin/helper-conformance -q; then
            echo "== helper conformance through the swift bridge as $user FAILED"
            status=1
        fi
    fi
    # The vm driver's own tests run once, in `make test`'s pass (`make test-vm` sets the matrix's switches).
    if [ -z "${SANDBOX_MCP_TEST_ISOLATION:-}" ]; then
        echo "== vm driver as $user"
        if ! "${as_user[@]}" target/bin/vm-qemu -q --test-threads=1; then
            echo "== vm driver as $user FAILED"
            status=1
        fi
    fi
fi
echo "== pytest as $user: $*"
if ! "${as_user[@]}" "$venv/bin/python" -m pytest -q -ra -p no:cacheprovider "$@"; then
    echo "== pytest as $user FAILED"
    status=1
fi
if [ $status -eq 0 ]; then echo "== all tests as $user passed"; fi
exit $status
