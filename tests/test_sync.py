"""sync_start and sync_stop through a real MCP client: the initial push,
mirroring of creates, edits, renames and deletes (files and directories),
ignored paths, the host roots policy and the error texts."""
import os
import re
import shutil
import time

from waiting import wait_for

DEST = "/workspace/proj"


def listing(srv, dest=DEST):
    """Every file, symlink and directory under `dest`, as sorted relative paths."""
    out, _ = srv.tool("exec", command=f"cd {dest} && find . -mindepth 1 | sed 's|^./||' | LC_ALL=C sort")
    return out.rsplit("\n", 1)[0].split("\n") if not out.startswith("(") else []


def mirrored(srv, want):
    """Waits until the sandbox listing equals `want`; returns the last listing."""
    want = sorted(want)
    last = []

    def check():
        nonlocal last
        last = listing(srv)
        return last == want

    wait_for(check)
    return last


def start(srv, project, dest=DEST):
    text, err = srv.tool("sync_start", local_dir=str(project), sandbox_dir=dest)
    assert not err, text
    m = re.match(r"Sync started \[(sync-[0-9a-f]{6})\]: (.+) -> default:(.+)\nInitial sync: (\d+) files\n"
                 r"Watching for changes \(ignoring \.DS_Store, \.git, \.venv, __pycache__, node_modules, venv, plus \.gitignore\)$",
                 text)
    assert m, text
    assert m.group(2) == str(project.resolve()) and m.group(3) == dest
    return m.group(1), int(m.group(4))


def tree(root):
    p = root / "project"
    (p / "src/pkg").mkdir(parents=True)
    (p / "src/pkg/mod.py").write_text("x = 1\n")
    (p / "README").write_text("readme\n")
    (p / ".gitignore").write_text("build/\n*.log\n")
    for ignored in (".git/config", "node_modules/left-pad/index.js", "src/__pycache__/mod.pyc",
                    ".venv/bin/python", "build/out.o", "debug.log", ".DS_Store"):
        (p / ignored).parent.mkdir(parents=True, exist_ok=True)
        (p / ignored).write_text("ignored\n")
    os.symlink("/etc/hostname", p / "link")
    return p


def test_initial_push_skips_ignored_and_keeps_symlinks(srv, roots):
    project = tree(roots)
    job, files = start(srv, project)
    assert files == 3
    assert listing(srv) == [".gitignore", "README", "link", "src", "src/pkg", "src/pkg/mod.py"]
    out, _ = srv.tool("exec", command=f"readlink {DEST}/link; cat {DEST}/src/pkg/mod.py")
    assert out.startswith("/etc/hostname\nx = 1\n"), out
    text, err = srv.tool("sync_stop", job_id=job)
    assert not err
    assert text == f"Stopped sync [{job}]: {project.resolve()} -> default:{DEST} (3 files synced total)"


def test_changes_are_mirrored(srv, roots):
    project = tree(roots)
    job, _ = start(srv, project)
    base = [".gitignore", "README", "link", "src", "src/pkg", "src/pkg/mod.py"]
    # create a file and a nested directory
    (project / "new.txt").write_text("new\n")
    (project / "a/b").mkdir(parents=True)
    (project / "a/b/c.txt").write_text("c\n")
    got = mirrored(srv, base + ["new.txt", "a", "a/b", "a/b/c.txt"])
    assert got == sorted(base + ["new.txt", "a", "a/b", "a/b/c.txt"]), got
    # edit (same size, same second: mtime polling would miss this)
    (project / "new.txt").write_text("NEW\n")
    assert wait_for(lambda: srv.tool("exec", command=f"cat {DEST}/new.txt")[0].startswith("NEW\n"))
    # rename a file and a directory
    (project / "new.txt").rename(project / "renamed.txt")
    (project / "a").rename(project / "z")
    want = base + ["renamed.txt", "z", "z/b", "z/b/c.txt"]
    assert mirrored(srv, want) == sorted(want)
    # delete a file and a whole directory
    (project / "renamed.txt").unlink()
    shutil.rmtree(project / "z")
    shutil.rmtree(project / "src")
    want = [".gitignore", "README", "link"]
    assert mirrored(srv, want) == want
    # ignored names created later are not pushed either
    (project / "node_modules/new.js").write_text("x\n")
    (project / "later.log").write_text("x\n")
    (project / "marker").write_text("m\n")
    want = [".gitignore", "README", "link", "marker"]
    assert mirrored(srv, want) == want
    srv.tool("sync_stop", job_id=job)


def test_gitignore_changes_apply(srv, roots):
    project = tree(roots)
    job, _ = start(srv, project)
    (project / ".gitignore").write_text("build/\n*.log\nsecret.txt\n")
    assert wait_for(lambda: "secret.txt" in srv.tool("exec", command=f"cat {DEST}/.gitignore")[0])
    (project / "secret.txt").write_text("s\n")
    (project / "marker").write_text("m\n")
    want = [".gitignore", "README", "link", "marker", "src", "src/pkg", "src/pkg/mod.py"]
    assert mirrored(srv, want) == want
    srv.tool("sync_stop", job_id=job)


