"""Shared pieces of the security suite (tests/test_security_*.py).

The attack tests share one server per module (starting a server and its
helper per test would cost the suite minutes), so this module has a
module-scoped server fixture built from the same pieces as conftest's
function-scoped ones: isolated XDG dirs, the shared test image, the real
binaries over stdio. Every attack test ends by checking that the server
and a bystander sandbox are unaffected (`assert_unaffected`).
"""
from __future__ import annotations

import base64
import contextlib
import json
import re
import uuid
from pathlib import Path
from typing import Any, Iterator

from conftest import (
    isolated_env,
    new_env_dir,
    remove_env_dir,
    required_env,
    saved_state,
    shared_image_store,
    stop_daemon,
    stop_servers,
)
from mcp_client import McpClient

# A sandbox that attacks never touch: it must keep answering, with the file
# it wrote at the start, after every attack on its neighbours.
BYSTANDER = "bystander"


class SecServer:
    """A server (stdio) in its own environment, with a bystander sandbox."""

    def __init__(self, client: McpClient, env: dict[str, str], extra_env: dict[str, str]):
        self.client = client
        self.env = env
        self.extra_env = extra_env
        self.tmp = Path(env["SANDBOX_MCP_TEST_TMP"])
        self.marker = uuid.uuid4().hex

    def call(self, tool: str, /, **args: Any) -> tuple[str, bool]:
        return self.client.call(tool, **args)

    def sh(self, command: str, sandbox: str = "default", timeout: float = 60, stdin: str = "") -> tuple[str, str, int]:
        """Runs a shell command in a sandbox: (stdout, stderr, exit code)."""
        r = self.client.call_raw(
            "exec", command=command, sandbox=sandbox, timeout=timeout, stdin=stdin, call_timeout=timeout + 60)
        out = r.structured_content
        assert out is not None and not r.is_error, r
        return out["stdout"], out["stderr"], out["exit_code"]

    def py(self, code: str, sandbox: str = "default", timeout: float = 60) -> tuple[str, str, int]:
        """Runs python3 code in a sandbox (passed base64 on the command line,
        so neither the tool nor a shell rewrites it)."""
        b64 = base64.b64encode(code.encode()).decode()
        return self.sh(f"python3 -c \"import base64; exec(base64.b64decode('{b64}'))\"", sandbox, timeout)

    def restart(self) -> None:
        """Stops this server and its daemon (the sandboxes live on in the
        helper) and starts a new one on the same state."""
        self.client.close()
        stop_daemon(self.env)
        self.client = _start(self.env, **self.extra_env)

    def saved(self) -> str:
        """What the state database holds, as text (see conftest.saved_state)."""
        return saved_state(self.env)

    def names(self) -> set[str]:
        """Names of the sandboxes `status` shows."""
        text, err = self.call("status")
        assert not err, text
        return set(re.findall(r"^  (\S+) .*  shell:", text, re.M))


def _start(env: dict[str, str], **extra_env: str) -> McpClient:
    log = f"{env['SANDBOX_MCP_TEST_TMP']}/server.log"
    return McpClient(required_env("SANDBOX_MCP_BIN"), env={**env, **extra_env}, stderr_path=log)


@contextlib.contextmanager
def sec_server(config: str | None = None, own_images: bool = False, **extra_env: str) -> Iterator[SecServer]:
    """A running server in fresh XDG dirs (optional config.toml text, an
    image store of its own for snapshots when `own_images`, and extra
    environment), its bystander sandbox started; everything stopped and
    removed afterwards."""
    base = new_env_dir()
    env = isolated_env(base)
    env["SANDBOX_MCP_TEST_TMP"] = base
    srv = None
    try:
        if config is not None:
            path = Path(env["XDG_CONFIG_HOME"]) / "sandbox-mcp" / "config.toml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(config)
        if own_images:
            # As conftest's image_store: the shared image symlinked in, new
            # images written beside it.
            image = required_env("SANDBOX_MCP_TEST_IMAGE")
            store = Path(base) / "images"
            store.mkdir()
            (store / image).symlink_to(Path(shared_image_store()) / image)
            env["SANDBOX_MCP_IMAGE_STORE"] = str(store)
        srv = SecServer(_start(env, **extra_env), env, extra_env)
        out, err, code = srv.sh(f"echo {srv.marker} > /workspace/bystander.txt", sandbox=BYSTANDER)
        assert code == 0, err
        yield srv
    finally:
        if srv is not None:
            srv.client.close()
        stop_servers(env)
        remove_env_dir(base)


def assert_unaffected(srv: SecServer, *also: str) -> None:
    """The server answers, the bystander sandbox runs commands and still has
    its file, and each sandbox in `also` (e.g. the attacker) still answers."""
    text, err = srv.call("status")
    assert not err and BYSTANDER in text, text
    out, err, code = srv.sh("cat /workspace/bystander.txt", sandbox=BYSTANDER)
    assert (out, code) == (f"{srv.marker}\n", 0), (out, err)
    for name in also:
        out, err, code = srv.sh("echo alive", sandbox=name)
        assert (out, code) == ("alive\n", 0), (name, out, err)
