"""snapshot, restore, list_snapshots, delete_snapshot, images, build_image and
clone through a real MCP client (stdio and HTTP), each on a per-test image store."""
import os
import re
import socket
import threading
import urllib.request
from pathlib import Path

from conftest import sandbox_key
from waiting import poll

SIZE = r"\d+(\.\d)?[KMG]?B"


def out(srv, command, sandbox="default"):
    text, err = srv.tool("exec", command=command, sandbox=sandbox)
    assert not err, text
    return text


# ---------------------------------------------------------------- snapshots


def test_snapshot_restore_roundtrip(isrv, roots):
    isrv.tool("exec", command="echo one > /etc/snapfile; rm /etc/issue.net; echo w1 > /workspace/w1")
    isrv.tool("env", action="set", key="SNAP_VAR", value="before")
    text, err = isrv.tool("snapshot", snapshot_name="s1")
    assert not err and re.fullmatch(rf"Snapshot 's1' saved from default \(incremental, {SIZE}, \d+ms\)", text), text
    # Incremental: the size is the new layer's, not the whole image's.
    assert re.search(r", \d+(\.\d)?K?B, ", text), text

    isrv.tool("exec", command="echo two > /etc/snapfile; touch /etc/extra; echo w2 > /workspace/w2")
    isrv.tool("env", action="set", key="SNAP_VAR", value="after")
    text, err = isrv.tool("restore", snapshot_name="s1")
    assert (text, err) == (f"Restored 's1' as 'default': {sandbox_key('default', roots)}", False)
    # The restored sandbox is the same one to its history: the commands run before the restore are listed.
    history, _ = isrv.tool("history")
    assert "echo two > /etc/snapfile" in history, history
    got = out(isrv, 'cat /etc/snapfile; ls /etc/issue.net /etc/extra 2>&1 | wc -l; echo "$SNAP_VAR"; '
                    "cat /workspace/w1 /workspace/w2")
    # Restored root filesystem, deletion kept, env from the snapshot, workspace untouched.
    assert got.startswith("one\n2\nbefore\nw1\nw2\n"), got

    # /workspace is not in the snapshot: another sandbox restored from it has its own.
    text, err = isrv.tool("restore", snapshot_name="s1", sandbox="other")
    assert (text, err) == (f"Restored 's1' as 'other': {sandbox_key('other', roots)}", False)
    got = out(isrv, "cat /etc/snapfile; ls -A /workspace | wc -l", sandbox="other")
    assert got.startswith("one\n0\n"), got


def test_snapshot_of_restored_sandbox_keeps_both_generations(isrv):
    out(isrv, "echo a > /etc/gen-a; rm /etc/motd")
    assert not isrv.tool("snapshot", snapshot_name="a")[1]
    assert not isrv.tool("restore", snapshot_name="a")[1]
    out(isrv, "echo b > /etc/gen-b")
    assert not isrv.tool("snapshot", snapshot_name="b")[1]
    assert not isrv.tool("restore", snapshot_name="b", sandbox="other")[1]
    got = out(isrv, "cat /etc/gen-a /etc/gen-b; test -e /etc/motd && echo motd-back || echo motd-gone", "other")
    assert got.startswith("a\nb\nmotd-gone\n"), got

    # b is built on a: a cannot go first; a sandbox on a deleted snapshot keeps working.
    text, err = isrv.tool("delete_snapshot", snapshot_name="a")
    assert err and text == "Error: snapshot 'a' is the base of snapshot 'b': delete those first", text
    assert isrv.tool("delete_snapshot", snapshot_name="b") == ("Deleted snapshot 'b'", False)
    assert isrv.tool("delete_snapshot", snapshot_name="a") == ("Deleted snapshot 'a'", False)
    assert out(isrv, "cat /etc/gen-a /etc/gen-b", "other").startswith("a\nb\n")
    assert isrv.tool("list_snapshots")[0] == "No snapshots saved. Use snapshot('name') to create one."


def test_list_snapshots_and_images(isrv):
    assert isrv.tool("list_snapshots") == ("No snapshots saved. Use snapshot('name') to create one.", False)
    out(isrv, "true", sandbox="box")
    assert not isrv.tool("snapshot", snapshot_name="v1.0", sandbox="box")[1]
    text, err = isrv.tool("list_snapshots")
    lines = text.split("\n")
    assert not err and lines[0] == "Available snapshots:", text
    assert re.fullmatch(rf"  - v1\.0 \({SIZE} layer, {SIZE} in all, from 'box', \d+s ago\)", lines[1]), lines

    text, err = isrv.tool("images")
    rows = text.split("\n")
    assert not err and rows[0].split() == ["NAME", "SIZE", "CREATED", "LAYERS", "KIND", "/", "PARENT"], text
    image = os.environ["SANDBOX_MCP_TEST_IMAGE"]
    base = next(r for r in rows if r.startswith(image + " "))
    assert base.split()[-2:] == ["1", "base"], base
    snap = next(r for r in rows if r.startswith("mcp-snap-v1.0 "))
    assert snap.split()[-4:] == ["2", "snapshot", "<-", image], snap


