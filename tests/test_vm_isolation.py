"""`isolation = "vm"` end to end (issue 12): an agent asks for a VM through the real MCP tools and gets a
qemu microVM with its own kernel, its /workspace on the host volume, a killed qemu reported and recovered by
`reset`; a spawned child can ask for one too.

The vm driver needs qemu and the guest kernel and initramfs built for the helper under test (`make test`
builds them into SANDBOX_MCP_VM_DIR; an ordinary user's `make vm` into its data dir): without them these tests
skip, saying which is missing. Each VM boots under TCG here (seconds), so the always-run cases boot few.
"""
from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import (TEST_HOST_BODY, TEST_HOST_PORT, pids_of, required_env, sandbox_key, vm_dir, volume_dir,
                      write_config)
from test_persistence import helper_pid
from waiting import poll

# Long enough for a TCG boot on a loaded machine, and the first build of the image's layer disk.
VM_CALL_TIMEOUT = 300.0
QEMU = "qemu-system-x86_64"
VM_PROJECT = 'isolation = "vm"\nnetwork = "none"\n'


def missing_vm_driver() -> str | None:
    """Why the vm driver cannot run here, or None."""
    if shutil.which(QEMU) is None:
        return f"{QEMU} is not installed (make vm)"
    d = vm_dir()
    if not (d / "vmlinux").is_file() or not (d / "kernel.release").is_file():
        return f"no guest kernel in {d} (make vm-assets)"
    notes = subprocess.run(["readelf", "-n", required_env("SANDBOX_VM_HELPER_BIN")], capture_output=True, text=True)
    build_id = next((line.split()[-1] for line in notes.stdout.splitlines() if "Build ID:" in line), "")
    if not (d / f"initramfs-{build_id}.cpio.gz").is_file():
        return f"no initramfs for the helper under test (build id {build_id}) in {d} (make vm-assets)"
    return None


needs_vm = pytest.mark.skipif(missing_vm_driver() is not None, reason=str(missing_vm_driver()))


def vm_server(front_end, roots: Path, **extra_env: str):
    """A stdio front-end serving `roots` whose helper finds the vm assets."""
    return front_end(SANDBOX_MCP_HOST_ROOTS=str(roots), SANDBOX_MCP_VM_DIR=str(vm_dir()), **extra_env)


def run(client, command: str, sandbox: str = "default") -> str:
    """The output of `command`, without exec's closing `(N ms)` line."""
    out, err = client.tool("exec", _timeout=VM_CALL_TIMEOUT, command=command, sandbox=sandbox)
    assert not err, out
    return out.rsplit("(", 1)[0]


def qemu_pids(key: str) -> list[int]:
    """The qemu of the sandbox keyed `key`, booted cold or restored (its run dir is named by the key; a vm
    taken from the warm pool keeps the pool's, and the pool's own and a template's are named otherwise)."""
    return pids_of(QEMU, arg=key)


@needs_vm
def test_a_vm_sandbox_from_the_project_file(front_end, roots, env):
    (roots / ".sandbox-mcp.toml").write_text(VM_PROJECT)
    # Without a warm pool its qemu runs in a dir named by its key (cold or restored from a saved state).
    client = vm_server(front_end, roots, SANDBOX_MCP_VM_POOL="0")
    release = (vm_dir() / "kernel.release").read_text().strip()
    assert release != os.uname().release
    assert run(client, "uname -r").strip() == release

    text, err = client.tool("write_file", path="/workspace/note.txt", content="from the agent\n")
    assert not err, text
    text, err = client.tool("read_file", path="/workspace/note.txt")
    assert not err and "from the agent" in text, text
    assert run(client, "cat /workspace/note.txt; echo made-inside > /workspace/inside.txt") == "from the agent\n"
    workspace = volume_dir(env, "default", roots) / "workspace"
    assert (workspace / "note.txt").read_text() == "from the agent\n"
    assert (workspace / "inside.txt").read_text() == "made-inside\n"

    status, _ = client.tool("status")
    assert "isolation:vm" in status, status
    # Its volumes are what it has: /workspace, no package caches (the vm driver shares nothing else).
    assert "apt/pip/npm caches on namespace sandboxes, none on vm ones" in status, status
    table, _ = client.tool("list_all")
    assert table.split("\n")[2].split()[5] == "vm", table
    health, _ = client.tool("health")
    assert "isolation=vm" in health, health

    # qemu and the virtiofsd serving /workspace share the sandbox's cgroup (named by its key) when the
    # helper has cgroups, and the helper's otherwise.
    pids = qemu_pids(sandbox_key("default", roots))
    assert len(pids) == 1, pids
    virtiofsd = pids_of("virtiofsd", arg=sandbox_key("default", roots))  # it forks into a pid namespace of its own
    assert virtiofsd, "no virtiofsd"
    groups = [Path(f"/proc/{pid}/cgroup").read_text() for pid in [pids[0], *virtiofsd]]
    assert all(g == groups[0] for g in groups), groups
    assert ("limits: not enforced" in status) != (sandbox_key("default", roots) in groups[0]), (status, groups)

    # Killing qemu from outside is reported with the helper's reason by the next call, which boots the sandbox
    # again with its /workspace (no reset needed).
    os.kill(pids[0], signal.SIGKILL)
    back = poll(lambda: client.tool("exec", _timeout=VM_CALL_TIMEOUT, command="cat /workspace/inside.txt; uname -r"),
                lambda r: not r[1] and "qemu was killed" in r[0], timeout=30)
    assert back and back[0].splitlines()[1:3] == ["made-inside", release], client.tool("exec", command="true")
    assert run(client, "cat /workspace/inside.txt; uname -r") == f"made-inside\n{release}\n"


