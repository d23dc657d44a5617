"""bg, logs and kill through a real MCP client."""
import re

from conftest import WAIT_SCALE
from waiting import poll


def test_bg_logs_kill(server):
    text, err = server.tool("bg", command="echo ready; echo warn >&2; sleep 300 & sleep 301", name="srv")
    assert not err, text
    assert re.match(r"Started \[srv\] PID \d+\nUse logs\('srv'\) to read output, kill\('srv'\) to stop\.$", text), text
    # Both lines, not the header (which shows the command, `warn` included).
    text = poll(lambda: server.tool("logs", name="srv")[0], lambda t: t.endswith("\nready\nwarn"),
                timeout=10 * WAIT_SCALE)
    assert text, "output never appeared"
    head, rule, body = text.split("\n", 2)
    assert re.match(r"\[srv\] PID \d+ \(alive\) — echo ready; echo warn >&2; sleep 300 & sleep 301$", head), head
    assert rule == "─" * 40
    assert body == "ready\nwarn"
    text, err = server.tool("kill", name="srv")
    assert not err
    assert re.match(r"Killed \[srv\] PID \d+\nLast output:\nready\nwarn$", text), text
    out, _ = server.tool("exec", command="cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sleep$' || true")
    assert out.startswith("0\n"), "kill must stop the whole process group"
    text, err = server.tool("logs", name="srv")
    assert err and text == "Error: no background process 'srv' in sandbox 'default'. Running: none"


def test_generated_name_and_tail(server):
    text, _ = server.tool("bg", command="for i in $(seq 1 100); do echo line$i; done; sleep 300")
    name = re.match(r"Started \[(bg-[0-9a-f]{6})\]", text).group(1)
    text = poll(lambda: server.tool("logs", name=name, tail=3)[0], lambda t: "line100" in t)
    assert text.split("\n", 2)[2] == "line98\nline99\nline100"
    server.tool("kill", name=name)


def test_exited_process_shows_exit_code(server):
    server.tool("bg", command="echo bye; exit 3", name="short")
    text = poll(lambda: server.tool("logs", name="short")[0], lambda t: "dead" in t)
    assert text and "(dead, exit code 3)" in text, text


def test_logs_are_bounded(server):
    server.tool("bg", command="head -c 3000000 /dev/zero | tr '\\0' x; echo; echo end", name="chatty")
    text = poll(lambda: server.tool("logs", name="chatty", tail=0)[0], lambda t: "end" in t, timeout=10 * WAIT_SCALE)
    assert text and len(text) <= (1 << 20) + 200, len(text)


def test_errors(server):
    server.tool("bg", command="sleep 300", name="dup")
    text, err = server.tool("bg", command="sleep 1", name="dup")
    assert err and "still running" in text
    text, err = server.tool("bg", command="true", name="bad name")
    assert err and text.startswith("Error: invalid process name 'bad name'")
    text, err = server.tool("kill", name="nope")
    assert err and text == "Error: no background process 'nope' in sandbox 'default'. Running: dup"
    text, err = server.tool("logs", name="x", sandbox="missing")
    assert err and text == "Error: no active sandbox 'missing'"


def test_bg_survives_a_server_restart(server_factory):
    first = server_factory()
    first.tool("bg", command="i=0; while true; do echo tick$i; i=$((i+1)); sleep 0.1; done", name="ticker")
    first.close()
    second = server_factory()
    text = poll(lambda: second.tool("logs", name="ticker", tail=1)[0], lambda t: "(alive)" in t)
    assert text, "the background process did not survive the restart"
    n1 = int(re.search(r"tick(\d+)", text).group(1))
    text = poll(lambda: second.tool("logs", name="ticker", tail=1)[0], lambda t: int(re.search(r"tick(\d+)", t).group(1)) > n1)
    assert text, "it is not running any more"
    second.tool("kill", name="ticker")
