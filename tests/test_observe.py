"""stats, health and the idle reaper through a real MCP client."""
import re
import socket
import time

from conftest import needs_cgroup_limits, write_config


@needs_cgroup_limits
def test_stats(server):
    server.tool("bg", command="sleep 300", name="sleeper")
    text, err = server.tool("stats")
    assert not err, text
    lines = text.split("\n")
    assert lines[0] == "Sandbox: default ('default', 2cpu/512M)"
    assert re.search(r"^Memory:  [\d.]+[KMG]?B / 512\.0MB \(\d+%\)$", text, re.M), text
    assert re.search(r"^CPU:     \d+\.\d\ds total$", text, re.M)
    assert re.search(r"^PIDs:    \d+$", text, re.M)
    assert re.search(r"^Disk:    .+ \(\d+% used\)$", text, re.M)
    assert re.search(r"^Quota:   .+ / 10\.0GB \(\d+%; writable layer, /tmp and /workspace\)$", text, re.M), text
    assert re.search(r"^Uptime:  \d+m \d+s$", text, re.M)
    assert "BgProcs: sleeper" in text
    assert lines[-1].startswith("History: ")


@needs_cgroup_limits
def test_health(server):
    assert server.tool("health") == ("No active sandboxes", False)
    server.tool("exec", command="true")
    server.tool("exec", command="true", sandbox="b")
    text, err = server.tool("health")
    assert not err
    lines = text.split("\n")
    assert lines[0] == "2 sandbox(es), 0 issue(s)", text
    assert re.match(r"^b:  shell=ok  isolation=namespaces  disk=\d+%.*  mem=\d+%  quota=\d+%  up=\d+m\d+s  procs=\d+$", lines[1]), lines[1]


def test_stats_and_health_show_a_disk_quota_stop(server_factory, env):
    write_config(env, '[defaults]\ndisk = "64M"\n')
    srv = server_factory()
    # A steady writer (1 MiB every 20 ms, 300 MiB in all) meets the watcher well before it ends.
    writer = "for i in $(seq 300); do head -c 1048576 /dev/zero >> /workspace/big; sleep 0.02; done"
    text, _ = srv.tool("exec", command=writer, timeout=120)
    assert "disk quota exceeded" in text, text
    text, err = srv.tool("stats")
    assert not err and re.search(r"^Quota:   disk quota exceeded: .+ used of 64 MiB", text, re.M), text
    data = srv.call_raw("stats").structured_content
    assert data["quota_limit_bytes"] == 64 << 20 and data["quota_exceeded"].startswith("disk quota exceeded"), data
    text, _ = srv.tool("health")
    assert re.search(r"quota=\d+% (HIGH|FULL)", text) and "1 issue(s)" in text, text
    srv.tool("exec", command="rm -f /workspace/big")


@needs_cgroup_limits
def test_health_flags_oom(server):
    server.tool("exec", command="python3 -c 'x = bytearray(900 * 1024 * 1024)'", timeout=60)
    text, _ = server.tool("health")
    assert "OOM" in text and "1 issue(s)" in text, text


def test_idle_sandboxes_are_reaped_but_not_default(server_factory):
    srv = server_factory(SANDBOX_MCP_IDLE_TTL="2")
    srv.tool("exec", command="true")
    srv.tool("exec", command="true", sandbox="temp")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status, _ = srv.tool("status")
        if "temp" not in status:
            break
        time.sleep(0.2)
    assert "temp" not in status, status
    assert "default" in status


def test_reaping_stops_the_sandboxes_forwards(server_factory):
    srv = server_factory(SANDBOX_MCP_IDLE_TTL="2")
    text, err = srv.tool("expose", port=8080, host_port=18931, sandbox="temp2")
    assert not err, text
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "temp2" in srv.tool("status")[0]:
        time.sleep(0.2)
    deadline = time.monotonic() + 5
    refused = False
    while time.monotonic() < deadline and not refused:
        try:
            socket.create_connection(("127.0.0.1", 18931), timeout=1).close()
            time.sleep(0.1)
        except ConnectionRefusedError:
            refused = True
    assert refused, "the forward kept listening after its sandbox was reaped"
    text, err = srv.tool("unexpose", port=18931)
    assert err and text.startswith("Error: no forward on localhost:18931"), text


@needs_cgroup_limits
def test_helpers_with_separate_state_do_not_share_cgroups(server):
    """cgroup paths are host-global: a second helper (another user's or test
    run's XDG dirs) with a sandbox of the same name must not see this one's
    counters."""
    import os

    from conftest import isolated_env, new_env_dir, remove_env_dir, stop_servers
    from mcp_client import McpClient

    server.tool("exec", command="python3 -c 'x = bytearray(900 * 1024 * 1024)'", timeout=60)
    assert "OOM" in server.tool("health")[0]
    base = new_env_dir()
    env = isolated_env(base)
    other = McpClient(os.environ["SANDBOX_MCP_BIN"], env=env, stderr_path=f"{base}/server.log")
    try:
        other.tool("exec", command="true")
        text, _ = other.tool("health")
        assert "OOM" not in text and "0 issue(s)" in text, text
    finally:
        other.close()
        stop_servers(env)
        remove_env_dir(base)
