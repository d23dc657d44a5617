"""The state database: nothing acknowledged is lost to kill -9 (history of the
last exec, a destroy under way), concurrent changes inside one HTTP server and
across two server processes on one helper are all kept, concurrent writes of
one file all succeed, and the JSON state file of earlier versions is imported
once."""
from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conftest import stop_daemon
from test_persistence import _lost, _restarted, _swallow, db_path, kill9_server, kill_helper_with_sandboxes, rows, until

FIXTURES = Path(__file__).parent / "fixtures"
SEED = 11
# How long another process holds the database's write lock: well past the
# tool call it is held across, well within the daemon's 10 s busy timeout.
HOLD_SECONDS = 3.0


@contextlib.contextmanager
def write_lock_held(env: dict[str, str]):
    """Another process's write transaction on the state database for
    HOLD_SECONDS from entry: the daemon's writes wait for it. Leaving waits
    until it has ended."""
    taken = threading.Event()

    def hold() -> None:
        db = sqlite3.connect(db_path(env), timeout=10, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            taken.set()
            time.sleep(HOLD_SECONDS)
            db.execute("ROLLBACK")
        finally:
            db.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(timeout=20), "could not take the database's write lock"
        yield
    finally:
        holder.join()


def test_history_of_the_last_exec_survives_kill9_right_after_the_answer(server_factory, env):
    rng = random.Random(SEED)
    missed = []
    for i in range(30):
        srv = server_factory()
        if i:
            text, err = srv.tool("history", limit=5)
            if f"marker-{i - 1}" not in text:
                missed.append(i - 1)
        # Seeded variety: a quick command or one that runs a little.
        command = f"echo marker-{i}" if rng.random() < 0.5 else f"sleep 0.0{rng.randint(1, 9)}; echo marker-{i}"
        text, err = srv.tool("exec", command=command)
        assert not err and f"marker-{i}" in text, text
        kill9_server(env)
    assert not missed, f"history lost after kill -9 in iterations {missed}"


def test_kill9_during_destroy_never_brings_the_sandbox_back_as_lost(server_factory, env):
    rng = random.Random(SEED)
    for i in range(6):
        srv = server_factory()
        name = f"victim{i}"
        text, err = srv.tool("exec", command="true", sandbox=name)
        assert not err, text
        destroying = threading.Thread(target=lambda: _swallow(lambda: srv.tool("destroy", sandbox=name)))
        destroying.start()
        time.sleep(rng.uniform(0.0, 0.04))
        kill9_server(env)
        destroying.join()
        again = server_factory()
        text, err = again.tool("exec", command="true", sandbox=name)
        assert "was lost" not in text, (i, text)
        text, err = again.tool("status")
        assert "Lost" not in text, (i, text)
        again.tool("destroy", sandbox=name)
        again.close()


def test_acknowledging_a_lost_sandbox_is_committed_before_the_answer(server_factory, env):
    srv = server_factory()
    assert not srv.tool("exec", command="true", sandbox="gone")[1]
    old = kill_helper_with_sandboxes(env)
    until(lambda: _restarted(env, old), "helper restarted")
    until(lambda: _lost(srv, "gone"), "lost")
    # The acknowledgement cannot be written until the lock goes; an answer
    # given before then, and a kill -9 right after it, would lose it.
    with write_lock_held(env):
        text, err = srv.tool("destroy", sandbox="gone")
        assert not err and "Forgot sandbox 'gone'" in text, text
        kill9_server(env)
    again = server_factory()
    text, _ = again.tool("status")
    assert "Lost" not in text, text
    text, err = again.tool("exec", command="true", sandbox="gone")
    assert not err, text


def test_concurrent_env_sets_in_one_http_server_are_all_kept(http_server):
    client = http_server().client()
    try:
        client.tool("exec", command="true")

        def set_key(n: int) -> tuple[str, bool]:
            return client.tool("env", action="set", key=f"K{n}", value=f"v{n}")

        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(set_key, range(100)))
        assert all(not err for _, err in results), [r for r in results if r[1]][:3]
        text, err = client.tool("exec", command="env | grep -c '^K[0-9]*=v'")
        assert not err and text.splitlines()[0] == "100", text
        text, err = client.tool("env", action="list")
        assert all(f"K{n}=" in text for n in range(100)), text
    finally:
        client.close()


