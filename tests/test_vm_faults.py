"""Faults on the vm driver (issue 24): `kill -9` of one qemu, of the helper with vms up (which keeps them, issue 25),
of the helper with its vms, and a full disk while a vm is snapshotted. Each gives a clear answer, leaves no qemu,
virtiofsd or run dir behind, and the other vms keep working. The vm driver's assets are needed as in test_vm_isolation (else these skip, saying which is missing)."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import pids_of, sandbox_key
from test_persistence import _restarted, exited, helper_pid, kill_helper_with_sandboxes
from test_vm_isolation import VM_CALL_TIMEOUT, VM_PROJECT, needs_vm, qemu_pids, run, vm_server
from waiting import poll, wait_for

pytestmark = needs_vm


def vm_processes(key: str) -> list[int]:
    """The qemu and virtiofsd of the sandbox keyed `key`."""
    return qemu_pids(key) + pids_of("virtiofsd", arg=key)


def run_dirs(env: dict[str, str]) -> list[str]:
    """The vm driver's run dirs (sockets, console logs) of the helper in `env`."""
    root = Path(env["XDG_RUNTIME_DIR"]) / "sandbox-mcp" / "qemu"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def test_kill9_of_a_qemu_and_of_the_helper_leaves_no_vm_behind(front_end, roots, env):
    (roots / ".sandbox-mcp.toml").write_text(VM_PROJECT)
    client = vm_server(front_end, roots, SANDBOX_MCP_VM_POOL="0")
    names = ("a", "b", "c")
    for name in names:
        assert run(client, f"echo {name} > /workspace/mark; echo up", sandbox=name) == "up\n"
    keys = {name: sandbox_key(name, roots) for name in names}
    assert all(len(qemu_pids(k)) == 1 for k in keys.values()), {n: qemu_pids(k) for n, k in keys.items()}

    # One qemu killed: its virtiofsd ends, the others answer, and its next call boots it again and says why.
    killed = vm_processes(keys["a"])
    os.kill(qemu_pids(keys["a"])[0], signal.SIGKILL)
    assert poll(lambda: [p for p in killed if not exited(p)], lambda p: p == [], timeout=30) == [], killed
    for name in ("b", "c"):
        assert run(client, "cat /workspace/mark", sandbox=name) == f"{name}\n"
    back = poll(lambda: client.tool("exec", _timeout=VM_CALL_TIMEOUT, command="cat /workspace/mark", sandbox="a"),
                lambda r: not r[1] and "qemu was killed" in r[0], timeout=30)
    assert back and back[0].splitlines()[1] == "a", client.tool("exec", command="true", sandbox="a")

    # The helper killed with two vms up: their keepers keep them (issue 25) and the new helper adopts both. The
    # same qemu and virtiofsd run on with a background job, and the next call answers with no notice.
    out, err = client.tool("bg", _timeout=VM_CALL_TIMEOUT, command="sleep 100000", name="nap", sandbox="b")
    assert not err, out
    kept = {name: vm_processes(keys[name]) for name in ("b", "c")}
    old = helper_pid(env)
    os.kill(old, signal.SIGKILL)
    assert wait_for(lambda: _restarted(env, old), timeout=60), "the helper was not started again"
    for name in ("b", "c"):
        assert run(client, "cat /workspace/mark", sandbox=name) == f"{name}\n"
        assert vm_processes(keys[name]) == kept[name], (name, kept[name], vm_processes(keys[name]))
    out, err = client.tool("logs", _timeout=VM_CALL_TIMEOUT, name="nap", sandbox="b")
    assert not err and "(alive)" in out, out

    # The helper killed with its vms, all at once (a crash of the whole tree): nothing of theirs is left, and the
    # next call boots the sandbox again with its /workspace and says so in a line before its own answer.
    old = kill_helper_with_sandboxes(env)
    left = poll(lambda: [p for k in keys.values() for p in vm_processes(k)], lambda p: p == [], timeout=30)
    assert left == [], f"vm processes outlived their helper: {left}"
    answers = []

    def answer():
        answers.append(client.tool("exec", _timeout=VM_CALL_TIMEOUT, command="cat /workspace/mark", sandbox="b"))
        return answers[-1]

    back = poll(answer, lambda r: not r[1] and "was lost and was started again" in r[0], timeout=30)
    assert back and back[0].splitlines()[1] == "b", answers[-1]
    # Until the watchdog notices, a call says the helper did not answer and how to go on, not a bare socket
    # error; the sandboxes are lost before a new helper starts, so none meets the new helper's "no such vm".
    for text, err in answers[:-1]:
        assert err and "the VM helper did not answer" in text and "retry in a few seconds" in text, text
    assert wait_for(lambda: _restarted(env, old), timeout=30), "the helper was not started again"
    # Only the sandbox that came back has one (its new vm's).
    assert poll(lambda: run_dirs(env), lambda d: d == [keys["b"]], timeout=30) == [keys["b"]], run_dirs(env)
    assert run(client, "cat /workspace/mark", sandbox="b") == "b\n"


def test_a_full_disk_while_a_vm_is_snapshotted_is_reported_and_leaves_nothing(front_end, roots, image_store):
    if os.geteuid() != 0:
        pytest.skip("a small filesystem for the image store's layers needs root to mount")
    layers = Path(image_store) / "layers"
    layers.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(layers)], check=True)
    try:
        (roots / ".sandbox-mcp.toml").write_text(VM_PROJECT)
        client = vm_server(front_end, roots, SANDBOX_MCP_VM_POOL="0", SANDBOX_MCP_IMAGE_STORE=image_store)
        # More than the layers' filesystem holds, written by the guest into its writable layer.
        assert run(client, "head -c 24M /dev/urandom > /var/big && echo written") == "written\n"
        text, err = client.tool("snapshot", _timeout=VM_CALL_TIMEOUT, snapshot_name="full")
        assert err and f"No space left on device in {layers}: free some and snapshot again" in text, text
        assert "Cannot write" not in text, "tar's line per file"
        assert not (Path(image_store) / "mcp-snap-full").exists(), "a snapshot that failed was kept"
        assert [p.name for p in layers.iterdir()] == [], "a half-written layer was left in the store"
        text, err = client.tool("restore", _timeout=VM_CALL_TIMEOUT, snapshot_name="full", sandbox="back")
        assert err and "full" in text, text
        # The vm keeps working; with room again, the snapshot is taken.
        assert run(client, "rm /var/big; echo small > /var/small; cat /var/small") == "small\n"
        text, err = client.tool("snapshot", _timeout=VM_CALL_TIMEOUT, snapshot_name="fits")
        assert not err and text.startswith("Snapshot 'fits' saved"), text
    finally:
        subprocess.run(["umount", "-l", str(layers)], check=False)
