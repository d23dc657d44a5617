"""Security suite: escapes tried from inside a sandbox, through the real MCP
client, that are blocked today and must stay blocked.

Each test runs the attack as root inside a sandbox (python3 and ctypes for
raw syscalls), asserts the specific refusal (the errno, or what the sandbox
sees instead of the host), and then that the server and a bystander sandbox
are unaffected. The README's "Security model" section maps these tests to
the layer that enforces each refusal (helper: namespaces, seccomp, cgroups;
orchestrator: names, host roots; agent: process trees).

Other files of the suite: test_security_names.py (hostile tool arguments),
test_security_ctl.py (sandbox-ctl abuse), test_security_weaknesses.py (the
reference product's 56 known flaws, by number).
"""
import json
import os
import platform
import threading
import uuid
from pathlib import Path

import pytest

from conftest import ON_VM, WAIT_SCALE, needs_cgroup_limits, volume_dir
from security_support import BYSTANDER, assert_unaffected, sec_server
from waiting import wait_for


# On the vm driver (`make test-vm`) the guest's root owns its kernel: unshare, mount, ptrace, its
# /proc/sys and its devices are its own, and the boundary is the VM. These cases attack the namespace
# driver's layers (seccomp, the shared kernel's /proc and devices); test_security_vm.py tries the same
# escapes against the VM's boundary (host files, image disks, /workspace, the agent's port).
namespace_layers = pytest.mark.skipif(ON_VM, reason="attacks the namespace driver's layers; on vm the "
                                      "guest owns its kernel (the VM's boundary: test_security_vm.py)")


@pytest.fixture(scope="module")
def srv():
    with sec_server() as s:
        yield s


def run_json(srv, code: str, sandbox: str = "default", timeout: float = 60):
    """Runs python3 `code` in a sandbox; it prints one JSON value."""
    out, err, rc = srv.py(code, sandbox, timeout)
    assert rc == 0, (out, err)
    return json.loads(out)


# ---------------------------------------------------------------- host files


@namespace_layers
def test_host_files_are_not_reachable_through_proc_root_cwd_or_symlinks(srv):
    # A file on the host that the sandbox must never see, by its host path.
    secret = srv.tmp / f"host-secret-{uuid.uuid4().hex}"
    secret.write_text("host only\n")
    secret.chmod(0o644)
    state_dir = os.path.join(srv.env["XDG_STATE_HOME"], "sandbox-mcp")
    srv.sh(f"ln -s {secret} /workspace/abs-link; ln -s ../../../../../../../..{secret} /workspace/rel-link")
    seen = run_json(srv, f"""
import glob, json, os
targets = [{str(secret)!r}, {state_dir!r}, "/workspace/abs-link", "/workspace/rel-link"]
results = {{}}
roots = ["/proc/1/root", "/proc/self/root", "/proc/thread-self/root"]
roots += glob.glob("/proc/[0-9]*/root") + glob.glob("/proc/[0-9]*/cwd") + glob.glob("/proc/[0-9]*/task/*/root")
same_root = True
for r in roots:
    try:
        st = os.stat(r + "/")
    except OSError:
        continue  # the process exited meanwhile
    same_root &= r.endswith("/cwd") or (st.st_dev, st.st_ino) == (os.stat("/").st_dev, os.stat("/").st_ino)
    for t in targets:
        path = r + t if t.startswith("/") else t
        try:
            open(path).read()
            results[path] = "READ"
        except OSError as e:
            results[path] = e.errno
print(json.dumps({{"same_root": same_root, "roots": len(roots), "results": results}}))
""")
    assert seen["same_root"], "some process in the sandbox has a root other than the sandbox's"
    assert seen["roots"] >= 3
    leaked = {p: r for p, r in seen["results"].items() if r == "READ"}
    assert not leaked, f"host paths readable from inside: {leaked}"
    # The symlinks resolve inside the sandbox (ENOENT there), never on the host.
    assert set(seen["results"].values()) == {2}, seen["results"]
    # The tools resolve them inside the sandbox too.
    text, err = srv.call("read_file", path="/workspace/abs-link")
    assert err and "No such file or directory" in text and "host only" not in text, text
    assert_unaffected(srv, "default")


