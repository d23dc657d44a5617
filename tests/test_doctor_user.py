"""`sandbox-mcp doctor` run as an ordinary user (root creates the user): it
reports what it really tried as that user, and each non-ok names the fix."""
from __future__ import annotations

import pwd
import subprocess
from pathlib import Path

from conftest import required_env, run_as, stop_servers, user_env
from test_doctor import lines_by_check


def doctor_as(user: str) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """Doctor as `user`, with a store of its own (root's test store is 0700, as root's store under /root is)."""
    env = user_env(user)
    env["SANDBOX_MCP_IMAGE_STORE"] = str(Path(env["XDG_DATA_HOME"]) / "sandbox-mcp" / "images")
    try:
        out = run_as(user, [required_env("SANDBOX_MCP_BIN"), "doctor"], env)
    finally:
        stop_servers(env)
    return out, lines_by_check(out.stdout)


def test_doctor_as_a_set_up_user_says_ok_for_what_it_tried(new_user):
    user = new_user()
    setup = subprocess.run(
        [required_env("SANDBOX_MCP_BIN"), "host-setup", "--user", user], capture_output=True, text=True
    )
    assert setup.returncode == 0, setup.stderr
    out, checks = doctor_as(user)
    assert checks["helper"].startswith("ok"), checks["helper"]
    # Exactly the map the helper gives sandboxes: root is the user, 1..65535 from its range (65535 ids, not 65536).
    uid = pwd.getpwnam(user).pw_uid
    start = next(int(line.split(":")[1]) for line in open("/etc/subuid") if line.split(":")[0] in (user, str(uid)))
    helper_map = f"newuidmap/newgidmap mapped a child's ids (0 {uid} 1 1 {start} 65535)"
    assert checks["userns"].startswith("ok") and helper_map in checks["userns"], checks["userns"]
    assert checks["subids"].startswith("ok") and f"{user} has subordinate ids" in checks["subids"]
    cgroups = checks["cgroups"]
    assert cgroups.startswith("ok") and f"sandbox-mcp.{user}/" in cgroups and "moved a process" in cgroups, cgroups
    assert checks["tun"].startswith("ok"), checks["tun"]
    # A new user has no image yet: the one failure, and it names how to make one.
    image = checks["image"]
    assert image.startswith("FAIL") and "default image mcp-test" in image and "make install" in image, image
    failed = [line for line in out.stdout.splitlines() if line.startswith("FAIL")]
    assert failed == [image], out.stdout + out.stderr
    assert out.returncode == 1, out.stdout + out.stderr


def test_doctor_as_a_user_without_setup_warns_and_fails_with_the_fix(new_user):
    user = new_user(subids=False)
    out, checks = doctor_as(user)
    fix = f"fix: sudo sandbox-mcp host-setup --user {user}"
    cgroups = checks["cgroups"]
    assert cgroups.startswith("WARN  cgroups    limits not enforced: no cgroup subtree delegated to " + user), cgroups
    assert cgroups.endswith(fix), cgroups
    subids = checks["subids"]
    assert subids.startswith("FAIL") and f"no range of 65536 ids for {user} in /etc/subuid" in subids, subids
    assert checks["subids"].endswith(fix), checks["subids"]
    assert checks["userns"].startswith("FAIL") and "ids cannot be mapped" in checks["userns"], checks["userns"]
    assert checks["userns"].endswith(fix), checks["userns"]
    assert out.returncode == 1
