"""Sandbox hardening seen from inside a real sandbox through the MCP client:
the seccomp filter's socket and io_uring rules, whole process trees ended by
timeouts, cancellation and `kill`, and out-of-memory kills that leave the
sandbox answering."""
from __future__ import annotations

import json
from typing import Callable, Iterator

import pytest

from conftest import needs_cgroup_limits, required_env
from mcp_client import McpClient
from waiting import poll

# Socket families and types as the sandbox's kernel numbers them (x86_64 and
# aarch64 agree on these).
SECCOMP_PROBE = r"""
import ctypes, errno, json, socket
libc = ctypes.CDLL(None, use_errno=True)
def sock(family, kind, proto=0):
    try:
        socket.socket(family, kind, proto).close()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def syscall(nr):
    ret = libc.syscall(nr, 0, 0, 0, 0, 0)
    return "ok" if ret >= 0 else errno.errorcode[ctypes.get_errno()]
URING = {"x86_64": (425, 426, 427), "aarch64": (425, 426, 427)}
import platform
setup, enter, register = URING[platform.machine()]
print(json.dumps({
    "packet_raw": sock(socket.AF_PACKET, socket.SOCK_RAW),
    "packet_dgram": sock(socket.AF_PACKET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC),
    "icmp_raw": sock(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    "icmp_raw_nonblock": sock(socket.AF_INET, socket.SOCK_RAW | socket.SOCK_NONBLOCK, socket.IPPROTO_ICMP),
    "icmp6_raw": sock(socket.AF_INET6, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.IPPROTO_ICMPV6),
    "inet_packet": sock(socket.AF_INET, 10, socket.htons(3)),
    "inet_packet_nonblock": sock(socket.AF_INET, 10 | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC, socket.htons(3)),
    "inet6_packet": sock(socket.AF_INET6, 10, socket.htons(3)),
    "vsock": sock(40, socket.SOCK_STREAM),
    "io_uring_setup": syscall(setup),
    "io_uring_enter": syscall(enter),
    "io_uring_register": syscall(register),
    "tcp": sock(socket.AF_INET, socket.SOCK_STREAM),
    "udp": sock(socket.AF_INET, socket.SOCK_DGRAM),
    "tcp6": sock(socket.AF_INET6, socket.SOCK_STREAM | socket.SOCK_CLOEXEC),
    "unix": sock(socket.AF_UNIX, socket.SOCK_STREAM),
    "netlink": sock(socket.AF_NETLINK, socket.SOCK_RAW, 0),
}))
"""


@pytest.fixture
def stdio(env: dict[str, str]) -> Iterator[Callable[..., McpClient]]:
    """Starts `sandbox-mcp` over stdio in `env` (these tests are about the
    sandbox, not the transport); every client is closed at teardown."""
    clients: list[McpClient] = []

    def start(**extra_env: str) -> McpClient:
        log = f"{env['SANDBOX_MCP_TEST_TMP']}/server-{len(clients)}.log"
        clients.append(McpClient(required_env("SANDBOX_MCP_BIN"), env={**env, **extra_env}, stderr_path=log))
        return clients[-1]

    try:
        yield start
    finally:
        for c in clients:
            c.close()


def output(text: str) -> str:
    """The command's output without the duration line exec appends."""
    return text.rsplit("\n(", 1)[0]


# ------------------------------------------------------------------ seccomp


def test_raw_sockets_vsock_and_io_uring_are_refused_and_ordinary_sockets_work(stdio):
    server = stdio()
    server.tool("write_file", path="/tmp/probe.py", content=SECCOMP_PROBE)
    text, err = server.tool("exec", command="python3 /tmp/probe.py")
    assert not err, text
    got = json.loads(output(text))
    assert got == {
        "packet_raw": "EPERM",
        "packet_dgram": "EPERM",
        "icmp_raw": "EPERM",
        "icmp_raw_nonblock": "EPERM",
        "icmp6_raw": "EPERM",
        "inet_packet": "EPERM",
        "inet_packet_nonblock": "EPERM",
        "inet6_packet": "EPERM",
        "vsock": "EPERM",
        "io_uring_setup": "ENOSYS",
        "io_uring_enter": "ENOSYS",
        "io_uring_register": "ENOSYS",
        "tcp": "ok",
        "udp": "ok",
        "tcp6": "ok",
        "unix": "ok",
        "netlink": "ok",
    }, got


def test_the_old_inet_spelling_of_a_packet_socket_is_refused(stdio):
    # socket(AF_INET, SOCK_PACKET) is turned into AF_PACKET by the kernel.
    server = stdio()
    text, err = server.tool(
        "exec", command='python3 -c "import socket; socket.socket(socket.AF_INET, 10, socket.htons(3))"'
    )
    assert "PermissionError" in text and "Operation not permitted" in text, text