@namespace_layers
def test_open_by_handle_cannot_reach_the_host_filesystem(srv):
    # "Shocker": open_by_handle_at with a guessed handle opens any inode of a
    # mounted filesystem, bypassing the mount namespace. /workspace is a host
    # filesystem, so this must be refused.
    if platform.machine() != "x86_64":
        pytest.skip("raw syscall numbers are x86_64")
    errnos = run_json(srv, """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("/workspace", os.O_RDONLY)
handle = ctypes.create_string_buffer(8 + 8)
ctypes.c_uint.from_buffer(handle, 0).value = 8       # handle_bytes
ctypes.c_int.from_buffer(handle, 4).value = 1        # FILEID_INO32_GEN
ctypes.c_uint.from_buffer(handle, 8).value = 2       # inode 2: a filesystem's root
r = libc.syscall(304, fd, handle, os.O_RDONLY)       # open_by_handle_at
print(json.dumps([r, ctypes.get_errno() if r == -1 else 0]))
""")
    assert errnos == [-1, 1], f"open_by_handle_at must fail with EPERM, got {errnos}"
    assert_unaffected(srv, "default")


# ---------------------------------------------------------------- syscalls

# (name, x86_64 number, arguments): every call is made with arguments that
# would work for root of a user namespace without the filter, so the EPERM
# comes from the sandbox's seccomp filter, not from a bad argument.
SYSCALLS = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
os.makedirs("/tmp/mnt", exist_ok=True)
ts = (ctypes.c_long * 2)(0, 0)
attr = ctypes.create_string_buffer(128)   # perf_event_attr, zeroed: a valid software event
ctypes.c_uint.from_buffer(attr, 0).value = 1      # PERF_TYPE_SOFTWARE
ctypes.c_uint.from_buffer(attr, 4).value = 128    # size
calls = {
    "mount tmpfs": (165, b"tmpfs", b"/tmp/mnt", b"tmpfs", 0, 0),
    "mount cgroup v1 (release_agent)": (165, b"cgroup", b"/tmp/mnt", b"cgroup", 0, b"memory"),
    "umount2 /workspace": (166, b"/workspace", 2),
    "pivot_root": (155, b"/tmp", b"/tmp/mnt"),
    "fsopen": (430, b"tmpfs", 0),
    "open_tree": (428, -100, b"/workspace", 1),
    "mount_setattr": (442, -100, b"/", 0, 0, 0),
    "unshare user": (272, 0x10000000),
    "unshare mount": (272, 0x00020000),
    "unshare net": (272, 0x40000000),
    "setns": (308, os.open("/proc/self/ns/net", os.O_RDONLY), 0),
    "clone newuser": (56, 0x10000000 | 17, 0, 0, 0, 0),
    "clone newpid": (56, 0x20000000 | 17, 0, 0, 0, 0),
    "clone newns": (56, 0x00020000 | 17, 0, 0, 0, 0),
    "init_module": (175, b"\0" * 64, 64, b""),
    "finit_module": (313, os.open("/bin/true", os.O_RDONLY), b"", 0),
    "delete_module": (176, b"ext4", 0),
    "bpf": (321, 0, 0, 0),
    "keyctl": (250, 0, -3, 0, 0, 0),
    "add_key": (248, b"user", b"k", b"v", 1, -3),
    "request_key": (249, b"user", b"k", 0, 0),
    "perf_event_open": (298, attr, 0, -1, -1, 0),
    "userfaultfd": (323, 0),
    "clock_settime": (227, 0, ts),
    "settimeofday": (164, ts, 0),
    "clock_adjtime": (305, 0, 0),
    "adjtimex": (159, 0),
    "reboot": (169, 0xfee1dead, 672274793, 0x4321fedc, 0),
    "kexec_load": (246, 0, 0, 0, 0),
    "kexec_file_load": (320, -1, -1, 0, b"", 0),
    "swapon": (167, b"/workspace/swap", 0),
    "iopl": (172, 3),
    "ioperm": (173, 0x80, 1, 1),
    "acct": (163, b"/tmp/acct"),
    "quotactl": (179, 0, b"/", 0, 0),
}
out = {}
for name, (nr, *args) in calls.items():
    r = libc.syscall(nr, *args)
    out[name] = ctypes.get_errno() if r == -1 else f"SUCCEEDED ({r})"
