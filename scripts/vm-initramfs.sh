#!/usr/bin/env bash
# Builds the vm driver's initramfs for one sandbox-vm-helper binary:
#   DIR/initramfs-<build id>.cpio.gz
# holding that binary (stripped; its `guest-init` role is the guest's PID 1,
# its `agent` role serves the helper on the virtio-serial port), the shared
# libraries it loads (the guest runs it before any image is mounted, and
# afterwards with these libraries, so no image's libc has to match), and the
# modules scripts/vm-kernel.sh collected. The helper picks the initramfs
# named by its own build id, so an agent in the guest always speaks its
# helper's protocol. Run vm-kernel.sh first. Quiet and idempotent.
#   usage: vm-initramfs.sh HELPER_BINARY
set -euo pipefail

helper=${1:?usage: vm-initramfs.sh HELPER_BINARY}
dir=${SANDBOX_MCP_VM_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/sandbox-mcp/vm}
if [ ! -s "$dir/modules/order" ]; then
    echo "vm-initramfs: no modules in $dir: run scripts/vm-kernel.sh first" >&2
    exit 1
fi
build_id=$(readelf -n "$helper" | sed -n 's/^ *Build ID: \([0-9a-f]*\)$/\1/p')
if [ -z "$build_id" ]; then
    echo "vm-initramfs: $helper has no GNU build id" >&2
    exit 1
fi
out="$dir/initramfs-$build_id.cpio.gz"
# Built means built since vm-kernel.sh last changed the modules.
if [ -f "$out" ] && [ "$out" -nt "$dir/modules/order" ]; then
    echo "vm-initramfs: $(basename "$out"): already built"
    exit 0
fi

work=$(mktemp -d "$dir/.initramfs.XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/root"
mkdir -p "$root"/{dev,proc,sys,run,newroot,lib/sandbox-mcp/modules}
# The binary and its libraries live together in one directory, which the
# guest init later binds into the sandbox's root for the agent.
lib="$root/lib/sandbox-mcp"
strip -o "$lib/sandbox-vm-helper" "$helper"
interp=$(readelf -l "$helper" | sed -n 's/.*Requesting program interpreter: \(.*\)]$/\1/p')
cp -L "$interp" "$lib/ld.so"
ldd "$helper" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | while read -r so; do
    cp -L "$so" "$lib/"
done
cp "$dir"/modules/*.ko "$dir/modules/order" "$lib/modules/"
# The kernel runs /init (the binary, `guest-init` given after `--` on the
# command line); the loader and libraries are found where the binary asks.
ln -s lib/sandbox-mcp/sandbox-vm-helper "$root/init"
mkdir -p "$root$(dirname "$interp")"
ln -s /lib/sandbox-mcp/ld.so "$root$interp"
ln -s sandbox-mcp "$root/lib/x86_64-linux-gnu"
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) | gzip -1 >"$work/initramfs.cpio.gz"
mv "$work/initramfs.cpio.gz" "$out"
# Older builds of the same directory are of other helper binaries.
find "$dir" -maxdepth 1 -name 'initramfs-*.cpio.gz' ! -name "$(basename "$out")" -mmin +60 -delete
echo "vm-initramfs: $(basename "$out") ($(du -h "$out" | cut -f1))"
