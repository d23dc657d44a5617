"""`make conformance HELPER_SOCKET=…`, the way a Mac user proves the Swift helper, run here against a
Linux helper started by hand: the suite talks only to that socket, boots the image it is told to, and
cleans up its VMs; without a socket it says what to set."""
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import isolated_env, new_env_dir, remove_env_dir, required_env

ROOT = Path(__file__).resolve().parent.parent


def make(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-s", "--no-print-directory", "-C", str(ROOT), *args], env=env,
                          capture_output=True, text=True, timeout=900)


def test_make_conformance_runs_the_suite_against_a_running_helper() -> None:
    if os.geteuid() != 0:
        pytest.skip("make conformance builds with cargo in root's target dir; as the test user the suite "
                    "runs from its built binary (scripts/test-user.sh)")
    base = new_env_dir()
    helper = None
    try:
        env = {**os.environ, **isolated_env(base)}
        socket = Path(base) / "helper.sock"
        helper = subprocess.Popen([required_env("SANDBOX_VM_HELPER_BIN"), "serve", "--socket", str(socket)],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not socket.exists():
            assert helper.poll() is None and time.monotonic() < deadline, "the helper did not come up"
            time.sleep(0.1)
        image = required_env("SANDBOX_MCP_TEST_IMAGE")
        done = make("conformance", f"HELPER_SOCKET={socket}", f"CONFORMANCE_IMAGE={image}",
                    "CONFORMANCE_FILTER=lifecycle_create_start_stop_restart_delete", env=env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "test result: ok. 1 passed" in done.stdout, done.stdout[-3000:]
        # Its VMs are gone again: the suite deletes what it made on a helper it does not own.
        vms = Path(base) / "state" / "sandbox-mcp" / "vms"
        assert not vms.exists() or not any(vms.iterdir()), list(vms.iterdir())
    finally:
        if helper is not None:
            helper.terminate()
            helper.wait(timeout=30)
        remove_env_dir(base)


def test_make_conformance_without_a_socket_says_what_to_set() -> None:
    done = make("conformance", env=dict(os.environ))
    assert done.returncode == 2 and "set HELPER_SOCKET=/path/to/helper.sock" in done.stderr, done
