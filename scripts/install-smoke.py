"""What a freshly installed sandbox-mcp must do for the user who installed it (`make test-install`): the MCP
client registration `sandbox-mcp config cursor` prints is started exactly as a client would start it, and a
sandbox is created, used and destroyed through the real MCP client (tests/mcp_client.py), then a vm sandbox
(`isolation = "vm"`, from a profile this adds to the user's config.toml): `make install` set the vm driver up.
    python install-smoke.py /abs/path/to/installed/sandbox-mcp [--no-vm]
--no-vm leaves the vm sandbox out (`make test-deb`: the Debian package carries no guest kernel).
Prints one line per step; exits non-zero on the first failure."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from mcp_client import McpClient  # noqa: E402


VM_PROFILE = "[profiles.vmsmoke]"
# A wheel and an npm package made inside the sandbox (no index reached), installed as an agent types it.
MAKE_WHEEL = """
import zipfile
files = {"hello_smcp/__init__.py": "",
         "hello_smcp-1.0.dist-info/METADATA": "Metadata-Version: 2.1\\nName: hello-smcp\\nVersion: 1.0\\n",
         "hello_smcp-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\\nGenerator: smoke\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
files["hello_smcp-1.0.dist-info/RECORD"] = "".join(f"{f},,\\n" for f in files) + "hello_smcp-1.0.dist-info/RECORD,,\\n"
with zipfile.ZipFile("/tmp/hello_smcp-1.0-py3-none-any.whl", "w") as z:
    for f, text in files.items():
        z.writestr(f, text)
"""
PIP_AND_NPM = (
    "set -e; pip install -q /tmp/hello_smcp-1.0-py3-none-any.whl && python3 -c 'import hello_smcp' && echo pip-ok; "
    "mkdir -p /tmp/hello && cd /tmp/hello && "
    """printf '%s' '{"name":"hello-smcp","version":"1.0.0","bin":{"hello-smcp":"cli.js"}}' > package.json && """
    """printf '#!/usr/bin/env node\\nconsole.log("hi from npm -g")\\n' > cli.js && """
    "npm pack --silent >/dev/null && npm install -g --offline ./hello-smcp-1.0.0.tgz >/dev/null && hello-smcp"
)


def step(what: str, ok: bool, detail: str) -> None:
    print(f"install-smoke: {'ok  ' if ok else 'FAIL'} {what}: {detail.strip()[:300]}", flush=True)
    if not ok:
        sys.exit(1)


def main() -> None:
    binary = sys.argv[1]
    with_vm = "--no-vm" not in sys.argv[2:]
    registration = subprocess.run([binary, "config", "cursor"], capture_output=True, text=True, check=True).stdout
    server = json.loads(registration)["mcpServers"]["sandbox"]
    step("registration", Path(server["command"]) == Path(binary), f"{server['command']} {server['args']}")
    log = Path(tempfile.mkstemp(prefix="install-smoke-", suffix=".log", dir=Path.home())[1])
    print(f"install-smoke: server log {log}", flush=True)
    # The server's project is its working directory, as for a client started in a checkout: the sandbox's
    # volume is keyed `<first 6 hex of SHA-256 of the project path>-<name>`.
    project = os.path.realpath(Path.home())
    key = f"{hashlib.sha256(project.encode()).hexdigest()[:6]}-smoke"
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "sandbox-mcp" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    if with_vm and VM_PROFILE not in (config.read_text() if config.exists() else ""):
        with config.open("a") as f:
            f.write(f'\n{VM_PROFILE}\nisolation = "vm"\nnetwork = "none"\n')
    with McpClient(server["command"], server["args"], env=dict(os.environ), stderr_path=str(log), cwd=project) as client:
        out, err = client.call("exec", sandbox="smoke", command="id -u; cat /etc/debian_version")
        step("exec (creates the sandbox)", not err and out.startswith("0\n"), out)
        out, err = client.call("write_file", sandbox="smoke", path="notes.txt", content="written by the smoke test\n")
        step("write_file", not err, out)
        out, err = client.call("read_file", sandbox="smoke", path="notes.txt")
        step("read_file", not err and "written by the smoke test" in out, out)
        volume = Path.home() / ".local/share/sandbox-mcp/volumes" / key / "workspace/notes.txt"
        owner = volume.stat().st_uid
        if os.getuid() == 0:
            # Root's sandboxes run as subordinate ids: what their root writes is never host root's.
            step("the file is not host root's", owner != 0, f"{volume} owned by {owner}")
        else:
            step("the file is the user's on the host", owner == os.getuid(), str(volume))
        # What an agent types first in the default image: no flags, no venv (README, Images).
        out, err = client.call("python", sandbox="smoke", code=MAKE_WHEEL)
        step("a wheel made in the sandbox", not err, out)
        out, err = client.call("exec", sandbox="smoke", command=PIP_AND_NPM, call_timeout=300)
        step("pip install and npm install -g", not err and "pip-ok" in out and "hi from npm -g" in out, out)
        out, err = client.call("list_all")
        step("list_all", not err and "smoke" in out, out)
        out, err = client.call("destroy", sandbox="smoke")
        step("destroy", not err, out)
        out, err = client.call("list_all")
        step("gone after destroy", "smoke" not in out, out)
        if not with_vm:
            print("install-smoke: skip a vm sandbox (--no-vm)", flush=True)
            return
        # The vm's first boot is cold under TCG (seconds) and builds the image's layer disk.
        out, err = client.call("exec", sandbox="vmsmoke", command="uname -r", call_timeout=600)
        step("a vm sandbox answers (its own kernel)", not err and out.split("\n")[0] != os.uname().release, out)
        out, err = client.call("destroy", sandbox="vmsmoke", call_timeout=300)
        step("destroy the vm sandbox", not err, out)


if __name__ == "__main__":
    main()