def test_concurrent_writes_of_one_file_all_succeed(http_server):
    client = http_server().client()
    try:
        client.tool("exec", command="true")
        contents = [f"version {n}\n" * (1 + n % 7) for n in range(100)]

        def write(content: str) -> tuple[str, bool]:
            return client.tool("write_file", path="same.txt", content=content)

        # Rounds, because the race (writes overlapping in the agent) needs luck.
        for _ in range(4):
            with ThreadPoolExecutor(32) as pool:
                results = list(pool.map(write, contents))
            assert all(not err for _, err in results), [r for r in results if r[1]][:3]
        text, err = client.tool("read_file", path="same.txt")
        assert not err and text in contents, text[:200]
        text, err = client.tool("exec", command="ls -A /workspace")
        assert not err and text.splitlines()[0] == "same.txt", text
    finally:
        client.close()


def test_two_servers_on_one_helper_keep_every_acknowledged_env_key(http_server, env):
    one = http_server().client()
    one.tool("exec", command="true")
    # Started after the sandbox exists, the second server attaches it.
    two = http_server().client()
    try:

        def set_keys(client, prefix: str) -> list[tuple[str, bool]]:
            return [client.tool("env", action="set", key=f"{prefix}{n}", value=str(n)) for n in range(35)]

        with ThreadPoolExecutor(2) as pool:
            done = [pool.submit(set_keys, c, p) for c, p in ((one, "A"), (two, "B"))]
            results = [r for d in done for r in d.result()]
        assert all(not err for _, err in results), [r for r in results if r[1]][:3]
        keys = {k for (k,) in rows(env, "SELECT key FROM env WHERE sandbox LIKE '%-default'")}
        assert keys == {f"{p}{n}" for p in "AB" for n in range(35)}, sorted(keys)
    finally:
        one.close()
        two.close()
    # A fresh server takes the env from the database: all 70 keys.
    third = http_server().client()
    try:
        text, err = third.tool("exec", command="env | grep -c '^[AB][0-9]*='")
        assert not err and text.splitlines()[0] == "70", text
    finally:
        third.close()


def test_the_old_state_file_is_imported_once(server_factory, env):
    first = server_factory()
    text, err = first.tool("exec", command="true")
    assert not err, text
    # The sandbox's key (`<project tag>-default`): the old file's sandbox is that VM.
    ((key,),) = rows(env, "SELECT name FROM sandboxes")
    first.close()
    # The daemon holds the database open while it runs: replace it stopped.
    stop_daemon(env)
    state_dir = db_path(env).parent
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        (state_dir / name).unlink(missing_ok=True)
    # A file today's main wrote (tests/fixtures/state_v2.json), with its lease
    # moved into the future and a lost sandbox added.
    saved = json.loads((FIXTURES / "state_v2.json").read_text())
    lease = time.time() + 3600
    saved["sandboxes"]["default"]["expires_at"] = lease
    saved["lost"] = {"ghost": "its VM went away with the VM helper"}
    (state_dir / "state.json").write_text(json.dumps(saved).replace('"default"', f'"{key}"'))
    second = server_factory()
    text, err = second.tool("history", limit=10)
    assert "imported-history-one" in text and "imported-history-two" in text, text
    text, err = second.tool("status")
    assert "ghost" in text, text
    text, err = second.tool("extend_ttl", minutes=1)
    assert not err, text
    assert abs(rows(env, "SELECT expires_at FROM sandboxes WHERE name = ?", key)[0][0] - (lease + 60)) < 1.0
    assert not (state_dir / "state.json").exists() and (state_dir / "state.json.imported").exists()
    second.close()
    stop_daemon(env)
    third = server_factory()
    text, err = third.tool("history", limit=10)
    assert text.count("imported-history-one") == 1, text
    third.close()


def test_a_write_that_cannot_replace_its_target_leaves_no_temp_file(server):
    text, err = server.tool("exec", command="mkdir -p /workspace/dir/sub")
    assert not err, text
    text, err = server.tool("write_file", path="dir/sub", content="x")
    assert err and "Is a directory" in text, text
    text, err = server.tool("exec", command="ls -A /workspace/dir")
    assert not err and text.splitlines()[0] == "sub", text
