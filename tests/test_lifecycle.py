"""status, list_all, destroy, reset, history and install through a real MCP client."""
import os
import subprocess

import pytest

from conftest import ON_VM, TEST_ISOLATION, isolated_env, new_env_dir, remove_env_dir, required_env, sandbox_key
from waiting import poll


def test_status_and_list_all_empty(server):
    assert server.tool("status") == ("No active sandboxes (boot on first use)", False)
    assert server.tool("list_all") == ("No active sandboxes. Use any sandbox tool to auto-create 'default'.", False)


def test_status_and_list_all(server):
    server.tool("exec", command="true")
    server.tool("exec", command="true", sandbox="other")
    text, _ = server.tool("status")
    lines = text.split("\n")
    assert lines[0].startswith("  default      default  shell:alive  idle:")
    assert "2cpu/512M" in lines[0] and "cmds:1" in lines[0]
    assert lines[1].startswith("  other ")
    assert any(line.startswith("Image:    ") for line in lines)
    text, _ = server.tool("list_all")
    rows = text.split("\n")
    assert rows[0].split() == ["Name", "Container", "Shell", "Idle", "Resources", "Isolation", "Project"]
    assert rows[1] == "─" * 102
    assert rows[2].split()[5] == (TEST_ISOLATION or "namespaces"), rows[2]
    assert rows[2].split()[0] == "default" and rows[2].split()[2] == "alive"


def test_a_name_with_underscores_boots_with_a_valid_hostname(server):
    # `_` is valid in sandbox names but never in hostnames.
    text, err = server.tool("exec", command="hostname", sandbox="my_box")
    assert not err and text.split("\n")[0] == "my-box", text


def test_destroy_keeps_workspace(server):
    server.tool("exec", command="echo kept > /workspace/keep.txt; echo gone > /tmp/gone")
    text, err = server.tool("destroy", sandbox="default")
    assert not err and text == f"Destroyed sandbox 'default' ({sandbox_key('default')})", text
    assert server.tool("status")[0].startswith("No active sandboxes")
    out, _ = server.tool("exec", command="cat /workspace/keep.txt; cat /tmp/gone")
    assert out.startswith("kept\n[stderr] cat: /tmp/gone: No such file or directory")


def test_destroy_errors(server):
    text, err = server.tool("destroy", sandbox="nope")
    assert err and text == "Error: no active sandbox 'nope'"
    text, err = server.tool("destroy", sandbox="../etc")
    assert err and text.startswith("Error: invalid sandbox name '../etc'")


def test_reset(server):
    server.tool("exec", command="echo ws > /workspace/w.txt; echo root > /etc/marker")
    server.tool("env", action="set", key="A", value="1")
    text, err = server.tool("reset")
    assert not err and text == "Fresh sandbox 'default' ready: default (workspace preserved)"
    out, _ = server.tool("exec", command='cat /workspace/w.txt; test -e /etc/marker || echo no-marker; echo "${A-unset}"')
    assert out.startswith("ws\nno-marker\nunset\n"), out
    text, _ = server.tool("reset", wipe_workspace=True)
    assert text == "Fresh sandbox 'default' ready: default (workspace wiped)"
    out, _ = server.tool("exec", command="ls -A /workspace | wc -l")
    assert out.startswith("0\n")


def test_reset_creates_missing(server):
    text, err = server.tool("reset", sandbox="fresh")
    assert not err and text.startswith("Fresh sandbox 'fresh' ready")


def test_history_newest_first_and_redacted(server):
    assert server.tool("history") == ("No command history for 'default'.", False)
    server.tool("exec", command="echo first")
    server.tool("exec", command="exit 4")
    server.tool("exec", command="curl -H 'Authorization: Bearer abc123secret' https://example.invalid || true")
    text, _ = server.tool("history", limit=2)
    lines = text.split("\n")
    assert lines[0] == "Recent commands in 'default' (2 shown):"
    assert lines[1].startswith("   1. [ok] ") and "Authorization: Bearer ***" in lines[1]
    assert "abc123secret" not in text
    assert lines[2].startswith("   2. [exit:4] ") and lines[2].endswith("  exit 4")


@pytest.mark.skipif(ON_VM, reason="the vm driver shares only /workspace: the apt cache volume does not reach a vm")
def test_install_with_apt(server):
    text, err = server.tool("install", packages="jq", _timeout=600)
    assert not err, text
    assert "jq" in text
    out, _ = server.tool("exec", command="echo '{\"a\": 5}' | jq .a")
    assert out.startswith("5\n")
    # The apt cache is a per-sandbox volume: the downloaded package survives reset.
    server.tool("reset")
    out, _ = server.tool("exec", command="ls /var/cache/apt/archives/ | grep -c '^jq_' ; command -v jq || echo gone")
    assert out.startswith("1\ngone\n"), out


