"""Issue 25, item 1: a sandbox outlives its helper, on both drivers. A helper
that dies (`kill -9`, a crash) takes no sandbox along: each namespace VM's
launcher, and each vm's qemu keeper, keeps its VM and hands it to the next
helper through its keeper socket (see the helper's `driver/keep.rs`), so
every process, background job, forward and root filesystem change goes on,
with no notice and no call that errors.

Also the keeper against an attacker: nothing inside a sandbox holds what
hands the VM over, a knock while a helper watches is turned away, and a
knock speaking another protocol is refused without harm."""
from __future__ import annotations

import array
import json
import os
import select
import signal
import socket
from pathlib import Path

import pytest

from conftest import ON_VM, TEST_HOST_PORT, sandbox_key
from mcp_client import McpClient
from test_comeback import NOTICE, ok, serve, status_lost
from test_crash_safety import _descendants
from test_daemon import daemon_pid
from test_persistence import _get, _restarted, exited, free_port, helper_pid, until

# Every process of a sandbox that is not its agent's plumbing: pid, start time, command line.
# (A process that ends mid-loop is skipped: the redirections that would fail come after 2>/dev/null.)
RUNNING = ("for d in /proc/[0-9]*; do c=$(tr '\\0' ' ' 2>/dev/null < $d/cmdline); case \"$c\" in "
           "'python3 -m http.server'*|'sleep 100000'*) echo \"${d#/proc/} $(cut -d' ' -f22 $d/stat 2>/dev/null) $c\";; "
           "esac; done | sort")


def running(client: McpClient, name: str) -> list[str]:
    return ok(client, "exec", command=RUNNING, sandbox=name).rsplit("\n(", 1)[0].splitlines()


def kill_helper(env: dict[str, str]) -> None:
    old = helper_pid(env)
    os.kill(old, signal.SIGKILL)
    until(lambda: _restarted(env, old), "the helper started again")


def adopted(env: dict[str, str], helper: int) -> dict[int, str]:
    """The processes of the sandboxes `helper` adopted: each launcher whose
    record (its VM directory's `launcher`: pid, start, owner pid, owner
    start) names `helper` as its owner, and everything under it."""
    found: dict[int, str] = {}
    for record in Path(env["XDG_STATE_HOME"]).rglob("vms/*/launcher"):
        fields = record.read_text().split()
        if len(fields) >= 3 and fields[2] == str(helper) and not exited(int(fields[0])):
            found[int(fields[0])] = fields[1]
            found.update(_descendants(int(fields[0])))
    return found


def keeper_of(env: dict[str, str], name: str, project: str | os.PathLike[str] | None = None) -> Path:
    """The keeper socket of a sandbox: a vm's in the run dir its record names (a pool vm keeps the pool's)."""
    key = sandbox_key(name, project)
    for record in Path(env["XDG_STATE_HOME"]).rglob(f"vms/{key}/qemu.json"):
        return Path(json.loads(record.read_text())["run_dir"]) / "keep.sock"
    sockets = list(Path(env["XDG_RUNTIME_DIR"]).rglob(f"{key}.keep"))
    assert len(sockets) == 1, sockets
    return sockets[0]


def test_a_helper_crash_keeps_every_sandbox_and_all_it_runs(front_end, http_server, env):
    ports = {name: free_port() for name in ("s1", "s2", "s3")}
    a = front_end()
    for name, port in ports.items():
        serve(a, name, port)
    before = {name: running(a, name) for name in ports}
    assert all(len(p) == 2 for p in before.values()), before
    kill_helper(env)
    # Two stdio clients and an HTTP client, each on its own sandbox: the same
    # processes, the root filesystem change, env and /workspace, no notice.
    b, h = front_end(), http_server().client()
    for client, name in ((a, "s1"), (b, "s2"), (h, "s3")):
        text = ok(client, "exec", sandbox=name,
                  command="cat /workspace/keep; printenv WHO; test -e /etc/gone-marker && echo rootfs-kept")
        assert text.splitlines()[:3] == [f"kept-{name}", f"env-{name}", "rootfs-kept"], text
        assert running(client, name) == before[name]
        assert _get(f"http://127.0.0.1:{ports[name]}/keep").strip() == f"kept-{name}"
        assert "(alive)" in ok(client, "logs", name="nap", sandbox=name)
    assert not status_lost(h), ok(h, "status")
    # The new helper watches them as the old one did: stats read the
    # sandbox's cgroup, and a new process and a new background job start.
    stats = ok(b, "stats", sandbox="s2")
    assert "Memory:" in stats and "Quota:" in stats, stats
    ok(b, "bg", command="sleep 100001", name="late", sandbox="s2")
    assert "(alive)" in ok(b, "logs", name="late", sandbox="s2")
    # Kept twice: the next helper adopts from the one that adopted.
    kill_helper(env)
    assert running(a, "s1") == before["s1"]
    # A kept sandbox is destroyed like any other: its processes and sockets go.
    keeper = keeper_of(env, "s3")
    ok(h, "destroy", sandbox="s3")
    assert not keeper.exists()
    text, err = a.tool("exec", command="echo x", sandbox="s1")
    assert not err and NOTICE not in text, text


