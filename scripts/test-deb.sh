#!/usr/bin/env bash
# `make test-deb`: issue 26's "a user without Rust installs from the package and gets a working session".
# As root: installs the newest .deb in DIST_DIR with apt-get (which brings its dependencies) and checks
# what its postinst printed; creates a throwaway login user without a Rust toolchain, whose sudo is
# limited to `sandbox-mcp host-setup` for itself, and follows those steps as that user (doctor,
# host-setup, the default image); then uses the installed server through a real MCP client
# (scripts/install-smoke.py; no vm step: the package carries no guest kernel). Removes the package,
# the user, its sudoers rule and cgroups at the end (scripts/throwaway-user.sh).
#   scripts/test-deb.sh DIST_DIR
set -uo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "== test-deb: skipped (installing a package needs root)"
    exit 0
fi
if dpkg -s sandbox-mcp >/dev/null 2>&1; then
    echo "== test-deb: skipped (a sandbox-mcp package is installed here already; this test would remove it)"
    exit 0
fi
set -e
repo=$(pwd)
. scripts/throwaway-user.sh
dist=$1
deb=$(realpath "$(ls -t "$dist"/sandbox-mcp_*.deb | head -n 1)")
user=smcp-deb$$
venv=${SMCP_USER_VENV:-/var/tmp/smcp-test-venv}
postinst=$(mktemp /tmp/smcp-test-deb.XXXXXX)

cleanup() {
    set +e
    throwaway_user_remove "$user"
    rm -f "$postinst"
    DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq sandbox-mcp >/dev/null 2>&1
}
trap cleanup EXIT

echo "== apt-get install $deb"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$deb" >"$postinst" 2>&1 || {
    cat "$postinst"
    echo "== installing the package FAILED"
    exit 1
}
for want in "sandbox-mcp image build" "sudo sandbox-mcp host-setup" "sandbox-mcp config claude"; do
    grep -qF "$want" "$postinst" || { cat "$postinst"; echo "== the postinst does not say '$want'"; exit 1; }
done
for b in sandbox-mcp sandbox-vm-helper sandbox-ctl; do
    [ -x "/usr/bin/$b" ] || { echo "== /usr/bin/$b missing"; exit 1; }
done

throwaway_user_create "$user"
throwaway_user_sudo "$user" "/usr/bin/sandbox-mcp host-setup --user $user"
home=$(getent passwd "$user" | cut -d: -f6)
# The smoke test and its MCP client, and the venv of the client (scripts/test-user.sh's), readable by the user.
mkdir -p "$home/smoke/scripts" "$home/smoke/tests"
cp "$repo/scripts/install-smoke.py" "$home/smoke/scripts/"
cp "$repo/tests/mcp_client.py" "$home/smoke/tests/"
chown -R "$user:" "$home/smoke"
PATH=/usr/bin:/bin:$PATH scripts/venv.sh "$venv" tests/requirements.txt

status=0
if as_user "$user" "command -v cargo || command -v rustc"; then
    echo "== $user has a Rust toolchain: not the user this test is for"
    exit 1
fi
as_user "$user" "sandbox-mcp doctor" || true
user_step "$user" "the postinst's steps as $user" "sudo /usr/bin/sandbox-mcp host-setup --user $user && sandbox-mcp image build"
user_step "$user" "the packaged server through a real MCP client, as $user" \
    "$venv/bin/python ~/smoke/scripts/install-smoke.py /usr/bin/sandbox-mcp --no-vm"
if [ $status -eq 0 ]; then echo "== test-deb passed"; fi
exit $status
