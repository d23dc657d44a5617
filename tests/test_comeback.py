"""Issue 25: what survives what. A lost sandbox comes back on its next use
(after a reboot, or when its helper died and took it along): the call
answers with a one-line notice and its own output, never an error asking
for `reset`; /workspace, env, history, lease, port forwards and background
processes marked `restart` come back with it, and a sandbox that serves
something (a forward, a restartable process) comes back without waiting for
a call. A daemon crash and an upgrade in place lose nothing at all, nor
does a helper crash on the namespace driver (tests/test_keep.py).

Runs on the namespace driver and, in the vm matrix, on vms; as root and as
the test user (`make test-user`)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import ON_VM, WAIT_SCALE, required_env, sandbox_key, write_config
from mcp_client import McpClient
from test_children import _vm_init_above
from test_crash_safety import _descendants
from test_daemon import daemon_pid
from test_persistence import _get, _restarted, exited, free_port, helper_pid, rows, until

NOTICE = "was lost and was started again"
WEB = "python3 -m http.server 8000 --bind 127.0.0.1"
# Booting again under TCG takes tens of seconds.
CALL = 60.0 * WAIT_SCALE


def ok(client: McpClient, tool: str, **args) -> str:
    text, err = client.tool(tool, _timeout=CALL, **args)
    assert not err, f"{tool} {args}: {text}"
    return text


def status_lost(client: McpClient) -> set[str]:
    text = ok(client, "status")
    block = text.split("Lost (the next call on one starts it again; destroy forgets it):", 1)
    return {line.split(":", 1)[0].strip() for line in block[1].splitlines() if line.startswith("  ")} if len(block) == 2 else set()


def serve(client: McpClient, name: str, host_port: int) -> None:
    """A sandbox with something in every place a loss touches: /workspace,
    its root filesystem, env, history, a web server marked to restart and
    exposed on the host, and a process not marked."""
    ok(client, "exec", command=f"echo kept-{name} > /workspace/keep; touch /etc/gone-marker", sandbox=name)
    ok(client, "env", action="set", key="WHO", value=f"env-{name}", sandbox=name)
    ok(client, "bg", command=WEB, name="web", restart=True, workdir="/workspace", sandbox=name)
    ok(client, "bg", command="sleep 100000", name="nap", sandbox=name)
    text = ok(client, "expose", port=8000, host_port=host_port, sandbox=name)
    assert "localhost" in text or str(host_port) in text, text
    until(lambda: _get(f"http://127.0.0.1:{host_port}/keep"), f"{name}'s server answers on the host", timeout=30 * WAIT_SCALE)


def check_back(client: McpClient, name: str) -> None:
    """The first call on a sandbox that came back: a notice, then its output."""
    text, err = client.tool("exec", _timeout=CALL, sandbox=name,
                            command="cat /workspace/keep; printenv WHO; test -e /etc/gone-marker || echo rootfs-fresh")
    assert not err, text
    lines = text.splitlines()
    assert lines[0].startswith(f"Note: sandbox '{name}' {NOTICE}"), text
    assert "Back: background process 'web'" in lines[0] and "Kept: /workspace, env (1 key)" in lines[0], text
    assert lines[1:4] == [f"kept-{name}", f"env-{name}", "rootfs-fresh"], text
    # Once: the next call is plain.
    text = ok(client, "exec", command="echo plain", sandbox=name)
    assert text.splitlines()[0] == "plain", text
    # The process not marked is gone, and says so; the marked one runs.
    text, err = client.tool("logs", name="nap", sandbox=name)
    assert err and "no background process 'nap'" in text, text
    assert "(alive)" in ok(client, "logs", name="web", sandbox=name)
    assert any("gone-marker" in line for line in ok(client, "history", sandbox=name).splitlines())


def kill_everything(env: dict[str, str]) -> None:
    """What a reboot does to sandbox-mcp: the daemon, the helper and every
    sandbox process end at once (the daemon stopped first, so that its
    watchdog starts no helper in between)."""
    daemon = daemon_pid(env)
    helper = helper_pid(env)
    tree = _descendants(helper)
    if daemon:
        os.kill(daemon, signal.SIGSTOP)
    for pid in [helper, *tree]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if daemon:
        os.kill(daemon, signal.SIGKILL)
        until(lambda: exited(daemon), "the daemon gone")
    until(lambda: exited(helper), "the helper gone")
    until(lambda: all(exited(p) for p in tree), "every sandbox process gone")


def test_after_a_simulated_reboot_every_sandbox_comes_back_on_its_next_call(front_end, http_server, env):
    ports = {name: free_port() for name in ("s1", "s2", "s3")}
    first = front_end()
    for name, port in ports.items():
        serve(first, name, port)
    ok(first, "exec", command="echo quiet > /workspace/keep", sandbox="idle")
    first.close()
    kill_everything(env)

    # After the restart: two stdio clients and an HTTP client, as a user has them.
    a, b = front_end(), front_end()
    h = http_server().client()
    # Sandboxes that serve something come back without waiting for a call.
    for name, port in ports.items():
        body = until(lambda: _get(f"http://127.0.0.1:{port}/keep"), f"{name}'s server back on the host",
                     timeout=60 * WAIT_SCALE)
        assert body.strip() == f"kept-{name}", body
    # One that serves nothing waits for its next call, and status says so.
    assert "idle" in status_lost(a), ok(a, "status")
    for client, name in ((a, "s1"), (b, "s2"), (h, "s3")):
        check_back(client, name)
    # Two clients racing on the idle one: both answered, one notice.
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda c: c.tool("exec", _timeout=CALL, command="cat /workspace/keep", sandbox="idle"),
                                (a, b)))
    assert all(not err and text.splitlines()[-2:-1] == ["quiet"] or "quiet" in text for text, err in answers), answers
    notices = [text for text, _ in answers if NOTICE in text]
    assert len(notices) == 1, answers
    assert not status_lost(h)


def test_kill9_of_the_helper_then_of_the_daemon_keeps_the_servers_answering(front_end, env):
    ports = {name: free_port() for name in ("s1", "s2", "s3")}
    client = front_end()
    for name, port in ports.items():
        serve(client, name, port)
    old = helper_pid(env)
    os.kill(old, signal.SIGKILL)
    until(lambda: _restarted(env, old), "the helper started again")
    # The servers answer again at once: they never stopped (the new helper
    # adopted them, on both drivers, see test_keep.py).
    for name, port in ports.items():
        until(lambda: _get(f"http://127.0.0.1:{port}/keep"), f"{name}'s server back after the helper crash",
              timeout=60 * WAIT_SCALE)
    text = ok(client, "exec", command="test -e /etc/gone-marker && echo rootfs-kept", sandbox="s1")
    assert NOTICE not in text and text.splitlines()[0] == "rootfs-kept", text
    daemon = daemon_pid(env)
    assert daemon
    before = _descendants(helper_pid(env))
    os.kill(daemon, signal.SIGKILL)
    until(lambda: exited(daemon), "the daemon gone")
    # A daemon crash takes no sandbox along: the servers never stop (the
    # same processes go on). The open front-end starts a new daemon at once,
    # which listens on their forwards again; its session goes on.
    for name, port in ports.items():
        body = until(lambda: _get(f"http://127.0.0.1:{port}/keep"), f"{name}'s forward back with the new daemon")
        assert body.strip() == f"kept-{name}", body
        text = ok(client, "exec", command="cat /workspace/keep", sandbox=name)
        assert NOTICE not in text and text.splitlines()[0] == f"kept-{name}", text
    assert all(not exited(p) for p in before), "a sandbox process ended with the daemon"


def test_an_upgrade_in_place_keeps_a_long_job_and_an_open_forward(front_end, env):
    """`make install` of a new build while a client runs: binaries go in by
    rename, the next front-end drains the old daemon, and nothing the old
    one served stops: the job runs on, the forward keeps its port."""
    prefix = Path(env["SANDBOX_MCP_TEST_TMP"]) / "prefix" / "bin"
    prefix.mkdir(parents=True)
    installed = prefix / "sandbox-mcp"

    def install(written: float) -> None:
        staged = prefix / ".sandbox-mcp.new"
        shutil.copy(required_env("SANDBOX_MCP_BIN"), staged)
        os.utime(staged, (written, written))
        staged.rename(installed)

    install(time.time() - 3600)
    port = free_port()
    old = front_end(binary=str(installed))
    ok(old, "bg", command="i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.2; done", name="long")
    ok(old, "bg", command=WEB, name="web", workdir="/workspace")
    ok(old, "exec", command="echo upgraded-through > /workspace/keep")
    ok(old, "expose", port=8000, host_port=port)
    until(lambda: _get(f"http://127.0.0.1:{port}/keep"), "the forward answers")
    held = socket.create_connection(("127.0.0.1", port), timeout=10)
    old_daemon = daemon_pid(env)
    install(time.time())
    new = front_end(binary=str(installed))
    ticks = ok(new, "logs", name="long", tail=1)
    assert "(alive)" in ticks and "tick" in ticks, ticks
    until(lambda: exited(old_daemon), "the old daemon drained")
    assert _get(f"http://127.0.0.1:{port}/keep").strip() == "upgraded-through"
    # A connection open through the forward at the upgrade belonged to the
    # old daemon: it is closed (the client sees EOF, never a hang), and the
    # client's next connection reaches the same server.
    held.settimeout(30)
    try:
        held.sendall(b"GET /keep HTTP/1.0\r\nHost: x\r\n\r\n")
        reply = held.recv(4096)
    except OSError:
        reply = b""
    held.close()
    assert reply == b"" or b"upgraded-through" in reply, reply
    text = ok(new, "exec", command="echo after")
    assert NOTICE not in text and text.splitlines()[0] == "after", text
    old.close()


def test_a_restart_mark_follows_kill_and_bg(front_end, env):
    client = front_end()
    ok(client, "bg", command="sleep 1000", name="a", restart=True)
    ok(client, "bg", command="sleep 1000", name="b", restart=True)
    key = sandbox_key("default")
    assert rows(env, "SELECT name FROM bg_restart WHERE sandbox = ? ORDER BY name", key) == [("a",), ("b",)]
    # The command is sealed at rest, as env values are.
    assert all("sleep" not in c for (c,) in rows(env, "SELECT command FROM bg_restart"))
    ok(client, "kill", name="a")
    ok(client, "kill", name="b")
    ok(client, "bg", command="sleep 1000", name="b")
    assert rows(env, "SELECT name FROM bg_restart WHERE sandbox = ?", key) == []
    ok(client, "bg", command="sleep 1000", name="c", restart=True)
    ok(client, "destroy", sandbox="default")
    assert rows(env, "SELECT name FROM bg_restart") == []


def test_destroy_of_a_lost_sandbox_forgets_what_it_kept(front_end, env):
    port = free_port()
    client = front_end()
    serve(client, "gone", port)
    ok(client, "exec", command="true", sandbox="idle")
    client.close()
    kill_everything(env)
    again = front_end()
    assert "idle" in status_lost(again)
    text = ok(again, "destroy", sandbox="idle")
    assert "Forgot sandbox 'idle'" in text, text
    text, err = again.tool("exec", command="cat /workspace/keep 2>&1; echo fresh", sandbox="idle")
    assert not err and NOTICE not in text and "fresh" in text, text
    # Reset of one that came back on its own, then a restart: its forward
    # and its restartable process are not brought back a second time.
    until(lambda: _get(f"http://127.0.0.1:{port}/keep"), "gone's server back")
    ok(again, "reset", sandbox="gone")
    assert rows(env, "SELECT name FROM bg_restart WHERE sandbox = ?", sandbox_key("gone")) == []


def test_a_sandbox_that_cannot_come_back_says_why_and_stays_lost(front_end, env):
    client = front_end()
    ok(client, "exec", command="echo still-here > /workspace/keep", sandbox="big")
    client.close()
    kill_everything(env)
    # After the restart the host allows one sandbox, and another takes it:
    # the comeback is refused with the reason and the way out, the server
    # stays up, and the sandbox stays lost until there is room.
    write_config(env, "max_sandboxes = 1\n")
    again = front_end()
    ok(again, "exec", command="true", sandbox="other")
    text, err = again.tool("exec", command="true", sandbox="big")
    assert err and "was lost" in text and "could not be started again" in text and "destroy('big')" in text, text
    assert "big" in status_lost(again)
    ok(again, "destroy", sandbox="other")
    text = ok(again, "exec", command="cat /workspace/keep", sandbox="big")
    assert text.startswith(f"Note: sandbox 'big' {NOTICE}") and "still-here" in text, text


def crash_own_vm(client: McpClient, name: str, port: int, marker: str) -> None:
    """A serving sandbox whose VM goes down on its own (its init killed from
    the host, as a crash would), until status lists it lost."""
    serve(client, name, port)
    ok(client, "bg", command=f"sleep {marker}", name="marker", sandbox=name)
    init = until(lambda: _vm_init_above(marker), "the sandbox's init")
    os.kill(init, signal.SIGKILL)
    until(lambda: name in status_lost(client), "the sandbox reported lost")


def test_a_sandbox_whose_vm_stops_on_its_own_waits_for_a_call(front_end, env):
    """A sandbox that brings its own VM down (here its init killed from the
    host, as a crash would) must not be started again in a loop: even with a
    forward and a restartable job it waits for a call, which says why."""
    if ON_VM:
        pytest.skip("the namespace driver's init is found by its host pid; test_vm_isolation kills a qemu")
    port = free_port()
    client = front_end()
    crash_own_vm(client, "crashy", port, "4245")
    time.sleep(3)
    assert "crashy" in status_lost(client), "started again without a call"
    assert _get(f"http://127.0.0.1:{port}/keep") is None
    text = ok(client, "exec", command="cat /workspace/keep", sandbox="crashy")
    assert text.startswith(f"Note: sandbox 'crashy' {NOTICE}") and "stopped on its own" in text, text
    until(lambda: _get(f"http://127.0.0.1:{port}/keep"), "the forward back after the call")


def test_a_destroy_racing_a_comeback_leaves_nothing_behind(front_end, env):
    client = front_end()
    other = front_end()
    for round_ in range(4):
        name = f"race{round_}"
        ok(client, "exec", command="true", sandbox=name)
        ok(client, "env", action="set", key="K", value="v", sandbox=name)
        # Half serve something (they come back without a call, racing the
        # destroy from the start), half wait for the exec.
        ok(client, "bg", command="sleep 1000", name="job", restart=round_ % 2 == 0, sandbox=name)
    client.close()
    other.close()
    kill_everything(env)
    a, b = front_end(), front_end()
    for round_ in range(4):
        name = f"race{round_}"
        with ThreadPoolExecutor(2) as pool:
            came = pool.submit(a.tool, "exec", command="echo here", sandbox=name)
            gone = pool.submit(b.tool, "destroy", sandbox=name)
            (text, err), (dtext, derr) = came.result(), gone.result()
        # Either order is fine. The exec fails only when the destroy ended
        # the sandbox under it (as it would a live one's), and a destroy that
        # came second is an ordinary destroy.
        assert (not err and "here" in text) or (err and not derr), (text, dtext)
        assert not derr or "no active sandbox" in dtext, dtext
        if not derr and NOTICE not in text:
            # The destroy came first (it forgot the lost sandbox, or
            # destroyed the one that came back on its own): the exec made a
            # fresh one.
            assert "Forgot sandbox" in dtext or "Destroyed sandbox" in dtext, (text, dtext)
        ok(a, "destroy", sandbox=name) if name in ok(a, "status") else None
        key = sandbox_key(name)
        for table, column in (("bg_restart", "sandbox"), ("env", "sandbox"), ("lost", "name"), ("sandboxes", "name")):
            assert rows(env, f"SELECT 1 FROM {table} WHERE {column} = ?", key) == [], (table, name)
    assert not status_lost(a)


def test_the_saved_env_wins_over_a_tampered_copy_in_a_snapshot(front_end, env, image_store):
    """Root inside a sandbox can rewrite the env copy in its root filesystem;
    a snapshot carries it. A comeback from that snapshot uses the env the
    state database saved, never the sandbox's own file."""
    client = front_end(SANDBOX_MCP_IMAGE_STORE=image_store)
    ok(client, "env", action="set", key="WHO", value="saved")
    ok(client, "exec", command="echo '{\"WHO\": \"planted\", \"LD_PRELOAD\": \"/tmp/x.so\"}' > /etc/sandbox-mcp/env.json")
    ok(client, "snapshot", snapshot_name="tampered")
    ok(client, "restore", snapshot_name="tampered")
    ok(client, "env", action="set", key="WHO", value="saved")
    ok(client, "env", action="unset", key="LD_PRELOAD")
    client.close()
    kill_everything(env)
    again = front_end(SANDBOX_MCP_IMAGE_STORE=image_store)
    text = ok(again, "exec", command="printenv WHO; printenv LD_PRELOAD || echo none")
    assert text.startswith(f"Note: sandbox 'default' {NOTICE} from image") and "tampered" in text.splitlines()[0], text
    assert text.splitlines()[1:3] == ["saved", "none"], text
