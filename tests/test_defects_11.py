"""Issue 11's tool-level correctness defects, each through a real MCP client:
restore keeps the old sandbox when the new one is refused (#39), idle reaping
(#32), read-only tools never create (#50), output fidelity (#23), and the
smaller ones found on the way."""
import base64
import json
import os
import re
import subprocess
from pathlib import Path

from conftest import sandbox_key, volume_dir, write_config
from test_children import _vm_init_above, names, spawn
from test_grpc import grpcurl_path
from test_persistence import kill9_server
from test_project_config import BAD
from test_sandbox_ctl import ctl_srv, sh  # noqa: F401 (ctl_srv is a fixture)
from waiting import wait_for

# Long enough to cover a reaper tick and the time a test takes to look.
IDLE_TTL = "2"
# `par` may spawn (without a table only `default` may, and `default` is never reaped).
PAR_SPAWNS = f"""
[spawn_policies.par]
allowed_images = ["{os.environ.get('SANDBOX_MCP_TEST_IMAGE', 'mcp-test')}"]
child_ttl = 0
"""


def reaped(srv, name: str) -> bool:
    """Waits until `name` is gone from status (the control sandbox of a reaping test)."""
    return wait_for(lambda: name not in names(srv), timeout=30)


# ---------------------------------------------------------------- #39


def test_restore_refused_by_a_broken_project_file_keeps_the_sandbox(isrv, roots):
    assert not isrv.tool("exec", command="echo root > /etc/marker; echo ws > /workspace/w")[1]
    assert not isrv.tool("snapshot", snapshot_name="s1")[1]
    assert not isrv.tool("exec", command="echo after > /etc/marker")[1]
    (roots / ".sandbox-mcp.toml").write_text(BAD)
    text, err = isrv.tool("restore", snapshot_name="s1")
    assert err and "is invalid (see validate_config)" in text, text
    # The old sandbox, its root filesystem and its workspace are untouched.
    assert "default" in names(isrv)
    text, err = isrv.tool("exec", command="cat /etc/marker /workspace/w")
    assert not err and text.startswith("after\nws\n"), text


def test_reset_refused_for_capacity_keeps_the_sandbox(server_factory):
    roomy = server_factory()
    assert not roomy.tool("exec", command="echo root > /etc/marker", sandbox="a")[1]
    assert not roomy.tool("exec", command="true", sandbox="b")[1]
    # A session allowed one sandbox: replacing 'a' would make two.
    tight = server_factory(SANDBOX_MCP_MAX_SANDBOXES="1")
    text, err = tight.tool("reset", sandbox="a")
    assert err and "max_sandboxes = 1" in text and "the sandbox is unchanged" in text, text
    assert {"a", "b"} <= names(roomy), roomy.tool("status")[0]
    text, err = roomy.tool("exec", command="cat /etc/marker", sandbox="a")
    assert not err and text.startswith("root"), text


# ---------------------------------------------------------------- #32


def test_a_running_background_process_keeps_its_sandbox_from_idle_reaping(server_factory):
    srv = server_factory(SANDBOX_MCP_IDLE_TTL=IDLE_TTL)
    assert not srv.tool("bg", command="sleep 600", name="server", sandbox="web")[1]
    assert not srv.tool("exec", command="true", sandbox="temp")[1]
    assert reaped(srv, "temp"), srv.tool("status")[0]
    assert "web" in names(srv), srv.tool("status")[0]
    # Once the process ends the sandbox is idle again.
    assert not srv.tool("kill", name="server", sandbox="web")[1]
    assert reaped(srv, "web"), srv.tool("status")[0]


def _parent_with_child(server_factory, env):
    """A server with a short idle TTL, sandbox 'par' and its child 'par..kid'."""
    write_config(env, PAR_SPAWNS)
    srv = server_factory(SANDBOX_MCP_IDLE_TTL=IDLE_TTL)
    assert not srv.tool("exec", command="true", sandbox="par")[1]
    text, err = spawn(srv, parent="par", name="kid")
    assert not err, text
    return srv