def test_isolation_errors_name_the_setting_and_the_fix(front_end, roots, env):
    # This helper finds no vm assets (its data dir is the test's own): the vm driver is listed, unusable.
    write_config(env, '[profiles.bare]\nisolation = "vm"\nnetwork = "none"\n')
    client = front_end(SANDBOX_MCP_HOST_ROOTS=str(roots))
    text, err = client.tool("exec", command="true", sandbox="bare")
    assert err and "the vm driver is not usable here: no vm kernel in" in text and "make vm" in text, text
    (roots / ".sandbox-mcp.toml").write_text('isolation = "gvisor"\n')
    text, err = client.tool("exec", command="true")
    assert err and 'isolation: must be "namespaces" or "vm", not "gvisor"' in text, text
    text, err = client.tool("validate_config")
    assert err and '  isolation: must be "namespaces" or "vm", not "gvisor"' in text, text


@needs_vm
def test_vm_assets_put_in_place_while_the_helper_runs_are_found(front_end, roots, env):
    """`make vm` after a vm request failed: the next request finds the kernel and initramfs, without anyone
    restarting the helper (issue 26)."""
    write_config(env, '[profiles.bare]\nisolation = "vm"\nnetwork = "none"\n')
    client = front_end(SANDBOX_MCP_HOST_ROOTS=str(roots))
    text, err = client.tool("exec", command="true", sandbox="bare")
    assert err and "no vm kernel in" in text and "make vm" in text, text
    helper = helper_pid(env)
    # Where make vm puts them for this user (the data dir's vm), as links to the ones built for this helper.
    target = Path(env["XDG_DATA_HOME"]) / "sandbox-mcp" / "vm"
    target.mkdir(parents=True, exist_ok=True)
    built = vm_dir()
    for name in ["vmlinux", "kernel.release", *(p.name for p in built.glob("initramfs-*.cpio.gz"))]:
        os.symlink(built / name, target / name)
    release = (built / "kernel.release").read_text().strip()
    assert run(client, "uname -r", sandbox="bare").strip() == release
    assert helper_pid(env) == helper, "the helper was restarted"


@needs_vm
def test_a_vm_sandbox_goes_out_through_the_helpers_stack_and_its_policy(front_end, roots):
    """EGRESS on the vm driver: the guest's resolver is the helper's stack, and a connection the policy
    refuses (the host's own address) is refused at once and shown by network_info, as on namespaces."""
    from test_network_policy import host_address

    (roots / ".sandbox-mcp.toml").write_text('isolation = "vm"\n')
    client = vm_server(front_end, roots)
    addr = host_address()
    code = f"import socket\ntry:\n    socket.create_connection(('{addr}', 9), timeout=20)\n    print('connected')\n" \
           "except OSError as e:\n    print('refused', e)\n"
    # eth0 is up with a carrier (operstate follows a moment later: the kernel's link watch).
    out = run(client, "grep nameserver /etc/resolv.conf; cat /sys/class/net/eth0/carrier /sys/class/net/eth0/flags")
    lines = out.splitlines()
    assert lines[:2] == ["nameserver 10.0.2.3", "1"] and int(lines[2], 16) & 1, out
    out, err = client.tool("python", _timeout=VM_CALL_TIMEOUT, code=code)
    assert not err and out.startswith("refused"), out
    info, err = client.tool("network_info")
    assert not err, info
    assert f"  refused tcp {addr}:9 \u2014 " in info, info


