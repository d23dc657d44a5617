"""Crash safety of the helper and the image store (issue 11): a helper
killed with `kill -9` in the middle of a snapshot takes its sandboxes with
it (even frozen ones) and leaves no half-copied layer once a new helper
starts; destroying a lost sandbox frees its writable layer; helpers sharing
one image store never collect a layer another one's sandbox runs on; and
payloads over gRPC's 4 MiB message size go through."""
from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Iterator

from conftest import isolated_env, new_env_dir, remove_env_dir, required_env, sandbox_key, stop_servers
from mcp_client import McpClient, McpError
from test_daemon import daemon_pid
from test_persistence import _lost, _restarted, helper_pid, kill_helper_with_sandboxes, until
from waiting import wait_for

# Seeds of the moments, after the snapshot froze the sandbox, at which the
# helper is killed.
SNAPSHOT_KILL_SEEDS = (1, 2, 3)
# Linux refuses one argument of 128 KiB or more; a shell command is one.
MAX_COMMAND_BYTES = 128 * 1024 - 1


@contextlib.contextmanager
def _called_meanwhile(client: McpClient, tool: str, **args: object) -> Iterator[list[tuple[str, bool]]]:
    """Calls `tool` on a thread while the block runs (the block kills
    something under it); yields the list that gets its (text, is_error), a
    client-side failure counting as an error."""
    outcome: list[tuple[str, bool]] = []

    def call() -> None:
        try:
            outcome.append(client.tool(tool, **args))
        except McpError as e:
            outcome.append((str(e), True))

    thread = threading.Thread(target=call)
    thread.start()
    try:
        yield outcome
    finally:
        thread.join(timeout=120)


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time), None once it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _descendants(root: int) -> dict[int, str]:
    """Every live process under `root`, with its start time (against pid reuse)."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, todo = {}, [root]
    while todo:
        parent = todo.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                start = _start_time(pid)
                if start is not None:
                    found[pid] = start
                    todo.append(pid)
    return found


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def _survivors(procs: dict[int, str]) -> dict[int, str]:
    """The processes of `procs` still alive (same start time), with their state."""
    return {pid: _state(pid) for pid, start in procs.items() if _start_time(pid) == start}


def _kill_survivors(procs: dict[int, str]) -> None:
    """What a failed test would otherwise leave frozen on the machine."""
    for pid in _survivors(procs):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _temp_layers(store: str) -> list[str]:
    layers = Path(store) / "layers"
    return sorted(p.name for p in layers.iterdir() if p.name.startswith(".tmp-")) if layers.is_dir() else []


def test_helper_killed_mid_snapshot_takes_its_frozen_sandbox_along(server_factory, env, image_store):
    srv = server_factory(SANDBOX_MCP_IMAGE_STORE=image_store)
    for seed in SNAPSHOT_KILL_SEEDS:
        rng = random.Random(seed)
        name = f"snap{seed}"
        # Enough to copy that the sandbox stays frozen for a while (one big
        # file is a reflink or copy_file_range, milliseconds: many small
        # files cost the copy per file), and a process of its own besides
        # the agent.
        text, err = srv.tool(
            "exec", sandbox=name,
            command=f"mkdir /root/many && cd /root/many && seq 40000 | xargs touch && (sleep 4242{seed} &) && echo ok",
        )
        assert not err and text.startswith("ok"), text
        helper = helper_pid(env)
        procs = _descendants(helper)
        sleeper = next(
            p for p in procs if Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", f"4242{seed}".encode()]
        )
        with _called_meanwhile(srv, "snapshot", snapshot_name=name, sandbox=name) as outcome:
            until(lambda: _state(sleeper) == "T", f"seed {seed}: the snapshot freezing the sandbox", timeout=60)
            time.sleep(rng.uniform(0, 0.05))
            os.kill(helper, signal.SIGKILL)
        assert outcome and outcome[0][1], f"seed {seed}: the snapshot survived its helper: {outcome}"
        try:
            until(lambda: not _survivors(procs), f"seed {seed}: no process of the dead helper's sandboxes left "
                  f"(left: {_survivors(procs)})")
        finally:
            _kill_survivors(procs)
        until(lambda: _restarted(env, helper), f"seed {seed}: helper restarted")
        until(lambda: _lost(srv, name), f"seed {seed}: {name} reported lost")
        until(lambda: not _temp_layers(image_store), f"seed {seed}: half-copied layers removed by the new helper "
              f"(left: {_temp_layers(image_store)})")
        text, err = srv.tool("reset", sandbox=name)
        assert not err, text
        text, err = srv.tool("exec", sandbox=name, command="test ! -e /root/big && echo fresh")
        assert not err and text.startswith("fresh"), text
        srv.tool("destroy", sandbox=name)


def test_a_new_helper_kills_a_sandbox_a_dead_one_left_frozen(server_factory, env):
    """What a helper from before launchers watched their helper left after a
    kill mid-snapshot: the whole sandbox stopped, its launcher with it (here
    stopped by the test, so it cannot act either)."""
    srv = server_factory()
    text, err = srv.tool("exec", sandbox="left", command="(sleep 42420 &) ; echo ok")
    assert not err, text
    helper = helper_pid(env)
    launcher = next(
        p for p, _ in _descendants(helper).items()
        if any(Path(f"/proc/{c}/cmdline").read_bytes().startswith(b"sleep\x0042420") for c in _descendants(p))
    )
    procs = {launcher: _start_time(launcher), **_descendants(launcher)}
    try:
        for pid in procs:
            os.kill(pid, signal.SIGSTOP)
        os.kill(helper, signal.SIGKILL)
        until(lambda: _restarted(env, helper), "helper restarted")
        until(lambda: not _survivors(procs), f"the frozen sandbox killed by the new helper (left: {_survivors(procs)})")
    finally:
        _kill_survivors(procs)


def test_destroy_of_a_lost_sandbox_frees_its_writable_layer(server_factory, env):
    srv = server_factory()
    text, err = srv.tool("exec", sandbox="gone", command="head -c 1M /dev/urandom > /root/junk && echo ok")
    assert not err, text
    vm_dir = Path(env["XDG_STATE_HOME"]) / "sandbox-mcp" / "vms" / sandbox_key("gone")
    assert vm_dir.is_dir()
    old = kill_helper_with_sandboxes(env)
    until(lambda: _restarted(env, old), "helper restarted")
    until(lambda: _lost(srv, "gone"), "lost")
    assert vm_dir.is_dir(), "the writable layer stays until the loss is acknowledged"
    text, err = srv.tool("destroy", sandbox="gone")
    assert not err and "Forgot sandbox 'gone'" in text, text
    assert not vm_dir.exists(), f"{vm_dir} left behind"


def test_helpers_sharing_a_store_keep_the_layers_each_others_sandboxes_use(env, image_store):
    binary = required_env("SANDBOX_MCP_BIN")
    other_base = new_env_dir()
    other_env = isolated_env(other_base)
    a = b = None
    try:
        a = McpClient(binary, env={**env, "SANDBOX_MCP_IMAGE_STORE": image_store},
                      stderr_path=f"{env['SANDBOX_MCP_TEST_TMP']}/a.log")
        b = McpClient(binary, env={**other_env, "SANDBOX_MCP_IMAGE_STORE": image_store},
                      stderr_path=f"{other_base}/b.log")
        text, err = a.tool("exec", sandbox="src", command="echo one > /root/f")
        assert not err, text
        text, err = a.tool("snapshot", snapshot_name="shared", sandbox="src")
        assert not err, text
        layers_dir = Path(image_store) / "layers"
        (layer,) = [p for p in layers_dir.iterdir() if not p.name.startswith(".")]
        # B's sandbox runs on the snapshot's layer; A deletes the snapshot,
        # which collects the layers A's helper sees no use for.
        text, err = b.tool("restore", snapshot_name="shared", sandbox="user")
        assert not err, text
        text, err = a.tool("delete_snapshot", snapshot_name="shared")
        assert not err, text
        assert layer.is_dir(), "a layer another helper's sandbox runs on was collected"
        text, err = b.tool("clone", source="user", target="copy")
        assert not err, text
        text, err = b.tool("exec", sandbox="copy", command="cat /root/f")
        assert not err and text.startswith("one"), text
        text, err = b.tool("snapshot", snapshot_name="again", sandbox="copy")
        assert not err, text
        text, err = b.tool("delete_snapshot", snapshot_name="again")
        assert not err, text
        # Once no sandbox of any helper uses it, it goes.
        for name in ("user", "copy"):
            text, err = b.tool("destroy", sandbox=name)
            assert not err, text
        until(lambda: not layer.exists(), "the layer collected once nobody uses it")
    finally:
        for client in (b, a):
            if client is not None:
                client.close()
        stop_servers(other_env)
        remove_env_dir(other_base)


def test_payloads_over_the_grpc_message_size(server):
    six_mib = 6 << 20
    text, err = server.tool("write_file", path="big", content="x" * six_mib)
    assert not err and f"Wrote {six_mib} bytes" in text, text
    text, err = server.tool("exec", command="wc -c < big")
    assert not err and text.splitlines()[0] == str(six_mib), text
    text, err = server.tool("read_file", path="big")
    assert not err and text.startswith("xxxx"), text[:200]
    text, err = server.tool("exec", command="wc -c", stdin="y" * (5 << 20))
    assert not err and text.splitlines()[0] == str(5 << 20), text
    # A command is one argument to the shell: the documented limit, named.
    longest = "echo " + "a" * (MAX_COMMAND_BYTES - 13) + " | wc -c"
    assert len(longest) == MAX_COMMAND_BYTES
    text, err = server.tool("exec", command=longest)
    assert not err and text.splitlines()[0] == str(MAX_COMMAND_BYTES - 12), text[:200]
    for tool in ("exec", "bg"):
        text, err = server.tool(tool, command="echo " + "a" * (5 << 20))
        assert err and f"at most {MAX_COMMAND_BYTES} bytes" in text and "write_file" in text, text[:300]


def _set_child_subreaper(on: bool) -> None:
    """Makes this process adopt its orphaned descendants (PR_SET_CHILD_SUBREAPER),
    as init does, except that it reaps them only when told to."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(36, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def test_a_helper_killed_mid_snapshot_before_anyone_reaps_it_leaves_no_half_copied_layer(env, image_store):
    """The fault suite's find: a helper whose daemon was killed is adopted by
    init (or a subreaper), and once killed itself stays a zombie until that
    one reaps it; the next helper took the zombie's /proc entry for a live
    copy and kept its half-copied layer for good. Here the test is the
    subreaper, and reaps only at the end."""
    binary = required_env("SANDBOX_MCP_BIN")
    store_env = {**env, "SANDBOX_MCP_IMAGE_STORE": image_store}
    log = f"{env['SANDBOX_MCP_TEST_TMP']}/server.log"
    _set_child_subreaper(True)
    first = second = None
    helper = 0
    try:
        first = McpClient(binary, env=store_env, stderr_path=log)
        text, err = first.tool(
            "exec", sandbox="z", command="mkdir /root/many && cd /root/many && seq 40000 | xargs touch && "
            "(sleep 42429 &) && echo ok")
        assert not err and text.startswith("ok"), text
        helper = helper_pid(env)
        os.kill(daemon_pid(env), signal.SIGKILL)
        first.close()
        until(lambda: Path(f"/proc/{helper}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(os.getpid()),
              "the helper adopted by the subreaper")
        second = McpClient(binary, env=store_env, stderr_path=log)
        procs = _descendants(helper)
        sleeper = next(p for p in procs if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"sleep\x0042429"))
        with _called_meanwhile(second, "snapshot", snapshot_name="z", sandbox="z") as outcome:
            until(lambda: _state(sleeper) == "T", "the snapshot freezing the sandbox", timeout=60)
            os.kill(helper, signal.SIGKILL)
        assert outcome and outcome[0][1], f"the snapshot survived its helper: {outcome}"
        until(lambda: _state(helper) == "Z", "the killed helper a zombie nobody reaped yet")
        until(lambda: _restarted(env, helper), "helper restarted")
        until(lambda: _lost(second, "z"), "z reported lost")
        until(lambda: not _temp_layers(image_store), f"the half-copied layer removed (left: {_temp_layers(image_store)})")
    finally:
        _set_child_subreaper(False)
        for client in (second, first):
            if client is not None:
                client.close()
        stop_servers(env)
        # What the test adopted: the killed helper's zombie, and whatever else ended meanwhile.
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass


