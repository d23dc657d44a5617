#!/usr/bin/env bash
# `make install`'s host step: runs `sandbox-mcp host-setup` for the user
# installing, with sudo and only when it would change something, and prints
# the command it ran as root. Root installing for itself needs none; root
# through sudo sets up the user who ran sudo.
#   scripts/host-setup.sh SANDBOX_MCP_BIN
set -euo pipefail

bin=$1

if [ "$(id -u)" -eq 0 ]; then
    if [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
        echo "host-setup: $bin host-setup --user $SUDO_USER"
        "$bin" host-setup --user "$SUDO_USER" | { grep -v '^ok ' || true; }
    fi
    exit 0
fi

user=$(id -un)
plan=$("$bin" host-setup --user "$user" --dry-run)
if ! grep -q '^would ' <<<"$plan"; then
    echo "host-setup: $user already set up"
    exit 0
fi
if ! command -v sudo >/dev/null; then
    # Sandboxes still work without it, with less: see README "Running as an ordinary user".
    echo "host-setup: needs root once; ask an administrator to run: $bin host-setup --user $user" >&2
    grep '^would ' <<<"$plan" >&2
    exit 0
fi
echo "host-setup: sudo $bin host-setup --user $user"
sudo "$bin" host-setup --user "$user" | { grep -v '^ok ' || true; }