def test_a_busy_child_keeps_its_parent(server_factory, env):
    srv = _parent_with_child(server_factory, env)
    assert not srv.tool("bg", command="sleep 600", name="work", sandbox="par..kid")[1]
    assert not srv.tool("exec", command="true", sandbox="temp")[1]
    assert reaped(srv, "temp"), srv.tool("status")[0]
    assert {"par", "par..kid"} <= names(srv), srv.tool("status")[0]


def test_using_a_reaped_child_says_what_happened(server_factory, env):
    srv = _parent_with_child(server_factory, env)
    assert reaped(srv, "par"), srv.tool("status")[0]
    text, err = srv.tool("exec", command="true", sandbox="par..kid")
    assert err and "'par..kid' was a child of 'par'" in text and "reaped" in text and "spawn" in text, text
    assert not ({"par", "par..kid"} & names(srv)), srv.tool("status")[0]


def test_a_reaped_childs_explanation_survives_kill9_of_the_daemon(server_factory, env):
    srv = _parent_with_child(server_factory, env)
    assert reaped(srv, "par"), srv.tool("status")[0]
    kill9_server(env)
    again = server_factory(SANDBOX_MCP_IDLE_TTL=IDLE_TTL)
    text, err = again.tool("exec", command="true", sandbox="par..kid")
    assert err and "'par..kid' was a child of 'par'" in text and "reaped" in text and "spawn" in text, text


# ---------------------------------------------------------------- #50


def test_read_only_tools_never_create_a_sandbox(srv):
    calls = [
        ("stats", {}), ("logs", {"name": "x"}),
        ("read_file", {"path": "/etc/hostname"}), ("env", {"action": "list"}),
        ("download", {"sandbox_path": "/etc/hostname", "local_path": "h"}),
        ("collect_artifacts", {"patterns": ["*"], "dest": "out"}),
    ]
    for tool, args in calls:
        text, err = srv.tool(tool, sandbox="ghost", **args)
        assert err and "'ghost'" in text, (tool, text)
    # The reference's answer for a sandbox without commands: nothing to report, nothing created.
    assert srv.tool("history", sandbox="ghost") == ("No command history for 'ghost'.", False)
    assert srv.tool("status")[0].startswith("No active sandboxes"), srv.tool("status")[0]
    assert srv.tool("network_info")[0] == "No active sandboxes."


# ---------------------------------------------------------------- #23


def test_output_text_and_structured_result_agree(srv):
    r = srv.call_raw("exec", command=r"printf 'a\377b\n\n\n'; printf 'e\n\n' >&2")
    out = r.structured_content
    text = r.content[0].text
    assert out["stdout"] == "a\ufffdb\n\n\n" and out["stderr"] == "e\n\n", out
    assert base64.b64decode(out["stdout_base64"]) == b"a\xffb\n\n\n", out
    assert "stderr_base64" not in out, out
    # The text shows the same output, its blank lines included.
    assert text.startswith("a\ufffdb\n\n\n[stderr] e\n\n("), repr(text)
    r = srv.call_raw("exec", command="echo hi")
    assert r.content[0].text.startswith("hi\n("), r.content[0].text
    assert "stdout_base64" not in r.structured_content, r.structured_content


# ---------------------------------------------------------------- smaller defects


def test_stats_disk_is_the_sandboxs_own(server):
    before = server.call_raw("stats").structured_content if "default" in names(server) else None
    assert before is None
    assert not server.tool("exec", command="head -c 8M /dev/urandom > /workspace/blob")[1]
    used = server.call_raw("stats").structured_content["disk_used_bytes"]
    st = os.statvfs("/tmp")
    host_used = (st.f_blocks - st.f_bfree) * st.f_frsize
    # 8 MiB of its own, not the host filesystem's usage.
    assert 8 << 20 <= used < 64 << 20 and used < host_used, (used, host_used)


def test_localhost_resolves(server):
    text, err = server.tool("exec", command="getent hosts localhost; hostname; getent hosts $(hostname)")
    assert not err and re.search(r"^(127\.0\.0\.1|::1)\s+localhost", text, re.M), text
    text, err = server.tool("python", code="import socket; print(socket.gethostbyname('localhost'))")
    assert not err and text.startswith("127.0.0.1\n"), text


