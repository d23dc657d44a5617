"""The host write guard (issue 22) through a real MCP client: download and
collect_artifacts never put a sandbox's file where the host would run or trust
it (.git/, .sandbox-mcp.toml, shell rc files, editor and agent settings...),
in any letter case, through no symlink; a refusal names its rule and how to
allow it, leaves nothing behind, and host_write_allow lifts one rule. Files
arrive without exec bits unless `executable` asks for them, never setuid."""
import os
import stat
from pathlib import Path

from conftest import write_config

PAYLOAD = "printf '#!/bin/sh\\necho pwned > /tmp/pwned\\n' > /tmp/pre-commit && chmod 4755 /tmp/pre-commit"


def config_path(env: dict[str, str]) -> Path:
    return Path(env["XDG_CONFIG_HOME"]) / "sandbox-mcp" / "config.toml"


def tree(root: Path) -> set[str]:
    """Every path under `root`, relative."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_download_file_refused_in_every_guarded_place(srv, roots, env):
    (roots / ".git/hooks").mkdir(parents=True)
    before = tree(roots)
    srv.tool("exec", command=PAYLOAD)
    text, err = srv.tool("download", sandbox_path="/tmp/pre-commit", local_path=str(roots / ".git/hooks/pre-commit"))
    assert err and text == (
        f"Error: refused to write {roots}/.git/hooks/pre-commit on the host: git runs hooks and obeys settings "
        'found there, so it could run on the next git command (rule ".git/"); to allow it, add ".git/" to '
        f"host_write_allow in {config_path(env)}"
    ), text
    for target, rule in [
        (".GIT/hooks/pre-commit", ".git/"),
        (".Git/config", ".git/"),
        ("new/.git/hooks/pre-commit", ".git/"),
        ("sub/.sandbox-mcp.toml", ".sandbox-mcp.toml"),
        (".Sandbox-MCP.toml", ".sandbox-mcp.toml"),
        (".bashrc", ".bashrc"),
        (".zshenv", ".zshenv"),
        (".envrc", ".envrc"),
        (".vscode/tasks.json", ".vscode/"),
        (".claude/settings.json", ".claude/"),
        (".mcp.json", ".mcp.json"),
        (".pre-commit-config.yaml", ".pre-commit-config.yaml"),
    ]:
        text, err = srv.tool("download", sandbox_path="/tmp/pre-commit", local_path=str(roots / target))
        assert err and text.startswith(f"Error: refused to write {roots}/{target} on the host: "), (target, text)
        assert f'(rule "{rule}"); to allow it, add "{rule}" to host_write_allow in ' in text, (target, text)
    # Into an existing guarded directory: the file's own name is checked.
    text, err = srv.tool("download", sandbox_path="/tmp/pre-commit", local_path=str(roots / ".git/hooks"))
    assert err and "refused to write" in text and '(rule ".git/")' in text, text
    srv.tool("exec", command="printf 'alias ls=evil' > /tmp/.bashrc")
    text, err = srv.tool("download", sandbox_path="/tmp/.bashrc", local_path=str(roots))
    assert err and f"refused to write {roots}/.bashrc on the host: a shell runs it" in text, text
    # Nothing written, no directory made on the way.
    assert tree(roots) == before, tree(roots)


def test_download_dir_skips_guarded_entries(srv, roots, env):
    setup = (
        "mkdir -p proj/src proj/.git/hooks proj/.GIT proj/.vscode proj/lib/.Git && "
        "echo 'print(1)' > proj/src/main.py && cp /bin/true proj/src/tool && "
        "echo evil > proj/.git/hooks/pre-commit && chmod 755 proj/.git/hooks/pre-commit && "
        "echo '[core]' > proj/.git/config && echo '[core]' > proj/.GIT/config && "
        "echo x > proj/lib/.Git/config && echo '{}' > proj/.vscode/tasks.json && echo x > proj/.envrc"
    )
    out, err = srv.tool("exec", command=setup)
    assert not err, out
    text, err = srv.tool("download", sandbox_path="/workspace/proj", local_path=str(roots / "proj"))
    assert not err, text
    assert text.startswith(f"Downloaded /workspace/proj/ -> {roots}/proj ("), text
    assert " entries refused by the host write guard: " in text, text
    for refused, rule in [(".git", ".git/"), (".GIT", ".git/"), ("lib/.Git", ".git/"), (".vscode", ".vscode/"),
                          (".envrc", ".envrc")]:
        assert f"{roots}/proj/{refused} (" in text, (refused, text)
        assert f'rule "{rule}"' in text, (rule, text)
    assert text.endswith(f"; to allow a rule, add it to host_write_allow in {config_path(env)}"), text
    got = tree(roots / "proj")
    assert got == {"src", "src/main.py", "src/tool", "lib"}, got
    # No exec bits unless asked.
    assert mode(roots / "proj/src/tool") & 0o111 == 0
    # A directory download into a guarded place is refused whole.
    text, err = srv.tool("download", sandbox_path="/workspace/proj/src", local_path=str(roots / "x/.git"))
    assert err and f"refused to write {roots}/x/.git on the host" in text, text
    assert not (roots / "x").exists()


def test_collect_artifacts_refuses_guarded_names(srv, roots, env):
    before = tree(roots)
    srv.tool("exec", command="mkdir -p x && printf 'network = \"egress\"\\n' > .sandbox-mcp.toml && "
                             "printf ok > out.txt && printf evil > x/.bashrc && printf c > x/CLAUDE.md")
    text, err = srv.tool("collect_artifacts", patterns=[".sandbox-mcp.toml"], dest=str(roots))
    assert err and text == (
        f"Error: nothing was written: 1 entry refused by the host write guard: {roots}/.sandbox-mcp.toml "
        "(it is sandbox-mcp's own configuration and would change what later sandboxes may do: rule "
        f'".sandbox-mcp.toml"); to allow a rule, add it to host_write_allow in {config_path(env)}'
    ), text
    assert not (roots / ".sandbox-mcp.toml").exists()
    # The project file (roots is the project directory) was not planted: a
    # reset still finds none.
    text, err = srv.tool("validate_config")
    assert not err and text.startswith("No .sandbox-mcp.toml at "), text
    # Mixed with allowed matches: those are written, the rest reported.
    text, err = srv.tool("collect_artifacts", patterns=["out.txt", ".sandbox-mcp.toml", "x/.bashrc", "x/CLAUDE.md"], dest=str(roots / "arts"))
    assert not err, text
    *rows, summary = text.split("\n")
    assert [r.split(" ", 2)[2] for r in rows] == [f"{roots}/arts/out.txt"], rows
    assert summary.startswith("Collected 1 file(s), ") and "3 entries refused by the host write guard: " in summary
    for name, rule in [(".sandbox-mcp.toml", ".sandbox-mcp.toml"), (".bashrc", ".bashrc"), ("CLAUDE.md", "CLAUDE.md")]:
        assert f'{roots}/arts/{name} (' in summary and f'rule "{rule}"' in summary, (name, summary)
    assert tree(roots / "arts") == {"out.txt"}
    # A guarded destination, in any case, is refused before anything is made.
    for dest in (".git/hooks", "new/.Git", ".VSCODE"):
        text, err = srv.tool("collect_artifacts", patterns=["out.txt"], dest=str(roots / dest))
        assert err and text.startswith(f"Error: refused to write {roots}/{dest} on the host: "), (dest, text)
    assert tree(roots) - before == {"arts", "arts/out.txt"}, tree(roots)


def test_symlinks_cannot_route_a_write_into_a_guarded_place(srv, roots):
    (roots / ".git/hooks").mkdir(parents=True)
    srv.tool("exec", command=PAYLOAD)
    # On the host: a symlink to .git/hooks (or to .git) is never written through.
    (roots / "hooks").symlink_to(".git/hooks")
    (roots / "dotgit").symlink_to(".git")
    for local in ("hooks/pre-commit", "hooks", "dotgit/hooks/pre-commit"):
        text, err = srv.tool("download", sandbox_path="/tmp/pre-commit", local_path=str(roots / local))
        assert err and "is a symlink; host-path tools do not follow symlinks" in text, (local, text)
    text, err = srv.tool("collect_artifacts", patterns=["/tmp/pre-commit"], dest=str(roots / "hooks"))
    assert err and "is a symlink" in text, text
    # In the sandbox: a tree whose symlinks point into .git arrives without them,
    # so a later download through the same name makes a plain directory.
    out, err = srv.tool("exec", command="mkdir -p out .git/hooks && ln -s ../.git/hooks out/h && "
                                        "ln -s ../.git out/g && echo f > out/f && cp /tmp/pre-commit out/pc")
    assert not err, out
    text, err = srv.tool("download", sandbox_path="/workspace/out", local_path=str(roots / "out"))
    assert not err and "2 symlinks/special files skipped" in text, text
    assert not (roots / "out/h").exists() and not (roots / "out/g").exists()
    text, err = srv.tool("download", sandbox_path="/tmp/pre-commit", local_path=str(roots / "out/h/pre-commit"))
    assert not err, text
    assert (roots / "out/h").is_dir() and not (roots / "out/h").is_symlink()
    # A sandbox symlink matched by collect_artifacts is skipped, not followed.
    srv.tool("exec", command="ln -s /workspace/.git/hooks/pre-commit link-pc && cp /tmp/pre-commit .git/hooks/")
    text, err = srv.tool("collect_artifacts", patterns=["link-pc"], dest=str(roots / "out"))
    assert err and "only symlinks, which are not copied" in text, text
    assert os.listdir(roots / ".git/hooks") == []


def test_allow_list_lifts_one_rule_and_deny_list_adds(server_factory, env, roots):
    write_config(env, 'host_write_allow = [".git/"]\nhost_write_deny = ["*.pem"]\n')
    srv = server_factory(SANDBOX_MCP_HOST_ROOTS=str(roots))
    srv.tool("exec", command=PAYLOAD + " && printf k > /tmp/key.pem")
    text, err = srv.tool("download", sandbox_path="/tmp/pre-commit",
                         local_path=str(roots / ".git/hooks/pre-commit"), executable=True)
    assert not err, text
    hook = mode(roots / ".git/hooks/pre-commit")
    assert hook & 0o7000 == 0 and hook & 0o100, oct(hook)
    # Only that rule: the others stay.
    text, err = srv.tool("download", sandbox_path="/tmp/pre-commit", local_path=str(roots / ".gitconfig"))
    assert err and '(rule ".gitconfig")' in text and f"host_write_allow in {config_path(env)}" in text, text
    text, err = srv.tool("download", sandbox_path="/tmp/key.pem", local_path=str(roots / "keys/Server.PEM"))
    assert err and "host_write_deny in the config file denies it (rule \"*.pem\")" in text, text
    assert not (roots / "keys").exists()


def test_exec_bits_only_when_asked_and_never_setuid(srv, roots):
    srv.tool("exec", command=PAYLOAD + " && mkdir -p d && cp /tmp/pre-commit d/run && chmod 2775 d/run")
    text, err = srv.tool("download", sandbox_path="/tmp/pre-commit", local_path=str(roots / "plain"))
    assert not err, text
    assert mode(roots / "plain") & 0o7111 == 0, oct(mode(roots / "plain"))
    text, err = srv.tool("download", sandbox_path="/tmp/pre-commit", local_path=str(roots / "runnable"),
                         executable=True)
    assert not err, text
    assert mode(roots / "runnable") & 0o7000 == 0 and mode(roots / "runnable") & 0o100, oct(mode(roots / "runnable"))
    text, err = srv.tool("download", sandbox_path="/workspace/d", local_path=str(roots / "tree"), executable=True)
    assert not err and mode(roots / "tree/run") & 0o7100 == 0o100, oct(mode(roots / "tree/run"))
    text, err = srv.tool("collect_artifacts", patterns=["/tmp/pre-commit", "d/run"], dest=str(roots / "a"))
    assert not err, text
    assert mode(roots / "a/pre-commit") & 0o7111 == 0 and mode(roots / "a/run") & 0o7111 == 0
    text, err = srv.tool("collect_artifacts", patterns=["/tmp/pre-commit"], dest=str(roots / "b"), executable=True)
    assert not err and mode(roots / "b/pre-commit") & 0o7100 == 0o100, text


def test_download_dir_skips_bare_repos_and_python_startup_files(srv, roots, env):
    # A bare repository's layout, under a .git name and under a plain one
    # (git recognises neither without its HEAD), and a .pth in a venv's
    # site-packages (Python runs its import lines at every start).
    setup = (
        "mkdir -p proj/src proj/mirror.git/objects/ab proj/mirror.git/refs/heads proj/bare/objects/ab "
        "proj/bare/refs/heads proj/.venv/lib/python3.11/site-packages && "
        "for d in proj/mirror.git proj/bare; do echo 'ref: refs/heads/main' > $d/HEAD && "
        "printf '[core]\\n\\tbare = true\\n\\tfsmonitor = touch /tmp/pwned\\n' > $d/config && "
        "echo x > $d/objects/ab/cdef && echo 0 > $d/refs/heads/main; done && "
        "echo 'import os; os.system(\"touch /tmp/pwned\")' > proj/.venv/lib/python3.11/site-packages/evil.pth && "
        "echo ok > proj/.venv/lib/python3.11/site-packages/mod.py && echo 'print(1)' > proj/src/main.py"
    )
    out, err = srv.tool("exec", command=setup)
    assert not err, out
    text, err = srv.tool("download", sandbox_path="/workspace/proj", local_path=str(roots / "proj"))
    assert not err, text
    assert " entries refused by the host write guard: " in text, text
    for refused, rule in [("mirror.git", "?*.git/"), ("bare/HEAD", "HEAD"),
                          (".venv/lib/python3.11/site-packages/evil.pth", "*.pth")]:
        assert f"{roots}/proj/{refused} (" in text, (refused, text)
        assert f'rule "{rule}"' in text, (rule, text)
    assert "Python runs it at every interpreter start" in text, text
    assert text.endswith(f"; to allow a rule, add it to host_write_allow in {config_path(env)}"), text
    got = tree(roots / "proj")
    assert not any(p.startswith("mirror.git") for p in got), got
    assert "bare/HEAD" not in got and "src/main.py" in got, got
    assert ".venv/lib/python3.11/site-packages/mod.py" in got, got
    assert not any(p.endswith(".pth") for p in got), got
    # Without its HEAD the rest of the plain layout is no repository to git.
    assert not (roots / "proj/bare/HEAD").exists()
    # collect_artifacts refuses the same names.
    text, err = srv.tool("collect_artifacts", patterns=["proj/bare/HEAD", "proj/.venv/lib/python3.11/site-packages/evil.pth"],
                         dest=str(roots / "arts"))
    assert err and text.startswith("Error: nothing was written: 2 entries refused by the host write guard: "), text
    assert not (roots / "arts").exists()
