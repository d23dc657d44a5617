#!/usr/bin/env bash
# Builds the vm driver's guest kernel from Debian's cloud kernel package:
#   DIR/vmlinux          the kernel as an uncompressed ELF, which qemu's
#                        microvm boots through PVH (no firmware, no in-guest
#                        decompression)
#   DIR/modules/*.ko     the modules the guest needs that the package does not
#                        build in, and DIR/modules/order, the order to load them
#   DIR/kernel.release   the kernel release (`uname -r` in the guest)
# DIR is $SANDBOX_MCP_VM_DIR, else $XDG_DATA_HOME/sandbox-mcp/vm. Quiet and
# idempotent (nothing is fetched when the package's release is already
# built); `apt-get download` and `dpkg-deb -x` need no root.
set -euo pipefail

dir=${SANDBOX_MCP_VM_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/sandbox-mcp/vm}
meta=${SANDBOX_MCP_VM_KERNEL_PACKAGE:-linux-image-cloud-amd64}
# virtio_mmio: microvm's transport; virtio_console: the agent's port;
# virtio_blk and virtiofs: the root filesystem's layers and /workspace;
# overlay: the image's layers plus the VM's writable layer; virtio_pci: the
# writable disk and /workspace, attached on PCIe root ports after a restore
# from a memory snapshot (the warm pool; microvm's virtio-mmio slots cannot
# be added to a running guest, a PCI bus can be rescanned); bridge and veth:
# dockerd's default bridge network in images that have Docker Engine (it runs
# with --iptables=false, so no netfilter modules: see rust/guest/containers.rs);
# virtio_net: the EGRESS network card (qemu's -netdev stream to the helper's stack).
wanted=(virtio_mmio virtio_console virtio_blk virtiofs overlay virtio_pci bridge veth virtio_net)

# The metapackage names the real package, whose version is the release.
pkg=$(apt-cache depends "$meta" 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -n1)
if [ -z "$pkg" ]; then
    echo "vm-kernel: apt-cache knows no package $meta depends on; run apt-get update (or set SANDBOX_MCP_VM_KERNEL_PACKAGE)" >&2
    exit 1
fi
release=${pkg#linux-image-}
# The build is current when the release matches and every wanted module is
# in the load order (a module added here rebuilds it).
current() {
    [ -f "$dir/vmlinux" ] && [ "$(cat "$dir/kernel.release" 2>/dev/null)" = "$release" ] || return 1
    local m
    for m in "${wanted[@]}"; do
        grep -qx "$m" "$dir/modules/order" 2>/dev/null || grep -qx "$m" "$dir/modules/builtin" 2>/dev/null || return 1
    done
}
if current; then
    echo "vm-kernel: $release: already built in $dir"
    exit 0
fi

mkdir -p "$dir"
work=$(mktemp -d "$dir/.kernel.XXXXXX")
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -qq "$pkg" >/dev/null 2>"$work/apt.log") || {
    cat "$work/apt.log" >&2
    echo "vm-kernel: apt-get download $pkg failed" >&2
    exit 1
}
dpkg-deb -x "$work"/"$pkg"_*.deb "$work/x"
vmlinuz="$work/x/boot/vmlinuz-$release"
moddir="$work/x/lib/modules/$release"

# The bzImage wraps the compressed ELF; find the payload by its
# compressor's magic (what the kernel's scripts/extract-vmlinux does) and
# keep the first one that decompresses to an ELF.
is_elf() { [ "$(head -c 4 "$1" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; }
extract() {
    local magic=$1 tool=$2 off
    for off in $(LC_ALL=C grep -aobP "$magic" "$vmlinuz" 2>/dev/null | cut -d: -f1 | head -n 5); do
        tail -c +$((off + 1)) "$vmlinuz" | $tool >"$work/vmlinux" 2>/dev/null || true
        if [ -s "$work/vmlinux" ] && is_elf "$work/vmlinux"; then
            return 0
        fi
    done
    return 1
}
extract '\x02\x21\x4c\x18' 'lz4 -dc' || extract '\x28\xb5\x2f\xfd' 'zstd -dc' ||
    extract '\xfd\x37\x7a\x58\x5a\x00' 'xz -dc' || extract '\x1f\x8b\x08' 'gzip -dc' || {
    echo "vm-kernel: found no ELF kernel inside $vmlinuz (lz4, zstd, xz and gzip tried)" >&2
    exit 1
}
if ! grep -q '^CONFIG_PVH=y' "$work/x/boot/config-$release"; then
    echo "vm-kernel: $pkg is built without CONFIG_PVH; qemu's microvm cannot boot it directly" >&2
    exit 1
fi

# Each wanted module that is not built in, after the modules it depends on.
mkdir -p "$work/modules"
: >"$work/modules/order"
add_module() {
    local name=$1 file dep
    grep -qx "$name" "$work/modules/order" && return 0
    grep -q "/$name.ko\$" "$moddir/modules.builtin" 2>/dev/null && return 0
    file=$(find "$moddir/kernel" -name "$name.ko" -o -name "${name//_/-}.ko" | head -n1)
    if [ -z "$file" ]; then
        echo "vm-kernel: $pkg has no module $name" >&2
        exit 1
    fi
    # A module's dependencies are its .modinfo's "depends=" (no kmod needed).
    for dep in $(tr '\0' '\n' <"$file" | sed -n 's/^depends=//p' | head -n1 | tr ',' ' '); do
        add_module "$dep"
    done
    cp "$file" "$work/modules/$name.ko"
    echo "$name" >>"$work/modules/order"
}
: >"$work/modules/builtin"
for m in "${wanted[@]}"; do
    if grep -q "/$m.ko\$" "$moddir/modules.builtin" 2>/dev/null; then
        echo "$m" >>"$work/modules/builtin"
    fi
    add_module "$m"
done

rm -rf "$dir/modules"
mv "$work/modules" "$dir/modules"
mv "$work/vmlinux" "$dir/vmlinux"
echo "$release" >"$dir/kernel.release"
echo "vm-kernel: $release: $dir/vmlinux ($(du -h "$dir/vmlinux" | cut -f1)), $(wc -l <"$dir/modules/order") modules ($(du -sh "$dir/modules" | cut -f1))"
