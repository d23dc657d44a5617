#!/usr/bin/env bash
# `make deb` and `make dist`: the release binaries packaged for a user without a Rust toolchain.
#   scripts/make-deb.sh deb  RELEASE_BIN_DIR OUT_DIR   a Debian package (sandbox-mcp_VERSION_ARCH.deb)
#   scripts/make-deb.sh dist RELEASE_BIN_DIR OUT_DIR   a release archive (sandbox-mcp-VERSION-linux-ARCH.tar.gz)
# Prints the path of what it made. The package's postinst runs nothing: it prints what each user runs next.
# The binaries link glibc dynamically: the package depends on the glibc they need (Debian 12 or later).
set -euo pipefail

kind=$1
bin=$2
out=$3
repo=$(cd "$(dirname "$0")/.." && pwd)
bins=(sandbox-mcp sandbox-vm-helper sandbox-ctl)

version=$("$bin/sandbox-mcp" --version | awk '{print $2}')
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$out"

# The newest glibc symbol version any binary needs.
glibc=$(for b in "${bins[@]}"; do objdump -T "$bin/$b"; done | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n 1)

next_steps() {
    cat <<EOF
Next, as each user who runs it (nothing here ran as root):
  sandbox-mcp doctor             says what the host still needs; if it names host-setup:
  sudo sandbox-mcp host-setup --user "\$USER"
  sandbox-mcp image build        the default image, once (a few minutes; Debian packages)
  sandbox-mcp config claude      the line that registers it with Claude Code (config cursor: Cursor, Claude Desktop)
EOF
}

case $kind in
deb)
    root="$stage/sandbox-mcp_${version}_${arch}"
    install -d "$root/DEBIAN" "$root/usr/bin" "$root/usr/share/doc/sandbox-mcp"
    for b in "${bins[@]}"; do
        install -m 755 "$bin/$b" "$root/usr/bin/$b"
    done
    install -m 644 "$repo/README.md" "$root/usr/share/doc/sandbox-mcp/README.md"
    cat >"$root/usr/share/doc/sandbox-mcp/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: sandbox-mcp

Files: *
License: Apache-2.0
 On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.
EOF
    size=$(du -sk "$root/usr" | cut -f1)
    cat >"$root/DEBIAN/control" <<EOF
Package: sandbox-mcp
Version: $version
Architecture: $arch
Maintainer: sandbox-mcp developers <sandbox-mcp@users.noreply.github.com>
Installed-Size: $size
Depends: libc6 (>= $glibc), libgcc-s1, mmdebstrap, uidmap
Recommends: qemu-system-x86
Section: devel
Priority: optional
Description: local, VM-grade sandboxes for AI agents, served as an MCP server
 Gives MCP clients (Claude Code, Cursor, Claude Desktop, any client over
 stdio or Streamable HTTP) tools to run code in named, isolated Linux
 sandboxes: Linux namespaces by default, qemu microVMs with
 isolation = "vm" (qemu-system-x86).
EOF
    {
        echo '#!/bin/sh'
        echo 'set -e'
        echo 'if [ "$1" = configure ]; then'
        echo "cat <<'EOT'"
        echo "sandbox-mcp $version installed in /usr/bin."
        next_steps
        echo 'EOT'
        echo 'fi'
    } >"$root/DEBIAN/postinst"
    chmod 755 "$root/DEBIAN/postinst"
    dpkg-deb --root-owner-group --build "$root" "$out/" >/dev/null
    echo "$out/sandbox-mcp_${version}_${arch}.deb"
    ;;
dist)
    name="sandbox-mcp-${version}-linux-${arch}"
    install -d "$stage/$name/bin"
    for b in "${bins[@]}"; do
        install -m 755 "$bin/$b" "$stage/$name/bin/$b"
    done
    install -m 644 "$repo/README.md" "$stage/$name/README.md"
    {
        echo "sandbox-mcp $version for Linux ($arch, glibc $glibc or later; needs mmdebstrap and uidmap)."
        echo "Put bin/ on your PATH (or copy its three files to ~/.local/bin), keeping them together."
        next_steps
    } >"$stage/$name/INSTALL"
    tar -C "$stage" -czf "$out/$name.tar.gz" "$name"
    echo "$out/$name.tar.gz"
    ;;
*)
    echo "make-deb.sh: deb or dist, not $kind" >&2
    exit 2
    ;;
esac
