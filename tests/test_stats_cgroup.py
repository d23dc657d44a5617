"""`stats` reports memory, tasks and CPU time as the sandbox's cgroup counts
them (what its limits are enforced against), not a sum over its processes,
which counts each shared page once per process; and an exec refused at the
task limit says so. The cgroup is found on the host from one of the
sandbox's processes (/proc/PID/cgroup), the way any reader of the host
would, as root or as the user whose delegated subtree holds it."""
from __future__ import annotations

import re
import secrets
import time
from pathlib import Path

import pytest

from conftest import ON_VM, pids_of, write_config

# A vm's processes run under its own kernel, out of the host's sight; its
# guest's group is what `stats` reads there (tests/helper_conformance).
pytestmark = pytest.mark.skipif(ON_VM, reason="the sandbox's processes and cgroup are inside the vm's guest")

MIB = 1 << 20
SLEEPERS = 45


def cgroup_mounts() -> dict[str, Path]:
    """Mount point of each v1 controller (by name) and of cgroup2 (`""`)."""
    mounts: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields = right.split()
        if len(fields) < 3:
            continue
        point = Path(left.split()[4])
        if fields[0] == "cgroup2":
            mounts[""] = point
        elif fields[0] == "cgroup":
            for option in fields[2].split(","):
                mounts[option] = point
    return mounts


class Group:
    """The cgroup files of the group holding host process `pid`, as the
    helper uses them: v1 when the memory controller has a v1 hierarchy
    (hybrid hosts too), else v2."""

    def __init__(self, pid: int):
        mounts = cgroup_mounts()
        paths: dict[str, str] = {}
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path.lstrip("/")
        self.v1 = "memory" in mounts and "memory" in paths
        if self.v1:
            self.memory = mounts["memory"] / paths["memory"]
            self.pids = mounts["pids"] / paths["pids"]
        else:
            self.memory = self.pids = mounts[""] / paths[""]

    def read(self, d: Path, name: str) -> str:
        return (d / name).read_text()

    def working_set(self) -> int:
        """The charge less the inactive file cache: the figure `stats` shows."""
        if self.v1:
            charge, inactive = int(self.read(self.memory, "memory.usage_in_bytes")), "total_inactive_file"
        else:
            charge, inactive = int(self.read(self.memory, "memory.current")), "inactive_file"
        stat = dict(line.split() for line in self.read(self.memory, "memory.stat").splitlines())
        return max(charge - int(stat.get(inactive, 0)), 0)

    def charge(self) -> int:
        return int(self.read(self.memory, "memory.usage_in_bytes" if self.v1 else "memory.current"))

    def tasks(self) -> int:
        return int(self.read(self.pids, "pids.current"))


def until(check, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def rss_sum(pids: list[int]) -> int:
    """What the old reading did: each process's resident set, summed."""
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * 4096
        except OSError:
            pass
    return total


def test_stats_are_the_cgroups_own_figures(server):
    marker = f"stats-{secrets.token_hex(4)}"
    sleeper = f"python3 -c 'import time; time.sleep(600)' {marker}"
    text, err = server.tool("exec", command=f"for i in $(seq {SLEEPERS}); do nohup {sleeper} >/dev/null 2>&1 & done")
    assert not err, text
    sleepers = until(lambda: len(pids_of("python3", arg=marker)) >= SLEEPERS and pids_of("python3", arg=marker),
                     f"{SLEEPERS} sleepers")
    data = server.call_raw("stats").structured_content
    if data.get("limits_not_enforced"):
        # No cgroup holds this user's sandbox: the guest's own sums stand in.
        assert data["pids"] >= SLEEPERS and data["memory_used_bytes"] > 0, data
        pytest.skip(f"the cgroup figures: limits are not enforced here ({data['limits_not_enforced']}); "
                    "checked the fallback to the guest's sums instead")
    group = Group(sleepers[0])
    # Let the interpreters finish starting before the figures are compared.
    time.sleep(1)
    before = (group.working_set(), group.tasks())
    data = server.call_raw("stats").structured_content
    after = (group.working_set(), group.tasks())
    used, limit = data["memory_used_bytes"], data["memory_limit_bytes"]
    low, high = min(before[0], after[0]), max(before[0], after[0])
    slack = max(high // 10, 4 * MIB)
    assert low - slack <= used <= high + slack, f"stats {used}, cgroup {before[0]}..{after[0]}: {data}"
    assert used < limit == 512 * MIB, data
    assert used <= group.charge() + slack, "never more than the cgroup is charged"
    assert data["pids"] in (before[1], after[1]), f"stats {data['pids']}, cgroup {before[1]}, {after[1]}"
    assert data["pids"] >= SLEEPERS, data
    assert data["cpu_seconds"] > 0, data
    # The old reading, shared interpreter pages counted once per process,
    # would have said more than the whole group holds.
    assert rss_sum(sleepers) > used, (rss_sum(sleepers), used)
    before = group.tasks()
    text, _ = server.tool("stats")
    after = group.tasks()
    pct = re.search(r"^Memory:  [\d.]+[KMG]?B / 512\.0MB \((\d+)%\)$", text, re.M)
    assert pct and int(pct.group(1)) < 100, text
    shown = re.search(r"^PIDs:    (\d+)$", text, re.M)
    assert shown and int(shown.group(1)) in (before, after), (text, before, after)


# Keeps the group full (tests/fixtures/fill_pids.py says how).
FILLER = (Path(__file__).parent / "fixtures" / "fill_pids.py").read_text()

PIDS = 32


def test_an_exec_at_the_task_limit_names_it(server_factory, env):
    write_config(env, f"[defaults]\npids = {PIDS}\n")
    srv = server_factory()
    text, err = srv.tool("exec", command=f"cat > /tmp/fill.py <<'EOF'\n{FILLER}EOF\nnohup python3 /tmp/fill.py >/dev/null 2>&1 &")
    assert not err, text
    data = srv.call_raw("stats").structured_content
    if data.get("limits_not_enforced"):
        pytest.skip(f"no task limit to reach: limits are not enforced here ({data['limits_not_enforced']})")
    until(lambda: srv.call_raw("stats").structured_content["pids"] >= PIDS, f"{PIDS} tasks")
    want = (rf"^Error: cannot start the process: the sandbox is at its process limit \(pids = (\d+) of {PIDS}\); "
            r"kill background processes or raise its limit \(`pids` in sandbox-mcp's config")
    for tool, args in (("exec", {"command": "true"}), ("bg", {"command": "true", "name": "one-more"})):
        text, err = srv.tool(tool, **args)
        found = re.search(want, text)
        assert err and found and int(found.group(1)) >= PIDS * 9 // 10, f"{tool}: {text}"
