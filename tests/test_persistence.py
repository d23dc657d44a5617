"""The state database and restarts: kill -9 of the server mid-operation, then
a new server on the same state finds everything again; a helper crash is
noticed, the helper restarted, and its sandboxes reported as lost (never
silently re-created)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import pids_of, sandbox_key, stop_daemon, volume_dir
from mcp_client import McpError
from test_grpc import SERVICE, grpcurl_path
from waiting import wait_for


def until(fn, what: str, timeout: float = 20.0):
    """`wait_for` that fails the test, naming what never happened."""
    value = wait_for(fn, timeout=timeout)
    assert value, f"timed out waiting for: {what}"
    return value


def server_pids(env: dict[str, str]) -> list[int]:
    """Pids of `sandbox-mcp` server processes running in `env`."""
    return pids_of("/sandbox-mcp", environ=f"XDG_STATE_HOME={env['XDG_STATE_HOME']}")


def exited(pid: int) -> bool:
    """Gone, or every thread a zombie: only then are its sockets closed (an
    exiting process loses its cmdline before its file descriptors, and a
    zombie leader's threads may still hold them)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        return all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X") for t in tasks)
    except OSError:
        return True


def kill9_server(env: dict[str, str]) -> None:
    pids = server_pids(env)
    assert pids, "no server process found"
    for pid in pids:
        # A front-end may end on its own meanwhile (its daemon killed first).
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    until(lambda: all(exited(p) for p in pids), "server gone")


def db_path(env: dict[str, str]) -> Path:
    return Path(env["XDG_STATE_HOME"]) / "sandbox-mcp" / "state.db"


def rows(env: dict[str, str], sql: str, *args) -> list[tuple]:
    """What the state database holds, read as a separate process would."""
    db = sqlite3.connect(db_path(env), timeout=10)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def sandbox_names(env: dict[str, str]) -> set[str]:
    """Plain names of the sandboxes in the database (rows are keyed `<project tag>-<name>`)."""
    return {re.sub(r"^[0-9a-f]{6}-", "", name) for (name,) in rows(env, "SELECT name FROM sandboxes")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def helper_pid(env: dict[str, str]) -> int:
    return int((Path(env["XDG_RUNTIME_DIR"]) / "sandbox-mcp" / "helper.pid").read_text().strip())


def kill_helper_with_sandboxes(env: dict[str, str]) -> int:
    """A helper crash that takes its sandboxes along (each sandbox's launcher
    would keep it for the next helper): the helper, every process under it
    and those of the sandboxes it adopted, killed at once. Returns its pid."""
    from test_crash_safety import _descendants  # noqa: PLC0415 (it imports this module)
    from test_keep import adopted  # noqa: PLC0415 (it imports this module)

    old = helper_pid(env)
    for pid in [old, *_descendants(old), *adopted(env, old)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return old


def test_kill9_mid_operation_then_restart_restores_everything(server_factory, env, roots):
    first = server_factory(SANDBOX_MCP_HOST_ROOTS=str(roots))
    text, err = first.tool("exec", command="echo one > /workspace/f; echo hello-history")
    assert not err, text
    first.tool("env", action="set", key="GREETING", value="hi")
    text, err = first.tool("extend_ttl", minutes=30)
    assert not err, text
    port = free_port()
    first.tool("bg", command="python3 -m http.server 8000 --bind 127.0.0.1", name="web")
    text, err = first.tool("expose", port=8000, host_port=port)
    assert not err, text
    (roots / "src").mkdir()
    (roots / "src" / "a.txt").write_text("a")
    text, err = first.tool("sync_start", local_dir=str(roots / "src"), sandbox_dir="/workspace/src")
    assert not err, text
    job = text.split("[", 1)[1].split("]", 1)[0]
    # Committed before each tool answered: no waiting.
    assert rows(env, "SELECT id FROM sync_jobs") == [(job,)]
    assert rows(env, "SELECT host_port, port FROM forwards") == [(port, 8000)]
    ((parent, generation, lease),) = rows(env, "SELECT parent, generation, expires_at FROM sandboxes")
    assert parent is None and generation == 0
    key = sandbox_key("default", roots)
    assert any("hello-history" in c for (c,) in rows(env, "SELECT command FROM history WHERE sandbox = ?", key))
    ((name, value),) = rows(env, "SELECT key, value FROM env WHERE sandbox = ?", key)
    assert name == "GREETING" and value.startswith("sealed:v1:"), value
    assert lease and lease > time.time() + 25 * 60

    # kill -9 while a command runs: nothing is saved at exit, nothing may be lost.
    running = threading.Thread(target=lambda: _swallow(lambda: first.tool("exec", command="sleep 20")), daemon=True)
    running.start()
    time.sleep(1.0)
    kill9_server(env)

    second = server_factory(SANDBOX_MCP_HOST_ROOTS=str(roots))
    text, err = second.tool("exec", command="cat /workspace/f; printenv GREETING")
    assert not err and text.splitlines()[:2] == ["one", "hi"], text
    text, _ = second.tool("history", limit=50)
    assert "hello-history" in text, text
    text, _ = second.tool("status")
    assert f"localhost:{port}" in text and job in text, text
    # The lease kept its end instead of starting over.
    assert abs(rows(env, "SELECT expires_at FROM sandboxes WHERE name = ?", key)[0][0] - lease) < 1.0
    body = until(lambda: _get(f"http://127.0.0.1:{port}/"), "forward restored")
    assert "Directory listing" in body
    # The sync job came back under its id and still mirrors.
    (roots / "src" / "b.txt").write_text("b")
    until(
        lambda: second.tool("exec", command="cat /workspace/src/b.txt")[0].splitlines()[0] == "b",
        what="resumed sync job pushes a new file",
    )
    text, err = second.tool("sync_stop", job_id=job)
    assert not err, text


def _swallow(f):
    try:
        f()
    except Exception:
        pass


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


def _damage_garbage(db: Path) -> None:
    db.write_bytes(b"this is not a database, it is a shopping list\n" * 40)


def _damage_truncate(db: Path) -> None:
    # What a partial copy or a full disk leaves: the file's first half.
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damage", [_damage_garbage, _damage_truncate], ids=["garbage", "truncated"])
def test_damaged_database_is_set_aside_reported_and_sandboxes_still_attach(server_factory, env, damage):
    first = server_factory()
    for i in range(30):
        first.tool("exec", command=f"echo x > /workspace/x; echo padding-the-history-{i}-{'y' * 150}")
    first.tool("env", action="set", key="K", value="v")
    first.close()
    # The daemon holds the database open while it runs: damage it stopped.
    stop_daemon(env)
    db = db_path(env)
    for side in ("state.db-wal", "state.db-shm"):
        (db.parent / side).unlink(missing_ok=True)
    damage(db)
    damaged = db.read_bytes()
    second = server_factory()
    text, err = second.tool("exec", command="cat /workspace/x")
    assert not err and text.splitlines()[0] == "x", text
    aside = [p for p in db.parent.iterdir() if p.name.startswith("state.db.damaged-") and "-wal" not in p.name]
    assert len(aside) == 1 and aside[0].read_bytes() == damaged, aside
    for tool in ("status", "health"):
        text, err = second.tool(tool)
        assert not err and "unreadable" in text and str(aside[0]) in text, (tool, text)
    # The new database works: this command is saved.
    assert any("cat /workspace/x" in c for (c,) in rows(env, "SELECT command FROM history"))
    second.close()
    stop_daemon(env)
    # A second damaged file never overwrites the first copy.
    (db.parent / "state.db-wal").unlink(missing_ok=True)
    (db.parent / "state.db-shm").unlink(missing_ok=True)
    db.write_bytes(b"damaged again" * 100)
    third = server_factory()
    third.tool("status")
    copies = sorted(p.name for p in db.parent.iterdir() if p.name.startswith("state.db.damaged-") and "-wal" not in p.name and "-shm" not in p.name)
    assert len(copies) == 2 and aside[0].read_bytes() == damaged, copies


def test_helper_crash_is_noticed_restarted_and_a_lost_sandbox_comes_back_on_its_next_call(server_factory, env):
    srv = server_factory()
    text, err = srv.tool("exec", command="echo keep > /workspace/k")
    assert not err, text
    old = kill_helper_with_sandboxes(env)
    until(lambda: _restarted(env, old), "helper restarted by the server")
    text = until(lambda: _lost(srv), "sandbox reported lost")
    assert "default: the VM helper stopped and was restarted at" in text, text
    # Other names work on the new helper.
    text, err = srv.tool("exec", command="echo fresh", sandbox="other")
    assert not err and text.splitlines()[0] == "fresh", text
    # The loss survives a server restart; the next call brings it back and
    # says so once.
    srv.close()
    stop_daemon(env)
    again = server_factory()
    assert _lost(again)
    text, err = again.tool("exec", command="cat /workspace/k")
    assert not err and text.splitlines()[1:2] == ["keep"], text
    assert text.startswith("Note: sandbox 'default' was lost and was started again") and "VM helper stopped" in text, text
    text, err = again.tool("exec", command="cat /workspace/k")
    assert not err and text.splitlines()[0] == "keep", text
    assert not _lost(again)


def test_destroy_forgets_a_lost_sandbox(server_factory, env):
    srv = server_factory()
    srv.tool("exec", command="true", sandbox="gone")
    old = kill_helper_with_sandboxes(env)
    until(lambda: _restarted(env, old), "helper restarted")
    until(lambda: _lost(srv, "gone"), "lost")
    text, err = srv.tool("destroy", sandbox="gone")
    assert not err and "Forgot sandbox 'gone'" in text, text
    text, err = srv.tool("destroy", sandbox="gone")
    assert err and "no active sandbox 'gone'" in text, text
    gone = sandbox_key("gone")
    until(lambda: not rows(env, "SELECT name FROM lost WHERE name = ?", gone), "the loss forgotten in the database")


def _restarted(env: dict[str, str], old: int) -> bool:
    try:
        return helper_pid(env) != old
    except (OSError, ValueError):
        return False


LOST_HEADER = "Lost (the next call on one starts it again; destroy forgets it):"


def _lost(srv, name: str = "default"):
    """`status`'s text when it lists `name` as lost (status never brings a
    lost sandbox back; every call on it does)."""
    try:
        text, err = srv.tool("status")
    except McpError:
        return None
    block = text.split(LOST_HEADER, 1)
    listed = len(block) == 2 and any(line.startswith(f"  {name}: ") for line in block[1].splitlines())
    return text if not err and listed else None


def test_database_never_lists_destroyed_sandboxes(server_factory, env):
    srv = server_factory()
    srv.tool("exec", command="true", sandbox="a")
    assert "a" in sandbox_names(env)
    srv.tool("destroy", sandbox="a")
    assert "a" not in sandbox_names(env)
    assert not rows(env, "SELECT command FROM history WHERE sandbox = ?", sandbox_key("a"))


def test_a_sandbox_whose_creation_was_cut_short_is_not_handed_out(server_factory, env):
    first = server_factory()
    text, err = first.tool("exec", command="echo half-done > /root/mark; echo ws > /workspace/w", sandbox="half")
    assert not err, text
    first.tool("exec", command="true", sandbox="whole")
    first.close()
    stop_daemon(env)
    # What a server killed in the middle of creating 'half' leaves behind:
    # the VM, the marker naming that (now dead) server, and no record of
    # 'half' in the database (it was never finished, so never saved).
    half = volume_dir(env, "half")
    (half / ".creating").write_text("4194305:1")
    db = sqlite3.connect(db_path(env), timeout=10)
    with db:
        db.execute("DELETE FROM sandboxes WHERE name = ?", (sandbox_key("half"),))
    db.close()
    second = server_factory()
    text, err = second.tool("exec", command="cat /root/mark 2>&1; cat /workspace/w", sandbox="half")
    assert not err and "half-done" not in text and "ws" in text.splitlines(), text
    assert not (half / ".creating").exists()
    text, err = second.tool("exec", command="true", sandbox="whole")
    assert not err, text


def test_a_creation_recorded_just_before_its_server_died_is_kept(server_factory, env):
    # The fault suite's find (kill -9 of the daemon during a sandbox-ctl spawn): the server had saved the
    # new sandbox, its commit point, and died before it removed its marker. The next server took the VM for
    # cut short and removed it, while the database said it existed: a sandbox reported lost right after it
    # was made. A recorded creation is finished: kept, with its marker gone.
    first = server_factory()
    text, err = first.tool("exec", command="echo kept > /root/mark; echo ws > /workspace/w", sandbox="done")
    assert not err, text
    first.close()
    stop_daemon(env)
    done = volume_dir(env, "done")
    (done / ".creating").write_text("4194305:1")
    assert "done" in sandbox_names(env)
    second = server_factory()
    text, err = second.tool("exec", command="cat /root/mark; cat /workspace/w", sandbox="done")
    assert not err and text.splitlines()[:2] == ["kept", "ws"], text
    assert not (done / ".creating").exists()
    text, err = second.tool("status")
    assert not err and "lost" not in text, text


def test_a_creation_the_helper_finishes_after_its_server_died_is_removed(server_factory, env):
    # The fault suite's find (kill -9 of the daemon during create, as the test user): the helper finishes a
    # creation whose caller died, after the next daemon's start looked at its VMs. Nothing held that VM and
    # its writable layer stayed for good. Here the helper makes such a VM while the server runs: the marker
    # names a dead server, no sandbox holds the name.
    srv = server_factory()
    text, err = srv.tool("exec", command="true")
    assert not err, text
    key = sandbox_key("late")
    volume = volume_dir(env, "late")
    volume.mkdir(parents=True, exist_ok=True)
    (volume / ".creating").write_text("4194305:1")
    sock = str(Path(env["XDG_RUNTIME_DIR"]) / "sandbox-mcp" / "helper.sock")

    def grpc(method: str, data: dict) -> str:
        r = subprocess.run([grpcurl_path(), "-plaintext", "-unix", "-authority", "localhost", "-d", json.dumps(data),
                            sock, f"{SERVICE}/{method}"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{method}: {r.stderr}"
        return r.stdout

    grpc("CreateVm", {"spec": {"id": key, "image": os.environ["SANDBOX_MCP_TEST_IMAGE"],
                               "labels": {"sandbox-mcp.name": key}}})
    grpc("StartVm", {"id": key})
    gone = wait_for(lambda: key not in grpc("ListVms", {}) and not (volume / ".creating").exists(), timeout=30)
    assert gone, grpc("ListVms", {})
    # The server's own sandbox is untouched, and the name can be created anew.
    text, err = srv.tool("exec", command="true")
    assert not err, text
    text, err = srv.tool("exec", command="echo again", sandbox="late")
    assert not err and "again" in text, text
