"""Leases (extend_ttl, expiry reaping) and the capacity preflight through a real MCP client."""
import re
import socket
from datetime import datetime, timezone

import pytest

from conftest import volume_dir
from waiting import wait_for

LEASE_RE = re.compile(r"^Lease of '([^']+)' now ends at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) \(in (\d+)m\)$")


def lease_end(text: str) -> datetime:
    m = LEASE_RE.match(text)
    assert m, text
    return datetime.strptime(m.group(2), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def test_extend_ttl_errors(server_factory):
    srv = server_factory(SANDBOX_MCP_MAX_LEASE_TTL="30")
    text, err = srv.tool("extend_ttl", minutes=5, sandbox="nope")
    assert err and text == "Error: no active sandbox 'nope'", text
    srv.tool("exec", command="true")
    for minutes in (0, 31):
        text, err = srv.tool("extend_ttl", minutes=minutes)
        assert err and text == f"Error: minutes must be between 1 and 30 (max_lease_ttl), got {minutes}", text
    text, err = srv.tool("extend_ttl", minutes=30)
    assert not err and text.endswith("(in 30m)"), text


def test_extend_ttl_adds_to_the_current_end(server):
    server.tool("exec", command="true")
    first, err = server.tool("extend_ttl", minutes=5)
    assert not err and LEASE_RE.match(first).group(1) == "default", first
    assert first.endswith("(in 5m)")
    second, _ = server.tool("extend_ttl", minutes=10)
    assert second.endswith("(in 15m)"), second
    assert (lease_end(second) - lease_end(first)).total_seconds() == 600
    assert re.search(r"  lease:1[45]m\d+s", server.tool("status")[0])
    # The sandbox is not reaped early because of it.
    out, err = server.tool("exec", command="echo alive")
    assert not err and out.startswith("alive")


def test_lease_expiry_reaps_default_and_its_forwards(server_factory, env):
    srv = server_factory(SANDBOX_MCP_LEASE_TTL_SECONDS="2")
    srv.tool("exec", command="echo kept > /workspace/keep.txt")
    text, err = srv.tool("expose", port=8080, host_port=18947, sandbox="other")
    assert not err, text
    gone = wait_for(lambda: srv.tool("status")[0].startswith("No active sandboxes"), timeout=20)
    assert gone, srv.tool("status")[0]

    def refused():
        try:
            socket.create_connection(("127.0.0.1", 18947), timeout=1).close()
            return False
        except ConnectionRefusedError:
            return True

    assert wait_for(refused, timeout=5), "the forward kept listening after its sandbox's lease ended"
    # Destroyed through the normal path: the workspace volume survives.
    assert (volume_dir(env, "default") / "workspace" / "keep.txt").read_text() == "kept\n"


def test_extend_ttl_keeps_a_leased_sandbox_alive(server_factory):
    srv = server_factory(SANDBOX_MCP_LEASE_TTL_SECONDS="3")
    srv.tool("exec", command="true", sandbox="short")
    srv.tool("exec", command="true", sandbox="long")
    text, err = srv.tool("extend_ttl", minutes=10, sandbox="long")
    assert not err, text
    assert wait_for(lambda: "short" not in srv.tool("status")[0], timeout=20)
    assert "long" in srv.tool("status")[0]


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"SANDBOX_MCP_LEASE_TTL": "500"}, "config lease_ttl: must not exceed max_lease_ttl (120 minutes)"),
        ({"SANDBOX_MCP_MAX_LEASE_TTL": "0"}, "config max_lease_ttl: must be 1 to"),
        ({"SANDBOX_MCP_MAX_SANDBOXES": "many"}, "config SANDBOX_MCP_MAX_SANDBOXES: 'many' is not a whole number"),
        ({"SANDBOX_MCP_MAX_SANDBOXES": "0"}, "config max_sandboxes: must be at least 1"),
    ],
)
def test_bad_limits_stop_the_server(server_factory, bad, message):
    with pytest.raises(AssertionError) as e:
        server_factory(**bad)
    assert "did not start" in str(e.value) and message in str(e.value), str(e.value)


def test_max_sandboxes_refuses_before_creating(server_factory, env):
    srv = server_factory(SANDBOX_MCP_MAX_SANDBOXES="1")
    srv.tool("exec", command="true")
    text, err = srv.tool("exec", command="true", sandbox="second")
    assert err and text == (
        "Error: cannot create sandbox 'second': 1 sandboxes already exist (max_sandboxes = 1); destroy one first"
    ), text
    assert "second" not in srv.tool("status")[0]
    assert not volume_dir(env, "second").exists(), "the refused sandbox left a volume behind"
    srv.tool("destroy", sandbox="default")
    text, err = srv.tool("exec", command="echo ok", sandbox="second")
    assert not err and text.startswith("ok"), text


def test_memory_preflight_refuses(server_factory, env):
    srv = server_factory(SANDBOX_MCP_MEMORY_HEADROOM_MB=str(1 << 40))
    text, err = srv.tool("exec", command="true")
    assert err, text
    m = re.match(
        r"^Error: cannot create sandbox 'default': host has (\d+) MiB memory available, needs (\d+) MiB "
        r"\(the sandbox's limit \+ (\d+) MiB headroom\)$",
        text,
    )
    assert m and int(m.group(2)) == 512 + (1 << 40) and int(m.group(3)) == 1 << 40, text
    assert srv.tool("status")[0].startswith("No active sandboxes")
    assert not volume_dir(env, "default").exists()


def test_disk_preflight_refuses(server_factory):
    srv = server_factory(SANDBOX_MCP_MIN_FREE_DISK_MB=str(1 << 40))
    text, err = srv.tool("exec", command="true")
    assert err and re.match(r"^Error: cannot create sandbox 'default': only \d+ MiB free disk in /\S+, needs \d+ MiB$", text), text
    assert srv.tool("status")[0].startswith("No active sandboxes")
