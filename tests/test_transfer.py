"""upload, download and git_clone through a real MCP client, with the host roots policy."""
import os


def test_upload_file_and_dir(srv, roots):
    (roots / "a.txt").write_text("alpha\n")
    (roots / "proj/src").mkdir(parents=True)
    (roots / "proj/src/main.py").write_text("print(1)\n")
    (roots / "proj/README").write_text("r\n")
    text, err = srv.tool("upload", local_path=str(roots / "a.txt"))
    assert not err and text.startswith(f"Uploaded {roots}/a.txt -> /workspace/a.txt ("), text
    text, err = srv.tool("upload", local_path=str(roots / "a.txt"), sandbox_path="/tmp/renamed.txt")
    assert not err and " -> /tmp/renamed.txt (" in text
    text, err = srv.tool("upload", local_path=str(roots / "proj"), sandbox_path="/workspace/proj")
    assert not err and text.startswith(f"Uploaded {roots}/proj/ -> /workspace/proj (2 files, "), text
    out, _ = srv.tool("exec", command="cat a.txt /tmp/renamed.txt proj/src/main.py proj/README")
    assert out.startswith("alpha\nalpha\nprint(1)\nr\n")


def test_upload_outside_roots_is_refused(srv, roots):
    for bad in ("/etc/shadow", str(roots / ".." / "x"), "~/.ssh/id_rsa"):
        text, err = srv.tool("upload", local_path=bad)
        assert err, text
        assert "outside the allowed host roots" in text or "does not exist on host" in text, text
    os.symlink("/etc/passwd", roots / "link")
    text, err = srv.tool("upload", local_path=str(roots / "link"))
    assert err and text == f"Error: {roots}/link is a symlink; host-path tools do not follow symlinks", text
    text, err = srv.tool("upload", local_path=str(roots / "missing"))
    assert err and text == f"Error: {roots}/missing does not exist on host"


def test_download_file_and_dir(srv, roots):
    srv.tool("exec", command="mkdir -p out/sub && echo one > out/sub/1.txt && printf two > out/2.txt && ln -s /etc/passwd out/link")
    text, err = srv.tool("download", sandbox_path="/workspace/out/2.txt", local_path=str(roots / "got.txt"))
    assert not err and text.startswith(f"Downloaded /workspace/out/2.txt -> {roots}/got.txt (3B, "), text
    assert (roots / "got.txt").read_text() == "two"
    text, err = srv.tool("download", sandbox_path="/workspace/out", local_path=str(roots / "tree"))
    assert not err and text.startswith(f"Downloaded /workspace/out/ -> {roots}/tree ("), text
    assert "1 symlinks/special files skipped" in text
    assert (roots / "tree/sub/1.txt").read_text() == "one\n"
    assert not (roots / "tree/link").exists() and not (roots / "tree/link").is_symlink()


def test_download_never_writes_through_a_symlink(srv, roots):
    victim = roots / "victim"
    victim.write_text("precious")
    os.symlink(victim, roots / "planted")
    srv.tool("exec", command="echo evil > /tmp/payload")
    text, err = srv.tool("download", sandbox_path="/tmp/payload", local_path=str(roots / "planted"))
    assert err and "symlink" in text, text
    assert victim.read_text() == "precious"


def test_download_errors(srv, roots):
    text, err = srv.tool("download", sandbox_path="/nope", local_path=str(roots / "x"))
    # A read-only tool never creates the sandbox (weakness #50).
    assert err and text == "Error: no active sandbox 'default'", text
    assert not srv.tool("exec", command="true")[1]
    text, err = srv.tool("download", sandbox_path="/nope", local_path=str(roots / "x"))
    assert err and text == "Error: /nope does not exist in sandbox"
    text, err = srv.tool("download", sandbox_path="/etc/hostname", local_path="/etc/evil")
    assert err and "outside the allowed host roots" in text


def test_git_clone_local_repo_with_token(srv):
    srv.tool("exec", command=(
        "git init -q /srv/demo.git && cd /srv/demo.git && git config user.email a@b && git config user.name a"
        " && echo hi > f && git add f && git commit -qm first"))
    text, err = srv.tool("git_clone", repo="file:///srv/demo.git", token="s3cr3t-token-value", path="/workspace/c")
    assert not err, text
    lines = text.split("\n")
    assert lines[0] == "Cloned file:///srv/demo.git -> /workspace/c/demo"
    assert lines[1].endswith(" first") and lines[2] == "1 files"
    history, _ = srv.tool("history")
    assert "s3cr3t" not in history and "git clone file:///srv/demo.git" in history
    leaked, _ = srv.tool("exec", command="grep -rl s3cr3t-token-value /workspace /root /etc /tmp 2>/dev/null | head -3; echo done")
    assert leaked.startswith("done"), leaked


def test_git_clone_errors(srv):
    text, err = srv.tool("git_clone", repo="--upload-pack=evil")
    assert err and text == "Error: invalid repository '--upload-pack=evil'"
    text, err = srv.tool("git_clone", repo="file:///nowhere/x.git")
    assert err and text.startswith("Error: cloning: "), text
    # A host path is read inside the sandbox: the answer says so and how a host repository gets in.
    text, err = srv.tool("git_clone", repo="/home/someone/project")
    assert err and "'/home/someone/project' was read inside the sandbox, not on the host" in text, text
    assert "upload(local_path='/home/someone/project', sandbox_path='/workspace/project')" in text, text
    text, err = srv.tool("git_clone", repo="https://127.0.0.1:1/x.git")
    assert err and "inside the sandbox" not in text, text