# A wheel made inside the sandbox (no index reached): one module, its metadata and record.
MAKE_WHEEL = r"""
import zipfile
name = "/tmp/hello_smcp-1.0-py3-none-any.whl"
files = {
    "hello_smcp/__init__.py": "GREETING = 'hello from a wheel'\n",
    "hello_smcp-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: hello-smcp\nVersion: 1.0\n",
    "hello_smcp-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
files["hello_smcp-1.0.dist-info/RECORD"] = "".join(f"{f},,\n" for f in files) + "hello_smcp-1.0.dist-info/RECORD,,\n"
with zipfile.ZipFile(name, "w") as z:
    for f, text in files.items():
        z.writestr(f, text)
print(name)
"""


def test_pip_install_works_as_an_agent_types_it(server):
    """Debian's Python refuses a plain `pip install` (PEP 668); the image's /etc/pip.conf lets it install into
    /usr/local, so an agent's first pip install works without flags or a venv."""
    text, err = server.tool("python", code=MAKE_WHEEL)
    assert not err and "/tmp/hello_smcp-1.0-py3-none-any.whl" in text, text
    out, err = server.tool("exec", command="pip install /tmp/hello_smcp-1.0-py3-none-any.whl 2>&1; echo rc=$?")
    assert not err and "rc=0" in out and "Successfully installed hello-smcp-1.0" in out, out
    assert "externally-managed" not in out, out
    out, err = server.tool("exec", command="python3 -c 'import hello_smcp; print(hello_smcp.GREETING, hello_smcp.__file__)'")
    assert not err and out.startswith("hello from a wheel /usr/local/lib/python3"), out


def test_a_missing_default_image_names_the_command_that_builds_it(front_end, tmp_path):
    """A user who installed without `make install` (a package, an archive) has no default image yet: the first
    call says how to make it, and the server stays up."""
    client = front_end(SANDBOX_MCP_IMAGE_STORE=str(tmp_path), SANDBOX_MCP_DEFAULT_IMAGE="mcp-dev")
    for name in ("default", "other"):
        text, err = client.tool("exec", command="true", sandbox=name)
        assert err and "image 'mcp-dev' not found" in text and "sandbox-mcp image build" in text, text
    text, err = client.tool("status")
    assert not err, text


def test_install_rejects_options_and_shell(server):
    for bad in ("--allow-unauthenticated", "jq;id", "$(id)"):
        text, err = server.tool("install", packages=bad)
        assert err and text.startswith("Error: invalid package name"), text
    text, err = server.tool("install", packages="  ")
    assert err and text == "Error: packages must name at least one package"


def test_install_unknown_package(server):
    text, err = server.tool("install", packages="no-such-package-smcp", _timeout=600)
    assert err
    assert "Unable to locate package no-such-package-smcp" in text


@pytest.mark.skipif(ON_VM, reason="kills the agent as PID 2, the namespace driver's; a vm's: "
                                  "test_vm_isolation.py kills its qemu and resets it")
def test_a_dead_sandbox_is_reported_not_replaced(server):
    server.tool("exec", command="echo keep > /workspace/k")
    server.tool("exec", command="kill -9 2")  # the sandbox's agent: the VM goes down with it
    text, err = server.tool("exec", command="echo hi")
    assert err and "stopped" in text and "reset(sandbox='default')" in text, text
    assert poll(lambda: server.tool("status")[0], lambda t: "shell:dead" in t), "status never showed it dead"
    server.tool("reset")
    out, _ = server.tool("exec", command="cat /workspace/k")
    assert out.startswith("keep\n")


def test_a_runtime_dir_too_long_for_a_socket_is_named_at_once():
    """A helper socket path over the kernel's 107 bytes cannot be bound: the
    server says so and what to change, instead of waiting for a helper that
    can never answer."""
    base = new_env_dir()
    try:
        env = {**os.environ, **isolated_env(base)}
        env["XDG_RUNTIME_DIR"] = os.path.join(base, "r" * 110)
        os.makedirs(env["XDG_RUNTIME_DIR"], mode=0o700)
        r = subprocess.run([required_env("SANDBOX_MCP_BIN"), "serve"], env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0, r
        assert "over the 107 a Unix socket allows: set XDG_RUNTIME_DIR to a shorter directory" in r.stderr, r.stderr
    finally:
        remove_env_dir(base)
