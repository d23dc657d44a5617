"""Security suite: the reference product's 56 known flaws
(shared/spec/weaknesses.md), one test per flaw that applies to this product,
named after its number, exercised through the tools; each would fail if we
had the flaw. Where an older test covers the flaw in depth, the one here is
small but still exercises it.

Tests elsewhere in the suite, by number:
  #53 oversize ctl request, #54 ctl slow-loris, #55 CLI retries, #56 ctl
  exec/run parameters: tests/test_security_ctl.py (they need its sandbox-ctl
  server).

Flaws that do not apply:
  #51 (text parsing of `container ls` tables): the orchestrator talks to the
      helper over a typed gRPC contract; no CLI output is ever parsed.
Parts of flaws kept on purpose:
  #50 `exec` creates a missing `workdir`: the reference's documented
      behaviour (`mkdir -p <workdir>`), kept for prompt compatibility; the
      flaw's other half (read-only tools booting sandboxes) is tested.
  #46 is about apk's `--no-cache`; the test checks the same property for
      apt (the package cache is a volume that outlives `reset`).

Items whose fixes land with issue 9 in parallel branches, so their tests
fail on the code before the merge: #9 (secrets in history and the state
file), #10 (git token readable by other processes), #18 and #44 (`setsid`
children surviving an exec's timeout and `kill` of a bg process).
"""
import base64
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import required_env, stop_daemon, volume_dir
from mcp_client import McpClient
from security_support import BYSTANDER, assert_unaffected, sec_server
from waiting import poll, wait_for

IMAGE = os.environ.get("SANDBOX_MCP_TEST_IMAGE", "mcp-test")

POLICY_CONFIG = f"""
[spawn_policies.default]
max_concurrent = 4
max_total = 40
total_child_cpus = 4
total_child_memory_mb = 1024
child_max_cpus = 1
child_max_memory = "128M"
allowed_images = ["{IMAGE}"]
child_ttl = 0
child_can_spawn = true
"""


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("roots")


@pytest.fixture(scope="module")
def srv(roots):
    """A server with `roots` as its only host root and an image store of its own."""
    with sec_server(own_images=True, SANDBOX_MCP_HOST_ROOTS=str(roots)) as s:
        s.sh("true")
        yield s


@pytest.fixture(scope="module")
def psrv():
    """A server where `default` may spawn children and grandchildren."""
    with sec_server(POLICY_CONFIG) as s:
        s.sh("true")
        yield s


def tidy(srv) -> None:
    """Destroys every sandbox but `default` and the bystander (the server
    caps sandboxes at 16, and the tests share it)."""
    for name in srv.names() - {"default", BYSTANDER}:
        text, err = srv.call("destroy", sandbox=name)
        if err and "destroy_child" in text:
            srv.call("destroy_child", name=name)


@pytest.fixture(autouse=True)
def _tidy(request):
    yield
    for name in ("srv", "psrv"):
        if name in request.fixturenames:
            tidy(request.getfixturevalue(name))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def history(srv, sandbox="default", limit=50) -> str:
    text, err = srv.call("history", sandbox=sandbox, limit=limit)
    assert not err, text
    return text


def no_process(srv, pattern: str, sandbox: str = "default") -> bool:
    """True when no process in the sandbox has `pattern` in its command line."""
    out, _, _ = srv.py(f"""
import glob, os
hits = 0
for p in glob.glob("/proc/[0-9]*/cmdline"):
    if int(p.split("/")[2]) in (os.getpid(), os.getppid()):
        continue  # the probe and its shell
    try:
        hits += {pattern!r}.encode() in open(p, "rb").read().replace(b"\\0", b" ")
    except OSError:
        pass
print(hits)
""", sandbox)
    return out == "0\n"


# ============================================================ A. security


def test_weakness_01_batch_write_cannot_reach_host_paths(srv):
    marker = f"smcp-w01-{uuid.uuid4().hex}"
    files = {f"/../../../../tmp/{marker}": "x", f"../../tmp/{marker}-rel": "y", f"/tmp/../../tmp/{marker}-2": "z"}
    srv.call("batch_write", files=json.dumps(files))
    for suffix in ("", "-rel", "-2"):
        assert not os.path.exists(f"/tmp/{marker}{suffix}")
        assert not os.path.exists(srv.tmp / f"{marker}{suffix}")
    assert_unaffected(srv, "default")


def test_weakness_02_host_reads_are_confined_to_the_host_roots(srv, roots):
    home = Path.home()
    for path in ("/etc/passwd", str(home / ".ssh/id_rsa"), str(roots / ".." / "escape"), "/proc/self/environ"):
        text, err = srv.call("upload", local_path=path)
        assert err and ("outside the allowed host roots" in text or "does not exist on host" in text), text
    text, err = srv.call("sync_start", local_dir="/etc")
    assert err and "outside the allowed host roots" in text, text
    os.symlink("/etc", roots / "etc-link")
    text, err = srv.call("upload", local_path=str(roots / "etc-link" / "passwd"))
    assert err and "is a symlink; host-path tools do not follow symlinks" in text, text
    assert_unaffected(srv, "default")