def test_images_empty_store(server_factory, env):
    empty = Path(env["SANDBOX_MCP_TEST_TMP"]) / "empty-store"
    empty.mkdir()
    srv = server_factory(SANDBOX_MCP_IMAGE_STORE=str(empty))
    assert srv.tool("images") == ("No images found", False)
    assert srv.tool("list_snapshots") == ("No snapshots saved. Use snapshot('name') to create one.", False)


def test_snapshot_errors(isrv):
    assert isrv.tool("snapshot", snapshot_name="s", sandbox="nope") == (
        "Error: no active sandbox 'nope' to snapshot", True)
    text, err = isrv.tool("snapshot", snapshot_name="Bad")
    assert err and text.startswith("Error: invalid snapshot name 'Bad'") and "lowercase" in text, text
    out(isrv, "true")
    assert not isrv.tool("snapshot", snapshot_name="s")[1]
    assert isrv.tool("snapshot", snapshot_name="s") == (
        "Error: snapshot 's' already exists: delete_snapshot('s') first or choose another name", True)
    assert isrv.tool("restore", snapshot_name="zz") == ("Error: snapshot 'zz' not found. Use list_snapshots().", True)
    assert isrv.tool("delete_snapshot", snapshot_name="zz") == ("Error: snapshot 'zz' not found. Available: s", True)
    assert isrv.tool("delete_snapshot", snapshot_name="s") == ("Deleted snapshot 's'", False)
    assert isrv.tool("delete_snapshot", snapshot_name="s") == ("Error: snapshot 's' not found. Available: none", True)


# ---------------------------------------------------------------- clone


def test_clone(isrv):
    out(isrv, "echo rootfs > /etc/cloned; mkdir -p /workspace/d; echo ws > /workspace/d/f")
    isrv.tool("env", action="set", key="CLONE_VAR", value="yes")
    text, err = isrv.tool("clone", source="default", target="copy")
    assert not err and re.fullmatch(rf"Cloned 'default' -> 'copy': copy \({SIZE}, \d+ms\)", text), text
    got = out(isrv, 'cat /etc/cloned /workspace/d/f; echo "$CLONE_VAR"', "copy")
    assert got.startswith("rootfs\nws\nyes\n"), got
    # Independent afterwards, both ways.
    out(isrv, "echo c > /etc/only-copy; echo c > /workspace/only-copy", "copy")
    out(isrv, "echo s > /etc/only-source")
    got = out(isrv, "ls /etc/only-copy /workspace/only-copy /etc/only-source 2>&1 | grep -c 'No such'")
    assert got.startswith("2\n"), got
    got = out(isrv, "ls /etc/only-source 2>&1 | grep -c 'No such'", "copy")
    assert got.startswith("1\n"), got


def test_clone_errors(isrv):
    assert isrv.tool("clone", source="nope", target="x") == ("Error: no active sandbox 'nope' to clone", True)
    out(isrv, "true")
    out(isrv, "true", sandbox="taken")
    assert isrv.tool("clone", source="default", target="taken") == (
        "Error: sandbox 'taken' already exists. Reset it first.", True)
    text, err = isrv.tool("clone", source="default", target="../x")
    assert err and text.startswith("Error: invalid sandbox name '../x'"), text
    # A workspace that cannot be copied (a Unix socket cannot be archived)
    # fails the clone, and the half-made target is removed.
    out(isrv, "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('/workspace/sock')\"")
    text, err = isrv.tool("clone", source="default", target="half")
    assert err and text.startswith(
        "Error: copying the workspace of 'default' failed, so the clone was removed: "), text
    assert "sock" in text, text
    assert "half" not in isrv.tool("list_all")[0].split()


# ---------------------------------------------------------------- build_image

CONTAINERFILE = """\
# An app image
FROM {image} AS base
ARG GREETING=hello
ENV APP_HOME=/opt/app MODE="prod mode"
WORKDIR $APP_HOME
RUN echo "$GREETING from $(pwd)" > greeting.txt
COPY <<EOF /etc/app.conf
key=value
EOF
COPY app.py ./
LABEL team=qa
RUN useradd -m builder \\
    && echo created
RUN ["sh", "-c", "echo exec-form > /exec.txt"]
RUN python3 <<PY
open('/py.txt', 'w').write('from-heredoc\\n')
PY
COPY --chown=builder:builder --chmod=600 <<EOF /home/builder/secret
s3cret
EOF
COPY src/ /opt/src/
USER builder
RUN whoami > /home/builder/who
"""


