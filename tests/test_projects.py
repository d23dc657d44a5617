"""Sandboxes per project (issue 11): a session's sandbox names belong to its
project directory, so two projects never share `default` or its /workspace by
accident; another project's sandbox is reached only by its qualified name
`<project-id>:<name>`, which `list_all(all_projects=true)` shows."""
from __future__ import annotations

import os
import re
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from conftest import stop_daemon, write_config
from test_sandbox_ctl import CTL_CONFIG, sh

MARK = "cat /workspace/mark 2>/dev/null || echo absent"


@pytest.fixture
def projects() -> Iterator[tuple[Path, Path]]:
    """Two project directories with the same name in different places (their
    ids differ only by the tag)."""
    base = Path(tempfile.mkdtemp(prefix="smcp-projects-"))
    a, b = base / "one" / "app", base / "two" / "app"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    try:
        yield a, b
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run(client, command: str, sandbox: str = "default") -> str:
    text, err = client.tool("exec", command=command, sandbox=sandbox)
    assert not err, text
    return text.splitlines()[0]


def project_id(client, name: str = "default") -> str:
    """The id of the project `client`'s sandbox `name` belongs to, from list_all."""
    text, err = client.tool("list_all")
    assert not err, text
    m = re.search(rf"(\S+-[0-9a-f]{{6}}):{re.escape(name)} ", text)
    assert m, text
    return m.group(1)


def test_two_projects_get_their_own_default_and_one_project_shares(front_end, projects):
    a_dir, b_dir = projects
    a, b = front_end(cwd=str(a_dir)), front_end(cwd=str(b_dir))
    assert run(a, "echo from-a > /workspace/mark; cat /workspace/mark") == "from-a"
    assert run(b, MARK) == "absent"
    assert run(b, "hostname") == "default"
    # A second editor on the same project (through a symlink: the canonical path counts) shares.
    link = a_dir.parent / "link"
    link.symlink_to(a_dir)
    assert run(front_end(cwd=str(link)), MARK) == "from-a"


def test_another_projects_sandbox_only_with_its_qualifier(front_end, projects):
    a_dir, b_dir = projects
    a, b = front_end(cwd=str(a_dir)), front_end(cwd=str(b_dir))
    run(a, "echo from-a > /workspace/mark")
    a_id = project_id(a)
    assert a_id.startswith("app-") and a_id != "app"
    # B's own list does not show A's sandbox; all_projects does, with A's path.
    text, _ = b.tool("list_all")
    assert a_id not in text, text
    text, err = b.tool("list_all", all_projects=True)
    assert not err and f"{a_id}:default {a_dir.resolve()}" in text, text
    # Qualified: A's sandbox. Plain: B's own.
    assert run(b, MARK, sandbox=f"{a_id}:default") == "from-a"
    assert run(b, MARK) == "absent"
    text, err = b.tool("history", sandbox=f"{a_id}:default")
    assert not err and f"'{a_id}:default'" in text and "cat /workspace/mark" in text, text
    text, _ = b.tool("status")
    assert a_id not in text, text


def test_project_qualifier_errors_name_the_argument(front_end, projects):
    a_dir, _ = projects
    a = front_end(cwd=str(a_dir))
    run(a, "true")
    for bad in [":default", "app-3f2a1c:", "a:b:c", "app:default", "APP-XYZ:default"]:
        text, err = a.tool("exec", command="true", sandbox=bad)
        assert err and text.startswith(f"Error: argument `sandbox`: '{bad}' is not a sandbox name"), (bad, text)
    text, err = a.tool("exec", command="true", sandbox="nosuch-abcdef:default")
    assert err and text.startswith("Error: argument `sandbox`: no project 'nosuch-abcdef'"), text
    text, err = a.tool("spawn", parent="nosuch-abcdef:default")
    assert err and "argument `parent`: no project 'nosuch-abcdef'" in text, text
    text, err = a.tool("clone", source="default", target="x:")
    assert err and "argument `target`: 'x:' is not a sandbox name" in text, text
    # A known project's id with a name that breaks the name rule.
    text, err = a.tool("exec", command="true", sandbox=f"{project_id(a)}:bad name")
    assert err and "invalid sandbox name 'bad name'" in text, text