@needs_vm
def test_a_vm_sandbox_reaches_the_allowed_test_host_and_not_another(front_end, roots, test_host):
    """The allow-list on the vm driver, from the MCP side: the test host it names answers over HTTP, a
    second test host it does not name (a private address: refused by default) is refused at once, and
    network_info shows that refusal."""
    allowed, other = test_host(), test_host()
    (roots / ".sandbox-mcp.toml").write_text(f'isolation = "vm"\n[network]\nallow = ["{allowed}"]\n')
    client = vm_server(front_end, roots)
    code = f"""
import socket
for addr in [{allowed!r}, {other!r}]:
    try:
        s = socket.create_connection((addr, {TEST_HOST_PORT}), timeout=20)
        s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
        print(addr, s.makefile("rb").read().split(b"\\r\\n\\r\\n")[-1].decode())
    except OSError as e:
        print(addr, "refused", type(e).__name__)
"""
    out, err = client.tool("python", _timeout=VM_CALL_TIMEOUT, code=code)
    assert not err, out
    lines = out.splitlines()
    assert lines[0] == f"{allowed} {TEST_HOST_BODY}", out
    assert lines[1].startswith(f"{other} refused"), out
    info, err = client.tool("network_info")
    assert not err, info
    assert f"  refused tcp {other}:{TEST_HOST_PORT} \u2014 " in info, info


@needs_vm
def test_a_child_asks_for_a_vm_within_its_parents_policy(front_end, roots, env):
    write_config(env, '[defaults]\nnetwork = "none"\n[spawn_policies.default]\n'
                      '[spawn_policies.strict]\nallowed_isolation = ["namespaces"]\n')
    client = vm_server(front_end, roots)
    assert run(client, "uname -r").strip() == os.uname().release
    run(client, "true", sandbox="strict")
    text, err = client.tool("spawn", parent="strict", isolation="vm")
    assert err and "Isolation 'vm' not allowed for children of 'strict' (allowed: namespaces)" in text, text
    text, err = client.tool("spawn", _timeout=VM_CALL_TIMEOUT, name="kid", isolation="vm")
    assert not err and "  Isolation: vm" in text, text
    release = (vm_dir() / "kernel.release").read_text().strip()
    assert run(client, "uname -r", sandbox="default..kid").strip() == release
    # Its own child takes its isolation unless told.
    status, _ = client.tool("status")
    assert "isolation:vm" in next(line for line in status.splitlines() if "default..kid" in line), status


@needs_vm
def test_a_vm_sandbox_keeps_to_its_disk_limit(front_end, roots):
    """The profile's `disk` holds on the vm driver as on namespaces: the writable disk is that size (a write
    past it fails in the guest), writes to /workspace count against the same limit (the watcher stops the
    writer with the quota message), and stats shows the sandbox's own figures, not the host's."""
    (roots / ".sandbox-mcp.toml").write_text(VM_PROJECT + 'disk = "64M"\n')
    client = vm_server(front_end, roots, SANDBOX_MCP_VM_POOL="0")
    out = run(client, "head -c 100M /dev/zero > /var/big; echo rc=$?; rm /var/big; sync")
    assert "No space left on device" in out and "rc=1" in out, out
    text, err = client.tool("stats")
    assert not err and re.search(r"^Quota:   .+ / 64.0MB \(\d+%", text, re.M), text
    data = client.call_raw("stats").structured_content
    assert data["quota_limit_bytes"] == 64 << 20 and data["quota_used_bytes"] < 64 << 20, data
    # A steady writer (1 MiB every 20 ms, 300 MiB in all) meets the watcher well before it ends.
    writer = "for i in $(seq 300); do head -c 1048576 /dev/zero >> /workspace/big; sleep 0.02; done"
    text, _ = client.tool("exec", _timeout=VM_CALL_TIMEOUT, command=writer, timeout=240)
    assert "disk quota exceeded" in text and "used of 64 MiB" in text, text
    text, err = client.tool("stats")
    assert not err and re.search(r"^Quota:   disk quota exceeded: .+ used of 64 MiB \(writable layer .+, /workspace ", text,
                                 re.M), text
    run(client, "rm -f /workspace/big")