def build_with_progress(srv, **args):
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total, message))

    result = srv._run(lambda s: s.call_tool("build_image", args, progress_callback=on_progress), 900, "build_image")
    return "".join(getattr(c, "text", "") for c in result.content), bool(result.is_error), seen


def test_build_image_and_boot_it(isrv, roots):
    image = os.environ["SANDBOX_MCP_TEST_IMAGE"]
    text, err, seen = build_with_progress(
        isrv, name="app", containerfile=CONTAINERFILE.format(image=image), context={"app.py": "print('app')\n", "src/a.txt": "A\n", "src/sub/b.txt": "B\n"})
    assert not err and re.fullmatch(rf"Built image 'app' \(15 steps, {SIZE}, \d+ms\)", text), text
    messages = [m for _, _, m in seen]
    assert messages[0] == f"Step 1/15: FROM {image} AS base", messages
    assert 'Step 5/15: RUN echo "$GREETING from $(pwd)" > greeting.txt' in messages, messages
    assert [p for p, _, _ in seen] == sorted(p for p, _, _ in seen) and {t for _, t, _ in seen} == {15}

    rows = isrv.tool("images")[0].split("\n")
    assert next(r for r in rows if r.startswith("app ")).split()[-3:] == ["built", "<-", image], rows
    assert not any(r.startswith("build-") for r in rows), rows

    (roots / ".sandbox-mcp.toml").write_text('image = "app"\n')
    got = out(isrv, 'cat /opt/app/greeting.txt /etc/app.conf /opt/app/app.py; echo "$MODE|${GREETING-unset}"; '
                    "whoami; cat /home/builder/who", sandbox="onapp")
    assert got.startswith("hello from /opt/app\nkey=value\nprint('app')\nprod mode|unset\nbuilder\nbuilder\n"), got
    got = out(isrv, "cat /exec.txt /py.txt /opt/src/a.txt /opt/src/sub/b.txt; stat -c '%U:%G %a' /home/builder/secret; "
                    "cat /home/builder/secret", sandbox="onapp")
    assert got.startswith("exec-form\nfrom-heredoc\nA\nB\nbuilder:builder 600\ns3cret\n"), got


def test_build_image_errors(isrv):
    image = os.environ["SANDBOX_MCP_TEST_IMAGE"]
    text, err = isrv.tool("build_image", name="x", containerfile=f"FROM {image}\nRUN true\nCMD [\"sh\"]\n")
    assert err and text == ("Error building image: line 3: unsupported instruction CMD "
                            "(supported: FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, LABEL)"), text
    for base in ("nope", "scratch"):
        text, err = isrv.tool("build_image", name="x", containerfile=f"FROM {base}\nRUN true\n")
        assert err and text.startswith(f"Error building image: line 1: FROM {base}: only local images"), text
        assert text.endswith(f"local images: {image}"), text
    # A registry reference is pulled first; a closed loopback port is all this one reaches.
    text, err = isrv.tool("build_image", name="x", containerfile="FROM 127.0.0.1:9/x:1\nRUN true\n")
    assert err and text.startswith("Error building image: line 1: FROM 127.0.0.1:9/x:1: pulling it failed: "
                                   "registry 127.0.0.1:9: "), text
    text, err = isrv.tool("build_image", name="x", containerfile=f"FROM {image}\nCOPY a.txt /a.txt\n")
    assert err and text.startswith(
        "Error building image: line 2: COPY source 'a.txt' is not in the build context (context files: none)"), text
    text, err = isrv.tool("build_image", name="Bad", containerfile=f"FROM {image}\n")
    assert err and text.startswith("Error building image: invalid image name"), text
    text, err = isrv.tool("build_image", name="mcp-snap-x", containerfile=f"FROM {image}\n")
    assert (text, err) == ("Error building image: image names starting with 'mcp-snap-' are reserved for snapshots",
                           True)
    text, err = isrv.tool("build_image", name="x", containerfile=f"FROM {image}\nADD https://example.com/a /a\n")
    assert err and "line 2: ADD of a URL" in text, text

    failing = f"FROM {image}\nRUN echo first > /f\nRUN echo out; echo err-line >&2; false\nENV X=1\n"
    text, err = isrv.tool("build_image", _timeout=300, name="x", containerfile=failing)
    assert err and text.startswith(
        "Error building image: step 3/4 RUN echo out; echo err-line >&2; false exited with code 1:\n"), text
    assert "out" in text and "err-line" in text
    # Nothing is left of the failed build.
    names = [r.split()[0] for r in isrv.tool("images")[0].split("\n")[1:]]
    assert names == [image], names

    meta_only = f"FROM {image}\nENV A=1\n"
    assert not isrv.tool("build_image", _timeout=300, name="meta", containerfile=meta_only)[1]
    text, err = isrv.tool("build_image", name="meta", containerfile=meta_only)
    assert err and text == "Error building image: image 'meta' already exists (pass force=true to replace it)", text
    text, err = isrv.tool("build_image", _timeout=300, name="meta", containerfile=f"FROM {image}\nENV A=2\n", force=True)
    assert not err and text.startswith("Built image 'meta' (2 steps, "), text


