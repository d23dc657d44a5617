#!/usr/bin/env bash
# Builds an image with the sandbox-mcp CLI unless the store already has it:
#   scripts/test-image.sh SANDBOX_MCP_BIN STORE NAME PACKAGES(comma list)
# mmdebstrap's progress goes to STORE/.NAME.build.log (a dot name: never an image); on failure its tail is shown.
set -euo pipefail

bin=$1
store=$2
name=$3
packages=$4

# The package list is remembered beside the image: a changed list rebuilds it. With the same list, `image build`
# returns at once, unless the image was built for other ids than this user's sandboxes map (then it rebuilds it).
stamp="$store/.$name.packages"
force=()
if [ -f "$store/$name/image.json" ] && [ "$(cat "$stamp" 2>/dev/null)" != "$packages" ]; then
    force=(--force)
fi

mkdir -p "$store"
# Root's store is private, as under Debian's 0700 /root, where `make install` puts it: nothing root does to
# an image may rely on the sandbox's ids reaching it by path.
if [ "$(id -u)" -eq 0 ]; then
    chmod 700 "$store"
fi
log="$store/.$name.build.log"
start=$SECONDS
echo "image: $name ($packages) in $store"
if ! "$bin" image build --name "$name" --packages "$packages" --store "$store" "${force[@]}" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "image: building $name failed (full log: $log)" >&2
    exit 1
fi
echo "$packages" >"$stamp"
echo "image: $name ready in $(( SECONDS - start )) s"
