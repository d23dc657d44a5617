"""The test image as `make test` built it: what sandboxes rely on being there.

Checks the real mmdebstrap result (the Rust unit tests cover the builder's
parts on small trees): metadata, ownership through the recorded id map, and
the packages apt inside a sandbox needs. Runs as root and as an ordinary
user alike (each with an image it built).
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
    for ids in ("uids", "gids"):
        assert sum(e["count"] for e in info["id_map"][ids]) >= 65_536, info["id_map"]
    assert rootfs.is_dir()


def host_id(extents: list[dict], inside: int) -> int:
    """The host id the map gives `inside`."""
    for e in extents:
        if e["inside"] <= inside < e["inside"] + e["count"]:
            return e["outside"] + inside - e["inside"]
    raise AssertionError(f"{inside} is not mapped by {extents}")


def outside_the_map(flag: str, extents: list[dict]) -> list[str]:
    """A find(1) expression matching files whose `flag` id is no host id of the map."""
    expr = ["!", "("]
    for i, e in enumerate(extents):
        expr += (["-o"] if i else []) + ["(", flag, f"+{e['outside'] - 1}", flag, f"-{e['outside'] + e['count']}", ")"]
    return expr + [")"]


def test_owners_are_the_ids_the_sandbox_maps(image: tuple[dict, Path]) -> None:
    info, rootfs = image
    uids, gids = info["id_map"]["uids"], info["id_map"]["gids"]
    st = rootfs.stat()
    assert (st.st_uid, st.st_gid) == (host_id(uids, 0), host_id(gids, 0))
    if os.geteuid() != 0:
        assert st.st_uid == os.geteuid(), "root inside is the user who built the image"
    # apt's `_apt` user owns its partial dir: mapped like every id, not shifted twice.
    partial = (rootfs / "var/lib/apt/lists/partial").stat()
    apt_uid = int(subprocess.run(["awk", "-F:", "$1 == \"_apt\" {print $3}", str(rootfs / "etc/passwd")],
                                 capture_output=True, text=True, check=True).stdout)
    assert partial.st_uid == host_id(uids, apt_uid)
    # Nothing may fall outside the ids the sandbox maps.
    expr = ["("] + outside_the_map("-uid", uids) + ["-o"] + outside_the_map("-gid", gids) + [")"]
    found = subprocess.run(["find", str(rootfs), "-xdev", *expr, "-print", "-quit"], capture_output=True, text=True)
    assert found.stdout == "", f"file owned outside {info['id_map']}: {found.stdout}"
    # An ordinary user cannot list directories its sandboxes' other ids keep private (apt's partial dirs).
    unreadable = [line for line in found.stderr.splitlines() if not line.endswith("Permission denied")]
    assert found.returncode == 0 or (os.geteuid() != 0 and not unreadable), found.stderr


def test_setuid_bits_survive_the_unpacking(image: tuple[dict, Path]) -> None:
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
