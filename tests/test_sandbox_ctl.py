"""sandbox-ctl from inside a sandbox: the CLI's commands, output and exit
codes (internals §16), and every error code of the NDJSON protocol (§15)
spoken raw to /run/sandbox-ctl.sock with python3."""
import base64
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from conftest import CTL_RAW_CLIENT as RAW_CLIENT, stop_daemon, write_config
from test_persistence import rows

IMAGE = os.environ.get("SANDBOX_MCP_TEST_IMAGE", "mcp-test")

CTL_CONFIG = f"""
[spawn_policies.default]
inject_ctl = true
max_concurrent = 2
max_total = 8
total_child_cpus = 4
total_child_memory_mb = 1024
child_max_cpus = 1
child_max_memory = "256M"
allowed_images = ["{IMAGE}"]
child_ttl = 0
"""

def sh(srv, command: str, sandbox: str = "default", timeout: int = 120) -> tuple[str, str, int]:
    """Runs a shell command in a sandbox: (stdout, stderr, exit code)."""
    r = srv.call_raw("exec", command=command, sandbox=sandbox, timeout=timeout, call_timeout=timeout + 30)
    out = r.structured_content
    assert out is not None, r
    return out["stdout"], out["stderr"], out["exit_code"]


@pytest.fixture
def ctl_srv(server_factory, env, ctl_bin):
    write_config(env, CTL_CONFIG)
    srv = server_factory(SANDBOX_CTL_BIN=ctl_bin)
    out, err, code = sh(srv, "ls -l /usr/local/bin/sandbox-ctl /run/sandbox-ctl.sock")
    assert code == 0, err
    return srv


def test_cli_commands(ctl_srv):
    srv = ctl_srv
    assert sh(srv, "sandbox-ctl ping") == ("ok (parent: default)\n", "", 0)
    out, _, code = sh(srv, "sandbox-ctl -h")
    assert code == 0 and out.startswith("Usage: sandbox-ctl [--json] <command>"), out
    out, err, code = sh(srv, "sandbox-ctl frobnicate")
    assert code == 1 and out == "" and err.startswith("sandbox-ctl: unknown command: frobnicate\nUsage:"), err
    _, err, code = sh(srv, "sandbox-ctl --bogus ping")
    assert code == 1 and "unknown flag: --bogus" in err, err

    assert sh(srv, "sandbox-ctl spawn --name w1 --memory 128M") == ("default..w1\n", "", 0)
    out, _, code = sh(srv, "sandbox-ctl list")
    lines = out.splitlines()
    assert code == 0 and re.fullmatch(r"NAME +IMAGE +CPUS +MEM\(MB\) +TTL", lines[0]), out
    assert re.fullmatch(rf"default\.\.w1 +{IMAGE} +1 +128 +-", lines[1]), out
    text, _ = srv.tool("children")
    assert text.startswith("Children of 'default' (1 active):\n  default..w1: default..w1 (1 CPUs, 128MB"), text

    out, err, code = sh(srv, "sandbox-ctl exec w1 -- sh -c 'echo out; echo err1 >&2; echo err2 >&2; exit 3'")
    assert (out, err, code) == ("out\n", "[stderr] err1\n[stderr] err2\n", 3)
    # A remote exit code outside 0..255 (here -1, a timeout) becomes 1.
    out, err, code = sh(srv, "sandbox-ctl exec w1 --timeout 1 -- sleep 10")
    assert code == 1 and "[stderr] Timed out after 1s" in err, (out, err)
    out, _, code = sh(srv, "sandbox-ctl exec w1 --workdir /tmp/new/dir -- pwd")
    assert (out, code) == ("/tmp/new/dir\n", 0)
    # The command ran in the child, through its audit log.
    text, _ = srv.tool("history", sandbox="default..w1")
    assert "echo out" in text, text

    out, _, code = sh(srv, "sandbox-ctl --json exec w1 -- echo it\\'s")
    result = json.loads(out)
    assert code == 0 and result["name"] == "default..w1" and result["result"]["stdout"] == "it's\n", out

    out, _, code = sh(srv, "sandbox-ctl run -- sh -c 'echo ran in $(hostname)'")
    assert code == 0 and out.startswith("ran in "), out
    out, _, _ = sh(srv, "sandbox-ctl --json list")
    assert [c["name"] for c in json.loads(out)["children"]] == ["default..w1"], out
    assert sh(srv, "sandbox-ctl destroy w1") == ("w1\n", "", 0)
    out, _, _ = sh(srv, "sandbox-ctl list")
    assert out.splitlines()[1:] == [], out
    # spawn w1, run's child, and nothing else counted.
    text, _ = srv.tool("children")
    assert text == "No active children for 'default' (2/8 lifetime spawns used)", text

    _, err, code = sh(srv, "sandbox-ctl destroy ghost")
    assert code == 1 and err == "sandbox-ctl: NOT_FOUND: Child 'ghost' not found under 'default'\n", err
    _, err, code = sh(srv, "SANDBOX_CTL_SOCK=/nonexistent sandbox-ctl ping")
    assert code == 1 and err.startswith("sandbox-ctl: cannot connect to /nonexistent"), err