def test_a_creation_cut_short_by_the_helpers_death_leaves_no_writable_layer(server_factory, env):
    """The fault suite's find: a helper killed while a sandbox was being
    created left that VM's writable layer behind for good (the cleanup asked
    the dead helper, the new one knew nothing of the VM)."""
    srv = server_factory()
    assert not srv.tool("exec", command="true")[1]
    helper = helper_pid(env)
    vm_dir = Path(env["XDG_STATE_HOME"]) / "sandbox-mcp" / "vms" / sandbox_key("cut")
    with _called_meanwhile(srv, "exec", command="true", sandbox="cut") as outcome:
        # Stopped the moment its directory exists, so the creation cannot finish first.
        assert wait_for(vm_dir.exists, timeout=60, every=0.001), "the VM's directory never appeared"
        os.kill(helper, signal.SIGSTOP)
        os.kill(helper, signal.SIGKILL)
    assert outcome and outcome[0][1], f"the creation survived its helper: {outcome}"
    until(lambda: _restarted(env, helper), "helper restarted")
    until(lambda: not vm_dir.exists(), f"{vm_dir} freed once a helper answers")
    text, err = srv.tool("status")
    assert not err and "cut" not in text, text
    text, err = srv.tool("exec", command="echo made", sandbox="cut")
    assert not err and text.startswith("made"), text
