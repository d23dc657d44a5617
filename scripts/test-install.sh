#!/usr/bin/env bash
# `make test-install`: issue 10's "done when", end to end. As root: creates a
# throwaway login user whose sudo is limited to what `make install` may run
# as root (apt-get through env, and `sandbox-mcp host-setup --user` for
# itself), gives it a Rust toolchain (a copy of the one running this) and a
# copy of this checkout, and runs `make install` AS that user: a release
# build, ~/.local/bin, the default image. Then starts the server the way the
# printed registration says and uses it through a real MCP client
# (scripts/install-smoke.py). Prints what sudo ran. Then root's own
# `make install` of the same checkout with a 0700 home, as Debian's /root
# is (the image store under it is out of the sandbox ids' reach by path),
# and the same smoke test. Removes the users' homes, sudoers rule,
# subordinate ids and cgroups at the end.
#   scripts/test-install.sh
set -uo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "== test-install: skipped (creating the test user needs root)"
    exit 0
fi
set -e
repo=$(pwd)
. scripts/throwaway-user.sh
user=smcp-inst$$
sudo_log=$(mktemp /tmp/smcp-test-install-sudo.XXXXXX)
venv=${SMCP_USER_VENV:-/var/tmp/smcp-test-venv}
root_home=$(mktemp -d /tmp/smcp-root-home.XXXXXX)
chmod 700 "$root_home"

cleanup() {
    set +e
    throwaway_user_remove "$user"
    stop_servers_of "$root_home"
    rm -rf "$root_home"
    rm -f "$sudo_log"
}
trap cleanup EXIT

throwaway_user_create "$user"
home=$(getent passwd "$user" | cut -d: -f6)
THROWAWAY_SUDO_LOG=$sudo_log throwaway_user_sudo "$user" \
    "/usr/bin/env DEBIAN_FRONTEND=noninteractive apt-get *" "$home/.local/bin/sandbox-mcp host-setup --user $user"

# A toolchain as rustup leaves one in a home: the active toolchain, cargo's
# bin dir and its download cache (so the build needs no registry access).
sysroot=$(rustc --print sysroot)
cargo_home=${CARGO_HOME:-$HOME/.cargo}
mkdir -p "$home/.rustup/toolchains" "$home/.cargo"
cp -a "$sysroot" "$home/.rustup/toolchains/"
printf 'default_toolchain = "%s"\nprofile = "default"\nversion = "12"\n' "$(basename "$sysroot")" >"$home/.rustup/settings.toml"
cp -a "$cargo_home/bin" "$cargo_home/env" "$home/.cargo/"
[ -d "$cargo_home/registry" ] && cp -a "$cargo_home/registry" "$home/.cargo/"
echo '. "$HOME/.cargo/env"' >>"$home/.profile"

# The checkout as it is (tracked files, changes included), as if cloned.
mkdir -p "$home/sandbox-mcp"
git ls-files -z | xargs -0 cp --parents -t "$home/sandbox-mcp"
cp -a .git "$home/sandbox-mcp/"
chown -R "$user:" "$home/.rustup" "$home/.cargo" "$home/sandbox-mcp"

# The venv of the MCP client, readable by every user (scripts/test-user.sh's).
PATH=/usr/bin:/bin:$PATH scripts/venv.sh "$venv" tests/requirements.txt

status=0
user_step "$user" "make install as $user" "cd ~/sandbox-mcp && make install"
user_step "$user" "the installed server through a real MCP client, as $user" \
    "$venv/bin/python ~/sandbox-mcp/scripts/install-smoke.py ~/.local/bin/sandbox-mcp"
# Root for itself, in a home only root can enter: the release build is the
# one just made (the same checkout), the default image is built anew.
as_root() {
    env -u XDG_DATA_HOME -u XDG_STATE_HOME -u XDG_CONFIG_HOME -u XDG_RUNTIME_DIR -u SANDBOX_MCP_IMAGE_STORE \
        HOME="$root_home" CARGO_HOME="$cargo_home" RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}" "$@"
}
if [ $status -eq 0 ]; then
    echo "== make install as root, home $root_home at 0700"
    if ! as_root make --no-print-directory -C "$home/sandbox-mcp" install; then
        echo "== make install as root with a 0700 home FAILED"
        status=1
    elif ! as_root "$venv/bin/python" "$home/sandbox-mcp/scripts/install-smoke.py" "$root_home/.local/bin/sandbox-mcp"; then
        echo "== MCP client as root with a 0700 home FAILED"
        status=1
    fi
fi
echo "== what sudo ran for $user:"
sed -n 's/^.*COMMAND=/  /p' "$sudo_log"
if [ $status -eq 0 ]; then echo "== test-install passed"; fi
exit $status