def test_ip_still_reads_the_sandbox_network_over_netlink(stdio):
    server = stdio()
    text, err = server.tool("exec", command="python3 -c 'import socket; print(socket.if_nameindex())'")
    assert not err, text
    assert "'lo'" in text, text


# ------------------------------------------------------- whole process trees

# Every way a command can leave its process group: a new session, a new
# session from a subshell that exits (the sleeper is orphaned), and a nohup'ed
# double fork. Each sleeper has its own duration so the count below finds
# exactly these.
ESCAPERS = (
    "setsid sleep 1001 & "
    "(setsid sh -c 'sleep 1002' &) ; "
    "nohup sh -c '(sleep 1003 &) ; sleep 1004' >/dev/null 2>&1 & "
)
COUNT_ESCAPERS = (
    "for p in /proc/[0-9]*; do { tr '\\0' ' ' < $p/cmdline; } 2>/dev/null; echo; done | grep -c '^sleep 100[0-9] ' || true"
)


def escapers_running(server: McpClient) -> int:
    text, err = server.tool("exec", command=COUNT_ESCAPERS)
    assert not err, text
    return int(output(text))


def wait_for_escapers(server: McpClient, n: int) -> bool:
    return poll(lambda: escapers_running(server), lambda k: k == n) is not None


def test_an_exec_timeout_ends_every_process_the_command_started(stdio):
    server = stdio()
    text, err = server.tool("exec", command=ESCAPERS + "sleep 1005", timeout=3)
    assert "timed out" in text.lower(), text
    assert wait_for_escapers(server, 0), f"{escapers_running(server)} sleepers survived the timeout"


def test_killing_a_background_process_ends_its_whole_tree(stdio):
    server = stdio()
    text, err = server.tool("bg", command=ESCAPERS + "echo started; sleep 1005", name="tree")
    assert not err, text
    assert wait_for_escapers(server, 5), escapers_running(server)
    text, err = server.tool("kill", name="tree")
    assert not err, text
    assert escapers_running(server) == 0, "kill returned before the tree was gone"


def test_killing_a_background_process_ends_descendants_that_ignore_term(stdio):
    # The leader dies of the TERM at once; its setsid'ed child ignores TERM
    # and is reparented away before the KILL.
    server = stdio()
    text, err = server.tool(
        "bg", command="setsid sh -c 'trap \"\" TERM; sleep 1007 & wait' & sleep 1008", name="stubborn"
    )
    assert not err, text
    assert wait_for_escapers(server, 2), escapers_running(server)
    text, err = server.tool("kill", name="stubborn")
    assert not err, text
    assert wait_for_escapers(server, 0), f"{escapers_running(server)} sleepers survived kill"


# A command that first tries to stop being a child subreaper (so that its
# orphans would reparent to PID 1, out of the tree), then orphans two
# sleepers through setsid and a double fork.
UNREAPER = r"""
import ctypes, os, subprocess, time
libc = ctypes.CDLL(None, use_errno=True)
ret = libc.prctl(36, 0, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER, 0
print("clear subreaper:", "ok" if ret == 0 else os.strerror(ctypes.get_errno()), flush=True)
subprocess.run("(setsid sh -c 'sleep 1001' &) ; (setsid sleep 1002 &)", shell=True)
time.sleep(600)
"""


def test_a_command_cannot_stop_being_a_subreaper_to_escape_a_timeout(stdio):
    server = stdio()
    server.tool("write_file", path="/tmp/unreaper.py", content=UNREAPER)
    text, err = server.tool("exec", command="exec python3 /tmp/unreaper.py", timeout=3)
    assert "clear subreaper: Operation not permitted" in text, text
    assert "timed out" in text.lower(), text
    assert wait_for_escapers(server, 0), f"{escapers_running(server)} sleepers survived the timeout"


def test_a_command_cannot_stop_being_a_subreaper_to_escape_kill(stdio):
    server = stdio()
    server.tool("write_file", path="/tmp/unreaper.py", content=UNREAPER)
    text, err = server.tool("bg", command="exec python3 /tmp/unreaper.py", name="unreaper")
    assert not err, text
    assert wait_for_escapers(server, 2), escapers_running(server)
    text, err = server.tool("logs", name="unreaper")
    assert "clear subreaper: Operation not permitted" in text, text
    text, err = server.tool("kill", name="unreaper")
    assert not err, text
    assert wait_for_escapers(server, 0), f"{escapers_running(server)} sleepers survived kill"