def test_weakness_03_host_writes_are_confined_and_tar_tricks_stay_inside(srv, roots):
    text, err = srv.call("download", sandbox_path="/etc/hostname", local_path="/etc/smcp-w03")
    assert err and "outside the allowed host roots" in text and not os.path.exists("/etc/smcp-w03"), text
    text, err = srv.call("collect_artifacts", patterns=["/etc/hostname"], dest="/tmp/smcp-w03")
    assert err and "outside the allowed host roots" in text and not os.path.exists("/tmp/smcp-w03"), text
    # A directory whose entries point out (absolute and `..` symlinks) lands as plain files only.
    srv.sh("mkdir -p /tmp/w03/d && echo ok > /tmp/w03/d/f && ln -s /etc/passwd /tmp/w03/abs "
           "&& ln -s ../../../../../../etc /tmp/w03/d/up")
    text, err = srv.call("download", sandbox_path="/tmp/w03", local_path=str(roots / "w03"))
    assert not err and "2 symlinks/special files skipped" in text, text
    found = sorted(str(p.relative_to(roots / "w03")) for p in (roots / "w03").rglob("*"))
    assert found == ["d", "d/f"], found
    assert_unaffected(srv, "default")


def test_weakness_04_names_cannot_inject_into_other_sandboxes(srv):
    srv.sh("true", sandbox="victim")
    hosts_before, _, _ = srv.sh("cat /etc/hosts", sandbox="victim")
    for name in ("x'; touch /tmp/w04 #", "x%n%s", "a\nb"):
        text, err = srv.call("exec", command="true", sandbox=name)
        assert err and text.startswith("Error: invalid sandbox name"), text
    out, _, _ = srv.sh("ls /tmp/w04 2>&1; cat /etc/hosts", sandbox="victim")
    assert out.startswith("ls: cannot access '/tmp/w04'") and out.endswith(hosts_before), out
    assert_unaffected(srv, "victim")


PEER_SERVER = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8765))
s.listen(8)
while True:
    c, _ = s.accept()
    c.sendall(b"PEER-SECRET\n")
    c.close()
"""

PEER_PROBE = r"""
import fcntl, json, socket, struct, sys
addrs = []
for _, name in socket.if_nameindex():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        addrs.append(socket.inet_ntoa(packed[20:24]))
    except OSError:
        pass
print(json.dumps(addrs))
"""


def test_weakness_05_sandboxes_cannot_reach_each_other(srv):
    srv.call("write_file", path="/tmp/peer.py", content=PEER_SERVER, sandbox="peer-a")
    text, err = srv.call("bg", command="python3 /tmp/peer.py", name="peer", sandbox="peer-a")
    assert not err, text
    probe = "python3 -c \"import socket; print(socket.create_connection(('127.0.0.1', 8765), 2).recv(64).decode())\""
    assert wait_for(lambda: srv.sh(probe, sandbox="peer-a")[0] == "PEER-SECRET\n\n"), "the peer never listened"
    out, _, _ = srv.py(PEER_PROBE, sandbox="peer-a")
    addrs = [a for a in json.loads(out) if a != "127.0.0.1"]
    # From the other sandbox: every address of the first (and its own
    # loopback) leads nowhere near the first's listener.
    out, _, _ = srv.py(f"""
got = []
import socket
for a in {addrs + ["127.0.0.1"]!r}:
    try:
        got.append(socket.create_connection((a, 8765), 2).recv(64).decode())
    except OSError as e:
        got.append(type(e).__name__)
print(got)
""", sandbox="peer-b")
    assert "PEER-SECRET" not in out, out
    srv.call("kill", name="peer", sandbox="peer-a")
    assert_unaffected(srv, "peer-a", "peer-b")


def test_weakness_06_code_in_default_cannot_spawn_sandboxes(srv):
    # The built-in policy gives `default` no sandbox-ctl (opt-in only).
    out, _, code = srv.sh("ls /run/sandbox-ctl.sock /run/sandbox-ctl /usr/local/bin/sandbox-ctl 2>&1")
    assert code != 0 and out.count("No such file or directory") == 3, out
    assert not (Path(srv.env["XDG_RUNTIME_DIR"]) / "sandbox-mcp" / "ctl" / "default").exists()


def test_weakness_07_there_is_a_global_cap_on_sandboxes():
    with sec_server(SANDBOX_MCP_MAX_SANDBOXES="2") as s:  # the bystander is one
        s.sh("true")
        text, err = s.call("exec", command="true", sandbox="third")
        assert err and text.startswith("Error: cannot create sandbox 'third': 2 sandboxes already exist"), text
        assert "third" not in s.names()
        assert_unaffected(s, "default")


def test_weakness_08_destroyed_workspaces_survive_a_restart(srv):
    srv.sh("echo precious > /workspace/keep.txt", sandbox="w08")
    assert not srv.call("destroy", sandbox="w08")[1]
    srv.restart()
    out, _, _ = srv.sh("cat /workspace/keep.txt", sandbox="w08")
    assert out == "precious\n"
    assert_unaffected(srv, "w08")


def test_weakness_09_secrets_are_redacted_from_history_and_state(srv):
    # Fixed with issue 9 (redaction in history and the state file).
    commands = [
        "mysql -psekret-w09-a -e 'select 1' 2>/dev/null; true",
        "curl -s -H 'Authorization: Bearer sekret-w09-b' http://127.0.0.1:9/ || true",
        "DEPLOY_TOKEN=sekret-w09-c true",
        "app --password=sekret-w09-d 2>/dev/null; true",
        "echo 'https://example.invalid/?token=sekret-w09-e' >/dev/null",
        "MY_SECRET=sekret-w09-f DB_PASSWORD=sekret-w09-g true",
    ]
    for c in commands:
        srv.sh(c, sandbox="w09")
    srv.call("git_clone", repo="https://user:sekret-w09-h@127.0.0.1:9/x.git", sandbox="w09")
    text = history(srv, "w09")
    assert "sekret-w09" not in text, text
    assert "mysql" in text and "DEPLOY_TOKEN" in text, text
    # Committed before the tool answered: no wait.
    saved = srv.saved()
    assert "w09" in saved, saved
    assert "sekret-w09" not in saved, [m for m in re.findall(r"[^']*sekret-w09[^']*", saved)]


GIT_AUTH_SERVER = r"""
import base64, http.server, sys, time
class H(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        auth = self.headers.get("Authorization", "")
        with open("/tmp/w10-auth.log", "a") as f:
            f.write(auth + "\n")
        if not auth:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="w10"')
            self.end_headers()
            return
        time.sleep(0.5)  # time for the watcher to look around
        super().do_GET()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8710), lambda *a: H(*a, directory="/srv/w10")).serve_forever()
