"""The docker_* tools (issue 12) through a real MCP client.

Cheap, always run: every tool refuses on a namespace sandbox, naming the fix
(`isolation = "vm"`), and creates nothing; bad arguments are refused before
anything runs, each error naming its argument.

Heavy (a vm sandbox under TCG, dockerd in the guest): build a `FROM scratch`
image of the sandbox image's static busybox (no registry is reachable), run,
exec, logs, ps, images, compose up/ps/down, cleanup, and a privileged
container with the VM's root bound in, which sees the VM, not the host. It
needs the vm driver (as tests/test_vm_isolation.py finds it) and the docker
test image (`make test-image-docker`) and skips, saying which, without them.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from conftest import shared_image_store, write_config
from test_vm_isolation import missing_vm_driver, vm_dir

TOOLS = {
    "docker_build": {"context_path": ".", "image_tag": "app:1"},
    "docker_run": {"image": "app:1"},
    "docker_exec": {"container": "web", "command": "true"},
    "docker_logs": {"container": "web"},
    "docker_compose": {"project_dir": ".", "action": "ps"},
    "docker_ps": {},
    "docker_images": {},
    "docker_cleanup": {},
}
FIX = 'docker_* tools need a vm sandbox: set isolation = "vm" (in .sandbox-mcp.toml or the profile) and reset'
DOCKER_IMAGE = os.environ.get("SANDBOX_MCP_DOCKER_TEST_IMAGE", "mcp-docker")
# dockerd under TCG on a loaded host: a call may take minutes.
SLOW = 600.0


def test_every_docker_tool_refuses_a_namespace_sandbox_naming_the_fix(server):
    names = {t.name for t in server.list_tools()}
    assert set(TOOLS) <= names, names
    for tool, args in TOOLS.items():
        text, err = server.call(tool, sandbox="box", **args)
        assert err, f"{tool}: {text}"
        assert text.startswith(f"Error: {FIX}"), f"{tool}: {text}"
        assert "'box' runs on the namespaces driver" in text, f"{tool}: {text}"
    # Refused before anything was made.
    text, _ = server.call("list_all")
    assert text.startswith("No active sandboxes"), text


@pytest.mark.parametrize("tool, args, argument", [
    ("docker_build", {"context_path": ".", "image_tag": "App:Latest"}, "image_tag"),
    ("docker_build", {"context_path": ".", "image_tag": "app:1", "build_args": {"A=B": "1"}}, "build_args"),
    ("docker_build", {"context_path": "--file=/etc/passwd", "image_tag": "app:1"}, "context_path"),
    ("docker_run", {"image": "app", "ports": ["8080:99999"]}, "ports"),
    ("docker_run", {"image": "app", "ports": ["eighty"]}, "ports"),
    ("docker_run", {"image": "app", "env": {"KEY=X": "1"}}, "env"),
    ("docker_run", {"image": "app", "volumes": ["../../etc:/etc2"]}, "volumes"),
    ("docker_run", {"image": "app", "volumes": ["/data:relative"]}, "volumes"),
    ("docker_run", {"image": "app", "name": "--privileged"}, "name"),
    ("docker_run", {"image": "--privileged"}, "image"),
    ("docker_exec", {"container": "web", "command": "true", "timeout_seconds": 0}, "timeout_seconds"),
    ("docker_logs", {"container": "web", "since": "$(id)"}, "since"),
    ("docker_compose", {"project_dir": ".", "action": "explode"}, "action"),
    ("docker_compose", {"project_dir": ".", "action": "exec", "command": "true"}, "services"),
    ("docker_cleanup", {"mode": "everything"}, "mode"),
])
def test_bad_arguments_are_refused_naming_the_argument(front_end, tool, args, argument):
    """Checked before the sandbox's isolation: the same errors on any
    sandbox, and nothing is created."""
    server = front_end()
    text, err = server.call(tool, **args)
    assert err, text
    assert text.startswith(f"Error: argument `{argument}`"), text
    text, _ = server.call("list_all")
    assert text.startswith("No active sandboxes"), text


def test_read_only_docker_tools_never_create_a_sandbox(env, front_end):
    """On a sandbox that would be a vm, the tools that only read or act on
    what exists answer that there is no such sandbox and boot nothing."""
    write_config(env, '[defaults]\nisolation = "vm"\nnetwork = "none"\n')
    server = front_end()
    for tool in ("docker_exec", "docker_logs", "docker_ps", "docker_images", "docker_cleanup"):
        text, err = server.call(tool, sandbox="ghost", **TOOLS[tool])
        assert err and text == "Error: no active sandbox 'ghost'", f"{tool}: {text}"
    assert server.call("status")[0].startswith("No active sandboxes"), server.call("status")[0]


# ---------------------------------------------------------------- vm sandbox

def vm_requirements() -> dict[str, str]:
    """The environment a vm sandbox with Docker needs, or a skip naming what is missing."""
    why = missing_vm_driver()
    if why:
        pytest.skip(why)
    if not (Path(shared_image_store()) / DOCKER_IMAGE / "image.json").is_file():
        pytest.skip(f"no image {DOCKER_IMAGE} in the test image store: run `make test-image-docker`")
    return {"SANDBOX_MCP_VM_DIR": str(vm_dir()), "SANDBOX_MCP_DEFAULT_IMAGE": DOCKER_IMAGE}


def ok(server, tool: str, **args) -> str:
    text, err = server.call(tool, call_timeout=SLOW, **args)
    assert not err, f"{tool}: {text}"
    assert "[exit code" not in text, f"{tool}: {text}"
    return text


@pytest.mark.heavy
def test_docker_workloads_in_a_vm_sandbox(env, front_end, tmp_path):
    extra = vm_requirements()
    # The vm driver has no egress yet; the default image is the docker one.
    write_config(env, '[defaults]\nisolation = "vm"\nnetwork = "none"\ntrust_host_ca = false\nmemory = "1G"\n')
    server = front_end(**extra)

    # A FROM scratch image of the sandbox image's static busybox.
    ok(server, "exec", command="mkdir -p /workspace/ctx && cp /bin/busybox /workspace/ctx/", timeout=SLOW)
    ok(server, "write_file", path="/workspace/ctx/Dockerfile",
       content='FROM scratch\nCOPY busybox /bin/sh\nCOPY busybox /bin/busybox\nCMD ["/bin/sh", "-c", "echo hello"]\n')
    text = ok(server, "docker_build", context_path="ctx", image_tag="scratch-test:1")
    assert text.startswith("$ docker build -t scratch-test:1 ctx\n"), text
    result = server.call_raw("docker_build", call_timeout=SLOW, context_path="ctx", image_tag="scratch-test:1")
    assert result.structured_content["command"] == "docker build -t scratch-test:1 ctx", result.structured_content
    assert result.structured_content["exit_code"] == 0, result.structured_content

    text = ok(server, "docker_run", image="scratch-test:1", name="web",
              command="sh -c 'echo started; while true; do busybox sleep 1; done'")
    assert text.startswith("$ docker run -d --name web scratch-test:1 sh -c "), text

    text = ok(server, "docker_exec", container="web", command="echo inside $((6*7))")
    assert "\ninside 42\n" in text, text
    text = ok(server, "docker_logs", container="web", tail=10)
    assert "\nstarted\n" in text, text
    assert "web" in ok(server, "docker_ps")
    assert "scratch-test" in ok(server, "docker_images")

    # A stopped container for cleanup to remove.
    text = ok(server, "docker_run", image="scratch-test:1", detach=False)
    assert "\nhello\n" in text, text
    text = ok(server, "docker_ps", all=True)
    assert "Exited (0)" in text, text
    text = ok(server, "docker_cleanup", mode="safe")
    assert "$ docker container prune -f\n" in text and "$ docker image prune -f\n" in text, text
    assert "Exited (0)" not in ok(server, "docker_ps", all=True)

    ok(server, "write_file", path="/workspace/proj/docker-compose.yml", content=(
        'version: "3"\nservices:\n  app:\n    image: scratch-test:1\n'
        '    command: ["sh", "-c", "echo compose-up; while true; do busybox sleep 1; done"]\n'))
    ok(server, "docker_compose", project_dir="proj", action="up")
    text = ok(server, "docker_compose", project_dir="proj", action="ps")
    assert "proj_app_1" in text or "proj-app-1" in text, text
    text = ok(server, "docker_compose", project_dir="proj", action="exec", services=["app"], command="echo in-app")
    assert "\nin-app\n" in text, text
    ok(server, "docker_compose", project_dir="proj", action="down")
    assert "proj" not in ok(server, "docker_ps", all=True).split("\n", 1)[1]

    # The VM is the boundary: privileged with / bound in reaches the VM's
    # root and kernel, never the host's.
    marker = tmp_path / "host-only"
    marker.write_text("on the host")
    guest_release, _ = server.call("exec", command="uname -r")
    text = ok(server, "docker_run", image="scratch-test:1", detach=False, privileged=True, volumes=["/:/host"],
              command=f"sh -c 'busybox uname -r; busybox ls /host{marker} || echo no-host-file'")
    lines = text.split("\n")
    assert lines[1] == guest_release.split("\n")[0] != platform.release(), text
    assert "no-host-file" in lines, text
