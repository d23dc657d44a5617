"""`sandbox-mcp doctor` and `sandbox-mcp config` run as a user would, in an
isolated environment."""
from __future__ import annotations

import json
import os
import re
import subprocess

from conftest import required_env

CHECKS = (
    "helper", "userns", "subids", "cgroups", "seccomp", "overlayfs", "kvm", "tun", "apparmor", "vm", "image",
    "sandbox-ctl", "disk", "quota",
)


def run(env: dict[str, str], *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [required_env("SANDBOX_MCP_BIN"), *args],
        env={**os.environ, **env, **extra},
        capture_output=True,
        text=True,
        timeout=120,
    )


def lines_by_check(stdout: str) -> dict[str, str]:
    found = {}
    for line in stdout.splitlines():
        status, name = line.split()[:2]
        assert status in ("ok", "WARN", "FAIL"), line
        found[name] = line
    return found


def test_doctor_passes_here_with_one_line_per_check(env):
    out = run(env, "doctor")
    checks = lines_by_check(out.stdout)
    assert tuple(checks) == CHECKS, out.stdout
    assert out.returncode == 0, out.stdout + out.stderr
    assert checks["helper"].startswith("ok"), checks["helper"]
    assert checks["image"].startswith("ok") and required_env("SANDBOX_MCP_TEST_IMAGE") in checks["image"]
    for line in checks.values():
        assert line.startswith("ok") or "; fix: " in line, line
    # make test built the guest kernel and this helper's initramfs: the vm driver is ready, and
    # doctor says under which accelerator (KVM where a probe boot of the kernel passes, else TCG).
    vm = checks["vm"]
    assert re.match(r"ok +vm +ready: guest kernel \S+ under (KVM|TCG, qemu's software CPU)", vm), vm


def test_missing_vm_assets_are_a_warning_naming_make_install(env, tmp_path):
    out = run(env, "doctor", SANDBOX_MCP_VM_DIR=str(tmp_path))
    vm = lines_by_check(out.stdout)["vm"]
    assert out.returncode == 0, out.stdout
    assert vm.startswith("WARN") and 'isolation = "vm" cannot run: no vm kernel in ' + str(tmp_path) in vm, vm
    assert "fix: make install" in vm, vm


def test_missing_default_image_fails_with_the_fix(env):
    out = run(env, "doctor", SANDBOX_MCP_DEFAULT_IMAGE="no-such-image")
    image = lines_by_check(out.stdout)["image"]
    assert out.returncode == 1
    assert image.startswith("FAIL") and "no-such-image" in image, image
    assert "make install" in image and "sandbox-mcp image build --name no-such-image" in image, image


def test_missing_sandbox_ctl_is_a_warning_with_the_fix(env):
    out = run(env, "doctor", SANDBOX_CTL_BIN="/nonexistent/sandbox-ctl")
    ctl = lines_by_check(out.stdout)["sandbox-ctl"]
    assert out.returncode == 0, out.stdout
    assert ctl.startswith("WARN") and "start without sandbox-ctl" in ctl and "make install" in ctl, ctl


def test_unstartable_helper_fails(env):
    out = run(env, "doctor", SANDBOX_VM_HELPER_BIN="/nonexistent/sandbox-vm-helper")
    helper = lines_by_check(out.stdout)["helper"]
    assert out.returncode == 1
    assert helper.startswith("FAIL") and "SANDBOX_VM_HELPER_BIN" in helper, helper


def test_config_prints_each_client_registration(env):
    binary = os.path.realpath(required_env("SANDBOX_MCP_BIN"))
    out = run(env, "config", "claude")
    assert out.returncode == 0 and out.stdout.strip() == f"claude mcp add sandbox -- {binary}", out.stdout
    for client in ("cursor", "desktop"):
        out = run(env, "config", client)
        assert json.loads(out.stdout)["mcpServers"]["sandbox"] == {"command": binary, "args": []}
    out = run(env, "config", "cursor", "--http", "http://127.0.0.1:8765/mcp")
    assert json.loads(out.stdout)["mcpServers"]["sandbox"] == {"url": "http://127.0.0.1:8765/mcp"}
    out = run(env, "config", "claude", "--http", "http://127.0.0.1:8765/mcp", SANDBOX_MCP_TOKEN="t0k")
    assert out.stdout.strip() == (
        "claude mcp add --transport http sandbox http://127.0.0.1:8765/mcp --header 'Authorization: Bearer t0k'"
    )
