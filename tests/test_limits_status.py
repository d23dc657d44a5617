"""`status`, `stats` and `health` tell the truth when a sandbox runs without
cpu/memory/pids limits: here a root server whose mount namespace hides
the cgroup mounts (as a helper without a usable hierarchy sees the host).
Unprivileged helpers without a delegated subtree take the same path; their
reason is covered by tests/test_doctor_user.py and the cgroup unit tests."""
from __future__ import annotations

import os

import pytest

from conftest import required_env
from mcp_client import McpClient

NOT_ENFORCED = "limits: not enforced (no cgroup hierarchy with memory, cpu and pids controllers; fix: "

# The server (and the helper it starts) see no cgroup mount at all.
HIDE_CGROUPS = 'umount -R /sys/fs/cgroup && exec "$0" "$@"'


@pytest.fixture
def unlimited(env):
    if os.geteuid() != 0:
        pytest.skip("hiding the cgroup mounts takes a mount namespace of root's")
    client = McpClient(
        "unshare",
        ["--mount", "--propagation", "private", "sh", "-c", HIDE_CGROUPS, required_env("SANDBOX_MCP_BIN")],
        env=env,
        stderr_path=f"{env['SANDBOX_MCP_TEST_TMP']}/server.log",
    )
    try:
        yield client
    finally:
        client.close()


def test_status_stats_and_health_say_limits_are_not_enforced(unlimited):
    # Some CPU time for the guest's sums to show (an `echo` alone can round to no clock tick).
    text, err = unlimited.tool("exec", command="python3 -c 'sum(range(10**7))' && echo up")
    assert not err and "up" in text, text
    status, _ = unlimited.tool("status")
    line = next(line for line in status.splitlines() if line.strip().startswith("default"))
    assert NOT_ENFORCED in line, status
    stats, _ = unlimited.tool("stats")
    assert "Limits:  " + NOT_ENFORCED in stats, stats
    data = unlimited.call_raw("stats").structured_content
    assert data["limits_not_enforced"].startswith("no cgroup hierarchy"), data
    # No cgroup counts the sandbox: the guest's own sums over its processes stand in.
    assert data["pids"] >= 2 and data["memory_used_bytes"] > 0 and data["cpu_seconds"] > 0, data
    health, _ = unlimited.tool("health")
    assert NOT_ENFORCED in health, health


def test_a_limited_sandbox_says_nothing_about_limits(server):
    if os.geteuid() != 0:
        pytest.skip("limits here come from root's cgroups")
    server.tool("exec", command="true")
    for tool in ("status", "stats", "health"):
        text, _ = server.tool(tool)
        assert "not enforced" not in text, text
    assert server.call_raw("stats").structured_content.get("limits_not_enforced") is None