r = libc.syscall(435, 0, 0)  # clone3: refused as not implemented, so libc falls back to clone
out["clone3"] = ctypes.get_errno() if r == -1 else f"SUCCEEDED ({r})"
print(json.dumps(out))
"""


@namespace_layers
def test_isolation_syscalls_are_refused_by_seccomp(srv):
    if platform.machine() != "x86_64":
        pytest.skip("raw syscall numbers are x86_64")
    got = run_json(srv, SYSCALLS)
    eperm = {name: e for name, e in got.items() if name != "clone3"}
    assert all(e == 1 for e in eperm.values()), {n: e for n, e in eperm.items() if e != 1}
    assert got["clone3"] == 38, got  # ENOSYS
    # Plain forks and threads still work, and the clock is the host's.
    out, _, code = srv.sh("python3 -c 'import threading, os; t = threading.Thread(target=print, args=(\"t\",)); "
                          "t.start(); t.join(); pid = os.fork(); os._exit(0) if pid == 0 else print(os.waitpid(pid, 0)[1])'")
    assert (out, code) == ("t\n0\n", 0), out
    assert_unaffected(srv, "default")


@namespace_layers
def test_ptrace_of_pid1_and_the_agent_grants_nothing_outside(srv):
    # ptrace stays allowed (debuggers); root inside may trace the sandbox's
    # own PID 1 and agent. That must give nothing of the host: their fds
    # reach no host file, their environment holds nothing of the server,
    # and their root is the sandbox's.
    seen = run_json(srv, """