def raw(srv, payload: bytes | str) -> dict:
    arg = "big" if payload == "big" else base64.b64encode(payload).decode()
    out, err, code = sh(srv, f"python3 /workspace/raw.py {arg}")
    assert code == 0, err
    assert out.endswith("\n") and out.count("\n") == 1, out
    return json.loads(out)


def test_protocol_error_codes(ctl_srv):
    srv = ctl_srv
    text, err = srv.call("write_file", path="/workspace/raw.py", content=RAW_CLIENT)
    assert not err, text

    def error(payload) -> tuple[object, str, str]:
        r = raw(srv, payload)
        return r["id"], r["error"]["code"], r["error"]["message"]

    rid, code, msg = error(b"{not json\n")
    assert (rid, code) == (None, "INVALID_REQUEST") and msg.startswith("Invalid JSON: "), msg
    assert error(b"[1, 2]\n") == (None, "INVALID_REQUEST", "Request must be a JSON object")
    assert error(b'{"id": 1}\n') == (1, "INVALID_REQUEST", "Missing method")
    assert error(b'{"id": "a", "method": "ping", "params": [1]}\n') == ("a", "INVALID_REQUEST", "params must be an object")
    assert error(b'{"id": 2, "method": "nope"}\n') == (2, "INVALID_REQUEST", "Unknown method: nope")
    assert error("big") == (None, "INVALID_REQUEST", "Request too long")
    assert error(b'{"id": 3, "method": "spawn", "params": {"image": "other"}}\n') == (
        3, "PERMISSION_DENIED", "Image 'other' not allowed for children of 'default'")
    assert error(b'{"id": 4, "method": "destroy", "params": {"name": "ghost"}}\n') == (
        4, "NOT_FOUND", "Child 'ghost' not found under 'default'")
    assert error(b'{"id": 5, "method": "destroy"}\n') == (5, "INVALID_REQUEST", "params.name required")
    assert error(b'{"id": 6, "method": "exec", "params": {"name": "x", "command": "true", "timeout": 7200}}\n')[1] == (
        "INVALID_REQUEST")

    # Ids are echoed as given; a last line without newline (then EOF) is answered too.
    assert raw(srv, b'{"id": "s-1", "method": "ping"}\n') == {"id": "s-1", "result": {"ok": True, "parent": "default"}}
    assert raw(srv, b'{"id": null, "method": "ping"}')["id"] is None
    assert raw(srv, b'{"id": 1.5, "method": "ping", "params": null}\n')["id"] == 1.5

    for n in (1, 2):
        r = raw(srv, f'{{"id": {n}, "method": "spawn", "params": {{"name": "p{n}", "cpus": "1"}}}}\n'.encode())
        assert r["result"]["name"] == f"default..p{n}" and r["result"]["cpus"] == 1 and r["result"]["expires_at"] is None, r
    assert error(b'{"id": 7, "method": "spawn"}\n') == (7, "LIMIT_REACHED", "Concurrent child limit reached")
    r = raw(srv, b'{"id": 8, "method": "exec", "params": {"name": "p1", "command": "echo hi; exit 4"}}\n')
    assert r["result"]["name"] == "default..p1" and r["result"]["result"]["stdout"] == "hi\n", r
    assert r["result"]["result"]["exit_code"] == 4 and r["result"]["result"]["stderr"] == "", r


def test_no_ctl_without_inject_ctl(server_factory, env, ctl_bin):
    # The built-in policy lets `default` spawn but gives it no sandbox-ctl.
    srv = server_factory(SANDBOX_CTL_BIN=ctl_bin)
    _, _, code = sh(srv, "test -e /run/sandbox-ctl.sock || test -e /usr/local/bin/sandbox-ctl")
    assert code == 1
    assert not srv.call("spawn", name="kid", call_timeout=120)[1]
    _, _, code = sh(srv, "test -e /run/sandbox-ctl.sock", sandbox="default..kid")
    assert code == 1


