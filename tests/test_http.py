"""`sandbox-mcp serve --http`: sessions, bearer token, Host/Origin checks,
through the official MCP client and raw HTTP requests. Every request goes to
127.0.0.1, even when the server is bound to 0.0.0.0."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import required_env
from mcp_client import McpError

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw-test", "version": "0"},
    },
}
TOKEN = "test-token-0123456789abcdef"


def post(url: str, headers: dict[str, str] | None = None, body: dict | None = None) -> tuple[int, dict[str, str]]:
    """POSTs a JSON-RPC message; returns (status, response headers)."""
    data = json.dumps(body or INIT).encode()
    req = urllib.request.Request(url, data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json, text/event-stream")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}


def token_file(env: dict[str, str]) -> Path:
    return Path(env["XDG_CONFIG_HOME"]) / "sandbox-mcp" / "http-token"


def test_two_sessions_share_sandboxes_with_their_own_ids(http_server):
    server = http_server()
    one, two = server.client(), server.client()
    try:
        assert one.session_id and two.session_id and one.session_id != two.session_id
        text, err = one.tool("write_file", path="from-one.txt", content="written by session one\n")
        assert not err, text
        text, err = two.tool("read_file", path="/workspace/from-one.txt")
        assert not err and text == "written by session one\n", text
        # Both sessions busy at once on the same server.
        with ThreadPoolExecutor(2) as pool:
            runs = [
                pool.submit(c.tool, "exec", command=f"sleep 0.3; echo {n}", sandbox="shared")
                for n, c in (("a", one), ("b", two))
            ]
            outs = [r.result()[0] for r in runs]
        assert outs[0].startswith("a") and outs[1].startswith("b"), outs
    finally:
        one.close()
        two.close()


def test_wildcard_bind_requires_the_generated_token(http_server, env):
    server = http_server("0.0.0.0:0")
    path = token_file(env)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = path.read_text().strip()
    assert len(token) == 64
    assert token in Path(server.log_path).read_text(), "the new token is printed to stderr"
    url = f"http://127.0.0.1:{server.port}/mcp"
    status, headers = post(url)
    assert status == 401 and headers.get("www-authenticate") == "Bearer"
    assert post(url, {"Authorization": "Bearer " + "0" * 64})[0] == 401
    assert post(url, {"Authorization": f"Bearer {token}"})[0] == 200
    with pytest.raises(McpError):
        server.client({}).close()
    client = server.client({"Authorization": f"Bearer {token}"})
    try:
        assert any(t.name == "exec" for t in client.list_tools())
    finally:
        client.close()
    # A second start reuses the stored token and does not print it again.
    server.stop()
    again = http_server("0.0.0.0:0")
    assert path.read_text().strip() == token
    assert token not in Path(again.log_path).read_text()
    assert post(f"http://127.0.0.1:{again.port}/mcp", {"Authorization": f"Bearer {token}"})[0] == 200


def test_explicit_token_is_required_on_loopback_too(http_server):
    server = http_server(SANDBOX_MCP_TOKEN=TOKEN)
    assert post(server.url)[0] == 401
    client = server.client({"Authorization": f"Bearer {TOKEN}"})
    try:
        assert client.session_id
    finally:
        client.close()


def test_short_token_is_refused_at_start(env):
    out = subprocess.run(
        [required_env("SANDBOX_MCP_BIN"), "serve", "--http", "127.0.0.1:0", "--token", "short"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "invalid token" in out.stderr, out.stderr


def test_foreign_origin_and_host_are_forbidden(http_server):
    server = http_server()
    auth = server.auth
    assert post(server.url, {"Origin": "http://evil.example", **auth})[0] == 403
    assert post(server.url, {"Origin": "null", **auth})[0] == 403
    assert post(server.url, {"Host": "evil.example", **auth})[0] == 403
    assert post(server.url, {"Host": f"localhost:{server.port}", **auth})[0] == 200


def test_origin_must_name_the_port_served(http_server):
    """Another port on localhost is another origin (any local web app): only
    the served port's pages may call."""
    server = http_server()
    auth = server.auth
    for host in ("localhost", "127.0.0.1", "[::1]"):
        assert post(server.url, {"Origin": f"http://{host}:{server.port}", **auth})[0] == 200, host
    other = 9999 if server.port != 9999 else 9998
    for origin in (f"http://localhost:{other}", "http://localhost:5173", "http://localhost", "https://127.0.0.1"):
        status, _ = post(server.url, {"Origin": origin, **auth})
        assert status == 403, origin