import ctypes, glob, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
def cmd(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")[0].decode()
    except OSError:
        return ""
pids = [int(p.split("/")[2]) for p in glob.glob("/proc/[0-9]*")]
# The agent is PID 1's fork: same program, not PID 1.
agent = [p for p in pids if p != 1 and cmd(p) == cmd(1)]
out = {"agent_pids": agent, "seize": {}, "fds": {}, "environ": {}, "root_same": True}
for pid in [1] + agent:
    r = libc.ptrace(0x4206, pid, 0, 0)   # PTRACE_SEIZE: no stop; detached when we exit
    out["seize"][pid] = ctypes.get_errno() if r == -1 else 0
    out["fds"][pid] = sorted(os.readlink(f) for f in glob.glob(f"/proc/{pid}/fd/*"))
    out["environ"][pid] = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
    out["root_same"] &= os.stat(f"/proc/{pid}/root/").st_ino == os.stat("/").st_ino
# Its own pid namespace: PID 1 is the sandbox's init, and only its processes show.
out["pids"] = sorted(pids)
out["init"] = cmd(1)
print(json.dumps(out))
""")
    assert seen["seize"]["1"] == 0, "ptrace of PID 1 is allowed inside (documented); this test relies on it"
    assert seen["agent_pids"], seen
    assert seen["root_same"], seen
    for pid, fds in seen["fds"].items():
        host_files = [f for f in fds if f.startswith("/") and f != "/dev/null"]
        assert not host_files, f"pid {pid} holds files: {host_files}"
        assert all(f.startswith(("socket:", "anon_inode:", "pipe:")) or f == "/dev/null" for f in fds), (pid, fds)
    for pid, environ in seen["environ"].items():
        for leak in ("XDG_", "SANDBOX_MCP", "SANDBOX_VM", srv.tmp.name):
            assert leak not in environ, (pid, leak, environ)
    assert seen["init"] == "sandbox-vm-init" and len(seen["pids"]) < 20, seen["pids"]
    assert_unaffected(srv, "default")


def test_the_control_socket_of_pid1_is_no_channel_to_the_helper(srv):
    # Root inside can copy PID 1's fds (pidfd_getfd, allowed like ptrace).
    # The control socket to the helper is one of them: what the sandbox
    # sends on it after start-up must change nothing outside.
    if platform.machine() != "x86_64":
        pytest.skip("raw syscall numbers are x86_64")
    out, err, code = srv.py("""
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
pidfd = libc.syscall(434, 1, 0)                    # pidfd_open(1)
for fd in range(3, 8):
    got = libc.syscall(438, pidfd, fd, 0)         # pidfd_getfd
    if got < 0:
        continue
    try:
        s = socket.socket(fileno=got)
    except OSError:
        continue
    for msg in (b"ready", b"error:pwned", b"pid:1", b"x" * 60000, b"term"):
        try:
            s.send(msg, socket.MSG_DONTWAIT)
        except OSError:
            pass
print("sent")
""", sandbox="ctl-abuse")
    assert code == 0 and out == "sent\n", (out, err)
    assert_unaffected(srv, "ctl-abuse")


# ---------------------------------------------------------------- /proc, /sys, /dev


@namespace_layers
def test_proc_sys_cgroup_and_sysrq_writes_are_refused(srv):
    host_forward = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    got = run_json(srv, """
import errno, glob, json, os
def write(path):
    try:
        with open(path, "w") as f:
            f.write("0\\n" if path.endswith("ip_forward") and open(path).read() == "1\\n" else "1\\n")
        return "WROTE"
    except OSError as e:
        return e.errno
paths = ["/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches",
         "/proc/sys/kernel/modprobe", "/proc/sys/net/ipv4/ip_forward", "/proc/sysrq-trigger",
         "/sys/kernel/uevent_helper", "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/power/state",
         "/sys/fs/cgroup/release_agent", "/sys/fs/cgroup/memory/release_agent", "/sys/fs/cgroup/cgroup.procs",
         "/proc/1/oom_score_adj"]
# Every writable-looking file under /sys/fs/cgroup, if anything is mounted there.
paths += [p for p in glob.glob("/sys/fs/cgroup/**/*", recursive=True) if os.path.isfile(p)][:200]
out = {p: write(p) for p in paths}
out["core_pattern"] = open("/proc/sys/kernel/core_pattern").read()
out["cgroup"] = open("/proc/self/cgroup").read()
print(json.dumps(out))
""")
    core_pattern = got.pop("core_pattern")
    cgroup = got.pop("cgroup")
    wrote = sorted(p for p, r in got.items() if r == "WROTE")
    # Two writes are the sandbox's own business: raising PID 1's OOM score
    # (making it more killable) and the sysctls of its own network namespace
    # (checked below to leave the host's alone). Anything else is a leak.
    assert wrote in ([], ["/proc/1/oom_score_adj"], ["/proc/1/oom_score_adj", "/proc/sys/net/ipv4/ip_forward"]), wrote
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == host_forward
    # Host-owned sysctls: the user namespace's root is not their owner.
    assert got["/proc/sys/kernel/core_pattern"] == 13, got  # EACCES
    assert got["/proc/sys/vm/drop_caches"] == 13, got
    # /sys is mounted read-only; what it does not have cannot be created.
    for p in ("/sys/kernel/uevent_helper", "/sys/power/state"):
        assert got[p] in (30, 2), (p, got[p])  # EROFS, ENOENT
    # No cgroup filesystem is mounted, and the cgroup namespace shows "/".
    assert got["/sys/fs/cgroup/release_agent"] in (2, 30), got
    assert all(line.endswith(":/") for line in cgroup.split()), cgroup
    assert core_pattern.strip() != "1"
    # Lowering PID 1's OOM score below the host's default needs a host capability.
    out, err, code = srv.sh("echo -1000 > /proc/1/oom_score_adj")
    assert code != 0 and "Permission denied" in err, (out, err)
    assert_unaffected(srv, "default")


@namespace_layers
def test_no_host_devices_and_none_can_be_made(srv):
    got = run_json(srv, """
import json, os, stat
devs = sorted(os.listdir("/dev"))
out = {"devs": devs, "mknod": {}, "open": {}}
for name, major, minor in [("mem", 1, 1), ("kmem", 1, 2), ("port", 1, 4), ("kmsg", 1, 11), ("sda", 8, 0), ("vda", 253, 0)]:
    try:
        os.mknod(f"/tmp/{name}", 0o600 | stat.S_IFCHR, os.makedev(major, minor))
        out["mknod"][name] = "MADE"
    except OSError as e:
        out["mknod"][name] = e.errno
for path in ["/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/proc/kmsg", "/proc/kcore", "/dev/sda", "/dev/vda"]:
    try:
        with open(path, "rb") as f:
            f.read(1)
        out["open"][path] = "READ"
    except OSError as e:
        out["open"][path] = e.errno
print(json.dumps(out))
""")
    chars = {"full", "null", "random", "tty", "urandom", "zero"}
    assert set(got["devs"]) <= chars | {"fd", "ptmx", "pts", "shm", "stdin", "stdout", "stderr"}, got["devs"]
    assert set(got["mknod"].values()) == {1}, got["mknod"]  # EPERM
    # Absent from /dev, and /proc's kernel views are root-of-the-host only.
    assert all(e in (2, 13, 1) for e in got["open"].values()), got["open"]
    assert got["open"]["/dev/mem"] == 2 and got["open"]["/proc/kmsg"] in (13, 1, 2), got["open"]
    assert_unaffected(srv, "default")


# ---------------------------------------------------------------- resource limits

# Every process forks until the deadline (argv[1] seconds); refusals are
# noted in the workspace (one file per errno). A refused process holds its
# slot asleep until the deadline rather than retrying, so the bomb stays at
# the limit without burning the machine's CPUs (a vm under TCG would
# otherwise spend minutes on the retries).
FORK_BOMB = r"""
import os, sys, time
deadline = time.monotonic() + float(sys.argv[1])
null = os.open("/dev/null", os.O_WRONLY)
first = os.getpid()
while time.monotonic() < deadline:
    try:
        pid = os.fork()
    except OSError as e:
        os.close(os.open(f"/workspace/bomb/refused-{e.errno}", os.O_CREAT | os.O_WRONLY, 0o644))
        time.sleep(max(0.0, deadline - time.monotonic()))
        break
    if pid == 0:
        os.dup2(null, 1)
        os.dup2(null, 2)
    time.sleep(0.05)
if os.getpid() != first:
    os._exit(0)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
print("bomb over")
"""


@needs_cgroup_limits
@pytest.mark.heavy
def test_fork_bomb_hits_the_pids_limit_and_everything_stays_up(srv):
    srv.sh("mkdir -p /workspace/bomb; rm -f /workspace/bomb/*", sandbox="bomb")
    assert not srv.call("write_file", path="/tmp/bomb.py", content=FORK_BOMB, sandbox="bomb")[1]
    # The bomb's refusals land in its workspace, which the test sees on the host.
    refused = volume_dir(srv.env, "bomb") / "workspace" / "bomb"
    result = {}

    def bomb():
        # A vm's guest (TCG) needs longer to fork its way to the limit.
        result["r"] = srv.client.call_raw("exec", command=f"python3 /tmp/bomb.py {4 * WAIT_SCALE}", sandbox="bomb",
                                          timeout=120 * WAIT_SCALE, call_timeout=120 * WAIT_SCALE + 60)

    t = threading.Thread(target=bomb)
    t.start()
    try:
        # At the limit: forks are refused with EAGAIN (the pids cgroup), and
        # meanwhile the server and the other sandboxes answer.
        assert wait_for(lambda: (refused / "refused-11").exists(), timeout=30 * WAIT_SCALE), \
            "no fork was ever refused"
        out, err, code = srv.sh("echo still-here", sandbox=BYSTANDER)
        assert (out, code) == ("still-here\n", 0), err
        # A vm's guest at the limit answers slowly under TCG, not never.
        stats, stats_err = srv.call("stats", sandbox="bomb", call_timeout=60 * WAIT_SCALE)
        assert "no active sandbox" not in stats, stats
        pids = [int(line.split()[1]) for line in stats.splitlines() if line.startswith("PIDs:")]
        assert stats_err or (pids and pids[0] <= 1024), stats
    finally:
        t.join()
    # Only the sandbox's own limits refused forks: pids (EAGAIN), perhaps its
    # memory (ENOMEM) with a thousand processes.
    assert {"refused-11"} <= set(os.listdir(refused)) <= {"refused-11", "refused-12"}, os.listdir(refused)
    assert not result["r"].is_error, result["r"]
    # The sandbox recovers once the bomb is over.
    assert wait_for(lambda: srv.sh("echo recovered", sandbox="bomb")[0] == "recovered\n", timeout=30)
    assert_unaffected(srv, "bomb")


@needs_cgroup_limits
@pytest.mark.heavy
def test_memory_limit_holds_and_the_sandbox_survives(srv):
    # 1 GiB written in a sandbox limited to 512 MiB: the kernel kills the
    # hog (the sandbox's OOM), not the host; the sandbox keeps answering.
    out, err, code = srv.sh("python3 -c 'x = b\"x\" * (1 << 30); print(len(x))'", sandbox="hog", timeout=120)
    assert code == 137 and "1073741824" not in out, (out, err, code)
    stats, _ = srv.call("stats", sandbox="hog")
    assert "/ 512.0MB" in stats, stats
    assert_unaffected(srv, "hog")