"""

TOKEN_WATCHER = r"""
import glob
needles = open("/tmp/w10-needles", "rb").read().split()
while True:
    for p in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline") + glob.glob("/tmp/*") + glob.glob("/tmp/.*"):
        if p.startswith("/tmp/w10"):
            continue
        try:
            data = open(p, "rb").read()
        except OSError:
            continue
        if any(n in data for n in needles):
            open("/tmp/w10-captured", "a").write(p + "\n")
"""


def test_weakness_10_a_git_token_is_never_readable_by_other_processes(srv):
    # Fixed with issue 9 (the token reaches git through a credential channel).
    token = f"tok-w10-{uuid.uuid4().hex[:12]}"
    basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    srv.sh("rm -rf /srv/w10 /tmp/w10-*; git init -q --bare /srv/w10/repo.git && git init -q /tmp/w10src && cd /tmp/w10src"
           " && git -c user.email=a@b -c user.name=a commit -q --allow-empty -m one"
           " && git push -q /srv/w10/repo.git HEAD:master && git -C /srv/w10/repo.git update-server-info", sandbox="w10")
    srv.call("write_file", path="/tmp/w10-server.py", content=GIT_AUTH_SERVER, sandbox="w10")
    srv.call("write_file", path="/tmp/w10-watch.py", content=TOKEN_WATCHER, sandbox="w10")
    srv.call("write_file", path="/tmp/w10-needles", content=f"{token}\n{basic}\n", sandbox="w10")
    srv.call("bg", command="python3 /tmp/w10-server.py", name="w10-server", sandbox="w10")
    srv.call("bg", command="python3 /tmp/w10-watch.py", name="w10-watch", sandbox="w10")
    probe = "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8710), 1)\""
    assert wait_for(lambda: srv.sh(probe, sandbox="w10")[2] == 0), "the git server never listened"
    text, err = srv.call("git_clone", repo="http://127.0.0.1:8710/repo.git", token=token, path="/workspace/w10",
                         shallow=False, sandbox="w10")
    assert not err, text
    out, _, _ = srv.sh("cat /tmp/w10-auth.log", sandbox="w10")
    sent = [base64.b64decode(line.split()[1]).decode() for line in out.splitlines() if line.startswith("Basic ")]
    assert any(s.endswith(f":{token}") for s in sent), f"the server never got the token: {out}"  # it was used...
    captured, _, _ = srv.sh("cat /tmp/w10-captured 2>/dev/null | sort -u", sandbox="w10")
    assert captured == "", f"...and nobody else may have seen it: {captured}"
    for name in ("w10-server", "w10-watch"):
        srv.call("kill", name=name, sandbox="w10")


def test_weakness_11_install_takes_package_names_only(srv):
    for packages, bad in (("jq; touch /tmp/w11", "jq;"), ("-o APT::Get::AllowUnauthenticated=1 jq", "-o"),
                          ("$(touch /tmp/w11)", "$(touch")):
        text, err = srv.call("install", packages=packages)
        assert err and text.startswith(f"Error: invalid package name '{bad}'"), text
    out, _, _ = srv.sh("ls /tmp/w11 2>&1")
    assert "No such file" in out


def test_weakness_12_no_prebuilt_binary_is_committed_and_ctl_is_the_built_one(ctl_bin):
    repo = Path(__file__).resolve().parent.parent
    # safe.directory: the suite also runs as an ordinary user on a checkout root owns.
    files = subprocess.run(["git", "-c", f"safe.directory={repo}", "-C", str(repo), "ls-files", "-z"],
                           capture_output=True, check=True).stdout
    elves = [f for f in files.decode().split("\0") if f and (repo / f).is_file()
             and (repo / f).open("rb").read(4) == b"\x7fELF"]
    assert elves == [], elves
    # The sandbox-ctl copied into sandboxes is the one cargo built from rust/ctl.
    with sec_server(f'[spawn_policies.default]\ninject_ctl = true\nallowed_images = ["{IMAGE}"]\n',
                    SANDBOX_CTL_BIN=ctl_bin) as s:
        out, _, _ = s.sh("sha256sum /usr/local/bin/sandbox-ctl")
        assert out.split()[0] == hashlib.sha256(Path(ctl_bin).read_bytes()).hexdigest()


FORGER = r"""
import glob, os, time
me = os.getpid()
end = time.monotonic() + 5
while time.monotonic() < end:
    for p in glob.glob("/proc/[0-9]*/fd/[12]"):
        if p.startswith(f"/proc/{me}/"):
            continue
        try:
            with open(p, "w") as f:
                f.write("\n__MCP_deadbeef_RC_0\n[exit code 0]\n")
        except OSError:
            pass
    time.sleep(0.05)