# A command that makes its child a sibling with a raw clone(CLONE_PARENT):
# the child's parent would be the agent, outside the tree a timeout or `kill`
# walks, and after setsid nothing else would find it.
SIBLING = r"""
import ctypes, os, platform, time
libc = ctypes.CDLL(None, use_errno=True)
SYS_clone = {"x86_64": 56, "aarch64": 220}[platform.machine()]
CLONE_PARENT, SIGCHLD = 0x8000, 17
zero = ctypes.c_long(0)
pid = libc.syscall(ctypes.c_long(SYS_clone), ctypes.c_long(CLONE_PARENT | SIGCHLD), zero, zero, zero, zero)
if pid == 0:
    os.setsid()
    os.execvp("sleep", ["sleep", "1001"])
print("clone parent:", "ok" if pid > 0 else os.strerror(ctypes.get_errno()), flush=True)
time.sleep(600)
"""


def test_a_command_cannot_hand_a_child_to_the_agent_to_escape_a_timeout(stdio):
    server = stdio()
    server.tool("write_file", path="/tmp/sibling.py", content=SIBLING)
    text, err = server.tool("exec", command="exec python3 /tmp/sibling.py", timeout=3)
    assert "timed out" in text.lower(), text
    assert wait_for_escapers(server, 0), f"{escapers_running(server)} sleepers survived the timeout"
    assert "clone parent: Operation not permitted" in text, text


def test_a_command_cannot_hand_a_child_to_the_agent_to_escape_kill(stdio):
    server = stdio()
    server.tool("write_file", path="/tmp/sibling.py", content=SIBLING)
    text, err = server.tool("bg", command="exec python3 /tmp/sibling.py", name="sibling")
    assert not err, text
    logs = poll(lambda: server.tool("logs", name="sibling")[0], lambda t: "clone parent:" in t)
    text, err = server.tool("kill", name="sibling")
    assert not err, text
    assert wait_for_escapers(server, 0), f"{escapers_running(server)} sleepers survived kill"
    assert logs is not None and "clone parent: Operation not permitted" in logs, logs


def test_a_cancelled_exec_ends_every_process_the_command_started(stdio):
    server = stdio()
    server.tool("exec", command="true")
    try:
        server._run(
            lambda s: s.call_tool("exec", {"command": ESCAPERS + "sleep 1005"}, read_timeout_seconds=2),
            30,
            "cancelled exec",
        )
    except AssertionError:
        pass  # the client gave up: it sends notifications/cancelled
    assert wait_for_escapers(server, 0), f"{escapers_running(server)} sleepers survived the cancellation"


def test_what_a_finished_exec_leaves_running_keeps_running(stdio):
    # Documented: a command that exits normally may leave work behind, as in
    # a terminal; only a timeout, a cancellation or `kill` end a tree.
    server = stdio()
    text, err = server.tool("exec", command="sleep 1009 >/dev/null 2>&1 & echo left")
    assert not err and text.startswith("left\n"), text
    assert escapers_running(server) == 1


# ---------------------------------------------------------- out of memory


@needs_cgroup_limits
def test_filling_dev_shm_and_memory_kills_the_workload_not_the_sandbox(stdio):
    server = stdio()
    text, err = server.tool("exec", command="df -k --output=size /dev/shm | tail -1")
    assert not err, text
    # A quarter of the default 512 MiB memory limit.
    assert int(output(text)) == 128 * 1024, text
    text, err = server.tool("exec", command="dd if=/dev/zero of=/dev/shm/fill bs=1M count=1024; echo dd=$?")
    assert not err, text
    assert "No space left on device" in text and "dd=1" in text, text
    # With /dev/shm full, allocate past the limit: the allocating process
    # is the OOM killer's choice, not PID 1 or the agent.
    text, err = server.tool("exec", command="python3 -c 'b = bytearray(1 << 30); print(len(b))'", timeout=120)
    assert not err, text
    assert "[exit code 137] (killed by signal 9)" in text, text
    text, err = server.tool("exec", command="echo still answering; ls /dev/shm")
    assert not err and output(text) == "still answering\nfill", text


def test_workloads_are_the_oom_killers_choice_before_pid1_and_the_agent(stdio):
    server = stdio()
    # PID 1 and the agent (its child) keep the lowest score the helper could
    # give them; what the agent starts sits 500 above, and cannot lower
    # itself below them.
    text, err = server.tool(
        "exec",
        command="cat /proc/1/oom_score_adj; cat /proc/$(cut -d' ' -f1 /proc/1/task/1/children)/oom_score_adj; "
        "cat /proc/self/oom_score_adj; echo -1000 > /proc/self/oom_score_adj; echo lower=$?",
    )
    assert not err, text
    lines = [line for line in output(text).split("\n") if not line.startswith("[stderr]")]
    pid1, agent, workload, lower = lines
    assert pid1 == agent, text
    assert int(workload) == max(int(agent), 0) + 500, text
    if int(agent) > -1000:
        # A floor above -1000 (rootless helper, or no CAP_SYS_RESOURCE):
        # lowering below it is refused.
        assert "lower=1" in lower, text
