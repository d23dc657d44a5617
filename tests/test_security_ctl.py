"""Security suite: sandbox-ctl abused from inside its sandbox. Spawning past
every budget (alone and by racing concurrent spawns), reaching sandboxes
that are not the parent's children, and malformed frames on the socket
(garbage, invalid UTF-8, deep nesting, oversize, pipelined, half-sent,
dribbled byte by byte). Each is refused with its protocol error, and the
API, the server and a bystander sandbox keep working afterwards.
"""
import json
import os
import re

import pytest

from security_support import BYSTANDER, assert_unaffected, sec_server

IMAGE = os.environ.get("SANDBOX_MCP_TEST_IMAGE", "mcp-test")

# Two CPUs and 320 MiB for at most three live children and eight spawns in all.
CTL_CONFIG = f"""
[spawn_policies.default]
inject_ctl = true
max_concurrent = 3
max_total = 8
total_child_cpus = 2
total_child_memory_mb = 320
child_max_cpus = 1
child_max_memory = "256M"
allowed_images = ["{IMAGE}"]
child_ttl = 0
"""

# One raw exchange per connection: `python3 /workspace/raw.py CASE`.
RAW = r"""
import json, select, socket, sys, threading, time
SOCK = "/run/sandbox-ctl.sock"

def conn():
    s = socket.socket(socket.AF_UNIX)
    s.connect(SOCK)
    s.settimeout(60)
    return s

def answer(s):
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace")

def exchange(payload, shut=True):
    s = conn()
    s.sendall(payload)
    if shut:
        s.shutdown(socket.SHUT_WR)
    return answer(s)

case = sys.argv[1]
out = {}
if case == "frames":
    frames = {
        "garbage": bytes(range(256)) + b"\n",
        "invalid_utf8": b'{"id": 1, "method": "\xff\xfe"}\n',
        "nul": b'{"id": 1, "method": "pi\x00ng"}\n',
        "nul_escaped": b'{"id": 1, "method": "pi\\u0000ng"}\n',
        "spawn_nul_name": b'{"id": 1, "method": "spawn", "params": {"name": "a\\u0000b"}}\n',
        "deep": b"[" * 30000 + b"]" * 30000 + b"\n",
        "deep_object": b'{"a":' * 10000 + b"1" + b"}" * 10000 + b"\n",
        "huge_number": b'{"id": 1e999999, "method": "ping"}\n',
        "empty": b"\n",
        "only_eof": b"",
        "partial": b'{"id": 1, "meth',
        "spawn_bad_types": b'{"id": 2, "method": "spawn", "params": {"name": ["x"], "cpus": {"a": 1}}}\n',
        "spawn_negative": b'{"id": 3, "method": "spawn", "params": {"cpus": -5}}\n',
        "spawn_huge_memory": b'{"id": 4, "method": "spawn", "params": {"memory": "99999999999999999999999G"}}\n',
        "spawn_tiny_memory": b'{"id": 5, "method": "spawn", "params": {"memory": "1M"}}\n',
        "spawn_bad_name": b'{"id": 6, "method": "spawn", "params": {"name": "../../etc"}}\n',
        "exec_long_timeout": b'{"id": 7, "method": "exec", "params": {"name": "x", "command": "true", "timeout": 1e300}}\n',
        "exec_negative_timeout": b'{"id": 8, "method": "exec", "params": {"name": "x", "command": "true", "timeout": -1}}\n',
    }
    for name, payload in frames.items():
        out[name] = exchange(payload)
    # Two requests on one connection: only the first is read and answered.
    out["pipelined"] = exchange(b'{"id": "one", "method": "ping"}\n{"id": "two", "method": "ping"}\n')
    # A request whose sender goes away before reading the answer.
    s = conn()
    s.sendall(b'{"id": 9, "method": "list"}\n')
    s.close()
    out["after"] = exchange(b'{"id": "after", "method": "ping"}\n')
elif case == "oversize":
    # 10 MB without a newline: refused after 64 KiB, never buffered whole.
    s = conn()
    try:
        for _ in range(160):
            s.sendall(b"a" * 65536)
    except OSError:
        pass  # the server stopped reading and closed: that is the point
    out["oversize"] = answer(s)
    # Just over the limit, then the newline and EOF.
    out["just_over"] = exchange(b'{"id": 1, "method": "ping", "p": "' + b"a" * 65536 + b'"}\n')
    out["after"] = exchange(b'{"id": "after", "method": "ping"}\n')
elif case == "fake":
    # A stand-in server that reads the request and hangs up without an
    # answer (or answers 2 MiB): the CLI must not send the request again.
    import os, subprocess
    path = "/tmp/fake-ctl.sock"
    for mode in ("hangup", "huge"):
        if os.path.exists(path):
            os.unlink(path)
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(path)
        srv.listen(8)
        seen, done = [], threading.Event()
        def serve():
            srv.settimeout(0.1)
            while not done.is_set():
                try:
                    c, _ = srv.accept()
                except socket.timeout:
                    continue
                c.settimeout(10)
                seen.append(c.makefile("rb").readline())
                if mode == "huge":
                    try:
                        c.sendall(b'{"id": "x", "result": "' + b"a" * (2 << 20) + b'"}\n')
                    except OSError:
                        pass  # the CLI stopped reading past its cap
                c.close()
        t = threading.Thread(target=serve)
        t.start()
        # The CLI has made every connection it will make once it exits.
        r = subprocess.run(["sandbox-ctl", "spawn", "--name", "once"], env={**os.environ, "SANDBOX_CTL_SOCK": path},
                           capture_output=True, text=True)
        done.set()
        t.join()
        out[mode] = {"code": r.returncode, "stderr": r.stderr, "requests": len(seen)}
elif case == "dribble":
    # Eight connections that each send a byte now and then but never a whole
    # line hold every slot; a ninth must still be answered.
    slow = [conn() for _ in range(8)]
    stop = time.monotonic() + 30
    def dribble():
        while time.monotonic() < stop:
            for s in slow:
                try:
                    s.send(b"{")
                except OSError:
                    pass
            time.sleep(0.3)
    threading.Thread(target=dribble, daemon=True).start()
    time.sleep(0.5)
    out["late"] = exchange(b'{"id": "late", "method": "ping"}\n')
    ready, _, _ = select.select(slow, [], [], 30)
    out["evicted"] = answer(ready[0]) if ready else "none evicted"
elif case == "race":
    # Ten spawns at once, each on its own connection.
    results = [None] * 10
    def spawn(i):
        results[i] = exchange(json.dumps({"id": i, "method": "spawn", "params": {"cpus": 1, "memory": "96M"}}).encode() + b"\n")
    threads = [threading.Thread(target=spawn, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["results"] = results
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def srv(ctl_bin):
    with sec_server(CTL_CONFIG, SANDBOX_CTL_BIN=ctl_bin) as s:
        assert not s.call("write_file", path="/workspace/raw.py", content=RAW)[1]
        out, err, code = s.sh("sandbox-ctl ping")
        assert (out, code) == ("ok (parent: default)\n", 0), err
        yield s


def raw(srv, case: str, timeout: float = 120) -> dict:
    out, err, code = srv.sh(f"python3 /workspace/raw.py {case}", timeout=timeout)
    assert code == 0, (out, err)
    return json.loads(out)


def error_of(line: str) -> tuple[str, str]:
    r = json.loads(line)
    return r["error"]["code"], r["error"]["message"]


def ctl(srv, args: str) -> tuple[str, str, int]:
    return srv.sh(f"sandbox-ctl {args}", timeout=120)


def children(srv) -> list[tuple[str, int, int]]:
    """(name, cpus, MiB) of each live child of `default`, from sandbox-ctl list."""
    out, _, code = ctl(srv, "--json list")
    assert code == 0, out
    return [(c["name"], c["cpus"], c["memory_mb"]) for c in json.loads(out)["children"]]


def destroy_all(srv) -> None:
    for name, _, _ in children(srv):
        assert ctl(srv, f"destroy {name}")[2] == 0


def test_malformed_frames_get_their_error_and_the_api_stays_up(srv):
    got = raw(srv, "frames")
    invalid = "INVALID_REQUEST"
    for name in ("garbage", "invalid_utf8", "nul", "deep", "deep_object", "huge_number", "empty", "partial"):
        code, msg = error_of(got[name])
        assert (code, msg.split(":")[0]) == (invalid, "Invalid JSON"), (name, msg)
    assert error_of(got["nul_escaped"]) == (invalid, "Unknown method: pi\x00ng"), got["nul_escaped"]
    assert error_of(got["spawn_nul_name"]) == (invalid, "Invalid child name: a\x00b"), got["spawn_nul_name"]
    assert got["only_eof"] == "", got["only_eof"]  # nothing asked, nothing answered
    code, msg = error_of(got["spawn_bad_types"])
    assert code == invalid and msg.startswith("params."), msg
    assert error_of(got["spawn_negative"]) == ("INVALID_REQUEST", "cpus must be >= 1"), got["spawn_negative"]
    assert error_of(got["spawn_huge_memory"]) == (invalid, "Invalid memory string: 99999999999999999999999G")
    assert error_of(got["spawn_tiny_memory"]) == (invalid, "memory must be >= 64M")
    assert error_of(got["spawn_bad_name"]) == (invalid, "Invalid child name: ../../etc")
    for name in ("exec_long_timeout", "exec_negative_timeout"):
        assert error_of(got[name])[0] == invalid, got[name]
    assert json.loads(got["pipelined"]) == {"id": "one", "result": {"ok": True, "parent": "default"}}
    assert json.loads(got["after"])["result"]["ok"] is True
    # Nothing was spawned by any of it.
    assert children(srv) == []
    text, _ = srv.call("children")
    assert text == "No active children for 'default' (0/8 lifetime spawns used)", text
    assert_unaffected(srv, "default")


def test_weakness_53_an_oversize_request_is_answered_not_dropped(srv):
    got = raw(srv, "oversize")
    assert error_of(got["oversize"]) == ("INVALID_REQUEST", "Request too long"), got["oversize"]
    assert error_of(got["just_over"]) == ("INVALID_REQUEST", "Request too long"), got["just_over"]
    assert json.loads(got["after"])["result"]["ok"] is True
    assert_unaffected(srv, "default")


@pytest.mark.heavy
def test_weakness_54_dribbling_connections_cannot_hold_the_api(srv):
    # The reference let 8 idle connections block a parent's API for 300 s;
    # a client that sends a byte at a time must not reset that clock.
    got = raw(srv, "dribble", timeout=90)
    assert json.loads(got["late"]) == {"id": "late", "result": {"ok": True, "parent": "default"}}
    assert error_of(got["evicted"]) == ("INVALID_REQUEST", "Read timeout"), got["evicted"]
    assert_unaffected(srv, "default")


def test_racing_spawns_never_exceed_a_budget(srv):
    destroy_all(srv)
    got = raw(srv, "race")
    answers = [json.loads(line) for line in got["results"]]
    ok = [a for a in answers if "result" in a]
    refused = [a["error"] for a in answers if "error" in a]
    # Two CPUs of budget at one CPU each: two win, every other one is told why.
    assert len(ok) == 2, answers
    assert {(e["code"], e["message"]) for e in refused} <= {
        ("LIMIT_REACHED", "Aggregate child CPU budget exceeded"),
        ("LIMIT_REACHED", "Concurrent child limit reached"),
        ("LIMIT_REACHED", "Aggregate child memory budget exceeded"),
    }, refused
    live = children(srv)
    assert len(live) == 2 and sum(c for _, c, _ in live) <= 2 and sum(m for _, _, m in live) <= 320, live
    assert_unaffected(srv, "default", *[n for n, _, _ in live])


def test_ctl_reaches_only_the_parents_own_children(srv):
    # The socket speaks for its parent only: a top-level sandbox (or the
    # parent itself) is no child, whatever the name.
    for target in (BYSTANDER, "default", "../bystander"):
        _, err, code = ctl(srv, f"exec {target} -- cat /workspace/bystander.txt")
        assert code == 1 and srv.marker not in err, err
        assert re.fullmatch(rf"sandbox-ctl: (NOT_FOUND: Child '{re.escape(target)}' not found under 'default'"
                            r"|INVALID_REQUEST: .*)\n", err), err
        _, err, code = ctl(srv, f"destroy {target}")
        assert code == 1, err
    assert_unaffected(srv, "default")


def test_weakness_55_the_cli_never_sends_a_request_twice(srv):
    got = raw(srv, "fake")
    hangup, huge = got["hangup"], got["huge"]
    assert hangup["code"] == 1 and hangup["requests"] == 1, hangup
    assert huge["code"] == 1 and huge["requests"] == 1 and "response exceeds 1048576 bytes" in huge["stderr"], huge
    # Nothing reached the real server either.
    assert "once" not in [n for n, _, _ in children(srv)]


def test_weakness_56_ctl_exec_and_run_parameters_are_checked(srv):
    destroy_all(srv)
    assert ctl(srv, "spawn --name w56")[2] == 0
    # Timeouts are bounded, workdirs created, ids of any JSON type echoed.
    _, err, code = ctl(srv, "exec w56 --timeout 7200 -- true")
    assert code == 1 and err.startswith("sandbox-ctl: INVALID_REQUEST: timeout"), err
    assert ctl(srv, "exec w56 --workdir /tmp/w56/new -- pwd")[:3:2] == ("/tmp/w56/new\n", 0)
    out, err, code = srv.py("""