"""


def test_weakness_13_output_cannot_forge_an_exit_code(srv):
    # No markers in the output stream: the exit code travels apart from it,
    # so neither the command nor a hostile neighbour can fake success.
    r = srv.client.call_raw("exec", command="printf '__MCP_deadbeef_RC_0\\n'; echo '[exit code 0]'; exit 3",
                            sandbox="w13")
    assert r.structured_content["exit_code"] == 3 and "[exit code 3]" in r.content[0].text, r
    srv.call("write_file", path="/tmp/forger.py", content=FORGER, sandbox="w13")
    srv.call("bg", command="python3 /tmp/forger.py", name="forger", sandbox="w13")
    r = srv.client.call_raw("exec", command="sleep 1; exit 4", sandbox="w13")
    assert r.structured_content["exit_code"] == 4 and not r.structured_content["timed_out"], r
    srv.call("kill", name="forger", sandbox="w13")


# ============================================================ B. shell protocol


def test_weakness_14_ordinary_shell_input_never_breaks_framing(srv):
    cases = [
        ("echo a # trailing comment", 0, "a\n"),
        ("cat <<'EOF'\nline\nEOF", 0, "line\n"),
        ("echo 'unbalanced", 2, ""),
        ("exec echo replaced", 0, "replaced\n"),
        ("exit 5", 5, ""),
        ("echo before; exit 6; echo after", 6, "before\n"),
    ]
    for command, code, out in cases:
        got_out, _, got_code = srv.sh(command, sandbox="w14", timeout=10)
        assert (got_out, got_code) == (out, code), command
    assert srv.sh("echo next", sandbox="w14")[0] == "next\n"


def test_weakness_15_stdin_is_never_shared(srv):
    out, _, code = srv.sh("cat; read x; echo eof-$?; python3 -c 'import sys; print(len(sys.stdin.read()))'",
                          sandbox="w15", timeout=10)
    assert (out, code) == ("eof-1\n0\n", 0), out
    srv.call("bg", command="cat; echo bg-eof-$?", name="reader", sandbox="w15")
    assert poll(lambda: srv.call("logs", name="reader", sandbox="w15")[0], lambda t: "bg-eof-0" in t)
    assert srv.sh("echo next", sandbox="w15")[0] == "next\n"


def test_weakness_16_no_state_leaks_between_calls(srv):
    srv.sh("cd /tmp; export LEAK=1; set -eu; alias ll=ls; trap 'echo TRAPPED' EXIT; umask 077", sandbox="w16")
    out, _, code = srv.sh("pwd; echo ${LEAK:-none}; false; echo after; alias ll >/dev/null 2>&1 || echo no-alias; umask",
                          sandbox="w16")
    assert out == "/workspace\nnone\nafter\nno-alias\n0022\n", out
    out, _, _ = srv.sh("pwd", sandbox="w16", timeout=10)
    assert out == "/workspace\n"
    # workdir applies to its own call only; a later call without it is back home.
    assert srv.client.call_raw("exec", command="pwd", workdir="/tmp", sandbox="w16").structured_content["stdout"] == "/tmp\n"
    assert srv.sh("pwd", sandbox="w16")[0] == "/workspace\n"
    out, _ = srv.call("python", code="import os; print(os.getcwd())", sandbox="w16")
    assert out.startswith("/workspace\n"), out


def test_weakness_17_env_unset_unsets_and_newlines_are_kept(srv):
    srv.call("env", action="set", key="MULTI", value="a\nexport EVIL=1\nb", sandbox="w17")
    srv.call("env", action="set", key="OTHER", value="c", sandbox="w17")
    out, _, _ = srv.sh('printf "%s|%s|%s" "$MULTI" "$OTHER" "${EVIL-unset}"', sandbox="w17")
    assert out == "a\nexport EVIL=1\nb|c|unset", out
    srv.call("env", action="unset", key="MULTI", sandbox="w17")
    out, _, _ = srv.sh('printf "%s|%s" "${MULTI-gone}" "$OTHER"; bash -lc \'printf "|%s" "${MULTI-gone}"\'',
                       sandbox="w17")
    assert out == "gone|c|gone", out


def test_weakness_18_timeouts_are_total_and_kill_the_whole_tree(srv):
    # Total, not per line: a command printing every 0.1 s still stops, its
    # output so far kept.
    r = srv.client.call_raw("exec", command="while true; do echo tick; sleep 0.1; done", timeout=1, sandbox="w18")
    sc = r.structured_content
    assert sc["timed_out"] and sc["exit_code"] == -1 and sc["stdout"].startswith("tick\n"), sc
    for bad in (0, -1, 1e9):
        text, err = srv.call("exec", command="true", timeout=bad, sandbox="w18")
        assert err and text.startswith("Error: timeout must be"), text
    # A queued call does not wait behind a long one (no per-sandbox lock).
    long_call = threading.Thread(target=lambda: srv.sh("sleep 3", sandbox="w18"))
    long_call.start()
    r = srv.client.call_raw("exec", command="echo quick", timeout=2, sandbox="w18")
    assert r.structured_content["stdout"] == "quick\n" and not r.structured_content["timed_out"], r
    assert long_call.is_alive()
    long_call.join()
    # Everything the command started stops, a setsid child included (issue 9).
    r = srv.client.call_raw("exec", command="setsid sleep 301 & sleep 302", timeout=1, sandbox="w18")
    assert r.structured_content["timed_out"], r
    assert wait_for(lambda: no_process(srv, "sleep 30", "w18"), timeout=10), "a process outlived the timeout"


def test_weakness_19_after_a_timeout_the_next_call_behaves_the_same(srv):
    srv.call("env", action="set", key="KEEP", value="kept", sandbox="w19")
    r = srv.client.call_raw("exec", command="sleep 30", timeout=1, workdir="/tmp", sandbox="w19")
    assert r.structured_content["timed_out"], r
    out, _, code = srv.sh('pwd; echo "$KEEP"; cd /tmp; pwd', sandbox="w19")
    assert (out, code) == ("/workspace\nkept\n/tmp\n", 0), out


def test_weakness_20_a_command_is_never_run_twice(srv):
    for command in ("echo run >> /tmp/count; kill -9 $$", "echo run >> /tmp/count; exit 255",
                    "echo run >> /tmp/count; kill -SEGV $$"):
        srv.sh("rm -f /tmp/count", sandbox="w20")
        r = srv.client.call_raw("exec", command=command, sandbox="w20")
        assert r.structured_content["exit_code"] != 0, r
        out, _, _ = srv.sh("cat /tmp/count", sandbox="w20")
        assert out == "run\n", (command, out)


def test_weakness_21_long_lines_do_not_break_the_stream(srv):
    r = srv.client.call_raw("exec", command="head -c 200000 /dev/zero | tr '\\0' x; echo; echo end", sandbox="w21")
    sc = r.structured_content
    assert sc["exit_code"] == 0 and sc["truncated"] and sc["stdout"] == "x" * 50_000, len(sc["stdout"])
    assert "[truncated — 195.3KB total, showing first 48.8KB]" in r.content[0].text
    out, _, code = srv.sh("echo own-output", sandbox="w21")
    assert (out, code) == ("own-output\n", 0)


def test_weakness_22_a_command_that_exits_at_once_never_hangs_the_server(srv):
    for command in ("exec >&- 2>&-; exit 0", "kill -9 $$", "exec true"):
        r = srv.client.call_raw("exec", command=command, sandbox="w22", timeout=10)
        assert not r.structured_content["timed_out"], (command, r)
    assert srv.sh("echo fine", sandbox="w22")[0] == "fine\n"
    assert_unaffected(srv, "w22")


def test_weakness_23_output_is_kept_byte_for_byte(srv):
    r = srv.client.call_raw("exec", command="printf 'a\\n\\n\\n'; printf 'e\\n\\n' >&2", sandbox="w23")
    assert (r.structured_content["stdout"], r.structured_content["stderr"]) == ("a\n\n\n", "e\n\n"), r
    # Not UTF-8: U+FFFD in the text, the exact bytes beside it in base64.
    r = srv.client.call_raw("exec", command="printf 'ok\\000\\377\\n'", sandbox="w23")
    assert r.structured_content["stdout"] == "ok\x00\ufffd\n", r
    assert base64.b64decode(r.structured_content["stdout_base64"]) == b"ok\x00\xff\n", r
    # Truncation counts bytes: 2-byte characters are cut at the byte cap.
    r = srv.client.call_raw("exec", command="python3 -c \"print('é' * 60000)\"", sandbox="w23")
    assert r.structured_content["truncated"] and r.structured_content["stdout"] == "é" * 25_000
    assert "[truncated — 117.2KB total, showing first 48.8KB]" in r.content[0].text, r.content[0].text[-120:]


def test_weakness_24_a_dead_sandbox_is_reported_not_silently_rerun(srv):
    srv.sh("echo keep > /workspace/k; echo gone > /tmp/gone", sandbox="w24")
    srv.client.call_raw("exec", command="kill -9 2", sandbox="w24")  # the agent: the sandbox goes down with it
    text, err = srv.call("exec", command="echo ran > /workspace/ran-twice", sandbox="w24")
    assert err and "reset(sandbox='w24')" in text, text
    assert "w24" in srv.call("status")[0]
    assert not srv.call("reset", sandbox="w24")[1]
    out, _, _ = srv.sh("cat /workspace/k; ls /workspace/ran-twice /tmp/gone 2>&1 | wc -l", sandbox="w24")
    assert out == "keep\n2\n", out
    assert_unaffected(srv, "w24")


# ============================================================ C. concurrency


def test_weakness_25_listing_while_sandboxes_come_and_go(srv):
    errors = []

    def churn():
        for i in range(4):
            for tool, args in (("exec", {"command": "true"}), ("destroy", {})):
                text, err = srv.call(tool, sandbox=f"w25-{i}", **args)
                if err:
                    errors.append(text)

    t = threading.Thread(target=churn)
    t.start()
    while t.is_alive():
        for tool in ("status", "health", "network_info", "list_all"):
            text, err = srv.call(tool)
            if err:
                errors.append(f"{tool}: {text}")
    t.join()
    assert errors == []
    assert not any(n.startswith("w25-") for n in srv.names())


def test_weakness_26_racing_spawns_in_a_tree_never_exceed_its_budget(psrv):
    # Children and grandchildren spawning at once share the root's budget.
    assert not psrv.call("spawn", name="w26-kid", cpus=1, memory="128M")[1]
    kid = "default..w26-kid"
    results = []

    def spawn(parent, label, i):
        results.append(psrv.call("spawn", parent=parent, name=f"w26-{label}-{i}", cpus=1, memory="128M"))

    parents = (("default", "d"), (kid, "k"))
    threads = [threading.Thread(target=spawn, args=(p, label, i)) for i in range(4) for p, label in parents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    status, _ = psrv.call("status")
    tree = [line for line in status.splitlines() if re.match(r"  default\.\.w26-", line)]
    cpus = sum(int(m) for m in re.findall(r"  (\d+)cpu/", "\n".join(tree)))
    assert cpus <= 4, status
    refused = {t for t, err in results if err}
    assert refused <= {
        "Error: SpawnLimitError: Concurrent child limit reached",
        "Error: SpawnLimitError: Aggregate child CPU budget exceeded",
        "Error: SpawnLimitError: CPU budget exceeded",
    }, refused
    psrv.call("destroy_child", name=kid)
    for t, err in results:
        m = re.match(r"Spawned child '([^']+)'", t)
        if m and m.group(1).startswith("default..w26-d-"):
            psrv.call("destroy_child", name=m.group(1))


def test_weakness_27_racing_creations_of_one_name_make_one_sandbox(srv):
    srv.sh("echo src > /workspace/src.txt")
    results = []

    def go(tool, args):
        results.append(srv.call(tool, **args))

    calls = [("clone", {"source": "default", "target": "w27"})] * 2 + [("exec", {"command": "true", "sandbox": "w27"})] * 2
    threads = [threading.Thread(target=go, args=c) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    status, _ = srv.call("status")
    assert len(re.findall(r"^  w27 ", status, re.M)) == 1, status
    for text, err in results:
        assert not err or "already exists" in text or "exists" in text, text
    assert srv.sh("echo one", sandbox="w27")[0] == "one\n"
    srv.call("destroy", sandbox="w27")
    assert "w27" not in srv.names()


def test_weakness_28_concurrent_python_calls_do_not_share_a_script(srv):
    results = {}

    def run(i):
        results[i] = srv.call("python", code=f"import time; time.sleep(0.2); print('script-{i}')", sandbox="w28")[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[i].startswith(f"script-{i}\n") for i in range(6)), results


def test_weakness_29_two_servers_share_sandboxes_without_clobbering(srv):
    # A second front-end shares the one daemon: it sees the sandboxes the
    # first made, before and after it started, and neither replaces the
    # other's.
    srv.sh("echo from-first > /tmp/w29", sandbox="w29")
    other = McpClient(required_env("SANDBOX_MCP_BIN"), env={**srv.env, **srv.extra_env},
                      stderr_path=str(srv.tmp / "second-server.log"))
    try:
        r = other.call_raw("exec", command="cat /tmp/w29; echo from-second >> /tmp/w29", sandbox="w29")
        assert r.structured_content["stdout"] == "from-first\n", r
        assert srv.sh("cat /tmp/w29", sandbox="w29")[0] == "from-first\nfrom-second\n"
        srv.sh("echo mine > /tmp/late", sandbox="w29-late")
        r = other.call_raw("exec", command="cat /tmp/late", sandbox="w29-late")
        assert r.structured_content["stdout"] == "mine\n", r
    finally:
        other.close()
    assert_unaffected(srv, "w29", "w29-late")


def test_weakness_30_a_long_call_does_not_block_other_tools_on_its_sandbox(srv):
    srv.sh("true", sandbox="w30")
    long_call = threading.Thread(target=lambda: srv.sh("sleep 4", sandbox="w30"))
    long_call.start()
    assert not srv.call("write_file", path="/tmp/x", content="y", sandbox="w30")[1]
    assert srv.call("read_file", path="/tmp/x", sandbox="w30") == ("y", False)
    assert "w30" in srv.call("health")[0]
    assert srv.sh("echo side", sandbox="w30")[0] == "side\n"
    assert long_call.is_alive(), "the calls above waited for the long one"
    long_call.join()


# ============================================================ D. lifecycle


def test_weakness_31_destroy_cascades_to_grandchildren(psrv):
    assert not psrv.call("spawn", name="w31-kid")[1]
    text, err = psrv.call("spawn", parent="default..w31-kid", name="w31-grand")
    assert not err, text
    psrv.sh("true", sandbox="default..w31-kid..w31-grand")
    assert not psrv.call("destroy", sandbox="default")[1]
    assert not {"default..w31-kid", "default..w31-kid..w31-grand"} & psrv.names()
    psrv.sh("true")


def test_weakness_32_the_idle_reaper_takes_a_parents_children_with_it():
    config = POLICY_CONFIG.replace("[spawn_policies.default]", "[spawn_policies.p]")
    with sec_server(config, SANDBOX_MCP_IDLE_TTL="2") as s:
        s.sh("true", sandbox="p")
        text, err = s.call("spawn", parent="p", name="p-kid")
        assert not err, text
        assert "p..p-kid" in s.names()
        assert poll(lambda: s.names(), lambda n: "p" not in n, timeout=30) is not None, s.names()
        assert "p..p-kid" not in s.names()
        # A new `p` starts with a fresh tree; the old child never re-attaches to it.
        s.sh("true", sandbox="p")
        text, _ = s.call("children", parent="p")
        assert text.startswith("No active children for 'p'"), text


def test_weakness_33_a_failed_boot_leaves_nothing_behind():
    with sec_server('[profiles.broken]\nimage = "no-such-image"\n') as s:
        for _ in range(2):
            text, err = s.call("exec", command="true", sandbox="broken")
            assert err and "no-such-image" in text, text
        assert "broken" not in s.names()
        vms = Path(s.env["XDG_STATE_HOME"]) / "sandbox-mcp"
        assert not [p for p in vms.rglob("*broken*") if p.is_dir() and "volumes" not in str(p)], list(vms.rglob("*"))
        assert_unaffected(s)


def test_weakness_34_every_sandbox_has_its_workspace(srv):
    for name in ("w34", "W34.odd-name.1", "9" * 48):
        out, _, code = srv.sh("grep -c ' /workspace ' /proc/mounts; touch /workspace/ok", sandbox=name)
        assert (out, code) == ("1\n", 0), (name, out)
        srv.call("destroy", sandbox=name)


def test_weakness_35_a_restarted_server_knows_its_sandboxes_at_once(srv):
    srv.sh("echo remembered-w35", sandbox="w35")
    srv.restart()
    # The very first calls after a restart already see it (no lazy start).
    assert "w35" in srv.call("status")[0]
    assert "echo remembered-w35" in history(srv, "w35")
    assert not srv.call("destroy", sandbox="w35")[1]


def test_weakness_36_background_processes_and_history_survive_a_restart(srv):
    srv.call("bg", command="echo started; sleep 300", name="w36-bg", sandbox="w36")
    srv.sh("echo audited-w36", sandbox="w36")
    srv.restart()
    text, err = srv.call("logs", name="w36-bg", sandbox="w36")
    assert not err and "(alive)" in text and text.endswith("started"), text
    assert "echo audited-w36" in history(srv, "w36")
    text, err = srv.call("kill", name="w36-bg", sandbox="w36")
    assert not err and text.startswith("Killed [w36-bg]"), text


def test_weakness_37_a_damaged_state_file_is_kept_and_sandboxes_attach(srv):
    srv.sh("echo w37 > /workspace/w37", sandbox="w37")
    srv.client.close()
    # The daemon holds the database open while it runs: damage it stopped.
    stop_daemon(srv.env)
    path = Path(srv.env["XDG_STATE_HOME"]) / "sandbox-mcp" / "state.db"
    for side in ("state.db-wal", "state.db-shm"):
        (path.parent / side).unlink(missing_ok=True)
    path.write_text("{ damaged")
    srv.restart()
    assert srv.sh("cat /workspace/w37", sandbox="w37")[0] == "w37\n"
    assert "w37" in srv.names()
    aside = [p for p in path.parent.iterdir() if ".damaged-" in p.name and not p.name.endswith(("-wal", "-shm"))]
    assert aside and aside[-1].read_text() == "{ damaged"
    assert "w37" in srv.saved()


def test_weakness_38_no_peer_names_in_etc_hosts(srv):
    srv.sh("true", sandbox="w38-a")
    srv.sh("true", sandbox="w38-b")
    out, _, _ = srv.sh("cat /etc/hosts", sandbox="w38-a")
    assert "w38-b" not in out and BYSTANDER not in out, out
    srv.call("destroy", sandbox="w38-b")
    srv.call("destroy", sandbox="w38-a")


def test_weakness_39_reset_and_a_failed_restore_leave_no_stale_state(srv):
    srv.call("bg", command="sleep 300", name="old", sandbox="w39")
    srv.sh("echo w39 > /workspace/w39", sandbox="w39")
    assert not srv.call("reset", sandbox="w39")[1]
    text, err = srv.call("logs", name="old", sandbox="w39")
    assert err and text == "Error: no background process 'old' in sandbox 'w39'. Running: none", text
    # A restore that cannot happen leaves the sandbox as it was.
    srv.sh("echo alive > /tmp/here", sandbox="w39")
    text, err = srv.call("restore", snapshot_name="no-such-snap", sandbox="w39")
    assert err, text
    assert srv.sh("cat /tmp/here /workspace/w39", sandbox="w39")[0] == "alive\nw39\n"


# ============================================================ E. features


def test_weakness_40_snapshots_keep_every_generation_and_no_workspace(srv):
    srv.sh("echo a > /etc/w40-a; echo ws > /workspace/w40-ws", sandbox="w40")
    assert not srv.call("snapshot", snapshot_name="w40-one", sandbox="w40")[1]
    assert not srv.call("restore", snapshot_name="w40-one", sandbox="w40-x")[1]
    srv.sh("echo b > /etc/w40-b; rm /etc/w40-a", sandbox="w40-x")
    assert not srv.call("snapshot", snapshot_name="w40-two", sandbox="w40-x")[1]
    assert not srv.call("restore", snapshot_name="w40-two", sandbox="w40-y")[1]
    out, _, _ = srv.sh("cat /etc/w40-b; ls /etc/w40-a /workspace/w40-ws 2>&1 | grep -c 'No such'", sandbox="w40-y")
    assert out == "b\n2\n", out


def test_weakness_41_clone_keeps_the_sources_image(srv):
    srv.sh("echo base > /etc/w41", sandbox="w41")
    assert not srv.call("snapshot", snapshot_name="w41", sandbox="w41")[1]
    assert not srv.call("restore", snapshot_name="w41", sandbox="w41-src")[1]
    text, err = srv.call("clone", source="w41-src", target="w41-dst")
    assert not err, text
    assert srv.sh("cat /etc/w41", sandbox="w41-dst")[0] == "base\n"
    text, err = srv.call("clone", source="w41-src", target="w41-dst")
    assert err, text


def test_weakness_42_upload_to_a_file_path_writes_that_file(srv, roots):
    (roots / "file.txt").write_text("content\n")
    text, err = srv.call("upload", local_path=str(roots / "file.txt"), sandbox_path="/tmp/new/dir/myfile.txt")
    assert not err, text
    out, _, _ = srv.sh("cat /tmp/new/dir/myfile.txt; test -f /tmp/new/dir/myfile.txt && echo file")
    assert out == "content\nfile\n", out


def test_weakness_43_paths_with_spaces_and_globs_are_not_split(srv):
    path = "/tmp/w43 dir/*glob/$(x)/f.txt"
    text, err = srv.call("write_file", path=path, content="ok", sandbox="w43")
    assert not err, text
    out, _, _ = srv.sh("cat '/tmp/w43 dir/*glob/$(x)/f.txt'; ls /tmp | grep -c w43", sandbox="w43")
    assert out == "ok1\n", out


def test_weakness_44_kill_ends_the_whole_tree_and_bg_names_are_checked(srv):
    text, err = srv.call("bg", command="sleep 311 | cat & setsid sleep 312 & sleep 313", name="tree", sandbox="w44")
    assert not err, text
    assert wait_for(lambda: not no_process(srv, "sleep 312", "w44")), "the tree never started"
    text, err = srv.call("kill", name="tree", sandbox="w44")
    assert not err and text.startswith("Killed [tree]"), text
    # Every process it started is gone, the setsid one included (issue 9).
    assert wait_for(lambda: no_process(srv, "sleep 31", "w44"), timeout=10), "kill left processes running"
    text, err = srv.call("bg", command="true", name="../../tmp/x", sandbox="w44")
    assert err and text.startswith("Error: invalid process name"), text
    srv.call("bg", command="sleep 300", name="dup", sandbox="w44")
    text, err = srv.call("bg", command="true", name="dup", sandbox="w44")
    assert err and "still running" in text, text
    srv.call("kill", name="dup", sandbox="w44")


def test_weakness_45_clone_directory_names_are_not_mangled(srv):
    srv.sh("git init -q --bare /srv/my.github.io.git && git init -q /tmp/w45 && cd /tmp/w45 && "
           "git -c user.email=a@b -c user.name=a commit -q --allow-empty -m one && "
           "git push -q /srv/my.github.io.git HEAD:master", sandbox="w45")
    text, err = srv.call("git_clone", repo="file:///srv/my.github.io.git", path="/workspace/c", sandbox="w45")
    assert not err and text.startswith("Cloned file:///srv/my.github.io.git -> /workspace/c/my.github.io\n"), text


def test_weakness_46_the_package_cache_is_a_volume_that_survives_reset(srv):
    srv.sh("touch /var/cache/apt/archives/w46.deb", sandbox="w46")
    assert not srv.call("reset", sandbox="w46")[1]
    out, _, _ = srv.sh("ls /var/cache/apt/archives/w46.deb; grep -c ' /var/cache/apt/archives ' /proc/mounts",
                       sandbox="w46")
    assert out == "/var/cache/apt/archives/w46.deb\n1\n", out


def test_weakness_47_sync_mirrors_same_size_edits_and_deleted_directories(srv, roots):
    project = roots / "w47"
    (project / "d/e").mkdir(parents=True)
    (project / "d/e/f.txt").write_text("one")
    (project / "g.txt").write_text("aaaa")
    text, err = srv.call("sync_start", local_dir=str(project), sandbox_dir="/workspace/w47", sandbox="w47")
    assert not err and "Initial sync: 2 files" in text, text
    job = re.search(r"\[(sync-[0-9a-f]+)\]", text).group(1)
    st = (project / "g.txt").stat()
    (project / "g.txt").write_text("bbbb")  # same size, same mtime
    os.utime(project / "g.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert wait_for(lambda: srv.sh("cat /workspace/w47/g.txt", sandbox="w47")[0] == "bbbb")
    shutil.rmtree(project / "d")
    assert wait_for(lambda: srv.sh("ls /workspace/w47", sandbox="w47")[0] == "g.txt\n")
    srv.call("sync_stop", job_id=job)
    text, err = srv.call("sync_start", local_dir=str(roots / "missing"), sandbox="w47")
    assert err and "Sync started" not in text, text


def test_weakness_48_expose_checks_ports_and_unexpose_does_not_hang(srv):
    for port in (0, 70000, -1):
        text, err = srv.call("expose", port=port, sandbox="w48")
        assert err and "port" in text, text
    srv.call("bg", command="exec python3 -m http.server 8000 --bind 127.0.0.1", name="http", sandbox="w48")
    probe = "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8000), 1)\""
    assert wait_for(lambda: srv.sh(probe, sandbox="w48")[2] == 0)
    hp = free_port()
    text, err = srv.call("expose", port=8000, host_port=hp, sandbox="w48")
    assert not err, text
    held = socket.create_connection(("127.0.0.1", hp), 10)  # an open connection during unexpose
    text, err = srv.call("unexpose", port=hp)
    assert not err, text
    held.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{hp}/", timeout=5)
    srv.call("kill", name="http", sandbox="w48")


def test_weakness_49_children_views_show_real_sizes_and_names_skip_collisions(psrv):
    psrv.sh("true", sandbox="default-child-0001")  # a top-level sandbox in the way
    text, err = psrv.call("spawn", cpus=1, memory="96M")
    assert not err, text
    name = re.match(r"Spawned child '([^']+)'", text).group(1)
    assert name != "default-child-0001", text
    assert re.search(rf"^  {name} .*  1cpu/96M", psrv.call("status")[0], re.M), psrv.call("status")[0]
    psrv.call("destroy_child", name=name)
    psrv.call("destroy", sandbox="default-child-0001")


def test_weakness_50_read_only_tools_do_not_create_sandboxes(srv):
    for tool, args in (("stats", {}), ("logs", {"name": "x"}), ("kill", {"name": "x"})):
        text, err = srv.call(tool, sandbox="ghost50", **args)
        assert err and text == "Error: no active sandbox 'ghost50'", (tool, text)
    for tool, key in (("history", "sandbox"), ("children", "parent"), ("network_info", None), ("health", None)):
        srv.call(tool, **({key: "ghost50"} if key else {}))
    assert "ghost50" not in srv.names()
    assert not volume_dir(srv.env, "ghost50").exists()


def test_weakness_52_large_outputs_and_files_are_streamed_not_hoarded(srv, roots):
    r = srv.client.call_raw("exec", command="head -c 20000000 /dev/zero | tr '\\0' y", sandbox="w52")
    assert r.structured_content["truncated"] and len(r.structured_content["stdout"]) == 50_000
    assert "[truncated — 19.1MB total, showing first 48.8KB]" in r.content[0].text
    srv.sh("head -c 30000000 /dev/urandom > /tmp/big.bin; sha256sum /tmp/big.bin > /tmp/big.sum", sandbox="w52")
    text, err = srv.call("download", sandbox_path="/tmp/big.bin", local_path=str(roots / "big.bin"), sandbox="w52")
    assert not err, text
    want = srv.sh("cut -c1-64 /tmp/big.sum", sandbox="w52")[0].strip()
    assert hashlib.sha256((roots / "big.bin").read_bytes()).hexdigest() == want
    (roots / "big.bin").unlink()
