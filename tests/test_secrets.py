"""Secrets stay secret (issue 9; weaknesses #10 and #9): a git_clone token
reaches git on a descriptor, never in any process's environment or argv
where other code in the sandbox reads it, and history and the state file
redact secrets typed on command lines; env values are sealed at rest."""
import base64
import hashlib
import json
import os
import secrets
import sqlite3
import stat
import time
from pathlib import Path

from conftest import saved_state, stop_daemon
from test_persistence import kill9_server
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


def files_holding(env: dict[str, str], needle: bytes) -> list[str]:
    """The state database's files (the WAL too) and every log on the host
    side that hold `needle` as bytes."""
    state = Path(env["XDG_STATE_HOME"]) / "sandbox-mcp"
    paths = [state / n for n in ("state.db", "state.db-wal")]
    paths += [*state.rglob("*.log"), *Path(env["SANDBOX_MCP_TEST_TMP"]).rglob("*.log")]
    return [str(p) for p in paths if p.is_file() and needle in p.read_bytes()]


def test_env_values_are_sealed_at_rest_yet_survive_a_restart_and_a_clone(server_factory, env):
    token = f"tok-{secrets.token_hex(12)}"
    srv = server_factory()
    text, err = srv.tool("env", action="set", key="API_TOKEN", value=token)
    assert not err, text
    text, err = srv.tool("env", action="set", key="PLAIN_NAME", value=f"also-{token}")
    assert not err, text
    out, _, code = sh(srv, "printenv API_TOKEN; printenv PLAIN_NAME")
    assert code == 0 and out.split() == [token, f"also-{token}"], out
    # Committed before the tool answered, sealed: not in the file, its WAL
    # or any log; the key beside it is the user's alone.
    assert files_holding(env, token.encode()) == []
    assert token not in saved_state(env)
    values = [v for (v,) in _env_rows(env)]
    assert len(values) == 2 and all(v.startswith("sealed:v1:") for v in values), values
    key = Path(env["XDG_STATE_HOME"]) / "sandbox-mcp" / "state.key"
    assert stat.S_IMODE(key.lstat().st_mode) == 0o600 and key.lstat().st_size == 32
    history, _ = srv.tool("history")
    assert token not in history, history

    # A clone has the env, and its record holds it sealed too.
    text, err = srv.tool("clone", source="default", target="copy")
    assert not err, text
    out, _, code = sh(srv, "printenv API_TOKEN", sandbox="copy")
    assert code == 0 and out.strip() == token, out
    assert files_holding(env, token.encode()) == []
    assert len(_env_rows(env)) == 4

    # kill -9 of the server: the next one opens what the database holds.
    srv.close()
    kill9_server(env)
    srv = server_factory()
    for sandbox in ("default", "copy"):
        out, _, code = sh(srv, "printenv API_TOKEN", sandbox=sandbox)
        assert code == 0 and out.strip() == token, (sandbox, out)
    assert files_holding(env, token.encode()) == []
    text, _ = srv.tool("history", limit=50)
    assert token not in text, text

    # A value stored in plaintext (by a version before sealing) is used,
    # and sealed in place when the next server opens the database. (An open
    # front-end would start a new daemon at once: it is closed first.)
    srv.close()
    stop_daemon(env)
    old = f"old-{secrets.token_hex(12)}"
    with sqlite3.connect(_db(env), timeout=10) as db:
        db.execute("UPDATE env SET value = ? WHERE key = 'API_TOKEN' AND sandbox LIKE '%-default'", (old,))
    db.close()
    srv = server_factory()
    out, _, code = sh(srv, "printenv API_TOKEN")
    assert code == 0 and out.strip() == old, out
    assert all(v.startswith("sealed:v1:") for (v,) in _env_rows(env))
    assert files_holding(env, old.encode()) == []


def _db(env: dict[str, str]) -> Path:
    return Path(env["XDG_STATE_HOME"]) / "sandbox-mcp" / "state.db"


def _env_rows(env: dict[str, str]) -> list[tuple[str]]:
    db = sqlite3.connect(f"file:{_db(env)}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute("SELECT value FROM env").fetchall()
    finally:
        db.close()


def test_a_lost_env_key_keeps_the_sandboxs_copy_and_env_set_works(server_factory, env):
    """The key file deleted between two servers (a restore from a backup without it): the saved values cannot
    be opened; the sandbox's own copy of its env is used, a later `env set` works (the values are sealed again
    with the new key), and `health` says what happened instead of a log line only."""
    srv = server_factory()
    text, err = srv.tool("env", action="set", key="KEPT", value="kept-1")
    assert not err, text
    # An open front-end would start a new daemon at once: closed first.
    srv.close()
    stop_daemon(env)
    (Path(env["XDG_STATE_HOME"]) / "sandbox-mcp" / "state.key").unlink()
    srv = server_factory()
    out, _, code = sh(srv, "printenv KEPT")
    assert code == 0 and out.strip() == "kept-1", out
    text, err = srv.tool("env", action="set", key="AFTER", value="after-1")
    assert not err, text
    out, _, code = sh(srv, "printenv KEPT; printenv AFTER")
    assert code == 0 and out.split() == ["kept-1", "after-1"], out
    text, _ = srv.tool("health")
    assert "state.key" in text and "could not be opened" in text, text
    # The next server opens what was sealed again.
    srv.close()
    stop_daemon(env)
    srv = server_factory()
    out, _, code = sh(srv, "printenv KEPT; printenv AFTER")
    assert code == 0 and out.split() == ["kept-1", "after-1"], out
    text, _ = srv.tool("health")
    assert "could not be opened" not in text, text
