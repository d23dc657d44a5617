"""Host-path tools against a sandbox that fights back (issue 9, finding 2).

The attack: the host roots contain a sandbox's /workspace volume (the default
when the server starts in $HOME), and code in that sandbox swaps a directory
for a symlink to a host directory outside the roots while upload, download,
sync_start and collect_artifacts use a path through it. Checked once and
reopened by name, the host path led outside the roots. Now every host path is
walked from a directory fd without following any symlink, and sandbox-mcp's
own directories (where every volume lives) are refused outright.

Also here: plain symlink escapes at every component position, `..`, absolute
paths, paths into sandbox-mcp's own directories, fifos and device nodes, hard
links. The transport is not under test, so these run over stdio only.
"""
from __future__ import annotations

import os
import re
import stat
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from conftest import required_env, stop_servers, volume_dir
from mcp_client import McpClient
from waiting import wait_for

# Rounds of every tool call against the racing sandbox, and a cap on the
# time they may take (whichever ends first).
ROUNDS = 25
ROUND_BUDGET_S = 240.0
OWN_DATA = "inside sandbox-mcp's own data"

# Swaps /workspace/d between a real directory (with decoy files) and a
# symlink to a host directory outside the roots, as fast as it can, touching
# a file on every turn so that sync jobs get events to push. Stops when
# /workspace/stop exists or after `n` turns.
#
# The victim's tools may create /workspace/d themselves while it is away
# (downloads make the parents of their target), and then a rename fails: the
# swapper moves that directory aside and goes on, so that the race lasts as
# long as the test needs it (it once died early and left d a plain directory).
SWAP = r"""
import os, sys
outside, n = sys.argv[1], int(sys.argv[2])
os.chdir('/workspace')

def settle(i):
    # Back to: real/ a directory, lnk a symlink, no d.
    if os.path.islink('d'):
        if os.path.lexists('lnk'):
            os.unlink('d')
        else:
            os.rename('d', 'lnk')
    elif os.path.isdir('d'):
        os.rename('d', 'real' if not os.path.isdir('real') else 'aside%d' % i)
    elif os.path.lexists('d'):
        os.rename('d', 'aside%d' % i)
    os.makedirs('real', exist_ok=True)
    for name in ('secret.txt', 'payload'):
        if not os.path.exists('real/' + name):
            with open('real/' + name, 'w') as f:
                f.write('decoy\\n')
    if not os.path.lexists('lnk'):
        os.symlink(outside, 'lnk')

settle(0)
print('swapping', flush=True)
settled = 0
for i in range(n):
    if os.path.exists('stop'):
        break
    try:
        os.rename('real', 'd')
        with open('d/tick', 'w') as f:
            f.write(str(i))
        os.rename('d', 'real')
        os.rename('lnk', 'd')
        with open('real/tock', 'w') as f:
            f.write(str(i))
        os.rename('d', 'lnk')
    except OSError:
        settled += 1
        try:
            settle(i)
        except OSError:
            pass
print('done after', i, 'turns, settled', settled, flush=True)
"""


