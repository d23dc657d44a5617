"""Two ordinary users on one machine (issue 10): each runs its own server, helper and sandbox through a real MCP
client, and neither reaches the other's sandboxes, sockets, state or host ids. Root creates the users and sets them
up with `sandbox-mcp host-setup`, as an administrator would; the tests skip unless root.

Each user needs an image built for its own id map. Building one with mmdebstrap takes minutes, so the users'
`sandbox-mcp image build` runs the real build and unpack (through the user's map, newuidmap included) on a tarball
made once from the shared test image, handed over by a stand-in for mmdebstrap: the part under test is the user's
own unpacking and everything after it, not Debian's package downloads.
"""
from __future__ import annotations

import ctypes
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from conftest import remove_env_dir, required_env, run_as, shared_image_store, stop_servers, user_env
from mcp_client import McpClient

IMAGE = "two-users"
# Stands in for mmdebstrap: writes the prepared tarball where the build wants its tarball (its last argument
# ending in rootfs.tar), and fails loudly on any other call.
STAND_IN = """#!/bin/sh
for a; do
    case $a in */rootfs.tar) exec cp -- "$SMCP_TEST_ROOTFS_TAR" "$a";; esac
done
echo "stand-in mmdebstrap: no */rootfs.tar target in: $*" >&2
exit 2
"""


def run_mapped(argv: list[str], id_map: dict, stdout: int) -> int:
    """Runs argv as root of a new user namespace with `id_map` (the image.json form), stdout to `stdout`; its
    exit status. Root writes the maps itself: util-linux's `unshare --map-users` goes through newuidmap, which
    refuses root's range unless /etc/subuid lists it, and a fresh machine's does not."""
    libc = ctypes.CDLL(None, use_errno=True)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only system calls until exec
        try:
            os.close(ready_r)
            os.close(go_w)
            if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
                os._exit(90)
            os.write(ready_w, b"u")
            if os.read(go_r, 1) != b"g":
                os._exit(91)
            os.setgroups([])
            os.setgid(0)
            os.setuid(0)
            os.dup2(stdout, 1)
            os.execvp(argv[0], argv)
        finally:
            os._exit(92)
    os.close(ready_w)
    os.close(go_r)
    try:
        assert os.read(ready_r, 1) == b"u", "the child could not make its user namespace"
        for name, key in (("uid_map", "uids"), ("gid_map", "gids")):
            lines = "".join(f"{e['inside']} {e['outside']} {e['count']}\n" for e in id_map[key])
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(lines)
        os.write(go_w, b"g")
    finally:
        os.close(ready_r)
        os.close(go_w)
        _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture(scope="module")
def rootfs_tar() -> Iterator[Path]:
    """The shared test image as mmdebstrap would write it (owners are the ids inside the chroot), and a dir with
    the stand-in mmdebstrap; both readable by every user."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create users")
    image = Path(shared_image_store()) / required_env("SANDBOX_MCP_TEST_IMAGE")
    id_map = json.loads((image / "image.json").read_text())["id_map"]
    d = Path(tempfile.mkdtemp(prefix="smcp-2u-"))
    d.chmod(0o755)
    tar = d / "rootfs.tar"
    # As root of a namespace with root's image map, tar records the ids inside (as mmdebstrap's tarball does).
    # That root cannot traverse root's 0700 store by path, so tar gets the rootfs as an fd opened here.
    rootfs = os.open(image / "rootfs", os.O_RDONLY | os.O_DIRECTORY)
    os.set_inheritable(rootfs, True)
    try:
        with open(tar, "wb") as out:
            status = run_mapped(["tar", "-C", f"/proc/self/fd/{rootfs}", "--numeric-owner", "--xattrs",
                                 "--xattrs-include=*", "--exclude=./dev/*", "-cf", "-", "."], id_map, out.fileno())
    finally:
        os.close(rootfs)
    assert status == 0, f"tar in root's image map exited {status}"
    tar.chmod(0o644)
    (d / "mmdebstrap").write_text(STAND_IN)
    (d / "mmdebstrap").chmod(0o755)
    try:
        yield tar
    finally:
        shutil.rmtree(d, ignore_errors=True)


def open_env(user: str) -> dict[str, str]:
    """`user_env`, with the base and XDG dirs open to everyone (0755, as homes and ~/.local often are): only
    sandbox-mcp's own directories and sockets must keep the other user out."""
    env = user_env(user)
    for d in [env["SANDBOX_MCP_TEST_TMP"]] + [env[k] for k in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME",
                                                                 "XDG_RUNTIME_DIR")]:
        os.chmod(d, 0o755)
    return env