@needs_vm
def test_three_clients_share_one_vm_sandbox(front_end, http_server, roots, env):
    """Two stdio front-ends and an HTTP session on one vm sandbox at once: each sees the others' writes, every
    acknowledged env set and file is kept, and a destroy through one is seen by the others as gone, not lost."""
    (roots / ".sandbox-mcp.toml").write_text(VM_PROJECT)
    extra = {"SANDBOX_MCP_HOST_ROOTS": str(roots), "SANDBOX_MCP_VM_DIR": str(vm_dir()), "SANDBOX_MCP_VM_POOL": "0"}
    a, b = front_end(**extra), front_end(**extra)
    h = http_server(**extra).client()
    release = (vm_dir() / "kernel.release").read_text().strip()
    assert run(a, "uname -r").strip() == release

    def work(n_client):
        n, client = n_client
        for i in range(4):
            text, err = client.tool("env", _timeout=VM_CALL_TIMEOUT, action="set", key=f"K{n}_{i}", value=f"v{n}{i}")
            assert not err, text
            text, err = client.tool("write_file", _timeout=VM_CALL_TIMEOUT, path=f"/workspace/c{n}_{i}",
                                    content=f"{n}-{i}\n")
            assert not err, text
            assert run(client, f"echo {n}-{i} >> /root/log; uname -r").strip() == release

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        list(pool.map(work, enumerate((a, b, h))))
    for client in (a, b, h):
        seen = run(client, "env | grep '^K[0-9]_' | sort; cat /workspace/c* | sort; sort /root/log")
        expected = sorted(f"K{n}_{i}=v{n}{i}" for n in range(3) for i in range(4))
        expected += 2 * sorted(f"{n}-{i}" for n in range(3) for i in range(4))
        assert seen.split() == expected, seen
    for client in (b, h):
        table, _ = client.tool("list_all")
        assert "vm" in table.split("\n")[2].split(), table

    text, err = b.tool("destroy", _timeout=VM_CALL_TIMEOUT, sandbox="default")
    assert not err, text
    for client in (a, h):
        status, _ = client.tool("status")
        assert "lost" not in status and "isolation:vm" not in status, status
    assert not qemu_pids(sandbox_key("default", roots))


@needs_vm
def test_a_guest_filling_its_disk_while_snapshots_race_it(front_end, roots, image_store):
    """The guest fills its 64 MiB writable disk over and over while snapshots are taken: the layer is frozen
    while it is archived (as the namespace driver freezes its cgroup), so every snapshot is saved whole,
    nothing half-written stays in the image store, the guest's writes go on afterwards, and a snapshot
    restores. An archiver killed mid-way (run by the sandbox itself) cannot leave the layer frozen."""
    (roots / ".sandbox-mcp.toml").write_text(VM_PROJECT + 'disk = "64M"\n')
    client = vm_server(front_end, roots, SANDBOX_MCP_VM_POOL="0", SANDBOX_MCP_IMAGE_STORE=image_store)
    assert run(client, "echo up") == "up\n"
    filler = ("i=0; while :; do i=$((i+1)); head -c 80M /dev/urandom > /var/fill.$i 2>/dev/null; "
              "sync; rm -f /var/fill.*; done")
    text, err = client.tool("bg", _timeout=VM_CALL_TIMEOUT, command=filler, name="filler")
    assert not err, text
    for n in range(3):
        text, err = client.tool("snapshot", _timeout=VM_CALL_TIMEOUT, snapshot_name=f"race{n}")
        assert not err and text.startswith(f"Snapshot 'race{n}' saved"), text
    text, err = client.tool("kill", _timeout=VM_CALL_TIMEOUT, name="filler")
    assert not err, text
    # Thawed: a write to the layer completes.
    assert run(client, "rm -f /var/fill.*; timeout 60 touch /var/after && echo thawed") == "thawed\n"
    layers = Path(image_store) / "layers"
    assert not [p.name for p in layers.iterdir() if p.name.startswith(".tmp-")], list(layers.iterdir())
    text, err = client.tool("restore", _timeout=VM_CALL_TIMEOUT, snapshot_name="race2", sandbox="back")
    assert not err, text
    assert run(client, "df -k / >/dev/null && echo restored", sandbox="back") == "restored\n"

    # The archiver (comm `ld.so`, the watchdog it forked is `layer-thaw`) stalls on a full pipe, is killed.
    archiver = "/run/sandbox-mcp/ld.so --library-path /run/sandbox-mcp /run/sandbox-mcp/sandbox-vm-helper __archive-layer"
    kill = "for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = ld.so ] && kill -9 ${p#/proc/}; done"
    out = run(client, f"head -c 20M /dev/urandom > /var/big; ({archiver} | (sleep 3; cat >/dev/null)) & "
                      f"sleep 2; {kill}; sleep 1; timeout 60 touch /var/after2 && echo thawed")
    assert out.endswith("thawed\n"), out
