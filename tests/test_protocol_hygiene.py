"""Protocol hygiene (issue 11): what the server answers to input the official MCP clients never send
(raw JSON-RPC over stdio, raw HTTP), the spellings models do send, the tool schemas strict clients
validate, and what the server writes to stderr."""
from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import httpx2
import pytest
from conftest import required_env, stop_servers
from mcp.client.stdio import get_default_environment
from waiting import wait_for

# rmcp's (and our) limit on one stdio message.
MAX_LINE = 16 << 20
# JSON Schema 2020-12's format vocabulary.
STANDARD_FORMATS = {
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4", "ipv6",
    "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer",
    "relative-json-pointer", "regex",
}
REPLY_TIMEOUT = 60.0


def init_message(version: str = "2025-11-25", id: int = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": id,
        "method": "initialize",
        "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
    }


class RawStdio:
    """`sandbox-mcp` over stdio, driven with raw bytes: for input an SDK client cannot produce."""

    def __init__(self, env: dict[str, str], log_path: str):
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [required_env("SANDBOX_MCP_BIN")],
                env={**get_default_environment(), **env},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        self._buf = b""
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def reply(self, timeout: float = REPLY_TIMEOUT) -> dict[str, Any]:
        """The next message the server writes (failing the test after `timeout`)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                pytest.fail(f"no reply from the server within {timeout} s; its log:\n{self.log()[-3000:]}")
            if self._sel.select(min(left, 0.5)):
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    pytest.fail(f"the server closed stdout; its log:\n{self.log()[-3000:]}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        self.send(json.dumps(message).encode() + b"\n")
        return self.reply()

    def initialize(self) -> None:
        assert "result" in self.request(init_message()), "initialize failed"
        self.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')

    def call(self, id: int, tool: str, arguments: Any) -> dict[str, Any]:
        params = {"name": tool, "arguments": arguments}
        return self.request({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self._sel.close()


@pytest.fixture
def raw(env: dict[str, str]) -> Iterator[RawStdio]:
    """An initialized stdio server in `env`, spoken to in raw JSON-RPC lines."""
    server = RawStdio(env, f"{env['SANDBOX_MCP_TEST_TMP']}/raw.log")
    try:
        server.initialize()
        yield server
    finally:
        server.close()


def assert_error(reply: dict[str, Any], code: int, id: Any) -> str:
    assert "error" in reply and reply["error"]["code"] == code, reply
    assert reply.get("id") == id, reply
    return reply["error"]["message"]


def assert_alive(raw: RawStdio, id: int) -> None:
    assert raw.request({"jsonrpc": "2.0", "id": id, "method": "ping"}) == {"jsonrpc": "2.0", "id": id, "result": {}}


# ---------------------------------------------------------------- stdio framing


def test_unparsable_lines_get_a_parse_error(raw):
    for n, line in enumerate([b"{not json\n", b'{"jsonrpc":"2.0","id":2,"method":"tools/li\n', b"\xff\xfe{}\n"]):
        raw.send(line)
        assert_error(raw.reply(), -32700, None)
        assert_alive(raw, 100 + n)


def test_a_line_over_the_limit_gets_an_error_with_its_id_and_the_server_keeps_serving(raw):
    head = b'{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"write_file","arguments":{"content":"'
    raw.send(head + b"a" * MAX_LINE + b'","path":"big"}}}\n')
    message = assert_error(raw.reply(), -32600, 77)
    assert "16 MiB" in message, message
    assert_alive(raw, 78)


def test_ill_shaped_request_is_answered_with_its_id(raw):
    assert_error(raw.request({"jsonrpc": "2.0", "id": 3, "method": 7}), -32600, 3)
    assert_error(raw.request({"jsonrpc": "2.0", "id": "s-4", "method": "ping", "result": {}}), -32600, "s-4")


def test_arguments_as_a_list_are_invalid_params(raw):
    message = assert_error(raw.call(5, "env", [1]), -32602, 5)
    assert "arguments" in message, message


# ---------------------------------------------------------------- tool arguments


def tool_text(reply: dict[str, Any]) -> tuple[str, bool]:
    result = reply["result"]
    return "".join(c.get("text", "") for c in result["content"]), bool(result.get("isError"))


def test_argument_type_errors_say_error_and_name_the_argument(raw):
    text, err = tool_text(raw.call(6, "exec", {"command": 5}))
    assert err and text.startswith("Error:") and "`command`" in text, text
    text, err = tool_text(raw.call(7, "exec", {"command": "true", "timeout": [1]}))
    assert err and text.startswith("Error:") and "`timeout`" in text, text


def test_numbers_sent_as_strings_are_accepted(raw):
    text, err = tool_text(raw.call(8, "exec", {"command": "echo hi", "timeout": "5"}))
    assert not err and text.startswith("hi"), text
    text, _ = tool_text(raw.call(9, "logs", {"name": "nothing-here", "tail": "3"}))
    assert "deserialize" not in text and "`tail`" not in text, text


def test_env_with_an_unknown_action_names_the_allowed_ones(raw):
    text, err = tool_text(raw.call(10, "env", {"action": "explode"}))
    assert err and text.startswith("Error:"), text
    assert all(a in text for a in ("set", "unset", "list")), text


def nonstandard_formats(schema: Any, where: str) -> list[str]:
    if isinstance(schema, dict):
        found = [f"{where}: {schema['format']}"] if schema.get("format") not in (None, *STANDARD_FORMATS) else []
        return found + [f for k, v in schema.items() for f in nonstandard_formats(v, f"{where}.{k}")]
    if isinstance(schema, list):
        return [f for i, v in enumerate(schema) for f in nonstandard_formats(v, f"{where}[{i}]")]
    return []


def test_tool_schemas_use_only_json_schema_formats(server):
    tools = server.list_tools()
    assert len(tools) > 20
    found = []
    for tool in tools:
        found += nonstandard_formats(tool.input_schema, f"{tool.name}.input")
        found += nonstandard_formats(tool.output_schema, f"{tool.name}.output")
    assert not found, found


# ---------------------------------------------------------------- logs


def test_logs_are_plain_text_and_peer_info_is_debug_only(env):
    daemon_log = Path(env["XDG_STATE_HOME"]) / "sandbox-mcp" / "daemon.log"
    for level, peer_info_shown in (("info", False), ("debug", True)):
        # The daemon logs what the sessions do, at the level of the
        # environment it was started in: a fresh one per level.
        stop_servers(env)
        daemon_log.unlink(missing_ok=True)
        server = RawStdio({**env, "RUST_LOG": level}, f"{env['SANDBOX_MCP_TEST_TMP']}/log-{level}.log")
        try:
            server.initialize()
            assert tool_text(server.call(2, "list_all", {}))[1] is False
        finally:
            server.close()
        log = server.log() + daemon_log.read_text(errors="replace")
        assert "\x1b[" not in log, log[-2000:]
        assert ("peer_info" in log) == peer_info_shown, log[-2000:]


# ---------------------------------------------------------------- HTTP


def post(server, body: dict[str, Any], **headers: str) -> httpx2.Response:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json", **headers}
    return httpx2.post(server.url, json=body, headers={**server.auth, **headers}, timeout=REPLY_TIMEOUT)


def test_session_delete_answers_200_and_the_python_client_closes_quietly(http_server, caplog):
    server = http_server()
    opened = post(server, init_message())
    assert opened.status_code == 200, opened.text
    sid = opened.headers["mcp-session-id"]
    headers = {**server.auth, "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
    assert httpx2.delete(server.url, headers=headers, timeout=REPLY_TIMEOUT).status_code == 200
    with caplog.at_level(logging.WARNING, logger="mcp.client.streamable_http"):
        server.client().close()
    assert "Session termination failed" not in caplog.text, caplog.text


def sse_events(body: str) -> list[dict[str, str]]:
    events = []
    for block in body.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line and not line.startswith(":"):
                key, _, value = line.partition(":")
                fields[key] = fields.get(key, "") + value.strip()
        if fields:
            events.append(fields)
    return events


def test_sse_priming_events_only_for_clients_that_know_them(http_server):
    server = http_server()
    for version, primed in (("2025-06-18", False), ("2025-03-26", False), ("2025-11-25", True)):
        response = post(server, init_message(version))
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.text)
        priming = [e for e in events if not e.get("data")]
        assert bool(priming) == primed, (version, events)
        assert json.loads(events[-1]["data"])["result"]["protocolVersion"], events


class RawSession:
    """One MCP session over raw HTTP (2025-11-25), for what the SDK client does not do: leave a call
    running and then delete the session or drop the connection."""

    def __init__(self, server):
        self.server = server
        opened = post(server, init_message())
        assert opened.status_code == 200, opened.text
        self.headers = {**server.auth, "mcp-session-id": opened.headers["mcp-session-id"],
                        "mcp-protocol-version": "2025-11-25"}
        assert post(server, {"jsonrpc": "2.0", "method": "notifications/initialized"}, **self.headers).is_success

    def start_call(self, id: int, tool: str, **arguments: Any) -> httpx2.Client:
        """Sends a tools/call and reads only the response headers; the call keeps running. Closing the
        returned client drops the connection."""
        client = httpx2.Client(timeout=REPLY_TIMEOUT)
        body = {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
                   **self.headers}
        request = client.build_request("POST", self.server.url, json=body, headers=headers)
        response = client.send(request, stream=True)
        assert response.status_code == 200
        return client

    def delete(self) -> int:
        return httpx2.delete(self.server.url, headers=self.headers, timeout=REPLY_TIMEOUT).status_code


def sleepers(client, marker: str) -> list[str]:
    # The test image has no ps: the command lines straight from /proc.
    listing = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null"
    text, err = client.tool("exec", command=listing, sandbox="shared")
    assert not err, text
    return [line for line in text.splitlines() if line.startswith(marker)]


@pytest.mark.parametrize("end", ["delete", "disconnect"])
def test_ending_a_session_stops_its_running_exec(http_server, end):
    server = http_server()
    watcher = server.client()
    try:
        session = RawSession(server)
        marker = f"sleep 3{len(end)}71"
        call = session.start_call(2, "exec", command=marker, timeout=600, sandbox="shared")
        assert wait_for(lambda: sleepers(watcher, marker), timeout=REPLY_TIMEOUT), "the exec never started"
        if end == "delete":
            session.delete()
        call.close()
        gone = wait_for(lambda: not sleepers(watcher, marker), timeout=REPLY_TIMEOUT)
        assert gone, f"the exec outlived its session: {sleepers(watcher, marker)}"
    finally:
        watcher.close()


# ---------------------------------------------------------------- the TypeScript SDK

TS_CLIENT = Path(__file__).resolve().parent / "ts_client"


def ts_sdk_dir() -> Path:
    """The TypeScript SDK pinned in ts_client/package.json, installed once into a per-user cache dir
    (skips the test with the reason when node or npm is missing or the install fails)."""
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("node and npm are needed to run the TypeScript SDK client")
    version = json.loads((TS_CLIENT / "package.json").read_text())["dependencies"]["@modelcontextprotocol/sdk"]
    cache = Path(tempfile.gettempdir()) / f"smcp-ts-sdk-{version}-{os.getuid()}"
    if not (cache / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        cache.mkdir(exist_ok=True)
        shutil.copy(TS_CLIENT / "package.json", cache / "package.json")
        out = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent"], cwd=cache,
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            pytest.skip(f"npm could not install the TypeScript SDK: {out.stderr[-500:]}")
    for script in TS_CLIENT.glob("*.mjs"):
        shutil.copy(script, cache / script.name)
    return cache


def test_typescript_sdk_client_prints_no_schema_warnings(env):
    cache = ts_sdk_dir()
    out = subprocess.run(["node", str(cache / "client.mjs"), required_env("SANDBOX_MCP_BIN")],
                         env={**os.environ, **env}, capture_output=True, text=True, timeout=REPLY_TIMEOUT * 2)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["tools"] > 20 and summary["text"].startswith("from-ts") and not summary["isError"], summary
    assert "unknown format" not in out.stderr, out.stderr[-3000:]


# How long the TypeScript client is watched after it cancels a call: rmcp asks for
# reconnections every 3 s, so a client caught re-fetching makes several GETs in it.
TS_WATCH_SECONDS = 12


def test_typescript_sdk_client_stops_fetching_after_a_cancelled_call(http_server):
    server = http_server()
    cache = ts_sdk_dir()
    out = subprocess.run(["node", str(cache / "cancel.mjs"), server.url, server.token or "", str(TS_WATCH_SECONDS)],
                         capture_output=True, text=True, timeout=REPLY_TIMEOUT * 2)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["outcome"].startswith("rejected") and "cancels the call" in summary["outcome"], summary
    # At most one attempt to resume the cancelled call's stream, answered so the client stops.
    assert len(summary["gets"]) <= 1, summary
    assert summary["text"].startswith("still-works") and not summary["errors"], summary


def read_events(response: httpx2.Response, until) -> list[dict[str, str]]:
    """SSE events from a streaming response, up to the first for which `until(event)` holds."""
    events: list[dict[str, str]] = []
    pending = ""
    for chunk in response.iter_text():
        pending += chunk
        while "\n\n" in pending:
            block, pending = pending.split("\n\n", 1)
            events += sse_events(block + "\n\n")
            if events and until(events[-1]):
                return events
    return events


def test_a_dropped_call_resumed_in_time_finishes_and_repeats_no_event(http_server):
    server = http_server()
    session = RawSession(server)
    # Longer than the 10 s the server waits for a resume before it cancels a dropped call.
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "exec", "arguments": {"command": "sleep 14; echo resumed-ok", "timeout": 120},
                       "_meta": {"progressToken": "p"}}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json", **session.headers}
    with httpx2.Client(timeout=REPLY_TIMEOUT) as client:
        response = client.send(client.build_request("POST", server.url, json=call, headers=headers), stream=True)
        seen = read_events(response, lambda e: "progress" in e.get("data", ""))
        response.close()
    last = seen[-1]["id"]
    resume = {**session.headers, "Accept": "text/event-stream", "Last-Event-ID": last}
    with httpx2.stream("GET", server.url, headers=resume, timeout=REPLY_TIMEOUT) as response:
        assert response.status_code == 200
        replayed = read_events(response, lambda e: '"result"' in e.get("data", ""))
    assert replayed and all(e.get("id") != last for e in replayed), (last, replayed)
    result = json.loads(replayed[-1]["data"])
    assert result["id"] == 2 and not result["result"]["isError"], result
    assert result["result"]["content"][0]["text"].startswith("resumed-ok"), result


def test_a_body_over_the_limit_is_refused_whole(http_server):
    server = http_server()
    session = RawSession(server)
    # Over one MCP message's ceiling (16 MiB, as a stdio line).
    big = "a" * (16 << 20)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "write_file", "arguments": {"path": "big", "content": big}}}
    assert post(server, call, **session.headers).status_code == 413
    assert post(server, {**init_message(), "padding": big}).status_code == 413
    check = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
             "params": {"name": "exec", "arguments": {"command": "test ! -e /workspace/big && echo absent"}}}
    text, err = tool_text(json.loads(sse_events(post(server, check, **session.headers).text)[-1]["data"]))
    assert not err and text.startswith("absent"), text
