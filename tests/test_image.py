"""The test image as `make test` built it: what sandboxes rely on being there.

Checks the real mmdebstrap result (the Rust unit tests cover the builder's
parts on small trees): metadata, shifted ownership, and the packages apt
inside a sandbox needs.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import required_env, shared_image_store


@pytest.fixture(scope="module")
def image() -> tuple[dict, Path]:
    store = Path(shared_image_store())
    name = required_env("SANDBOX_MCP_TEST_IMAGE")
    info = json.loads((store / name / "image.json").read_text())
    return info, store / name / "rootfs"


def test_metadata_describes_the_tree(image: tuple[dict, Path]) -> None:
    info, rootfs = image
    assert info["name"] == required_env("SANDBOX_MCP_TEST_IMAGE")
    assert info["shell"] == "/bin/bash"
    assert info["package_manager"] == "apt"
    assert info["size_bytes"] > 50_000_000
    assert info["id_count"] >= 65_536
    assert rootfs.is_dir()


def test_ownership_is_shifted_once(image: tuple[dict, Path]) -> None:
    info, rootfs = image
    base, count = info["uid_base"], info["id_count"]
    st = rootfs.stat()
    assert (st.st_uid, st.st_gid) == (base, base)
    # apt's `_apt` user owns its partial dir: shifted like root, not double-shifted.
    partial = (rootfs / "var/lib/apt/lists/partial").stat()
    assert base < partial.st_uid < base + count
    # Nothing may fall outside the range the sandbox maps.
    out = subprocess.run(
        ["find", str(rootfs), "-xdev", "(", "-uid", f"-{base}", "-o", "-gid", f"-{base}",
         "-o", "-uid", f"+{base + count - 1}", "-o", "-gid", f"+{base + count - 1}", ")", "-print", "-quit"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert out == "", f"file owned outside {base}..{base + count}: {out}"


def test_setuid_bits_survive_the_shift(image: tuple[dict, Path]) -> None:
    _, rootfs = image
    assert os.stat(rootfs / "usr/bin/su").st_mode & 0o4000


def test_apt_works_offline_inside(image: tuple[dict, Path]) -> None:
    _, rootfs = image
    for rel in ("usr/bin/gpgv", "etc/ssl/certs/ca-certificates.crt", "usr/bin/python3"):
        assert (rootfs / rel).exists(), rel
    # Package lists are kept so `apt-get install` needs no `apt-get update` first.
    assert any((rootfs / "var/lib/apt/lists").glob("*_Packages")), "apt lists were cleaned"
    sources = [p for p in [rootfs / "etc/apt/sources.list", *(rootfs / "etc/apt/sources.list.d").glob("*")]
               if p.is_file() and p.stat().st_size > 0]
    assert sources, "no apt sources in the image"
