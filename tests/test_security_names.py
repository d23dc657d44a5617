"""Security suite: hostile or confused tool arguments. Every name-like
argument of every tool gets quotes, shell metacharacters, newlines, NUL,
'=', path tricks, terminal escapes and 10 KB strings; each is refused with
an error naming the problem, nothing is created (no sandbox, volume or
file, no command run), and the server and a bystander sandbox are unaffected.
Values that are data rather than names (env values, command text) must
arrive verbatim and never be interpreted by a shell of ours.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import required_env
from security_support import assert_unaffected, sec_server

# A file each value tries to create (on the host and in every sandbox).
PWN = "/tmp/smcp-pwned"

HOSTILE = [
    f"a'b;touch {PWN}",
    f"$(touch {PWN})",
    f"`touch {PWN}`",
    f"x\ntouch {PWN}",
    "a\x00b",
    "a=b",
    "a b",
    "../etc",
    "..",
    "/etc/passwd",
    "-rf",
    "%s%n%x",
    "é",
    "\x1b]0;pwned\x07",
    "a\rb",
    "a;" * 5120,  # 10 KB
]

SANDBOX_NAME = "Error: invalid sandbox name '"
# (tool, fixed arguments, the argument under attack, how the refusal starts)
TARGETS = [
    ("exec", {"command": "true"}, "sandbox", SANDBOX_NAME),
    ("python", {"code": "1"}, "sandbox", SANDBOX_NAME),
    ("write_file", {"path": "x", "content": "y"}, "sandbox", SANDBOX_NAME),
    ("read_file", {"path": "x"}, "sandbox", SANDBOX_NAME),
    ("batch_write", {"files": '{"a.txt": "x"}'}, "sandbox", SANDBOX_NAME),
    ("install", {"packages": "jq"}, "sandbox", SANDBOX_NAME),
    ("env", {}, "sandbox", SANDBOX_NAME),
    ("env", {"action": "set", "value": "v"}, "key", "Error: invalid env key '"),
    ("env", {"action": "unset"}, "key", "Error: invalid env key '"),
    ("bg", {"command": "true"}, "sandbox", SANDBOX_NAME),
    ("bg", {"command": f"touch {PWN}"}, "name", "Error: invalid process name '"),
    ("logs", {"name": "x"}, "sandbox", SANDBOX_NAME),
    ("logs", {}, "name", "Error: no background process '"),
    ("kill", {"name": "x"}, "sandbox", SANDBOX_NAME),
    ("kill", {}, "name", "Error: no background process '"),
    ("stats", {}, "sandbox", SANDBOX_NAME),
    ("history", {}, "sandbox", SANDBOX_NAME),
    ("destroy", {}, "sandbox", SANDBOX_NAME),
    ("reset", {}, "sandbox", SANDBOX_NAME),
    ("extend_ttl", {"minutes": 1}, "sandbox", SANDBOX_NAME),
    ("upload", {"local_path": "{roots}/f.txt"}, "sandbox", SANDBOX_NAME),
    ("download", {"sandbox_path": "/etc/hostname", "local_path": "{roots}/out"}, "sandbox", SANDBOX_NAME),
    ("git_clone", {"repo": "file:///srv/x.git"}, "sandbox", SANDBOX_NAME),
    ("sync_start", {"local_dir": "{roots}"}, "sandbox", SANDBOX_NAME),
    ("sync_stop", {}, "job_id", "Error: no sync job '"),
    ("collect_artifacts", {"patterns": ["*"], "dest": "{roots}/art"}, "sandbox", SANDBOX_NAME),
    ("expose", {"port": 8000}, "sandbox", SANDBOX_NAME),
    ("snapshot", {"snapshot_name": "s1"}, "sandbox", SANDBOX_NAME),
    ("snapshot", {}, "snapshot_name", "Error: invalid snapshot name '"),
    ("restore", {"snapshot_name": "s1"}, "sandbox", SANDBOX_NAME),
    ("restore", {}, "snapshot_name", "Error: invalid snapshot name '"),
    ("delete_snapshot", {}, "snapshot_name", "Error: snapshot '"),
    ("clone", {"target": "t"}, "source", SANDBOX_NAME),
    ("clone", {"source": "default"}, "target", SANDBOX_NAME),
    ("build_image", {"containerfile": "FROM mcp-test\n"}, "name", "Error building image: invalid image name "),
    # Refused before any request: the closed loopback port is never dialled.
    ("pull_image", {"reference": "127.0.0.1:9/x:1"}, "name", "Error pulling image: invalid image name "),
    ("pull_image", {"name": "x"}, "reference", "Error pulling image: invalid image reference "),
    ("spawn", {}, "parent", SANDBOX_NAME),
    ("spawn", {}, "name", "Error: ValueError: Invalid child name: "),
    ("spawn", {}, "image", "Error: PermissionError: Image '"),
    ("spawn", {}, "memory", "Error: ValueError: Invalid memory string: "),
    ("destroy_child", {}, "name", SANDBOX_NAME),
]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    roots = tmp_path_factory.mktemp("roots")
    (roots / "f.txt").write_text("f\n")
    with sec_server(SANDBOX_MCP_HOST_ROOTS=str(roots)) as s:
        s.roots = roots
        s.sh("true")  # `default` exists, so spawn reaches its name checks
        yield s


def created_names(srv) -> set[str]:
    """Every sandbox name the server or helper made anything for."""
    volumes = Path(srv.env["XDG_DATA_HOME"]) / "sandbox-mcp" / "volumes"
    # Volume directories are named by key: `<project tag>-<name>`.
    return srv.names() | {d.split("-", 1)[1] for d in os.listdir(volumes)}


@pytest.mark.parametrize("tool,fixed,arg,refusal", TARGETS, ids=[f"{t[0]}.{t[2]}" for t in TARGETS])
def test_hostile_names_are_refused_by_every_tool(srv, tool, fixed, arg, refusal):
    before = created_names(srv)
    args = {k: (v.replace("{roots}", str(srv.roots)) if isinstance(v, str) else v) for k, v in fixed.items()}
    for value in HOSTILE:
        text, err = srv.call(tool, **{**args, arg: value})
        assert err and text.startswith(refusal), (tool, arg, value[:40], text[:300])
    assert created_names(srv) == before
    assert not os.path.exists(PWN)
    out, _, _ = srv.sh(f"ls {PWN} 2>&1; ls /workspace")
    assert "No such file" in out, out
    assert_unaffected(srv, "default")


def test_children_of_a_hostile_parent_is_a_harmless_lookup(srv):
    # `children` only reads: a hostile parent name is refused as a name (like
    # every sandbox argument, before any tool runs) and creates nothing.
    before = created_names(srv)
    for value in HOSTILE:
        text, err = srv.call("children", parent=value)
        assert err and text.startswith(SANDBOX_NAME), text[:200]
    assert created_names(srv) == before
    assert_unaffected(srv, "default")


def test_data_arguments_arrive_verbatim_and_are_never_run(srv):
    # Env values, command stdin and file contents are data: quotes,
    # substitutions and newlines reach the program as they are.
    nasty = f"'; touch {PWN}; echo '\n$(touch {PWN})`touch {PWN}`\\ %s \x1b[2J"
    text, err = srv.call("env", action="set", key="NASTY", value=nasty, sandbox="data")
    assert not err, text
    out, err, code = srv.sh('printf %s "$NASTY"', sandbox="data")
    assert (out, code) == (nasty, 0), (out, err)
    out, _, _ = srv.sh("cat", sandbox="data", stdin=nasty)
    assert out == nasty
    assert not srv.call("write_file", path="/tmp/nasty", content=nasty, sandbox="data")[1]
    out, _, _ = srv.sh("cat /tmp/nasty", sandbox="data")
    assert out == nasty
    # Login shells source the env file: the value must survive that too.
    out, _, _ = srv.sh("bash -lc 'printf %s \"$NASTY\"'", sandbox="data")
    assert out == nasty
    out, _, _ = srv.sh(f"ls {PWN} 2>&1", sandbox="data")
    assert "No such file" in out, out
    assert not os.path.exists(PWN)
    assert_unaffected(srv, "data")


def test_nul_bytes_are_refused_where_they_cannot_be_passed_on(srv):
    # A NUL cannot be part of a path, an argument or an environment value:
    # each tool says so, and the sandbox keeps working afterwards.
    cases = [
        ("exec", {"command": "echo a\x00b"}, "nul byte"),
        ("exec", {"command": "pwd", "workdir": "/tmp/a\x00b"}, "NUL byte"),
        ("write_file", {"path": "/tmp/a\x00b", "content": "x"}, "contains a NUL byte"),
        ("read_file", {"path": "/tmp/a\x00b"}, "contains a NUL byte"),
        ("batch_write", {"files": json.dumps({"a\x00b": "x"})}, "contains a NUL byte"),
        ("bg", {"command": "echo a\x00b"}, "nul byte"),
        ("git_clone", {"repo": "file:///x", "path": "/tmp/a\x00b"}, "contains a NUL byte"),
    ]
    for tool, args, words in cases:
        text, err = srv.call(tool, sandbox="nul", **args)
        assert err and text.startswith("Error") and words in text, (tool, text)
    # Stdin and file contents are bytes: a NUL passes through.
    out, _, _ = srv.sh("od -c | head -1", sandbox="nul", stdin="a\x00b")
    assert "a  \\0   b" in out, out
    assert_unaffected(srv, "nul")


def test_a_nul_in_an_env_value_is_refused_and_does_not_break_the_sandbox(srv):
    # An environment value cannot hold a NUL: accepting one made every later
    # command in the sandbox fail to start ("nul byte found"), until unset.
    text, err = srv.call("env", action="set", key="BROKEN", value="a\x00b", sandbox="envnul")
    assert err and "NUL" in text, text
    out, err, code = srv.sh("echo works", sandbox="envnul")
    assert (out, code) == ("works\n", 0), err
    assert_unaffected(srv, "envnul")


def test_option_like_arguments_are_not_options(srv):
    # Arguments that reach a program of ours as argv never become its options.
    text, err = srv.call("git_clone", repo="file:///x", branch=f"--upload-pack=touch {PWN}")
    assert err and text == f"Error: invalid branch '--upload-pack=touch {PWN}'", text
    text, err = srv.call("git_clone", repo=f"--upload-pack=touch {PWN}")
    assert err and text.startswith("Error: invalid repository"), text
    text, err = srv.call("install", packages=f"jq; touch {PWN}")
    assert err and text.startswith("Error: invalid package name 'jq;'"), text
    text, err = srv.call("install", packages="--allow-unauthenticated jq")
    assert err and "invalid package name '--allow-unauthenticated'" in text, text
    out, _, _ = srv.sh(f"ls {PWN} 2>&1")
    assert "No such file" in out
    assert_unaffected(srv, "default")


def test_hostile_names_in_the_config_stop_the_server_naming_them(tmp_path):
    # Profile and policy names become sandbox names: the config file is
    # checked with the same rule before anything starts.
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    for sub in ("data", "state", "run", "config/sandbox-mcp"):
        (tmp_path / sub).mkdir(parents=True)
    env.update(XDG_DATA_HOME=str(tmp_path / "data"), XDG_STATE_HOME=str(tmp_path / "state"),
               XDG_RUNTIME_DIR=str(tmp_path / "run"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    for table in ("profiles", "spawn_policies"):
        (tmp_path / "config/sandbox-mcp/config.toml").write_text(f'[{table}."x\'; touch {PWN}"]\n')
        r = subprocess.run([required_env("SANDBOX_MCP_BIN"), "serve"], env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0, r
        assert "invalid sandbox name" in r.stderr, r.stderr[-2000:]
    assert not os.path.exists(PWN)