def test_http_sessions_belong_to_the_serve_invocations_project(front_end, http_server, projects):
    a_dir, b_dir = projects
    a, b = front_end(cwd=str(a_dir)), front_end(cwd=str(b_dir))
    run(a, "echo from-a > /workspace/mark")
    h = http_server(SANDBOX_MCP_PROJECT_DIR=str(b_dir)).client()
    try:
        assert run(h, MARK) == "absent"
        run(h, "echo from-http > /workspace/mark")
        assert run(b, MARK) == "from-http"
        assert run(a, MARK) == "from-a"
    finally:
        h.close()


def test_a_sandbox_ctl_child_stays_in_its_project(front_end, env, ctl_bin, projects):
    write_config(env, CTL_CONFIG)
    a_dir, b_dir = projects
    a = front_end(cwd=str(a_dir), SANDBOX_CTL_BIN=ctl_bin)
    b = front_end(cwd=str(b_dir), SANDBOX_CTL_BIN=ctl_bin)
    assert sh(a, "sandbox-ctl spawn --name kid --memory 128M") == ("default..kid\n", "", 0)
    assert sh(a, "sandbox-ctl ping") == ("ok (parent: default)\n", "", 0)
    # B's default is another sandbox: its sandbox-ctl sees no child of A's.
    out, _, code = sh(b, "sandbox-ctl list")
    assert code == 0 and "kid" not in out, out
    a_id = project_id(a)
    for name in ["kid", "default..kid", f"{a_id}:default..kid"]:
        out, err, code = sh(b, f"sandbox-ctl exec {name} -- true")
        assert code != 0 and "not found" in err.lower(), (name, out, err)
    # A's child is A's: children() from A lists it, from B (plainly) not.
    text, _ = a.tool("children", parent="default")
    assert "default..kid" in text, text
    text, _ = b.tool("children", parent="default")
    assert "kid" not in text, text
    text, _ = b.tool("children", parent=f"{a_id}:default")
    assert f"{a_id}:default..kid" in text, text


MAIN_BIN = os.environ.get("SANDBOX_MCP_MAIN_BIN", "")


@pytest.mark.skipif(not os.access(MAIN_BIN, os.X_OK), reason=f"needs a pre-project build at {MAIN_BIN}")
def test_sandboxes_from_before_projects_are_the_legacy_projects(front_end, env, projects):
    a_dir, _ = projects
    old = front_end(binary=MAIN_BIN, cwd=str(a_dir))
    run(old, "echo old > /workspace/mark")
    text, err = old.tool("env", action="set", key="OLD", value="1")
    assert not err, text
    old.close()
    stop_daemon(env)
    db = Path(env["XDG_STATE_HOME"]) / "sandbox-mcp" / "state.db"
    with sqlite3.connect(db) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 1
    new = front_end(cwd=str(a_dir))
    # The old `default` is not this project's: the plain name is a new sandbox.
    assert run(new, MARK) == "absent"
    text, err = new.tool("list_all", all_projects=True)
    assert not err and "legacy:default (before projects)" in text, text
    assert run(new, MARK, sandbox="legacy:default") == "old"
    assert run(new, "echo $OLD", sandbox="legacy:default") == "1"
    text, err = new.tool("history", sandbox="legacy:default")
    assert not err and "echo old > /workspace/mark" in text, text
    with sqlite3.connect(db) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 2
        rows = dict(c.execute("SELECT name, project FROM sandboxes").fetchall())
    assert rows["default"] is None, rows
    assert [p for n, p in rows.items() if n.endswith("-default")] == [str(a_dir.resolve())], rows