import json, socket
for rid in ("s", 7, [1], {"a": 1}, None):
    s = socket.socket(socket.AF_UNIX)
    s.connect("/run/sandbox-ctl.sock")
    s.sendall(json.dumps({"id": rid, "method": "ping"}).encode() + b"\\n")
    print(json.dumps(json.loads(s.makefile().readline())["id"]))
""")
    assert (out, code) == ('"s"\n7\n[1]\n{"a": 1}\nnull\n', 0), (out, err)
    destroy_all(srv)


def test_spawning_past_each_budget_is_refused(srv):
    destroy_all(srv)
    used = int(re.search(r"\((\d+)/8 lifetime", srv.call("children")[0]).group(1))
    assert used <= 5, used
    # Over the per-child ceilings: clamped to them, never more.
    out, err, code = ctl(srv, "--json spawn --name big --cpus 64 --memory 64G")
    assert code == 0, err
    assert (json.loads(out)["cpus"], json.loads(out)["memory_mb"]) == (1, 256), out
    out, err, code = ctl(srv, "spawn --name second --memory 128M")
    assert code == 1 and err == "sandbox-ctl: LIMIT_REACHED: Aggregate child memory budget exceeded\n", err
    out, err, code = ctl(srv, "spawn --name second --memory 64M")
    assert code == 0, err
    out, err, code = ctl(srv, "spawn --name third --memory 64M")
    assert code == 1 and err == "sandbox-ctl: LIMIT_REACHED: Aggregate child CPU budget exceeded\n", err
    # The lifetime count never goes back, whatever is destroyed.
    destroy_all(srv)
    while True:
        out, err, code = ctl(srv, "run -- true")
        if code != 0:
            break
    assert err == "sandbox-ctl: LIMIT_REACHED: Lifetime spawn limit reached\n", err
    _, err, code = ctl(srv, "spawn --name late")
    assert code == 1 and "Lifetime spawn limit reached" in err, err
    text, _ = srv.call("children")
    assert text == "No active children for 'default' (8/8 lifetime spawns used)", text
    assert_unaffected(srv, "default")