def test_ctl_children_and_policy_mounts(server_factory, env, ctl_bin):
    # A child gets ctl only when its parent's policy lets it spawn; other
    # sandboxes never do.
    write_config(env, CTL_CONFIG.replace("child_ttl = 0", "child_ttl = 0\nchild_can_spawn = true"))
    srv = server_factory(SANDBOX_CTL_BIN=ctl_bin)
    assert sh(srv, "sandbox-ctl spawn --name kid") == ("default..kid\n", "", 0)
    assert sh(srv, "sandbox-ctl ping", sandbox="default..kid") == ("ok (parent: default..kid)\n", "", 0)
    assert sh(srv, "sandbox-ctl spawn --name grand", sandbox="default..kid") == ("default..kid..grand\n", "", 0)
    _, err, code = sh(srv, "sandbox-ctl spawn", sandbox="default..kid")
    assert code == 1 and err == "sandbox-ctl: LIMIT_REACHED: Concurrent child limit reached\n", err
    _, _, code = sh(srv, "test -e /run/sandbox-ctl.sock", sandbox="default..kid..grand")
    assert code == 1
    _, _, code = sh(srv, "test -e /run/sandbox-ctl.sock", sandbox="other")
    assert code == 1
    # Destroying the parent removes its socket with the subtree.
    assert not srv.call("destroy", sandbox="default")[1]
    sock_dir = os.path.join(env["XDG_RUNTIME_DIR"], "sandbox-mcp", "ctl", "default..kid")
    assert not os.path.exists(sock_dir)


def test_socket_dir_is_read_only_in_the_sandbox(ctl_srv, env):
    # It used to be handed to the sandbox's root: the sandbox could plant
    # files and symlinks in a host directory the server chmods paths in.
    _, err, code = sh(ctl_srv, "touch /run/sandbox-ctl/x; ln -s / /run/sandbox-ctl/y; rm -f /run/sandbox-ctl/ctl.sock")
    assert code == 1 and err.count("Read-only file system") == 3, err
    # The directory is named by the sandbox's key: `<project tag>-default`.
    (host_dir,) = Path(env["XDG_RUNTIME_DIR"], "sandbox-mcp", "ctl").glob("??????-default")
    assert os.listdir(host_dir) == ["ctl.sock"]
    assert sh(ctl_srv, "sandbox-ctl ping") == ("ok (parent: default)\n", "", 0)


def test_destroy_mid_grandchild_spawn_leaves_no_orphan(server_factory, env, ctl_bin):
    # A grandchild being spawned (under its parent's lock) while the root is
    # destroyed goes with the tree; it used to outlive its parent, running
    # outside every budget. The race is tried at several points of the spawn.
    write_config(env, CTL_CONFIG.replace("child_ttl = 0", "child_ttl = 0\nchild_can_spawn = true"))
    srv = server_factory(SANDBOX_CTL_BIN=ctl_bin)

    def spawn_grandchild():
        try:
            sh(srv, "sandbox-ctl spawn --name grand", sandbox="default..kid")
        except AssertionError:
            pass  # kid went away under the command: fine either way

    for delay in (0.0, 0.03, 0.06, 0.1):
        assert sh(srv, "sandbox-ctl spawn --name kid") == ("default..kid\n", "", 0)
        spawner = threading.Thread(target=spawn_grandchild)
        spawner.start()
        time.sleep(delay)
        assert not srv.call("destroy", sandbox="default")[1]
        spawner.join()
        text = srv.call("list_all")[0]
        assert text.startswith("No active sandboxes."), f"delay {delay}: {text}"


# Holds every connection slot with idle connections, then asks as a ninth.
SLOW_LORIS = r"""
import json, select, socket, time
SOCK = "/run/sandbox-ctl.sock"
idle = []
for _ in range(8):
    s = socket.socket(socket.AF_UNIX)
    s.connect(SOCK)
    idle.append(s)
time.sleep(0.5)
late = socket.socket(socket.AF_UNIX)
late.connect(SOCK)
late.sendall(b'{"id": "late", "method": "ping"}\n')
print(late.makefile().readline().strip())
ready, _, _ = select.select(idle, [], [], 10)
print(json.loads(ready[0].makefile().readline())["error"]["message"])
"""


def test_idle_connections_cannot_block_the_api(ctl_srv):
    srv = ctl_srv
    text, err = srv.call("write_file", path="/workspace/loris.py", content=SLOW_LORIS)
    assert not err, text
    out, err, code = sh(srv, "python3 /workspace/loris.py", timeout=90)
    assert code == 0, err
    late, evicted = out.splitlines()
    assert json.loads(late) == {"id": "late", "result": {"ok": True, "parent": "default"}}
    assert evicted == "Read timeout"