def start_server(env: dict[str, str], name: str, **extra: str) -> McpClient:
    log = f"{env['SANDBOX_MCP_TEST_TMP']}/{name}.log"
    return McpClient(required_env("SANDBOX_MCP_BIN"), env={**env, **extra}, stderr_path=log)


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A host directory outside every root, holding secret.txt with a
    unique secret; yields (directory, secret)."""
    d = tmp_path / "outside"
    d.mkdir()
    secret = f"SECRET-{uuid.uuid4().hex}"
    (d / "secret.txt").write_text(secret + "\n")
    yield d, secret


def assert_untouched(outside_dir: Path, secret: str) -> None:
    assert sorted(p.name for p in outside_dir.iterdir()) == ["secret.txt"]
    assert (outside_dir / "secret.txt").read_text() == secret + "\n"


def start_swapping(srv: McpClient, outside_dir: Path, sandbox: str, turns: int = 5_000_000) -> None:
    out, err = srv.tool("exec", command=f"cat > /tmp/swap.py <<'EOF'\n{SWAP}\nEOF", sandbox=sandbox)
    assert not err, out
    out, err = srv.tool("bg", command=f"python3 /tmp/swap.py {outside_dir} {turns}", name="swap", sandbox=sandbox)
    assert not err, out
    assert wait_for(lambda: "swapping" in srv.tool("logs", name="swap", sandbox=sandbox)[0], timeout=30)


def stop_swapping(srv: McpClient, sandbox: str) -> None:
    """Stops the swapper, checking that it raced to the end (a swapper that
    died early would leave the later rounds racing nothing)."""
    srv.tool("exec", command="touch /workspace/stop", sandbox=sandbox)
    assert wait_for(lambda: "done after" in srv.tool("logs", name="swap", sandbox=sandbox)[0], timeout=30), \
        srv.tool("logs", name="swap", sandbox=sandbox)[0]
    srv.tool("kill", name="swap", sandbox=sandbox)


def attack_round(srv: McpClient, volume: Path, i: int, sandbox: str = "default") -> list[tuple[str, str, bool]]:
    """Every host-path tool of `sandbox` once through /workspace/d of the
    racing sandbox (whose host path is `volume`); returns (call, text,
    is_error) triples."""
    d = volume / "d"
    calls = [
        ("upload file", dict(local_path=f"{d}/secret.txt", sandbox_path="/tmp/up/")),
        ("upload dir", dict(local_path=str(d), sandbox_path=f"/tmp/updir{i}")),
        ("download file", dict(sandbox_path="/tmp/payload", local_path=f"{d}/target.txt")),
        ("download dir", dict(sandbox_path="/tmp/payloaddir", local_path=f"{d}/tree")),
        ("collect_artifacts", dict(patterns=["/tmp/payload"], dest=str(d))),
        ("sync_start", dict(local_dir=str(d), sandbox_dir=f"/tmp/sync{i}")),
    ]
    results = []
    for label, args in calls:
        tool = label.split()[0]
        text, err = srv.tool(tool, sandbox=sandbox, **args)
        results.append((label, text, err))
        if tool == "sync_start" and not err:
            job = re.match(r"Sync started \[(sync-[0-9a-f]{6})\]", text).group(1)
            # Let the job push a few of the swapper's events, then stop it.
            time.sleep(0.2)
            results.append(("sync_stop", *srv.tool("sync_stop", job_id=job)))
    return results


def refused_calls(results: list[tuple[str, str, bool]]) -> list[str]:
    """The texts of calls that met the swapped-in symlink and were refused."""
    return [t for _, t, e in results if e and "is a symlink; host-path tools do not follow symlinks" in t]


def prepare_payloads(srv: McpClient, sandbox: str = "default") -> None:
    out, err = srv.tool("exec", command="mkdir -p /tmp/payloaddir/sub && echo planted > /tmp/payload"
                        " && echo planted > /tmp/payloaddir/sub/f", sandbox=sandbox)
    assert not err, out


def assert_no_leak(
    srv: McpClient, results, outside_dir: Path, secret: str, host_tree: Path, sandbox: str = "default"
) -> None:
    for label, text, _ in results:
        assert secret not in text, (label, text)
    out, _ = srv.tool("exec", command=f"grep -rls {secret} /tmp /workspace /root 2>/dev/null; echo checked",
                      sandbox=sandbox)
    assert out.startswith("checked"), out
    assert_untouched(outside_dir, secret)
    for p in host_tree.rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert secret.encode() not in p.read_bytes(), p


def other_server_env(env: dict[str, str], roots: Path) -> dict[str, str]:
    """XDG dirs of a second server (its own daemon and helper) whose data
    directory, and so its sandboxes' volumes, lie under `roots`."""
    base = env["SANDBOX_MCP_TEST_TMP"]
    other = {k: f"{base}/other-{k.split('_')[1].lower()}" for k in
             ("XDG_STATE_HOME", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME")}
    other["XDG_DATA_HOME"] = str(roots / "otherdata")
    for d in other.values():
        os.makedirs(d, mode=0o700, exist_ok=True)
    return other


def test_race_through_another_servers_volume(env, roots, outside):
    """The fd walk alone: the roots hold the volume of a sandbox that this
    server does not know as its own (another server's data directory), so
    only walking without following symlinks stands between it and the host."""
    outside_dir, secret = outside
    other = other_server_env(env, roots)
    attacker = start_server(env, "attacker", **other)
    srv = start_server(env, "victim", SANDBOX_MCP_HOST_ROOTS=str(roots))
    try:
        start_swapping(attacker, outside_dir, "attacker")
        volume = volume_dir(other, "attacker") / "workspace"
        # The swapper renames real -> d -> real -> ... as fast as it can, so
        # two separate checks can both miss; one listing at a time, polled,
        # shows that this is the racing sandbox's volume.
        assert wait_for(lambda: {"real", "d", "lnk"} & set(os.listdir(volume))), sorted(os.listdir(volume))
        prepare_payloads(srv)
        results = []
        deadline = time.monotonic() + ROUND_BUDGET_S
        # ROUNDS at least, and on until the race has been met once: on a
        # loaded machine the swapper may lose every early round.
        i = 0
        while (i < ROUNDS or not refused_calls(results)) and time.monotonic() < deadline:
            results += attack_round(srv, volume, i)
            i += 1
        stop_swapping(attacker, "attacker")
        # The sandbox did race: some calls met the symlink and were refused.
        assert refused_calls(results), results[:12]
        assert_no_leak(srv, results, outside_dir, secret, roots)
    finally:
        srv.close()
        attacker.close()
        stop_servers(other)


def test_race_through_three_clients_at_once(env, roots, outside, http_server):
    """Two stdio clients and an HTTP client at once: the first drives the
    sandbox that swaps its /workspace/d for a symlink (under a daemon of its
    own, whose data directory lies in the roots: one daemon would refuse its
    own data outright, see below), while the second stdio client and the
    HTTP client, sharing one daemon, run every host-path tool through that
    directory concurrently, each for a sandbox of its own."""
    outside_dir, secret = outside
    other = other_server_env(env, roots)
    attacker = start_server(env, "attacker3", **other)
    victim = start_server(env, "victim3", SANDBOX_MCP_HOST_ROOTS=str(roots))
    web = http_server(SANDBOX_MCP_HOST_ROOTS=str(roots)).client()
    try:
        start_swapping(attacker, outside_dir, "attacker")
        volume = volume_dir(other, "attacker") / "workspace"
        clients = {"stdio": (victim, "v-stdio"), "http": (web, "v-http")}
        for srv, sandbox in clients.values():
            prepare_payloads(srv, sandbox)
        results: dict[str, list] = {name: [] for name in clients}
        deadline = time.monotonic() + ROUND_BUDGET_S

        def race(name: str) -> None:
            srv, sandbox = clients[name]
            i = 0
            while (i < ROUNDS // 5 or not refused_calls(results[name])) and time.monotonic() < deadline:
                results[name] += attack_round(srv, volume, i, sandbox)
                i += 1

        threads = [threading.Thread(target=race, args=(name,)) for name in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop_swapping(attacker, "attacker")
        for name, (srv, sandbox) in clients.items():
            assert refused_calls(results[name]), (name, results[name][:12])
            assert_no_leak(srv, results[name], outside_dir, secret, roots, sandbox)
    finally:
        web.close()
        victim.close()
        attacker.close()
        stop_servers(other)


def test_race_through_own_volume_is_refused_outright(env, outside):
    """The default setup: the host root contains the server's own data
    directory, so its sandbox's /workspace is under the root. Every path
    into it is refused by device and inode, whatever the sandbox does."""
    outside_dir, secret = outside
    base = Path(env["SANDBOX_MCP_TEST_TMP"])
    srv = start_server(env, "server", SANDBOX_MCP_HOST_ROOTS=str(base))
    try:
        start_swapping(srv, outside_dir, "default")
        volume = volume_dir(env, "default", base) / "workspace"
        prepare_payloads(srv)
        results = []
        for i in range(ROUNDS // 5):
            results += attack_round(srv, volume, i)
        stop_swapping(srv, "default")
        for label, text, err in results:
            assert err and OWN_DATA in text and "(" + str(base / "data/sandbox-mcp") + ")" in text, (label, text)
        assert_no_leak(srv, results, outside_dir, secret, base / "data")
    finally:
        srv.close()


def test_own_directories_are_out_of_reach(env):
    """Data, state, config and runtime directories, and the sandbox volumes
    in them, are refused for reading and writing; the rest of the root is not."""
    base = Path(env["SANDBOX_MCP_TEST_TMP"])
    srv = start_server(env, "server", SANDBOX_MCP_HOST_ROOTS=str(base))
    try:
        srv.tool("exec", command="echo inside > /workspace/w.txt")
        volume = volume_dir(env, "default", base) / "workspace"
        assert (volume / "w.txt").is_file()
        for path in (volume / "w.txt", volume, base / "state/sandbox-mcp", base / "run/sandbox-mcp"):
            text, err = srv.tool("upload", local_path=str(path))
            assert err and text.startswith(f"Error: {path} is {OWN_DATA} ("), text
        text, err = srv.tool("download", sandbox_path="/workspace/w.txt", local_path=f"{volume}/copy.txt")
        assert err and OWN_DATA in text, text
        text, err = srv.tool("download", sandbox_path="/workspace", local_path=str(base / "config/sandbox-mcp/ws"))
        assert err and OWN_DATA in text, text
        # No configuration can be planted (the unit tests cover the directory not existing yet).
        assert not (base / "config/sandbox-mcp/config.toml").exists()
        srv.tool("exec", command="printf 'host_roots = [\"/\"]\\n' > /tmp/config.toml")
        text, err = srv.tool("download", sandbox_path="/tmp/config.toml",
                             local_path=str(base / "config/sandbox-mcp/config.toml"))
        assert err and OWN_DATA in text, text
        assert not (volume / "copy.txt").exists() and not (base / "config/sandbox-mcp/ws").exists()
        assert not (base / "config/sandbox-mcp/config.toml").exists()
        text, err = srv.tool("sync_start", local_dir=str(volume), sandbox_dir="/tmp/s")
        assert err and OWN_DATA in text, text
        text, err = srv.tool("collect_artifacts", patterns=["w.txt"], dest=str(base / "data/sandbox-mcp/images"))
        assert err and OWN_DATA in text, text
        # A directory that contains them uploads without them.
        (base / "mine").mkdir()
        (base / "mine/ok.txt").write_text("ok\n")
        text, err = srv.tool("upload", local_path=str(base), sandbox_path="/tmp/base")
        assert not err, text
        out, _ = srv.tool("exec", command="cat /tmp/base/mine/ok.txt; ls /tmp/base/data")
        assert out.startswith("ok\n") and "sandbox-mcp" not in out, out
        # A download into the root above them works.
        text, err = srv.tool("download", sandbox_path="/workspace/w.txt", local_path=str(base / "w.txt"))
        assert not err and (base / "w.txt").read_text() == "inside\n", text
    finally:
        srv.close()


def test_root_inside_own_data_refuses_everything_under_it(env):
    """A root configured inside sandbox-mcp's own data: the server starts,
    and every path under that root is refused."""
    base = Path(env["SANDBOX_MCP_TEST_TMP"])
    root = base / "data/sandbox-mcp"
    root.mkdir(parents=True, exist_ok=True)
    (root / "x.txt").write_text("x\n")
    srv = start_server(env, "server", SANDBOX_MCP_HOST_ROOTS=str(root))
    try:
        text, err = srv.tool("upload", local_path=str(root / "x.txt"))
        assert err and text == f"Error: {root}/x.txt is {OWN_DATA} ({root}): host-path tools may not use it", text
        text, err = srv.tool("download", sandbox_path="/etc/hostname", local_path=str(root / "h"))
        assert err and OWN_DATA in text and not (root / "h").exists(), text
    finally:
        srv.close()


@pytest.fixture
def srv1(env, roots) -> Iterator[McpClient]:
    """One stdio server with `roots` as its only host root."""
    client = start_server(env, "server", SANDBOX_MCP_HOST_ROOTS=str(roots))
    try:
        yield client
    finally:
        client.close()


def test_symlinks_at_every_position(srv1, roots, outside):
    outside_dir, secret = outside
    (roots / "a/b").mkdir(parents=True)
    (roots / "a/b/real.txt").write_text("real\n")
    os.symlink(outside_dir, roots / "first")                      # first component under the root
    os.symlink(outside_dir, roots / "a/middle")                   # a middle component
    os.symlink(outside_dir / "secret.txt", roots / "a/b/last")     # the last component
    os.symlink(outside_dir / "secret.txt", roots / "a/b/payload")  # the name an artifact gets
    srv1.tool("exec", command="echo planted > /tmp/payload")
    symlink = "is a symlink; host-path tools do not follow symlinks"
    through_dirs = [
        ("upload", dict(local_path="{d}/secret.txt")),
        ("download", dict(sandbox_path="/tmp/payload", local_path="{d}/new.txt")),
        ("download", dict(sandbox_path="/tmp", local_path="{d}/tree")),
        ("sync_start", dict(local_dir="{d}")),
        ("sync_start", dict(local_dir="{d}/sub")),
        ("collect_artifacts", dict(patterns=["/tmp/payload"], dest="{d}")),
        ("collect_artifacts", dict(patterns=["/tmp/payload"], dest="{d}/new")),
    ]
    for link in (roots / "first", roots / "a/middle"):
        for tool, args in through_dirs:
            args = {k: v.format(d=link) if isinstance(v, str) else v for k, v in args.items()}
            text, err = srv1.tool(tool, **args)
            assert err and text == f"Error: {link} {symlink}", (tool, args, text)
    last = roots / "a/b/last"
    for tool, args in [
        ("upload", dict(local_path=str(last))),
        ("download", dict(sandbox_path="/tmp/payload", local_path=str(last))),
        ("sync_start", dict(local_dir=str(last))),
    ]:
        text, err = srv1.tool(tool, **args)
        assert err and text == f"Error: {last} {symlink}", (tool, args, text)
    text, err = srv1.tool("collect_artifacts", patterns=["/tmp/payload"], dest=str(roots / "a/b"))
    assert err and text == f"Error: {roots}/a/b/payload {symlink}", text
    assert_untouched(outside_dir, secret)
    text, err = srv1.tool("upload", local_path=str(roots / "a/b/real.txt"))
    assert not err, text


def test_dotdot_and_absolute_paths(srv1, roots, outside):
    outside_dir, secret = outside
    rel_out = os.path.relpath(outside_dir / "secret.txt", roots)
    srv1.tool("exec", command="echo planted > /tmp/payload")
    for path in (f"{roots}/{rel_out}", f"{roots}/a/../../{outside_dir.parent.name}", str(outside_dir / "secret.txt"), "/etc/shadow"):
        for tool, args in [
            ("upload", dict(local_path=path)),
            ("download", dict(sandbox_path="/tmp/payload", local_path=path)),
            ("sync_start", dict(local_dir=path)),
            ("collect_artifacts", dict(patterns=["/tmp/payload"], dest=path)),
        ]:
            text, err = srv1.tool(tool, **args)
            assert err and "outside the allowed host roots" in text and secret not in text, (tool, args, text)
    assert_untouched(outside_dir, secret)


def test_fifos_and_devices(srv1, roots):
    """A fifo never blocks a tool, a device node is never read or written."""
    if os.geteuid() != 0:
        pytest.skip("making the device node on the host needs root")
    os.mkfifo(roots / "fifo")
    os.mknod(roots / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    (roots / "tree").mkdir()
    (roots / "tree/plain.txt").write_text("plain\n")
    os.mkfifo(roots / "tree/fifo")
    text, err = srv1.tool("upload", local_path=str(roots / "fifo"))
    assert err and text == f"Error: {roots}/fifo is a fifo: only regular files and directories are copied", text
    text, err = srv1.tool("upload", local_path=str(roots / "null"))
    assert err and text == f"Error: {roots}/null is a character device: only regular files and directories are copied", text
    srv1.tool("exec", command="echo data > /tmp/payload")
    for target in ("fifo", "null"):
        text, err = srv1.tool("download", sandbox_path="/tmp/payload", local_path=str(roots / target))
        assert err and "only regular files and directories are copied" in text, text
    assert stat.S_ISFIFO(os.lstat(roots / "fifo").st_mode) and stat.S_ISCHR(os.lstat(roots / "null").st_mode)
    # In a tree, special files are left out and the rest goes through.
    text, err = srv1.tool("upload", local_path=str(roots / "tree"), sandbox_path="/tmp/tree")
    assert not err and "(1 files, " in text, text
    text, err = srv1.tool("sync_start", local_dir=str(roots / "tree"), sandbox_dir="/tmp/synced")
    assert not err and "Initial sync: 1 files" in text, text
    out, _ = srv1.tool("exec", command="ls /tmp/tree /tmp/synced")
    assert "fifo" not in out and out.count("plain.txt") == 2, out
    srv1.tool("collect_artifacts", patterns=["/tmp/payload"], dest=str(roots / "arts"))
    os.mkfifo(roots / "arts/fifo-named")
    srv1.tool("exec", command="echo x > /tmp/fifo-named")
    text, err = srv1.tool("collect_artifacts", patterns=["/tmp/fifo-named"], dest=str(roots / "arts"))
    assert err and "is a fifo" in text, text


def test_hard_links_are_replaced_not_written_through(srv1, roots, outside):
    outside_dir, secret = outside
    linked = outside_dir.parent / "linked-target"
    linked.write_text("keep me\n")
    os.link(linked, roots / "hl.txt")
    (roots / "arts").mkdir()
    os.link(linked, roots / "arts/payload")
    srv1.tool("exec", command="echo new > /tmp/payload")
    text, err = srv1.tool("download", sandbox_path="/tmp/payload", local_path=str(roots / "hl.txt"))
    assert not err, text
    text, err = srv1.tool("collect_artifacts", patterns=["/tmp/payload"], dest=str(roots / "arts"))
    assert not err, text
    assert (roots / "hl.txt").read_text() == "new\n" and (roots / "arts/payload").read_text() == "new\n"
    assert linked.read_text() == "keep me\n" and os.stat(linked).st_nlink == 1
    leftovers = [p.name for p in roots.rglob("*smcp-tmp")]
    assert not leftovers, leftovers
