"""Security suite on the vm driver (issue 12): escapes tried from inside a vm sandbox, as root of its
guest, through the real MCP client. The guest's root may do anything to its own kernel (that is the
point of a VM); what must hold is the boundary: no host file, process or device is reachable, the
read-only image disks stay read-only, `/workspace` is the volume and nothing wider, and a guest that
takes over its agent's port and speaks garbage to the helper hurts no one but itself.

Each test ends with the server and a bystander vm sandbox unaffected (security_support).
Skips, saying why, without qemu or the vm assets (`make test` builds them).
"""
import base64
import json
import os
import uuid

import pytest

from security_support import assert_unaffected, sec_server
from test_vm_isolation import VM_CALL_TIMEOUT, missing_vm_driver, needs_vm, vm_dir

pytestmark = needs_vm


@pytest.fixture(scope="module")
def srv():
    if missing_vm_driver() is not None:
        pytest.skip(str(missing_vm_driver()))
    with sec_server(config='isolation = "vm"\n[defaults]\nnetwork = "none"\n',
                    SANDBOX_MCP_VM_DIR=str(vm_dir())) as s:
        yield s


def run_json(srv, code: str, sandbox: str = "default"):
    """Runs python3 `code` as root in the guest; it prints one JSON value."""
    out, err, rc = srv.py(code, sandbox, VM_CALL_TIMEOUT)
    assert rc == 0, (out, err)
    return json.loads(out)


def test_the_host_is_not_in_the_guest(srv):
    """Host files by their paths, the helper's state dir, and the host's processes: none exists in the
    guest, by any route (/proc roots, symlinks in /workspace, the tools)."""
    secret = srv.tmp / f"host-secret-{uuid.uuid4().hex}"
    secret.write_text("host only\n")
    secret.chmod(0o644)
    state_dir = os.path.join(srv.env["XDG_STATE_HOME"], "sandbox-mcp")
    srv.sh(f"ln -s {secret} /workspace/abs-link; ln -s ../../../../../../../..{secret} /workspace/rel-link",
           timeout=VM_CALL_TIMEOUT)
    seen = run_json(srv, f"""
import glob, json, os
found = {{}}
for t in [{str(secret)!r}, {state_dir!r}, "/workspace/abs-link", "/workspace/rel-link"]:
    for root in ["", "/proc/1/root", "/proc/self/root"]:
        try:
            open(root + t).read()
            found[root + t] = "READ"
        except OSError as e:
            found[root + t] = e.errno
# Processes naming the host's state dir (the daemon, the helper) would be the host's.
host_procs = []
for cmd in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        if {srv.env["XDG_STATE_HOME"]!r}.encode() in open(cmd, "rb").read():
            host_procs.append(cmd)
    except OSError:
        pass
print(json.dumps({{"found": found, "host_procs": host_procs, "uname": os.uname().release}}))
""")
    assert seen["uname"] != os.uname().release, "the guest runs the host's kernel"
    leaked = {p: r for p, r in seen["found"].items() if r == "READ"}
    assert not leaked, f"host paths readable from inside: {leaked}"
    assert set(seen["found"].values()) == {2}, seen["found"]  # ENOENT: not there at all
    assert not seen["host_procs"], seen["host_procs"]
    text, err = srv.call("read_file", path="/workspace/abs-link")
    assert err and "host only" not in text, text
    assert_unaffected(srv, "default")


def test_the_image_disks_stay_read_only_and_workspace_is_only_the_volume(srv):
    """Root of the guest opens the image's layer disks for writing (qemu attached them read-only)
    and mounts the workspace's virtiofs tag again, climbing out of it with `..`: the disks refuse,
    and the second mount shows the same volume, nothing above it."""
    srv.sh("echo inside-volume > /workspace/marker", timeout=VM_CALL_TIMEOUT)
    got = run_json(srv, """
import glob, json, os, subprocess
disks = {}
for ro in glob.glob("/sys/block/vd*/ro"):
    name = ro.split("/")[3]
    try:
        fd = os.open(f"/dev/{name}", os.O_WRONLY)
        try:
            os.pwrite(fd, b"x" * 512, 0)
            disks[name] = [open(ro).read().strip(), "WROTE"]
        except OSError as e:
            disks[name] = [open(ro).read().strip(), e.errno]
        os.close(fd)
    except OSError as e:
        disks[name] = [open(ro).read().strip(), e.errno]
os.makedirs("/mnt/again", exist_ok=True)
mounted = subprocess.run(["mount", "-t", "virtiofs", "workspace", "/mnt/again"], capture_output=True, text=True)
same = mounted.returncode == 0 and open("/mnt/again/marker").read() == "inside-volume\\n"
up = sorted(os.listdir(os.path.realpath("/mnt/again/..")))
print(json.dumps({"disks": disks, "mounted": mounted.returncode, "err": mounted.stderr, "same": same,
                  "up": up, "root": sorted(os.listdir("/"))}))
""")
    read_only = {n: r for n, (flag, r) in got["disks"].items() if flag == "1"}
    assert read_only, f"no read-only image disk seen: {got['disks']}"
    assert "WROTE" not in read_only.values(), f"an image disk took a write: {got['disks']}"
    # A second mount of the tag is the volume again (or refused); `..` of it is the guest's /mnt.
    assert got["mounted"] != 0 or got["same"], got
    assert got["up"] == ["again"], got
    assert_unaffected(srv, "default")


def test_a_guest_that_speaks_garbage_on_its_agent_port_hurts_only_itself(srv):
    """Guest root takes the agent's own virtio-serial descriptor (pidfd_getfd) and writes a frame header
    announcing 1 GiB, then random bytes, to the helper. The helper drops that connection (a broken peer);
    it stays up, the bystander is unaffected, and `reset` gives the attacked sandbox a working VM."""
    srv.sh("true", timeout=VM_CALL_TIMEOUT)
    attack = r"""
import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
def agent_port():
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if "vport" in os.readlink(f"/proc/{pid}/fd/{fd}"):
                    return int(pid), int(fd)
        except OSError:
            continue
    raise SystemExit("no process holds a virtio-serial port")
pid, fd = agent_port()
pidfd = libc.syscall(434, pid, 0)            # pidfd_open
port = libc.syscall(438, pidfd, fd, 0)       # pidfd_getfd
assert port >= 0, ctypes.get_errno()
# kind 11 (Stdout), stream 1, length 1 GiB: more than any frame may be.
os.write(port, struct.pack(">BII", 11, 1, 1 << 30))
os.write(port, os.urandom(1 << 16))
print("sent", flush=True)
"""
    # The exec's own stream rides on the connection it breaks: its answer may be an error.
    b64 = base64.b64encode(attack.encode()).decode()
    r = srv.client.call_raw("exec", command=f"python3 -c \"import base64; exec(base64.b64decode('{b64}'))\"",
                            sandbox="default", timeout=60, call_timeout=VM_CALL_TIMEOUT)
    said = r.structured_content or {}
    # Carried out: the garbage went out ("sent"), or the broken connection took the exec's answer with it.
    assert r.is_error or said.get("stdout") == "sent\n", (r.is_error, said, r.content)
    if r.is_error:
        text = str(r.content)
        assert "agent was lost" in text and "VM helper unavailable at :" not in text, text
    assert_unaffected(srv)
    text, err = srv.call("reset", sandbox="default", call_timeout=VM_CALL_TIMEOUT)
    assert not err, text
    out, err, code = srv.sh("echo alive", timeout=VM_CALL_TIMEOUT)
    assert (out, code) == ("alive\n", 0), (out, err)
    assert_unaffected(srv, "default")