def test_build_env_path_extends_the_default_path(isrv, roots):
    # The test image sets no PATH: `$PATH` is the default one RUN steps get,
    # not empty (which left PATH=/opt/bin: and every later RUN without `id`).
    image = os.environ["SANDBOX_MCP_TEST_IMAGE"]
    containerfile = f"FROM {image}\nENV PATH=/opt/bin:$PATH\nRUN id -u > /uid\n"
    text, err = isrv.tool("build_image", _timeout=300, name="pathy", containerfile=containerfile)
    assert not err, text
    (roots / ".sandbox-mcp.toml").write_text('image = "pathy"\n')
    got = out(isrv, 'echo "$PATH"; cat /uid', sandbox="onpathy")
    assert got.startswith("/opt/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n0\n"), got


def host_sleepers(tag):
    """Processes on the host (sandboxes included) whose argv is `sleep <tag>`."""
    found = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes() == f"sleep\0{tag}\0".encode():
                    found += 1
            except OSError:
                pass
    return found


def test_build_image_cancel_cleans_up(isrv):
    image = os.environ["SANDBOX_MCP_TEST_IMAGE"]
    containerfile = f"FROM {image}\nRUN echo layer > /l\nRUN sleep 313\n"

    def cancelled_build():
        try:
            isrv._run(lambda s: s.call_tool("build_image", {"name": "slow", "containerfile": containerfile},
                                            read_timeout_seconds=20), 60, "cancelled build")
        except AssertionError:
            pass  # the client gave up: it sends notifications/cancelled

    caller = threading.Thread(target=cancelled_build)
    caller.start()
    started = poll(lambda: host_sleepers(313), lambda n: n == 1, timeout=20)
    caller.join()
    assert started, "the build never reached its RUN sleep step"
    assert poll(lambda: host_sleepers(313), lambda n: n == 0, timeout=20) is not None, "the build's RUN kept running"
    rows = poll(lambda: isrv.tool("images")[0].split("\n")[1:],
                lambda rs: [r.split()[0] for r in rs] == [image], timeout=20)
    assert rows is not None, isrv.tool("images")[0]


# ---------------------------------------------------------------- children and what follows a restore


def test_child_sandboxes_refused(isrv):
    out(isrv, "true")
    text, err = isrv.call("spawn", call_timeout=120, name="kid")
    assert not err, text
    assert isrv.tool("snapshot", snapshot_name="k", sandbox="default..kid") == (
        "Error: snapshots not permitted on child sandboxes", True)
    assert isrv.tool("clone", source="default..kid", target="x") == (
        "Error: cloning from a child sandbox is not permitted", True)
    assert not isrv.tool("snapshot", snapshot_name="p")[1]
    assert isrv.tool("restore", snapshot_name="p", sandbox="default..kid") == (
        "Error: restore not permitted on child sandboxes", True)
    # The snapshot is checked first.
    assert isrv.tool("restore", snapshot_name="zz", sandbox="default..kid") == (
        "Error: snapshot 'zz' not found. Use list_snapshots().", True)
    # Restoring the parent replaces its subtree.
    assert not isrv.tool("restore", snapshot_name="p")[1]
    assert "default..kid" not in isrv.tool("list_all")[0].split()


def test_forward_survives_restore(isrv):
    out(isrv, "echo hi > /workspace/index.html")
    isrv.tool("bg", command="exec python3 -m http.server 8765 --directory /workspace", name="web")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        hp = s.getsockname()[1]
    assert not isrv.tool("expose", port=8765, host_port=hp)[1]
    assert not isrv.tool("snapshot", snapshot_name="f")[1]
    assert not isrv.tool("restore", snapshot_name="f")[1]
    isrv.tool("bg", command="exec python3 -m http.server 8765 --directory /workspace", name="web")

    def fetch():
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{hp}/index.html", timeout=5).read()
        except OSError:
            return None

    assert poll(fetch, lambda body: body == b"hi\n", timeout=15), "the forward did not follow the restored sandbox"