def build_image(user: str, env: dict[str, str], tar: Path) -> str:
    """Builds the image as `user` into a store of its own; returns the store."""
    store = f"{env['SANDBOX_MCP_TEST_TMP']}/images"
    build_env = {**env, "PATH": f"{tar.parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
                 "SMCP_TEST_ROOTFS_TAR": str(tar)}
    out = run_as(user, [required_env("SANDBOX_MCP_BIN"), "image", "build", "--name", IMAGE, "--packages", "procps",
                        "--store", store], build_env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return store


def serve_as(user: str, env: dict[str, str], store: str) -> McpClient:
    """A stdio server run as `user` (runuser) with exactly `env`, on `store`."""
    server_env = {**env, "SANDBOX_MCP_IMAGE_STORE": store, "SANDBOX_MCP_DEFAULT_IMAGE": IMAGE,
                  "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}
    argv = ["-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in server_env.items()), required_env("SANDBOX_MCP_BIN")]
    return McpClient("runuser", argv, env={}, stderr_path=f"{env['SANDBOX_MCP_TEST_TMP']}/server.log")


def descendants(pid: int) -> list[int]:
    """Every process below `pid`."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def host_ranges(table: str) -> list[range]:
    """The host ids a /proc/PID/{uid,gid}_map table (or image.json extents) reaches."""
    return [range(int(outside), int(outside) + int(count))
            for _inside, outside, count in (line.split() for line in table.strip().splitlines())]


def vm_maps(env: dict[str, str]) -> dict[str, set[str]]:
    """The uid and gid maps of every process the user's helper runs in a user namespace of its own (its VMs'
    init and agent processes, and its warm launcher, which the next VM gets)."""
    helper = int((Path(env["XDG_RUNTIME_DIR"]) / "sandbox-mcp" / "helper.pid").read_text())
    own_ns = os.readlink(f"/proc/{helper}/ns/user")
    maps: dict[str, set[str]] = {"uid_map": set(), "gid_map": set()}
    for pid in descendants(helper):
        try:
            if os.readlink(f"/proc/{pid}/ns/user") == own_ns:
                continue
            for name in maps:
                maps[name].add(Path(f"/proc/{pid}/{name}").read_text())
        except OSError:
            continue  # gone meanwhile
    return maps


def overlaps(a: list[range], b: list[range]) -> bool:
    return any(x.start < y.stop and y.start < x.stop for x in a for y in b)


# A user's attempt at another user's files and sockets: prints one line per path, `ok` or the errno name.
PROBE = r"""
import errno, os, socket, sys
for path in sys.argv[1:]:
    try:
        if path.endswith(".sock"):
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            s.close()
        elif os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").close()
        print(path, "ok")
    except OSError as e:
        print(path, errno.errorcode.get(e.errno, e.errno))
"""


def test_two_users_see_neither_each_others_sandboxes_nor_ids(new_user, rootfs_tar):
    users = [new_user(subids=False), new_user(subids=False)]
    for user in users:
        setup = subprocess.run([required_env("SANDBOX_MCP_BIN"), "host-setup", "--user", user],
                               capture_output=True, text=True)
        assert setup.returncode == 0, setup.stdout + setup.stderr
    envs = [open_env(user) for user in users]
    clients: list[McpClient] = []
    try:
        stores = [build_image(user, env, rootfs_tar) for user, env in zip(users, envs)]
        for i, (user, env, store) in enumerate(zip(users, envs, stores)):
            clients.append(serve_as(user, env, store))
            out, err = clients[i].call("exec", sandbox=f"box{i}", command=f"echo from-{i} > /workspace/owned-{i}; id -u")
            assert not err and "0" in out, out
        a, b = users
        env_a, env_b = envs

        # Host ids: the two users' sandboxes, and root's (the shared image's map), share none.
        maps = [vm_maps(env) for env in envs]
        root_map = json.loads((Path(shared_image_store()) / required_env("SANDBOX_MCP_TEST_IMAGE") / "image.json")
                              .read_text())["id_map"]
        for name, key in (("uid_map", "uids"), ("gid_map", "gids")):
            assert all(len(m[name]) == 1 for m in maps), f"one {name} per user's sandboxes: {maps}"
            ra, rb = (host_ranges(next(iter(m[name]))) for m in maps)
            rroot = [range(e["outside"], e["outside"] + e["count"]) for e in root_map[key]]
            assert not overlaps(ra, rb), f"{name}: {a} {ra} and {b} {rb} overlap"
            assert not overlaps(ra, rroot) and not overlaps(rb, rroot), f"{name}: {ra} {rb} overlap root's {rroot}"
        uid_a = pwd.getpwnam(a).pw_uid
        assert next(iter(maps[0]["uid_map"])).split()[:3] == ["0", str(uid_a), "1"], "root in A's sandbox is A"

        # A file A's sandbox root writes in /workspace belongs to A on the host.
        # Volumes are named by the sandbox's key, `<project tag>-box0`.
        (volume,) = (Path(env_a["XDG_DATA_HOME"]) / "sandbox-mcp" / "volumes").glob("??????-box0")
        owned = volume / "workspace" / "owned-0"
        assert owned.stat().st_uid == uid_a and owned.read_text() == "from-0\n"

        # A reaches none of B's sockets, state or runtime files.
        run_b = Path(env_b["XDG_RUNTIME_DIR"]) / "sandbox-mcp"
        sockets = sorted(str(p) for p in run_b.rglob("*") if p.is_socket())
        assert str(run_b / "helper.sock") in sockets, sockets
        own_dirs = [Path(env_b[k]) / "sandbox-mcp" for k in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR")]
        targets = sockets + [str(d) for d in own_dirs if d.exists()]
        probe = run_as(a, ["python3", "-c", PROBE, *targets])
        results = dict(line.rsplit(" ", 1) for line in probe.stdout.splitlines())
        assert len(results) == len(targets), probe.stdout + probe.stderr
        assert set(results.values()) == {"EACCES"}, results

        # A's server lists only A's sandbox.
        listed, _ = clients[0].call("list_all")
        assert "box0" in listed and "box1" not in listed, listed
    finally:
        for c in clients:
            c.close()
        for env in envs:
            stop_servers(env)
            remove_env_dir(env["SANDBOX_MCP_TEST_TMP"])
