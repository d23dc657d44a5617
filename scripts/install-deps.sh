#!/usr/bin/env bash
# Installs the host packages sandbox-mcp needs to build, run and test, only
# when missing, quietly, one line per step (CI logs stay readable).
#   mmdebstrap         builds images
#   uidmap             newuidmap/newgidmap: image builds without root
#   protobuf-compiler  protoc, needed by build.rs
#   procps             ps: a Mac tells a live server by it (no /proc); a test runs it here
#   python3-venv       the test venv (only if this python3 cannot make one)
# With SANDBOX_MCP_VM=1 (`make install` unless VM=0, `make vm`, the test setup), also
# what the optional vm driver needs (scripts/vm-kernel.sh, vm-initramfs.sh):
#   qemu-system-x86    qemu-system-x86_64, and virtiofsd (qemu-system-common)
#   e2fsprogs          mke2fs -d: the image layers' disks
#   binutils           strip and readelf for the initramfs
#   cpio lz4           the initramfs archive; the kernel's compressed payload
# With SANDBOX_MCP_TEST_TOOLS=1 (`make test`), also what the OCI image tests
# run (tests/oci_registry.rs, tests/test_oci_images.py); not for `make install`,
# as Debian's docker-registry starts a registry service of its own:
#   docker-registry    a registry on loopback to pull from
#   skopeo             pushes the tests' images and reads exported ones
#   busybox-static     the tests' small image, made from /bin/busybox
set -euo pipefail

packages=(mmdebstrap uidmap protobuf-compiler procps)
if [ "${SANDBOX_MCP_VM:-0}" = 1 ]; then
    packages+=(qemu-system-x86 e2fsprogs binutils cpio lz4)
fi
if [ "${SANDBOX_MCP_TEST_TOOLS:-0}" = 1 ]; then
    packages+=(docker-registry skopeo busybox-static)
fi
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    packages+=(python3-venv)
fi

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "deps: ${packages[*]}: already installed"
else
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null; then
            echo "deps: missing ${missing[*]}; install them as root: apt-get install ${missing[*]}" >&2
            exit 1
        fi
        sudo=(sudo)
    fi
    # apt-get itself under sudo (not a shell), so a sudoers rule can allow
    # exactly this and the sudo log shows what ran.
    apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get)
    # Says what runs as root (issue 10: an ordinary user's install uses sudo for apt only).
    echo "deps: ${apt[*]} update -qq; ${apt[*]} install -y -qq --no-install-recommends ${missing[*]}"
    log=$(mktemp)
    trap 'rm -f "$log"' EXIT
    if ! { "${apt[@]}" update -qq && "${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        echo "deps: apt-get failed" >&2
        exit 1
    fi
    echo "deps: installed ${missing[*]}"
fi

# Rust: the workspace's rust-version. Debian 12's own cargo (1.63) is older, so the message names rustup and
# the package, which needs no toolchain at all (README, Set-up).
rust_min=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$(dirname "$0")/../Cargo.toml")
if ! command -v cargo >/dev/null || ! command -v rustc >/dev/null; then
    echo "deps: cargo not found on PATH: building sandbox-mcp needs Rust $rust_min or later (https://rustup.rs;" \
         "Debian's own cargo is older). Without Rust, install the Debian package instead (README, Set-up)." >&2
    exit 1
fi
rust_now=$(rustc --version | cut -d' ' -f2)
if [ "$(printf '%s\n%s\n' "$rust_min" "$rust_now" | sort -V | head -n 1)" != "$rust_min" ]; then
    echo "deps: rustc $rust_now is older than the $rust_min sandbox-mcp needs: rustup update (https://rustup.rs)" >&2
    exit 1
fi
for tool in cc python3; do
    if ! command -v "$tool" >/dev/null; then
        echo "deps: $tool not found on PATH (install a C linker, build-essential, and Python 3.10+)" >&2
        exit 1
    fi
done
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "deps: python3 is $(python3 -V 2>&1); the mcp test client needs 3.10+" >&2
    exit 1
fi
echo "deps: $(cargo --version | cut -d' ' -f1-2), $(python3 -V 2>&1), $(mmdebstrap --version)"