def test_allowed_host_widens_host_and_origin(http_server):
    # Without a port the name is accepted on the served port; with one (a
    # proxy in front), on that port.
    server = http_server(args=("--allowed-host", "sandbox.test", "--allowed-host", "proxy.test:443"))
    ok = {"Host": "sandbox.test", "Origin": f"http://sandbox.test:{server.port}", **server.auth}
    assert post(server.url, ok)[0] == 200
    assert post(server.url, {"Origin": "https://sandbox.test", **server.auth})[0] == 403
    assert post(server.url, {"Origin": "https://proxy.test", **server.auth})[0] == 200
    assert post(server.url, {"Origin": f"http://proxy.test:{server.port}", **server.auth})[0] == 403
    assert post(server.url, {"Origin": "https://other.test", **server.auth})[0] == 403


def test_only_mcp_is_served(http_server):
    server = http_server()
    for path in ("/", "/other"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(server.base + path, timeout=30)
        assert e.value.code == 404


# ---------------------------------------------------------------- a token on loopback too (issue 9)


def test_loopback_requires_the_generated_token_by_default(http_server, env):
    # Any local process (a sandbox did, through its network) or other user
    # reaches a loopback port: without a token it could drive every tool.
    server = http_server()
    path = token_file(env)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    token = path.read_text().strip()
    assert len(token) == 64 and server.token == token
    assert "bearer token required" in Path(server.log_path).read_text()
    status, headers = post(server.url)
    assert status == 401 and headers.get("www-authenticate") == "Bearer"
    assert post(server.url, {"Authorization": "Bearer " + "0" * 64})[0] == 401
    assert post(server.url, {"Authorization": f"Basic {token}"})[0] == 401
    assert post(server.url, {"Authorization": f"Bearer {token}"})[0] == 200
    with pytest.raises(McpError):
        server.client({}).close()
    client = server.client()
    try:
        text, err = client.tool("exec", command="echo authenticated")
        assert not err and text.startswith("authenticated"), text
    finally:
        client.close()


def test_no_auth_turns_the_token_off_and_says_so(http_server, env):
    server = http_server(args=("--no-auth",))
    log = Path(server.log_path).read_text()
    assert "--no-auth: HTTP requests are NOT authenticated" in log and "(no token: --no-auth)" in log, log
    assert not token_file(env).exists()
    assert post(server.url)[0] == 200
    client = server.client({})
    try:
        assert any(t.name == "exec" for t in client.list_tools())
    finally:
        client.close()


def test_no_auth_and_a_token_exclude_each_other(env):
    out = subprocess.run(
        [required_env("SANDBOX_MCP_BIN"), "serve", "--http", "127.0.0.1:0", "--no-auth", "--token", TOKEN],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--no-auth" in out.stderr, out.stderr


def test_config_prints_the_stored_token_for_a_loopback_url(http_server, env):
    server = http_server()
    token = server.token

    def config(client: str) -> str:
        out = subprocess.run(
            [required_env("SANDBOX_MCP_BIN"), "config", client, "--http", server.url],
            env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert config("claude").strip() == (
        f"claude mcp add --transport http sandbox {server.url} --header 'Authorization: Bearer {token}'")
    cursor = json.loads(config("cursor"))
    assert cursor["mcpServers"]["sandbox"]["headers"]["Authorization"] == f"Bearer {token}"
    desktop = json.loads(config("desktop"))
    assert desktop["mcpServers"]["sandbox"]["env"]["SANDBOX_MCP_AUTH"] == f"Bearer {token}"
    # The printed header works.
    assert post(server.url, {"Authorization": f"Bearer {token}"})[0] == 200
