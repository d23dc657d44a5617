"""Secrets stay secret (issue 9; weaknesses #10 and #9): a git_clone token
reaches git on a descriptor, never in any process's environment or argv
where other code in the sandbox reads it, and history and the state file
redact secrets typed on command lines."""
import base64
import hashlib
import json
import os
import time

from conftest import saved_state
from waiting import wait_for

PORT = 18641

# A dumb-HTTP git server that answers 401 (after a pause, so git lives long
# enough for the spy to see it) until the right Basic auth arrives. It gets
# only a hash of the expected header: its own argv must not hold the token.
GIT_SERVER = r"""
import functools, hashlib, http.server, sys, time
WANT = sys.argv[2]
class H(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        auth = self.headers.get("Authorization", "")
        if hashlib.sha256(auth.encode()).hexdigest() != WANT:
            time.sleep(1)
            with open("/tmp/denied", "a") as f:
                f.write(self.path + "\n")
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with open("/tmp/granted", "a") as f:
            f.write(self.path + "\n")
        super().do_GET()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), functools.partial(H, directory="/srv/web")).serve_forever()
"""

# Collects every distinct environment entry and argv string of every other
# process, as often as it can, into /tmp/spy.json.
SPY = r"""
import json, os, time
seen = set()
me = str(os.getpid())
end = time.time() + 120
while time.time() < end:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        for what in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as f:
                    seen.update(f.read().decode(errors="replace").split("\0"))
            except OSError:
                pass
    with open("/tmp/spy.tmp", "w") as f:
        json.dump(sorted(seen), f)
    os.replace("/tmp/spy.tmp", "/tmp/spy.json")
"""


def sh(srv, command: str, sandbox: str = "default") -> tuple[str, str, int]:
    r = srv.call_raw("exec", command=command, sandbox=sandbox, timeout=120, call_timeout=150)
    out = r.structured_content
    assert out is not None, r
    return out["stdout"], out["stderr"], out["exit_code"]


def serve_repo(srv, port: int, credentials: str) -> None:
    """A bare repo with one commit, served at http://127.0.0.1:PORT/demo.git."""
    _, err, code = sh(srv, (
        "set -e; git init -q /tmp/src && cd /tmp/src && git config user.email a@b && git config user.name a"
        " && echo hi > f && git add f && git commit -qm first"
        " && mkdir -p /srv/web && git clone -q --bare /tmp/src /srv/web/demo.git"
        " && git -C /srv/web/demo.git update-server-info"))
    assert code == 0, err
    assert not srv.call("write_file", path="/tmp/gitserver.py", content=GIT_SERVER)[1]
    want = hashlib.sha256(f"Basic {base64.b64encode(credentials.encode()).decode()}".encode()).hexdigest()
    text, err = srv.tool("bg", command=f"exec python3 /tmp/gitserver.py {port} {want}", name=f"git{port}")
    assert not err, text
    assert wait_for(lambda: sh(srv, f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}))'")[2]
                    == 0, timeout=20)


def spied(srv) -> list[str]:
    out, _, code = sh(srv, "cat /tmp/spy.json")
    return json.loads(out) if code == 0 and out else []


def test_git_clone_token_never_appears_in_any_environ_or_cmdline(srv):
    token = "tok-" + os.urandom(8).hex()
    serve_repo(srv, PORT, f"alice:{token}")
    assert not srv.call("write_file", path="/tmp/spy.py", content=SPY)[1]
    assert not srv.tool("bg", command="exec python3 /tmp/spy.py", name="spy")[1]
    assert wait_for(lambda: spied(srv), timeout=20)

    text, err = srv.call("git_clone", repo=f"http://127.0.0.1:{PORT}/demo.git", token=f"alice:{token}",
                         path="/workspace/c", shallow=False, call_timeout=150)
    assert not err, text
    assert text.split("\n")[0] == f"Cloned http://127.0.0.1:{PORT}/demo.git -> /workspace/c/demo", text
    # It authenticated: refused first, then let in.
    assert sh(srv, "cat /tmp/denied")[0] and sh(srv, "cat /tmp/granted")[0]
    assert sh(srv, "cat /workspace/c/demo/f") == ("hi\n", "", 0)

    time.sleep(0.5)  # one more pass of the spy after git ended
    seen = spied(srv)
    # The spy watched git while it waited on the server ...
    assert "GIT_CONFIG_COUNT=2" in seen, seen
    assert any("credential.helper" in s or "cat <&3" in s for s in seen), seen
    # ... and never saw the token, nor its Basic form.
    basic = base64.b64encode(f"alice:{token}".encode()).decode()
    assert not [s for s in seen if token in s or basic in s], [s for s in seen if token in s or basic in s]
    history, _ = srv.tool("history")
    assert token not in history
    # Nor is it in any file (the spy, which records this grep's argv, is stopped first).
    assert not srv.tool("kill", name="spy")[1]
    sh(srv, "rm -f /tmp/spy.json")
    _, _, code = sh(srv, f"grep -rqs {token[4:]} /workspace /root /etc /tmp")
    assert code == 1