def test_a_helper_then_a_daemon_crash_keep_the_servers(front_end, env):
    port = free_port()
    client = front_end()
    serve(client, "web", port)
    before = running(client, "web")
    kill_helper(env)
    daemon = daemon_pid(env)
    os.kill(daemon, signal.SIGKILL)
    until(lambda: daemon_pid(env) not in (None, daemon), "a new daemon")
    body = until(lambda: _get(f"http://127.0.0.1:{port}/keep"), "the forward back with the new daemon")
    assert body.strip() == "kept-web", body
    assert running(client, "web") == before


def test_egress_goes_on_through_the_new_helpers_network_stack(front_end, env, roots, test_host):
    allowed = test_host()
    (roots / ".sandbox-mcp.toml").write_text(f'[network]\nallow = ["{allowed}"]\n')
    client = front_end(SANDBOX_MCP_HOST_ROOTS=str(roots))
    fetch = (f"python3 -c 'import socket; s = socket.create_connection((\"{allowed}\", {TEST_HOST_PORT}), timeout=20); "
             "s.sendall(b\"GET / HTTP/1.0\\r\\n\\r\\n\"); print(s.makefile(\"rb\").read().split(b\"\\r\\n\\r\\n\")[-1].decode())'")
    first = ok(client, "exec", command=fetch)
    kill_helper(env)
    again = ok(client, "exec", command=fetch)
    assert NOTICE not in again and again.splitlines()[0] == first.splitlines()[0], (first, again)
    # The policy came along with the sandbox: a private address it does not
    # name is still refused, and the new helper's stack records it.
    code = ("import socket\ntry:\n    socket.create_connection(('10.215.0.9', 80), timeout=5)\n    print('connected')\n"
            "except OSError as e:\n    print(type(e).__name__)")
    assert "connected" not in ok(client, "python", code=code)
    assert "10.215.0.9" in ok(client, "network_info")


def test_nothing_inside_a_sandbox_holds_what_hands_it_over(front_end, env):
    client = front_end()
    serve(client, "box", free_port())
    keeper = keeper_of(env, "box")
    inode = next(line.split()[6] for line in Path("/proc/net/unix").read_text().splitlines()[1:]
                 if line.endswith(str(keeper)))
    # Only its launcher (a vm's keeper) holds the keeper socket, and only the
    # helper and launchers hold a tun: no process of a sandbox (a launcher's
    # descendant: PID 1's tree, or qemu) does.
    helper = helper_pid(env)
    tree = [helper, *_descendants(helper)]
    launchers = [p for p in tree if Path(f"/proc/{p}/cmdline").read_bytes().startswith((b"sandbox-vm-init",
                                                                                         b"sandbox-vm-keep"))]
    holders, tun = [], []
    for pid in tree:
        try:
            targets = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        holders += [pid] * targets.count(f"socket:[{inode}]")
        tun += [pid] * targets.count("/dev/net/tun")
    assert len(holders) == 1 and holders[0] in launchers, (holders, launchers)
    if not ON_VM:
        assert tun and set(tun) <= {helper, *launchers}, (tun, launchers)
    # Nor can the sandbox reach it by path.
    text = ok(client, "exec", command=f"ls {keeper} 2>&1 || echo unreachable", sandbox="box")
    assert "unreachable" in text, text


def knock(keeper: Path, message: bytes) -> tuple[bytes, list[int]]:
    """One message to the keeper and its answer with the fds it carried."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(10)
        s.connect(str(keeper))
        fds = array.array("i")
        try:
            s.send(message)
            data, anc, _, _ = s.recvmsg(256, socket.CMSG_SPACE(3 * fds.itemsize))
        except (BrokenPipeError, ConnectionResetError):
            # Turned away before it could speak or hear.
            return b"", []
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(raw[: len(raw) - len(raw) % fds.itemsize])
        return data, list(fds)


def test_the_keeper_turns_away_knocks_and_other_protocols(front_end, env):
    client = front_end()
    port = free_port()
    serve(client, "box", port)
    before = running(client, "box")
    keeper = keeper_of(env, "box")
    # Its helper lives: a knock is turned away, whatever it says.
    assert knock(keeper, b"adopt:1") == (b"", [])
    # Its helper dies while the daemon cannot start another (stopped): the
    # launcher waits for one. Another protocol and garbage are refused and
    # take nothing.
    daemon = daemon_pid(env)
    os.kill(daemon, signal.SIGSTOP)
    try:
        old = helper_pid(env)
        # Gone as the launcher sees it: its pidfd of the helper reads ready
        # (a moment after the last thread turns zombie).
        helper = os.pidfd_open(old)
        os.kill(old, signal.SIGKILL)
        assert select.select([helper], [], [], 30)[0], "the helper gone"
        os.close(helper)
        for message in (b"adopt:999", b"\x00" * 200, b"kept:1:1"):
            data, fds = knock(keeper, message)
            for fd in fds:
                os.close(fd)
            assert data.startswith(b"refused:") and not fds, (message, data, fds)
        # The right words get the VM: the helper's control end (a namespace
        # VM's), PID 1's (or qemu's) pidfd and the network link. Dropping
        # them orphans it again, unharmed.
        data, fds = knock(keeper, b"adopt:1")
        for fd in fds:
            os.close(fd)
        assert data.startswith(b"kept:1:") and len(fds) == (2 if ON_VM else 3), (data, fds)
    finally:
        os.kill(daemon, signal.SIGCONT)
    until(lambda: _restarted(env, old), "the helper started again")
    assert running(client, "box") == before
    assert _get(f"http://127.0.0.1:{port}/keep").strip() == "kept-box"