def test_a_relative_workdir_is_under_the_workspace(server):
    text, err = server.tool("exec", command="pwd", workdir="sub/dir")
    assert not err and text.startswith("/workspace/sub/dir\n"), text


def test_network_info_shows_the_sandboxs_own_setting_and_a_changed_config(srv, roots):
    assert not srv.tool("exec", command="true")[1]
    (roots / ".sandbox-mcp.toml").write_text('network = "none"\n')
    text, err = srv.tool("network_info")
    assert not err and re.search(r"^default\s+default\s+net:egress ", text, re.M), text
    assert "configuration now says: none" in text and "reset" in text, text


def test_list_snapshots_reports_the_snapshots_own_layer(isrv):
    assert not isrv.tool("exec", command="echo x > /etc/small")[1]
    text, err = isrv.tool("snapshot", snapshot_name="small")
    assert not err, text
    saved = re.search(r"incremental, ([^,]+),", text).group(1)
    text, err = isrv.tool("list_snapshots")
    assert not err and re.search(rf"^  - small \({re.escape(saved)} layer, [\d.]+[KMG]?B in all, from 'default', ", text, re.M), text


def test_throwaway_run_children_leave_no_workspace(ctl_srv, env):  # noqa: F811
    volumes = Path(env["XDG_DATA_HOME"]) / "sandbox-mcp" / "volumes"
    out, err, code = sh(ctl_srv, "sandbox-ctl --json run -- sh -c 'echo junk > /workspace/j'")
    assert code == 0, (out, err)
    child = json.loads(out)["name"]
    assert not volume_dir(env, child).exists(), sorted(p.name for p in volumes.iterdir())


def test_batch_write_error_is_complete(server):
    assert not server.tool("exec", command="mkdir -p /workspace/d/e")[1]
    text, err = server.tool("batch_write", files=json.dumps({"d": "x", "ok.txt": "y"}))
    assert err and text.startswith("Error: ") and "/workspace/d:" in text and "Is a directory" in text, text
    # Every mention of a path is the whole path (the tar header's copy was cut at 100 bytes).
    long = "a" * 300
    text, err = server.tool("batch_write", files=json.dumps({long: "x"}))
    assert err and "File name too long" in text, text
    assert [len(m) for m in re.findall(r"workspace/a+", text)] == [len("workspace/") + 300], text


def test_lost_says_how_the_vm_ended(server_factory):
    srv = server_factory()
    assert not srv.tool("exec", command="sleep 4244 >/dev/null 2>&1 &")[1]
    init = _vm_init_above("4244")
    assert init, "the sandbox's VM init process was not found"
    os.kill(init, 9)
    assert wait_for(lambda: "default" not in names(srv), timeout=20), srv.tool("status")[0]
    text, err = srv.tool("exec", command="true")
    assert not err and text.startswith("Note: sandbox 'default' was lost and was started again"), text
    assert re.search(r"status 137|signal 9", text) and "helper" not in text, text


def test_lost_when_another_client_deletes_its_vm_does_not_blame_the_helper(server_factory, env):
    # Servers of one user share a daemon, so a destroy through one is seen by
    # all; what still vanishes under the daemon is a VM another client of the
    # helper (grpcurl here; a second daemon with other runtime dirs) deletes.
    srv = server_factory()
    assert not srv.tool("exec", command="true", sandbox="shared")[1]
    sock = Path(env["XDG_RUNTIME_DIR"]) / "sandbox-mcp" / "helper.sock"
    deleted = subprocess.run(
        [grpcurl_path(), "-plaintext", "-unix", "-authority", "localhost", "-d", json.dumps({"id": sandbox_key("shared")}),
         str(sock), "sandbox_mcp.helper.v1.VmHelper/DeleteVm"],
        capture_output=True, text=True, timeout=30)
    assert deleted.returncode == 0, deleted.stderr
    assert wait_for(lambda: "shared" not in names(srv), timeout=20)
    text, err = srv.tool("exec", command="true", sandbox="shared")
    assert not err and "was lost and was started again" in text, text
    assert "deleted" in text and "went away with the VM helper" not in text, text
