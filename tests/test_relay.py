"""The stdio relay (rust/daemon/relay.rs) under load and at a daemon's
death: a ~1 MB answer racing client messages arrives whole, and a daemon
killed mid-answer leaves the stream parseable (the call in flight gets the
retry error, never a hang)."""
from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from conftest import ON_VM
from mcp_client import McpError
from test_comeback import ok
from test_daemon import daemon_pid
from test_persistence import exited, until

# The relay is the same over any driver; under TCG the 1 MB writer alone
# outlasts the waits.
pytestmark = pytest.mark.skipif(ON_VM, reason="driver-independent: make test runs it on the namespace driver")

# ~1,000,000 bytes of output, 1000 numbered lines (logs keeps the last 1 MiB).
BIG = ("i=0; while [ $i -lt 1000 ]; do printf '%06d' $i; head -c 994 /dev/zero | tr '\\0' x; echo; "
       "i=$((i+1)); done; sleep 100000")


def test_a_large_answer_is_not_torn_by_a_request_sent_while_it_streams(front_end):
    """relay_one (relay.rs:185-214) declares `line` inside the loop and reads the
    daemon with read_until inside select!. read_until appends to `line` as it
    goes; when the client's branch wins while a long answer is half read, the
    half is dropped with `line`, and the rest reaches the client as a line of
    its own: two broken JSON lines, the first request never answered."""
    client = front_end()
    ok(client, "bg", command=BIG, name="big")
    until(lambda: "000999" in client.tool("logs", name="big", tail=1)[0], "the output written")
    stop = threading.Event()
    errors: list[BaseException] = []

    def chatter() -> None:
        while not stop.is_set():
            try:
                client.list_tools(timeout=30)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
                return

    t = threading.Thread(target=chatter, daemon=True)
    t.start()
    try:
        for _ in range(15):
            text, err = client.tool("logs", _timeout=30, name="big", tail=0)
            assert not err and "000000" in text and "000999" in text, text[:300]
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors


def test_a_daemon_killed_mid_answer_leaves_the_stream_parseable(front_end, env):
    """At EOF read_until returns the partial line (n > 0): relay.rs:204-206 writes
    it to stdout without a newline, and answer_in_flight (relay.rs:220-249) then
    appends its error object to the same line. The client can parse neither: the
    call in flight hangs instead of getting 'retry'. Stress: fails when the kill
    lands while a ~1 MB answer is being relayed."""
    for attempt in range(4):
        client = front_end()  # a front-end each: the relay's budget is 3 deaths a minute
        ok(client, "bg", command=BIG, name=f"big{attempt}")
        until(lambda: "000999" in client.tool("logs", name=f"big{attempt}", tail=1)[0], "the output written")
        failures: list[str] = []
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                try:
                    client.tool("logs", _timeout=30, name=f"big{attempt}", tail=0)
                except McpError as e:
                    failures.append(str(e))

        t = threading.Thread(target=hammer, daemon=True)
        t.start()
        time.sleep(1 + random.random())
        pid = daemon_pid(env)
        os.kill(pid, signal.SIGKILL)
        until(lambda: exited(pid), "the daemon gone")
        time.sleep(3)
        stop.set()
        t.join(90)
        hung = [f for f in failures if "no answer within" in f]
        assert not hung, f"attempt {attempt}: a call in flight at the kill was never answered: {hung[0][:500]}"
        assert ok(client, "exec", command="echo alive").startswith("alive")
        client.close()