def test_stop_stops_mirroring(srv, roots):
    project = tree(roots)
    job, _ = start(srv, project)
    (project / "one").write_text("1\n")
    assert wait_for(lambda: "one" in listing(srv))
    text, err = srv.tool("sync_stop", job_id=job)
    assert not err and text.endswith("(4 files synced total)"), text
    (project / "two").write_text("2\n")
    # A negative can only be checked after a while: the mirror takes tens of
    # milliseconds, so a second without it is conclusive.
    time.sleep(1.0)
    assert "two" not in listing(srv)
    text, err = srv.tool("sync_stop", job_id=job)
    assert err and text == f"Error: no sync job '{job}'. Active: none"


def test_errors(srv, roots):
    text, err = srv.tool("sync_start", local_dir="/etc")
    assert err and text.startswith("Error: host path /etc is outside the allowed host roots"), text
    (roots / "file.txt").write_text("x")
    text, err = srv.tool("sync_start", local_dir=str(roots / "file.txt"))
    assert err and text == f"Error: {roots}/file.txt is not a directory", text
    text, err = srv.tool("sync_start", local_dir=str(roots / "missing"))
    assert err and text == f"Error: {roots}/missing does not exist on host", text
    text, err = srv.tool("sync_stop", job_id="sync-nope00")
    assert err and text == "Error: no sync job 'sync-nope00'. Active: none"
    job, _ = start(srv, tree(roots))
    text, err = srv.tool("sync_stop", job_id="sync-nope00")
    assert err and text == f"Error: no sync job 'sync-nope00'. Active: {job}"
    srv.tool("sync_stop", job_id=job)


def test_initial_push_failure_starts_no_job(srv, roots):
    project = tree(roots)
    # /proc is not writable inside the sandbox, so the push fails.
    text, err = srv.tool("sync_start", local_dir=str(project), sandbox_dir="/proc/nope")
    assert err and text.startswith(f"Error: initial sync of {project.resolve()} failed, sync not started: "), text
    text, err = srv.tool("sync_stop", job_id="sync-000000")
    assert err and text.endswith("Active: none"), text


def test_job_stops_when_its_sandbox_is_destroyed(srv, roots):
    project = tree(roots)
    text, err = srv.tool("sync_start", local_dir=str(project), sandbox="gone")
    assert not err, text
    job = re.match(r"Sync started \[(sync-[0-9a-f]{6})\]", text).group(1)
    srv.tool("destroy", sandbox="gone")
    (project / "poke").write_text("x\n")
    # Asked about another id, so the poll itself never stops the job.
    assert wait_for(lambda: srv.tool("sync_stop", job_id="sync-zzzzzz")[0].endswith("Active: none"), timeout=20)
    text, err = srv.tool("sync_stop", job_id=job)
    assert err and text == f"Error: no sync job '{job}'. Active: none"


def test_project_file_sync_exclude(srv, roots):
    (roots / ".sandbox-mcp.toml").write_text('[sync]\nexclude = ["secrets/", "*.tmp"]\n')
    project = tree(roots)
    (project / "secrets").mkdir()
    (project / "secrets/key").write_text("k\n")
    (project / "a.tmp").write_text("t\n")
    job, files = start(srv, project)
    assert files == 3
    (project / "later.tmp").write_text("t\n")
    (project / "barrier.txt").write_text("b\n")
    base = [".gitignore", "README", "link", "src", "src/pkg", "src/pkg/mod.py"]
    assert mirrored(srv, base + ["barrier.txt"]) == sorted(base + ["barrier.txt"])
    srv.tool("sync_stop", job_id=job)


def test_a_directory_swapped_for_a_symlink_is_never_followed(srv, roots, tmp_path):
    """Every push walks from the root's fd without following symlinks: a
    directory replaced by a symlink to a host directory outside the roots
    reaches the sandbox as that symlink, never as the files behind it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("SECRET-outside\n")
    project = tree(roots)
    job, _ = start(srv, project)
    shutil.rmtree(project / "src")
    os.symlink(outside, project / "src")
    (project / "barrier").write_text("b\n")
    # src's contents are deleted from the mirror; src itself stays a (now
    # empty) directory, since the agent does not replace a directory with
    # a symlink, or becomes the symlink.
    want = [".gitignore", "README", "barrier", "link", "src"]
    assert mirrored(srv, want) == want
    out, _ = srv.tool("exec", command=f"grep -rl SECRET-outside {DEST} /tmp; ls -A {DEST}/src/; echo checked")
    assert out.startswith("checked\n"), out
    # The job's own directory swapped for a symlink: pushes fail (and are
    # counted), nothing behind the symlink is read.
    moved = roots / "moved"
    project.rename(moved)
    os.symlink(outside, project)
    (moved / "later").write_text("x\n")
    (outside / "new.txt").write_text("SECRET-outside\n")
    text, err = srv.tool("sync_stop", job_id=job)
    assert not err, text
    out, _ = srv.tool("exec", command=f"grep -rl SECRET-outside {DEST} /tmp; ls {DEST}; echo checked")
    assert "SECRET" not in out and "new.txt" not in out, out
