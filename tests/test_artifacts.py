"""collect_artifacts through a real MCP client: manifest with sha256, host-root policy, symlinks."""
import hashlib
from pathlib import Path


def manifest(text: str) -> tuple[list[tuple[int, str, Path]], str]:
    *lines, summary = text.split("\n")
    rows = []
    for line in lines:
        size, sha, path = line.split(" ", 2)
        rows.append((int(size), sha, Path(path)))
    return rows, summary


def test_manifest_sizes_and_sha256(srv, roots):
    setup = (
        "mkdir -p out b deep/x/y && printf hello > out/a.txt && printf world! > b/a.txt && "
        "head -c 100000 /dev/urandom > /tmp/c.bin && printf log > deep/x/y/z.log && "
        "ln -s /etc/passwd out/link && sha256sum out/a.txt b/a.txt /tmp/c.bin deep/x/y/z.log"
    )
    out, err = srv.tool("exec", command=setup)
    assert not err, out
    inside = {line.split()[1]: line.split()[0] for line in out.splitlines()[:4]}
    dest = roots / "arts"
    text, err = srv.tool("collect_artifacts", patterns=["out/*", "b/*.txt", "/tmp/c.bin", "deep/**/*.log"], dest=str(dest))
    assert not err, text
    rows, summary = manifest(text)
    real = dest.resolve()
    assert [p for _, _, p in rows] == [real / "a.txt", real / "2-a.txt", real / "c.bin", real / "z.log"]
    for (size, sha, path), source in zip(rows, ["out/a.txt", "b/a.txt", "/tmp/c.bin", "deep/x/y/z.log"]):
        data = path.read_bytes()
        assert size == len(data) and sha == hashlib.sha256(data).hexdigest() == inside[source], (path, source)
    assert rows[0][0] == 5 and rows[2][0] == 100000
    assert summary.startswith("Collected 4 file(s), ") and f" into {real} " in summary + " ", summary
    assert summary.endswith("(1 symlink(s) skipped: /workspace/out/link)"), summary
    assert not (dest / "link").exists()


def test_patterns_with_spaces_are_not_split(srv, roots):
    srv.tool("exec", command="printf x > 'my file.txt'; printf y > my")
    text, err = srv.tool("collect_artifacts", patterns=["my file.txt"], dest=str(roots))
    assert not err, text
    rows, _ = manifest(text)
    assert [p.name for _, _, p in rows] == ["my file.txt"]


def test_dest_outside_roots_refused(srv, roots, tmp_path):
    srv.tool("exec", command="printf x > f.txt")
    outside = tmp_path / "elsewhere"
    text, err = srv.tool("collect_artifacts", patterns=["f.txt"], dest=str(outside))
    assert err and text.startswith(f"Error: host path {outside} is outside the allowed host roots"), text
    assert not outside.exists()


def test_no_match_and_only_symlinks(srv, roots):
    srv.tool("exec", command="ln -s /etc/hostname only-link")
    text, err = srv.tool("collect_artifacts", patterns=["nope/*", "*.missing"], dest=str(roots / "d"))
    assert err and text == "Error: no files in sandbox 'default' match nope/*, *.missing", text
    text, err = srv.tool("collect_artifacts", patterns=["only-link"], dest=str(roots / "d"))
    assert err and text.endswith("(only symlinks, which are not copied: /workspace/only-link)"), text
    text, err = srv.tool("collect_artifacts", patterns=[], dest=str(roots / "d"))
    assert err and text == "Error: patterns must be a non-empty list of globs", text
    assert not (roots / "d").exists()


def test_never_writes_through_a_host_symlink(srv, roots, tmp_path):
    srv.tool("exec", command="printf x > f.txt")
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    (roots / "d").mkdir()
    (roots / "d" / "f.txt").symlink_to(victim)
    text, err = srv.tool("collect_artifacts", patterns=["f.txt"], dest=str(roots / "d"))
    assert err and "symlink" in text, text
    assert victim.read_text() == "untouched"
