"""`status` and `list_all` report real liveness (issue 9, finding 5): a
sandbox whose VM the helper still calls running but whose agent does not
answer (here: the whole sandbox stopped with SIGSTOP from the host) is
`dead`, and `alive` again once it answers."""
import os
import re
import signal

from waiting import wait_for


def _ppid(pid: str) -> str:
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]


def sandbox_processes(tag: str) -> list[int]:
    """Host pids of the sandbox holding the process `sleep <tag>`: its
    `sandbox-vm-init` and every descendant."""
    want = f"sleep\0{tag}\0".encode()
    init = None
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            if open(f"/proc/{d}/cmdline", "rb").read() == want:
                pid = d
                while pid not in ("0", "1"):
                    pid = _ppid(pid)
                    if open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"sandbox-vm-init"):
                        init = pid
                        break
        except OSError:
            continue
    assert init, "the sandbox's init process was not found"
    tree = {init}
    changed = True
    while changed:
        changed = False
        for d in filter(str.isdigit, os.listdir("/proc")):
            try:
                if d not in tree and _ppid(d) in tree:
                    tree.add(d)
                    changed = True
            except OSError:
                continue
    return [int(p) for p in tree]


def shell_state(srv, name: str) -> str | None:
    text, _ = srv.tool("status")
    m = re.search(rf"^  {re.escape(name)} .*shell:(\w+)", text, re.M)
    return m.group(1) if m else None


def test_a_stopped_sandbox_is_reported_dead_then_alive_again(server_factory):
    srv = server_factory()
    assert not srv.tool("exec", command="sleep 4377 >/dev/null 2>&1 &")[1]
    assert not srv.tool("exec", command="true", sandbox="other")[1]
    assert shell_state(srv, "default") == "alive"
    pids = sandbox_processes("4377")
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    try:
        assert shell_state(srv, "default") == "dead", srv.tool("status")[0]
        assert shell_state(srv, "other") == "alive", srv.tool("status")[0]
        table, _ = srv.tool("list_all")
        assert re.search(r"^default\s.*\bdead\b", table, re.M), table
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert wait_for(lambda: shell_state(srv, "default") == "alive", timeout=20), srv.tool("status")[0]