def test_git_clone_bare_token_and_a_wrong_token(srv):
    token = "ghp_" + os.urandom(8).hex()
    serve_repo(srv, PORT + 1, f"x-access-token:{token}")
    text, err = srv.call("git_clone", repo=f"http://127.0.0.1:{PORT + 1}/demo.git", token="wrong",
                         path="/workspace/w", shallow=False, call_timeout=150)
    assert err and text.startswith("Error: cloning: "), text
    text, err = srv.call("git_clone", repo=f"http://127.0.0.1:{PORT + 1}/demo.git", token=token,
                         path="/workspace/b", shallow=False, call_timeout=150)
    assert not err, text
    assert sh(srv, "cat /workspace/b/demo/f") == ("hi\n", "", 0)
    # A newline would add lines to git's credential protocol.
    text, err = srv.tool("git_clone", repo=f"http://127.0.0.1:{PORT + 1}/demo.git", token="a\nhost=evil")
    assert err and text == "Error: token must not contain control characters", text


def test_history_and_state_file_redact_secrets(server_factory, env):
    srv = server_factory()
    commands = [
        ("mysql -u root -pS3cretA -e 'select 1' || true", "mysql -u root -p*** -e 'select 1' || true"),
        ("FOO_TOKEN=S3cretB env | grep -c FOO_TOKEN", "FOO_TOKEN=*** env | grep -c FOO_TOKEN"),
        ("curl -s -H 'Authorization: Bearer S3cretC' http://127.0.0.1:9/ || true",
         "curl -s -H 'Authorization: Bearer ***' http://127.0.0.1:9/ || true"),
        ("git ls-remote https://bob:S3cretD@127.0.0.1:9/r.git || true",
         "git ls-remote https://bob:***@127.0.0.1:9/r.git || true"),
        ("echo --password S3cretE token=S3cretF", "echo --password *** token=***"),
        ("curl -s -u alice:S3cretI http://127.0.0.1:9/ || true", "curl -s -u alice:*** http://127.0.0.1:9/ || true"),
        ("sshpass -pS3cretJ true || true", "sshpass -p*** true || true"),
        ("git ls-remote https://S3cretK@127.0.0.1:9/r.git || true", "git ls-remote https://***@127.0.0.1:9/r.git || true"),
        ("curl -s -H 'Cookie: sid=S3cretL; x=S3cretM' http://127.0.0.1:9/ || true",
         "curl -s -H 'Cookie: ***' http://127.0.0.1:9/ || true"),
        ("GH_PAT=S3cretN echo eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.S3cretO",
         "GH_PAT=*** echo ***"),
    ]
    for command, _ in commands:
        assert not srv.tool("exec", command=command)[1]
    assert not srv.tool("bg", command="sleep 60 --password=S3cretG", name="b")[1]
    assert not srv.tool("python", code="password = 'S3cretH'\nprint('ok')")[1]
    history, _ = srv.tool("history")
    assert "S3cret" not in history, history
    for _, shown in commands:
        assert shown in history, (shown, history)
    assert "bg[b]: sleep 60 --password=***" in history and "python: password = ***" in history, history

    # Committed before the tool answered: read as another process would.
    text = saved_state(env)
    assert "python: password" in text, text
    assert "S3cret" not in text and "FOO_TOKEN=***" in text, text
