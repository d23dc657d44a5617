"""One orchestrator per user (issue 11): every front-end in an environment,
stdio or HTTP, is served by the same `sandbox-mcp daemon`, so all of them see
one truth; the daemon is private to its user, started once, replaced by a
newer build, and its death ends a session cleanly."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import pytest

from conftest import pids_of, required_env
from mcp_client import McpClient, McpError
from test_persistence import _get, exited, free_port, until

Client = Callable[..., McpClient]
SEED = 11
# The idle-exit race: front-ends connecting at once, sessions each, and the
# longest pause between two sessions, long enough for the 1 s idle checks
# to find no connection now and then.
RACE_WORKERS = 3
RACE_ROUNDS = 12
RACE_MAX_PAUSE = 1.2


def runtime(env: dict[str, str]) -> Path:
    return Path(env["XDG_RUNTIME_DIR"]) / "sandbox-mcp"


def daemon_pid(env: dict[str, str]) -> int | None:
    try:
        return int((runtime(env) / "daemon.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def daemon_pids(env: dict[str, str]) -> list[int]:
    """Pids of `sandbox-mcp daemon` processes running in `env`."""
    return pids_of("sandbox-mcp", arg="daemon", environ=f"XDG_STATE_HOME={env['XDG_STATE_HOME']}")


@pytest.fixture
def trio(front_end: Client, http_server) -> Iterator[tuple[McpClient, McpClient, McpClient]]:
    """Two stdio front-ends and an HTTP session, all started before any sandbox exists."""
    a, b = front_end(), front_end()
    h = http_server().client()
    try:
        yield a, b, h
    finally:
        h.close()


def test_a_sandbox_created_through_one_front_end_is_usable_from_another(trio):
    a, b, h = trio
    text, err = a.tool("exec", command="echo made-by-a > /root/mark", sandbox="x")
    assert not err, text
    for other in (b, h):
        text, err = other.tool("exec", command="cat /root/mark", sandbox="x")
        assert not err and text.splitlines()[0] == "made-by-a", text


def test_a_sandbox_destroyed_through_one_front_end_is_not_reported_lost_by_another(front_end, http_server):
    a = front_end()
    text, err = a.tool("exec", command="true", sandbox="x")
    assert not err, text
    # Started after 'x' exists, so they know it from the start.
    b = front_end()
    h = http_server().client()
    try:
        text, err = a.tool("destroy", sandbox="x")
        assert not err, text
        for other in (b, h):
            text, _ = other.tool("status")
            assert "lost" not in text and not any(line.split()[:1] == ["x"] for line in text.splitlines()), text
            text, err = other.tool("exec", command="echo fresh", sandbox="x")
            assert not err and text.splitlines()[0] == "fresh", text
            other.tool("destroy", sandbox="x")
    finally:
        h.close()


def test_list_all_is_the_same_from_every_front_end(trio):
    a, b, h = trio
    a.tool("exec", command="true", sandbox="one")
    b.tool("exec", command="true", sandbox="two")
    h.tool("exec", command="true", sandbox="three")

    def names(c: McpClient) -> list[str]:
        text, err = c.tool("list_all")
        assert not err, text
        return [row.split()[0] for row in text.splitlines()[2:] if row.strip()]

    assert names(a) == names(b) == names(h) == ["one", "three", "two"]


def test_env_sets_from_every_front_end_are_kept(trio):
    # Interleaved, one at a time: concurrent sets on one sandbox are the
    # orchestrator's own ordering question, not the front-ends'.
    clients = trio
    clients[0].tool("exec", command="true")
    for i in range(8):
        for n, c in enumerate(clients):
            text, err = c.tool("env", action="set", key=f"K_{n}_{i}", value=f"v{n}{i}")
            assert not err, text
    want = {f"K_{n}_{i}=v{n}{i}" for i in range(8) for n in range(3)}
    for c in clients:
        text, err = c.tool("exec", command="env")
        assert not err and want <= set(text.splitlines()), text


def test_front_ends_started_together_start_one_daemon(front_end, env):
    with ThreadPoolExecutor(3) as pool:
        clients = list(pool.map(lambda _: front_end(), range(3)))
    assert all(not c.tool("exec", command="true")[1] for c in clients)
    assert daemon_pids(env) == [daemon_pid(env)]


def test_the_daemon_socket_is_private(front_end, env):
    front_end().tool("status")
    sock = runtime(env) / "daemon.sock"
    assert stat.S_ISSOCK(sock.stat().st_mode)
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(runtime(env).stat().st_mode) == 0o700
    assert (Path(env["XDG_STATE_HOME"]) / "sandbox-mcp" / "daemon.log").read_text().count("daemon listening") == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="connecting as another user needs root")
def test_another_user_is_refused_even_through_open_modes(front_end, env):
    front_end().tool("status")
    sock = runtime(env) / "daemon.sock"
    # Open every mode on the way, so that only the peer check stands between.
    for p in (Path(env["SANDBOX_MCP_TEST_TMP"]), Path(env["XDG_RUNTIME_DIR"]), runtime(env)):
        p.chmod(0o755)
    sock.chmod(0o777)
    hello = json.dumps({"build": {"version": "0", "written_ns": 0}, "source": {"vars": {}, "cwd": "/"},
                        "mode": "stdio"}) + "\n"
    probe = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.connect({str(sock)!r})\n"
        "s.settimeout(20)\n"
        "try:\n"
        f"    s.sendall({hello!r}.encode())\n"
        "    answer = s.recv(4096)\n"
        "except (BrokenPipeError, ConnectionResetError):\n"
        "    answer = b''\n"
        "print(repr(answer) if answer else 'closed')\n"
    )
    out = subprocess.run(["runuser", "-u", "nobody", "--", "python3", "-c", probe],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "closed", (out.stdout, out.stderr)
    log = (Path(env["XDG_STATE_HOME"]) / "sandbox-mcp" / "daemon.log").read_text()
    assert "refused a connection from another user" in log


def test_a_stale_socket_is_replaced(front_end, env):
    first = front_end()
    first.tool("exec", command="echo kept > /workspace/k")
    old = daemon_pid(env)
    os.kill(old, signal.SIGKILL)
    until(lambda: exited(old), "old daemon gone")
    assert (runtime(env) / "daemon.sock").exists()
    text, err = front_end().tool("exec", command="cat /workspace/k")
    assert not err and text.splitlines()[0] == "kept", text
    assert daemon_pid(env) not in (None, old)


def test_the_daemon_dying_mid_session_moves_the_session_to_a_new_daemon(front_end, env):
    """A daemon killed under a session: the call in flight is answered with
    an error saying so (never left hanging), and the same session goes on
    with a new daemon, which has the sandboxes as they were."""
    client = front_end()
    client.tool("exec", command="echo kept > /workspace/k")
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            client.tool("exec", command="sleep 50", _timeout=120)
            outcome.append(None)
        except McpError as e:
            outcome.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    until(lambda: "sleep 50" in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout,
          "the command runs")
    old = daemon_pid(env)
    os.kill(old, signal.SIGKILL)
    t.join(timeout=100)
    assert outcome and outcome[0] is not None, "the call in flight was answered by a dead daemon?"
    assert "daemon stopped while this request ran" in str(outcome[0]) and "retry" in str(outcome[0]), outcome[0]
    assert "moving the session to a new one" in Path(client.stderr_path).read_text()
    # The same session, on a new daemon that re-attached the sandbox.
    text, err = client.tool("exec", command="cat /workspace/k")
    assert not err and text.splitlines()[0] == "kept", text
    assert daemon_pid(env) not in (None, old)
    assert any(t.name == "exec" for t in client.list_tools())


def test_a_daemon_that_keeps_dying_ends_the_session_saying_so(front_end, env):
    client = front_end()
    assert not client.tool("exec", command="true")[1]
    # Three new daemons within a minute are taken; the fourth death ends it.
    for death in range(4):
        pid = daemon_pid(env)
        os.kill(pid, signal.SIGKILL)
        until(lambda: exited(pid), "the daemon gone")
        if death < 3:
            until(lambda: daemon_pid(env) not in (None, pid), f"new daemon {death + 1}", timeout=40)
    with pytest.raises(McpError):
        client.tool("exec", command="true", _timeout=20)
    log = Path(client.stderr_path).read_text()
    assert "each new one went away too" in log or "the sandbox-mcp daemon did not start" in log, log
    # A new front-end starts over.
    assert not front_end().tool("exec", command="true")[1]


def test_an_http_front_end_outlives_its_daemon(http_server, env):
    server = http_server()
    first = server.client()
    assert not first.tool("exec", command="echo kept > /workspace/k")[1]
    old = daemon_pid(env)
    os.kill(old, signal.SIGKILL)
    until(lambda: daemon_pid(env) not in (None, old), "a new daemon for the HTTP front-end")
    # The same address serves new sessions (an old session id is unknown to
    # the new daemon, and clients start a new session, as the spec says).
    again = until(lambda: _client_or_none(server), "the address serves again")
    text, err = again.tool("exec", command="cat /workspace/k")
    assert not err and text.splitlines()[0] == "kept", text


def _client_or_none(server):
    try:
        return server.client()
    except McpError:
        return None


def test_each_session_runs_under_its_own_start_directory_and_environment(front_end, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    for d, mode in ((one, "first"), (two, "second")):
        d.mkdir()
        (d / ".sandbox-mcp.toml").write_text(f'[env]\nAPP_MODE = "{mode}"\n')
    a = front_end(cwd=str(one))
    b = front_end(cwd=str(two))
    text, err = a.tool("exec", command='echo "$APP_MODE"', sandbox="pa")
    assert not err and text.splitlines()[0] == "first", text
    text, err = b.tool("exec", command='echo "$APP_MODE"', sandbox="pb")
    assert not err and text.splitlines()[0] == "second", text
    # Host roots too: each session may reach its own start directory only.
    (one / "f").write_text("from one")
    text, err = b.tool("upload", local_path=str(one / "f"), sandbox_path="/tmp/f", sandbox="pb")
    assert err and "outside the allowed host roots" in text, text
    text, err = a.tool("upload", local_path=str(one / "f"), sandbox_path="/tmp/f", sandbox="pa")
    assert not err, text


def test_an_invalid_session_config_is_refused_at_start_naming_the_variable(front_end, env):
    front_end().tool("status")
    with pytest.raises(McpError) as e:
        front_end(SANDBOX_MCP_NETWORK="wifi")
    assert "SANDBOX_MCP_NETWORK" in str(e.value)
    # The daemon and its other sessions are unaffected.
    assert not front_end().tool("exec", command="true")[1]


def test_a_forward_outlives_the_session_that_made_it(front_end, env):
    port = free_port()
    a = front_end()
    a.tool("bg", command="python3 -m http.server 8000 --bind 127.0.0.1", name="web")
    text, err = a.tool("expose", port=8000, host_port=port)
    assert not err, text
    until(lambda: _get(f"http://127.0.0.1:{port}/"), "forward answers")
    a.close()
    body = until(lambda: _get(f"http://127.0.0.1:{port}/"), "forward still answers after its session closed")
    assert "Directory listing" in body


def older_copy(env: dict[str, str]) -> Path:
    """A copy of $SANDBOX_MCP_BIN that counts as an older install of the same
    version: its binary was written a day earlier."""
    old_bin = Path(env["SANDBOX_MCP_TEST_TMP"]) / "old" / "sandbox-mcp"
    old_bin.parent.mkdir()
    shutil.copy(required_env("SANDBOX_MCP_BIN"), old_bin)
    written = Path(required_env("SANDBOX_MCP_BIN")).stat().st_mtime - 86400
    os.utime(old_bin, (written, written))
    return old_bin


def test_a_newer_build_replaces_the_daemon_and_keeps_the_sandboxes(front_end, env):
    old_bin = older_copy(env)
    old = front_end(binary=str(old_bin))
    text, err = old.tool("exec", command="echo kept > /workspace/k; echo mark > /root/m")
    assert not err, text
    old.tool("env", action="set", key="KEPT", value="yes")
    old_pid = daemon_pid(env)
    assert Path(f"/proc/{old_pid}/exe").resolve() == old_bin.resolve()
    new = front_end()
    text, err = new.tool("exec", command="cat /workspace/k /root/m; printenv KEPT")
    assert not err and text.splitlines()[:3] == ["kept", "mark", "yes"], text
    assert exited(old_pid)
    new_pid = daemon_pid(env)
    assert Path(f"/proc/{new_pid}/exe").resolve() == Path(required_env("SANDBOX_MCP_BIN")).resolve()
    log = (Path(env["XDG_STATE_HOME"]) / "sandbox-mcp" / "daemon.log").read_text()
    assert "draining for a newer build" in log


def test_a_second_daemon_refuses_to_start(front_end, env):
    front_end().tool("status")
    out = subprocess.run([required_env("SANDBOX_MCP_BIN"), "daemon"], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "another sandbox-mcp daemon is running" in out.stderr, out.stderr


def test_a_daemon_that_cannot_start_is_reported_by_the_front_end(front_end, env):
    with pytest.raises(McpError) as e:
        front_end(SANDBOX_VM_HELPER_BIN="/nonexistent/sandbox-vm-helper")
    log = Path(env["SANDBOX_MCP_TEST_TMP"]) / "front-end-0.log"
    text = log.read_text()
    assert "the sandbox-mcp daemon did not start: it exited" in text and "/nonexistent/sandbox-vm-helper" in text, text
    assert "daemon.log" in text, text
    assert daemon_pids(env) == []


def test_a_broken_handshake_is_dropped_and_the_daemon_serves_on(front_end, env):
    client = front_end()
    for junk in (b"not json\n", b"{\"build\": 1}\n", b"x" * (2 << 20)):
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(runtime(env) / "daemon.sock"))
        s.settimeout(30)
        try:
            s.sendall(junk)
            assert s.recv(100) == b""
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            s.close()
    log = (Path(env["XDG_STATE_HOME"]) / "sandbox-mcp" / "daemon.log").read_text()
    assert "bad handshake line" in log and "handshake line incomplete or over" in log, log
    assert not client.tool("exec", command="true")[1]


def test_http_on_an_address_in_use_is_refused_naming_it(front_end, env):
    front_end().tool("status")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        addr = "127.0.0.1:%d" % taken.getsockname()[1]
        out = subprocess.run([required_env("SANDBOX_MCP_BIN"), "serve", "--http", addr], env={**os.environ, **env},
                             capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and f"cannot listen on {addr}" in out.stderr, out.stderr


def test_an_idle_daemon_without_sandboxes_exits(front_end, env):
    client = front_end(SANDBOX_MCP_DAEMON_IDLE="1")
    assert client.tool("status")[0].startswith("No active sandboxes")
    pid = daemon_pid(env)
    client.close()
    until(lambda: exited(pid), "idle daemon exits")
    assert not (runtime(env) / "daemon.sock").exists() and daemon_pid(env) is None


def test_an_older_front_end_uses_a_newer_daemon_as_it_is(front_end, env):
    new = front_end()
    new.tool("exec", command="true")
    pid = daemon_pid(env)
    old = front_end(binary=str(older_copy(env)))
    text, err = old.tool("exec", command="echo from-old")
    assert not err and text.splitlines()[0] == "from-old", text
    assert daemon_pid(env) == pid and not new.tool("exec", command="true")[1]


def test_front_ends_racing_the_idle_exit_are_all_served(front_end, env):
    # SANDBOX_MCP_DAEMON_IDLE=0: the daemon exits at every check that finds no
    # connection, so connects keep landing while it decides to go and goes.
    rng = random.Random(SEED)
    pauses = [[rng.uniform(0, RACE_MAX_PAUSE) for _ in range(RACE_ROUNDS)] for _ in range(RACE_WORKERS)]
    failures: list[str] = []

    def worker(w: int) -> None:
        for i, pause in enumerate(pauses[w]):
            time.sleep(pause)
            try:
                with front_end(SANDBOX_MCP_DAEMON_IDLE="0") as client:
                    text, err = client.tool("status")
                if err:
                    failures.append(text)
            except McpError as e:
                failures.append(f"worker {w} round {i}: {e}")

    with ThreadPoolExecutor(RACE_WORKERS) as pool:
        list(pool.map(worker, range(RACE_WORKERS)))
    assert not failures, "\n\n".join(failures[:2])
    # The race was run: daemons exited and new ones started in between.
    log = (Path(env["XDG_STATE_HOME"]) / "sandbox-mcp" / "daemon.log").read_text()
    assert log.count("daemon listening") > 1, log[-2000:]


def test_front_ends_racing_a_drain_are_all_served(front_end, env):
    old = front_end(binary=str(older_copy(env)))
    assert not old.tool("exec", command="echo kept > /workspace/k")[1]
    # Each finds the older daemon; one drains it, the others reach it while it drains.
    with ThreadPoolExecutor(RACE_WORKERS) as pool:
        clients = list(pool.map(lambda _: front_end(), range(RACE_WORKERS)))
    for c in clients:
        text, err = c.tool("exec", command="cat /workspace/k")
        assert not err and text.splitlines()[0] == "kept", text
    assert daemon_pids(env) == [daemon_pid(env)]
