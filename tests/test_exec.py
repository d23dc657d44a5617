"""exec and python through a real MCP client: output shapes, the shell edge
cases a marker-framed persistent shell gets wrong, timeouts and caps."""
import base64
import re
import threading

from conftest import ON_VM

DURATION = re.compile(r"\(\d+\.\dms\)$")


def test_lists_the_core_tools(server):
    names = {t.name for t in server.list_tools()}
    assert {"exec", "python", "write_file", "read_file", "batch_write", "env", "install",
            "status", "list_all", "destroy", "reset", "history"} <= names


def test_echo_hi(server):
    text, err = server.tool("exec", command="echo hi")
    assert not err
    assert text.startswith("hi\n(")
    assert DURATION.search(text), text


def test_exit_code_and_stderr(server):
    text, err = server.tool("exec", command="echo out; echo oops >&2; exit 3")
    assert not err, "a non-zero exit is a result, not a tool error"
    lines = text.split("\n")
    assert lines[0] == "out"
    assert lines[1] == "[stderr] oops"
    assert lines[2] == "[exit code 3]"


def test_trailing_comment_does_not_hang(server):
    text, _ = server.tool("exec", command="echo a # a comment", timeout=10)
    assert text.startswith("a\n(")


def test_heredoc(server):
    text, _ = server.tool("exec", command="cat <<'EOF'\nline one\n$HOME stays literal\nEOF")
    assert text.startswith("line one\n$HOME stays literal\n(")


def test_exit_builtin_then_next_call_works(server):
    text, _ = server.tool("exec", command="exit 7")
    assert "[exit code 7]" in text
    text, _ = server.tool("exec", command="echo still here")
    assert text.startswith("still here")


def test_command_reading_stdin_gets_eof(server):
    text, _ = server.tool("exec", command="cat; read x; echo read-status=$?", timeout=10)
    assert text.startswith("read-status=1"), text


def test_stdin_parameter(server):
    text, _ = server.tool("exec", command="read first; echo got:$first; wc -l", stdin="hello\nb\nc\n")
    assert text.startswith("got:hello\n2\n("), text


def test_state_does_not_leak_between_calls(server):
    server.tool("exec", command="cd /tmp; export LEAK=1; set -e")
    text, _ = server.tool("exec", command="pwd; echo ${LEAK:-none}; false; echo after-false")
    assert text.startswith("/workspace\nnone\nafter-false"), text


def test_workdir_is_created(server):
    text, _ = server.tool("exec", command="pwd", workdir="/tmp/new dir/sub")
    assert text.startswith("/tmp/new dir/sub\n")


def test_one_megabyte_single_line(server):
    text, _ = server.tool("exec", command="head -c 1000000 /dev/zero | tr '\\0' a")
    first, rest = text.split("\n", 1)
    assert first == "a" * 50_000
    assert rest.startswith("[truncated — 976.6KB total, showing first 48.8KB]"), rest[:100]
    text, _ = server.tool("exec", command="head -c 1000000 /dev/zero | tr '\\0' a | wc -c")
    assert text.startswith("1000000\n")


def test_binary_output_is_not_lost(server):
    r = server.call_raw("exec", command="printf 'ok\\000\\377\\n'")
    # NUL is a control character: shown as an escape; the invalid byte as U+FFFD, exact in base64 beside.
    assert r.content[0].text.startswith("ok\\x00\ufffd\n("), repr(r.content[0].text)
    assert base64.b64decode(r.structured_content["stdout_base64"]) == b"ok\0\xff\n", r.structured_content
    text, _ = server.tool(
        "exec", command="python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256)))' | base64 -w0")
    assert text.split("\n")[0] == base64.b64encode(bytes(range(256))).decode()


def test_timeout_keeps_output_and_kills_the_group(server):
    text, err = server.tool("exec", command="echo started; sleep 300 & sleep 301; echo never", timeout=1)
    assert not err
    assert text.startswith("started\n[stderr] Timed out after 1.0s"), text
    assert "[exit code -1]" in text
    assert "never" not in text
    text, _ = server.tool("exec", command="cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sleep$' || true")
    assert text.startswith("0\n"), f"sleep processes survived the timeout: {text}"


def test_background_child_holding_stdout_does_not_hang(server):
    text, _ = server.tool("exec", command="sleep 60 & echo parent done", timeout=20)
    assert text.startswith("parent done")


def test_bad_timeouts_are_rejected(server):
    for bad in (0, -1, 100000):
        text, err = server.tool("exec", command="true", timeout=bad)
        assert err and text.startswith("Error: timeout must be"), text


def test_invalid_sandbox_name(server):
    text, err = server.tool("exec", command="true", sandbox="bad name'")
    assert err
    assert text.startswith("Error: invalid sandbox name 'bad name''")


def test_root_inside(server):
    text, _ = server.tool("exec", command="id -u; hostname")
    assert text.startswith("0\ndefault\n")


def test_named_sandboxes_are_separate(server):
    server.tool("exec", command="echo one > /tmp/which", sandbox="one")
    server.tool("exec", command="echo two > /tmp/which", sandbox="two")
    assert server.tool("exec", command="cat /tmp/which", sandbox="one")[0].startswith("one\n")
    assert server.tool("exec", command="cat /tmp/which", sandbox="two")[0].startswith("two\n")


def test_concurrent_calls(server):
    results = {}

    def run(i):
        results[i] = server.tool("exec", command=f"sleep 0.3; echo {i}")[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[i].startswith(f"{i}\n") for i in range(6)), results


def test_python(server):
    text, err = server.tool("python", code="import sys\nprint(1 + 1)\nprint(sys.version_info[0])")
    assert not err
    assert text.startswith("2\n3\n(")


def test_python_error(server):
    text, _ = server.tool("python", code="raise SystemExit('boom')")
    assert "[stderr] boom" in text
    assert "[exit code 1]" in text


def test_python_timeout(server):
    # python3 alone takes over a second to start in a vm under TCG.
    limit = 5 if ON_VM else 1
    text, _ = server.tool("python", code="import time\nprint('x', flush=True)\ntime.sleep(60)", timeout=limit)
    assert text.startswith(f"x\n[stderr] Timed out after {limit}.0s"), text


def test_missing_program_reads_like_a_shell(server):
    text, err = server.tool("exec", command="no-such-program --flag")
    assert not err
    assert "no-such-program: command not found" in text and "[exit code 127]" in text, text


def test_plain_and_shell_commands_agree(server):
    plain, _ = server.tool("exec", command="printf %s-%s a b")
    shelled, _ = server.tool("exec", command="printf '%s-%s' a b")
    assert plain.split("\n")[0] == shelled.split("\n")[0] == "a-b"


def test_the_servers_environment_does_not_reach_the_sandbox(server_factory):
    srv = server_factory(MY_API_TOKEN="s3cr3t-host-token")
    text, err = srv.tool("exec", command="cat /proc/1/environ /proc/self/environ | tr '\\0' '\\n'; env")
    assert not err, text
    assert "s3cr3t-host-token" not in text and "MY_API_TOKEN" not in text, text
    assert "XDG_STATE_HOME" not in text, text
