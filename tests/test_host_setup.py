"""`sandbox-mcp host-setup`: what root does once for an ordinary user, run
for throwaway users (root only), and what that user can then do."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import delegated_cgroups, required_env, run_as


def host_setup(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [required_env("SANDBOX_MCP_BIN"), "host-setup", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def subid_lines(user: str) -> list[str]:
    files = ("/etc/subuid", "/etc/subgid")
    return [line for f in files for line in Path(f).read_text().splitlines() if line.startswith(f"{user}:")]


def test_host_setup_is_idempotent_and_lets_the_user_limit_and_network(new_user):
    user = new_user(subids=False)
    first = host_setup("--user", user)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "done     /etc/subuid: added " in first.stdout and f"for {user}" in first.stdout, first.stdout
    assert f"cgroup: delegated /sys/fs/cgroup/memory/sandbox-mcp.{user} to {user}" in first.stdout, first.stdout
    ranges = subid_lines(user)
    assert len(ranges) == 2 and ranges[0].endswith(":65536") and ranges[0] == ranges[1], ranges

    again = host_setup("--user", user)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() and all(line.startswith("ok ") for line in again.stdout.splitlines()), again.stdout
    assert subid_lines(user) == ranges

    # The user makes a group in its subtree and moves its own shell into it.
    memory = Path(f"/sys/fs/cgroup/memory/sandbox-mcp.{user}")
    enter = (
        f"mkdir {memory}/t && echo 16777216 > {memory}/t/memory.limit_in_bytes"
        f" && echo $$ > {memory}/t/cgroup.procs && cat /proc/self/cgroup"
    )
    out = run_as(user, ["sh", "-c", enter])
    assert out.returncode == 0, out.stderr
    assert f"memory:/sandbox-mcp.{user}/t" in out.stdout, out.stdout
    (memory / "t").rmdir()
    # ...and creates a tun in its own user + network namespace (EGRESS networking).
    out = run_as(user, ["unshare", "-Urn", "ip", "tuntap", "add", "dev", "tun0", "mode", "tun"])
    assert out.returncode == 0, out.stderr


def test_dry_run_changes_nothing(new_user):
    user = new_user(subids=False)
    out = host_setup("--user", user, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "would    /etc/subuid: add " in out.stdout and "usermod --add-subuids" in out.stdout, out.stdout
    assert f"would    cgroup: create /sys/fs/cgroup/memory/sandbox-mcp.{user}" in out.stdout, out.stdout
    assert subid_lines(user) == [] and delegated_cgroups(user) == []


def test_refuses_without_root_and_names_the_command(new_user):
    user = new_user()
    out = run_as(user, [required_env("SANDBOX_MCP_BIN"), "host-setup"], {"SUDO_USER": user})
    assert out.returncode == 1
    assert "must run as root: sudo sandbox-mcp host-setup --user " + user in out.stderr, out.stderr
    assert delegated_cgroups(user) == []


def test_needs_an_existing_user(new_user):
    new_user()  # root only, like the rest of this file
    env = {k: v for k, v in os.environ.items() if k != "SUDO_USER"}
    out = subprocess.run([required_env("SANDBOX_MCP_BIN"), "host-setup"], env=env, capture_output=True, text=True)
    assert out.returncode == 1 and "pass --user NAME" in out.stderr, out.stderr
    out = host_setup("--user", "smcp-no-such-user")
    assert out.returncode == 1 and "no such user: smcp-no-such-user" in out.stderr, out.stderr


def test_root_itself_needs_nothing(new_user):
    new_user()
    out = host_setup("--user", "root")
    assert out.returncode == 0 and out.stdout.startswith("ok       root needs no setup"), out.stdout
