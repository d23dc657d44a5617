"""The project file .sandbox-mcp.toml and validate_config through a real MCP client."""
from waiting import poll

GOOD = """
cpus = 1
memory = "1G"
services = ["echo svc-started; exec sleep 300", "echo second"]
[env]
APP_MODE = "ci"
[sync]
exclude = ["*.log"]
"""

BAD = """
foo = 1
memory = "lots"
network = "wifi"
services = "python3 -m http.server"
[env]
"1X" = "a"
[sync]
exclude = "build"
"""


def test_project_config_applied_on_creation(srv, roots):
    (roots / ".sandbox-mcp.toml").write_text(GOOD)
    out, err = srv.tool("exec", command='echo "$APP_MODE"')
    assert not err and out.startswith("ci\n"), out
    status, _ = srv.tool("status")
    assert "1cpu/1G" in status, status
    logs = poll(lambda: srv.tool("logs", name="svc-1")[0], lambda t: "svc-started" in t)
    assert logs, srv.tool("logs", name="svc-1")
    assert poll(lambda: srv.tool("logs", name="svc-2")[0], lambda t: "second" in t)
    # A reset makes a fresh sandbox from the same project settings.
    srv.tool("reset")
    out, _ = srv.tool("exec", command='echo "$APP_MODE"')
    assert out.startswith("ci\n"), out


def test_invalid_project_config_refuses_creation(srv, roots):
    (roots / ".sandbox-mcp.toml").write_text(BAD)
    text, err = srv.tool("exec", command="true")
    assert err and "project config" in text and "is invalid (see validate_config)" in text, text
    assert srv.tool("status")[0].startswith("No active sandboxes")


def test_validate_config_lists_every_problem(srv, roots):
    path = roots / ".sandbox-mcp.toml"
    path.write_text(BAD)
    text, err = srv.tool("validate_config")
    assert err, text
    lines = text.split("\n")
    assert lines[0] == f"Error: {path.resolve()} has 6 problem(s):", text
    for want in [
        "  foo is not supported (allowed: image, cpus, memory, network, disk, trust_host_ca, isolation, env, sync, services)",
        "  memory: invalid memory size 'lots' (use e.g. 512M or 2G)",
        '  network: must be "egress", "none" or a table { allow = [...], deny = [...] }, not "wifi"',
        "  services: expected a list of non-empty command strings",
        "  env.1X: invalid env key '1X' (must be [A-Za-z_][A-Za-z0-9_]*)",
        "  sync.exclude: expected a list of strings",
    ]:
        assert want in lines, (want, text)


def test_validate_config_ok_absent_and_paths(srv, roots, tmp_path):
    text, err = srv.tool("validate_config")
    assert not err and text.startswith(f"No .sandbox-mcp.toml at {roots.resolve()}/.sandbox-mcp.toml; sandboxes use"), text
    (roots / ".sandbox-mcp.toml").write_text(GOOD)
    text, err = srv.tool("validate_config")
    assert not err and text.startswith("Config OK: image=mcp-test cpus=1 memory=1G network=egress"), text
    assert "env=APP_MODE sync.exclude=*.log services=2" in text, text
    (roots / "sub").mkdir()
    (roots / "sub" / "other.toml").write_text("cpus = 'two'\n")
    text, err = srv.tool("validate_config", path=str(roots / "sub" / "other.toml"))
    assert err and text.endswith("has 1 problem(s):\n  cpus: expected a whole number of CPUs, at least 1"), text
    text, err = srv.tool("validate_config", path=str(roots))
    assert not err and text.startswith("Config OK"), text
    (tmp_path / ".sandbox-mcp.toml").write_text("")
    text, err = srv.tool("validate_config", path=str(tmp_path))
    assert err and "outside the allowed host roots" in text, text


def test_reset_refused_by_a_broken_project_file_keeps_the_sandbox(srv, roots):
    (roots / ".sandbox-mcp.toml").write_text(GOOD)
    srv.tool("exec", command="echo kept > /workspace/k; echo root > /etc/k")
    (roots / ".sandbox-mcp.toml").write_text(BAD)
    text, err = srv.tool("reset")
    assert err and "is invalid (see validate_config)" in text, text
    # Checked before the old sandbox goes: it runs on, root filesystem and all.
    out, err = srv.tool("exec", command="cat /workspace/k /etc/k")
    assert not err and out.startswith("kept\nroot\n"), out