def test_ctl_and_spawn_state_survive_a_server_restart(server_factory, env, ctl_bin):
    write_config(env, CTL_CONFIG.replace("child_ttl = 0", "child_ttl = 0\nchild_can_spawn = true"))
    first = server_factory(SANDBOX_CTL_BIN=ctl_bin)
    assert sh(first, "sandbox-ctl spawn --name kid") == ("default..kid\n", "", 0)
    first.close()
    second = server_factory(SANDBOX_CTL_BIN=ctl_bin)
    # The sockets are listened on again; the mounted directory sees the new ones.
    assert sh(second, "sandbox-ctl ping") == ("ok (parent: default)\n", "", 0)
    assert sh(second, "sandbox-ctl ping", sandbox="default..kid") == ("ok (parent: default..kid)\n", "", 0)
    # The child is still the parent's, with its policy to spawn a grandchild.
    out, _, _ = sh(second, "sandbox-ctl list")
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["default..kid"], out
    assert sh(second, "sandbox-ctl spawn --name grand", sandbox="default..kid") == ("default..kid..grand\n", "", 0)


def test_spawn_counters_survive_a_server_restart(server_factory, env, ctl_bin):
    # The lifetime counters and derived policies travel in the state file.
    write_config(env, CTL_CONFIG.replace("child_ttl = 0", "child_ttl = 0\nchild_can_spawn = true"))
    first = server_factory(SANDBOX_CTL_BIN=ctl_bin)
    assert sh(first, "sandbox-ctl spawn --name kid") == ("default..kid\n", "", 0)
    assert sh(first, "sandbox-ctl spawn --name grand", sandbox="default..kid") == ("default..kid..grand\n", "", 0)
    # Committed before the tool answered: read as another process would.
    (spawn,) = rows(env, "SELECT value FROM meta WHERE key = 'spawn'")[0]
    saved = json.loads(spawn)
    # Keyed by `<project tag>-<name>`.
    seqs = {k.split("-", 1)[1]: v for k, v in saved.get("spawn_seqs", {}).items()}
    assert seqs == {"default": 1, "default..kid": 1}, saved
    (derived,) = [v for k, v in saved["derived_policies"].items() if k.endswith("-default..kid")]
    assert derived["max_total"] == 4
    first.close()
    stop_daemon(env)
    second = server_factory(SANDBOX_CTL_BIN=ctl_bin)
    text, _ = second.tool("children")
    assert text.endswith("Lifetime spawns: 1/8"), text
    text, _ = second.tool("children", parent="default..kid")
    assert text.endswith("Lifetime spawns: 1/4"), text


def test_run_honours_name_and_counts_as_a_spawn(ctl_srv):
    srv = ctl_srv
    assert not srv.call("write_file", path="/workspace/raw.py", content=RAW_CLIENT)[1]
    r = raw(srv, b'{"id": 1, "method": "run", "params": {"name": "once", "command": "hostname"}}\n')
    assert r["result"]["name"] == "default..once" and r["result"]["result"]["exit_code"] == 0, r
    text, _ = srv.tool("children")
    assert text == "No active children for 'default' (1/8 lifetime spawns used)", text


def test_a_sandbox_racing_children_onto_a_missing_image_gets_refusals_and_keeps_its_budget(
        server_factory, env, ctl_bin, image_store):
    """A sandbox whose policy allows an image the store does not have races six spawns and runs onto it at once:
    each is refused naming the image, no child is left, no lifetime spawn is used up (max_total is 2 here), and
    the sandbox then spawns on the test image as usual."""
    write_config(env, CTL_CONFIG.replace("max_total = 8", "max_total = 2")
                 .replace(f'allowed_images = ["{IMAGE}"]', f'allowed_images = ["{IMAGE}", "absent"]'))
    srv = server_factory(SANDBOX_CTL_BIN=ctl_bin, SANDBOX_MCP_IMAGE_STORE=image_store)
    race = " & ".join([f"sandbox-ctl spawn --image absent --name p{n} >/tmp/p{n}.out 2>&1; echo $? >>/tmp/p{n}.out"
                       for n in range(4)] + [f"sandbox-ctl run --image absent -- true >/tmp/r{n}.out 2>&1; "
                                             f"echo $? >>/tmp/r{n}.out" for n in range(2)])
    out, err, code = sh(srv, f"({race}) ; wait; for f in /tmp/p*.out /tmp/r*.out; do cat $f; echo ==; done")
    assert code == 0, err
    answers = [a for a in out.split("==\n") if a.strip()]
    assert len(answers) == 6, out
    for answer in answers:
        assert answer.rstrip().endswith("\n1"), answer
        assert "absent" in answer and "not found" in answer, answer
    text, _ = srv.tool("children")
    assert text == "No active children for 'default' (0/2 lifetime spawns used)", text
    assert sh(srv, f"sandbox-ctl spawn --image {IMAGE} --name real") == ("default..real\n", "", 0)
    assert sh(srv, "sandbox-ctl exec real -- echo alive")[:2] == ("alive\n", "")
