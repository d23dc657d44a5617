"""write_file, read_file, batch_write and env through a real MCP client."""
import json
import os
import uuid


def test_write_then_read(server):
    text, err = server.tool("write_file", path="notes/a b.txt", content="héllo\nworld\n")
    assert not err
    assert text == "Wrote 13 bytes to notes/a b.txt"
    text, err = server.tool("read_file", path="/workspace/notes/a b.txt")
    assert not err
    assert text == "héllo\nworld\n"


def test_read_missing_file(server):
    assert not server.tool("exec", command="true")[1]
    text, err = server.tool("read_file", path="/nope/missing.txt")
    assert err
    assert text.startswith("Error: cat: /nope/missing.txt: No such file or directory"), text


def test_write_file_errors(server):
    text, err = server.tool("write_file", path="", content="x")
    assert err and text == "Error: path must not be empty"
    server.tool("exec", command="mkdir -p /workspace/adir/sub")
    text, err = server.tool("write_file", path="adir", content="x")
    assert err and text == "Error: cannot write /workspace/adir: Is a directory (os error 21)", text


def test_batch_write(server):
    files = {"src/main.py": "print('hi')\n", "/etc/app.conf": "k=v\n", "z.txt": ""}
    text, err = server.tool("batch_write", files=json.dumps(files))
    assert not err
    assert text.startswith("Wrote 3 files (")
    assert text.endswith("): src/main.py, /etc/app.conf, z.txt")
    out, _ = server.tool("exec", command="cat src/main.py /etc/app.conf; wc -c < z.txt")
    assert out.startswith("print('hi')\nk=v\n0\n")


def test_batch_write_never_touches_the_host(server):
    marker = f"smcp-escape-{uuid.uuid4().hex}"
    files = {f"/../../../../tmp/{marker}": "x", f"../../tmp/{marker}-2": "y"}
    server.tool("batch_write", files=json.dumps(files))
    assert not os.path.exists(f"/tmp/{marker}")
    assert not os.path.exists(f"/tmp/{marker}-2")


def test_batch_write_bad_input(server):
    text, err = server.tool("batch_write", files="{not json")
    assert err and text.startswith("Error: invalid JSON:"), text
    text, err = server.tool("batch_write", files="[1, 2]")
    assert err and text == "Error: files must be a JSON object mapping paths to contents"
    text, err = server.tool("batch_write", files='{"a.txt": 5}')
    assert err and "'a.txt' is not a string" in text


def test_env_set_list_unset(server):
    text, err = server.tool("env", action="set", key="GREETING", value="it's a \"test\"")
    assert not err and text == "Set GREETING in 'default' (persists across commands)"
    out, _ = server.tool("exec", command='echo "$GREETING"')
    assert out.startswith("it's a \"test\"\n")
    out, _ = server.tool("python", code="import os; print(os.environ['GREETING'])")
    assert out.startswith("it's a \"test\"\n")
    text, _ = server.tool("env")
    assert text == "Persistent env vars in 'default':\nexport GREETING='it'\\''s a \"test\"'"
    out, _ = server.tool("exec", command="bash -lc 'echo \"$GREETING\"'")
    assert out.startswith("it's a \"test\"\n"), "login shells see the env too"
    text, _ = server.tool("env", action="unset", key="GREETING")
    assert text == "Unset GREETING in 'default'"
    out, _ = server.tool("exec", command='echo "${GREETING-really unset}"')
    assert out.startswith("really unset\n")
    text, _ = server.tool("env", action="list")
    assert text.startswith("No persistent env vars set.")


def test_env_multiline_value(server):
    server.tool("env", action="set", key="MULTI", value="a\nb")
    server.tool("env", action="set", key="OTHER", value="c")
    out, _ = server.tool("exec", command='printf "%s|%s" "$MULTI" "$OTHER"')
    assert out.startswith("a\nb|c\n(")


def test_env_errors(server):
    text, err = server.tool("env", action="set", key="1BAD", value="x")
    assert err and text == "Error: invalid env key '1BAD' (must be [A-Za-z_][A-Za-z0-9_]*)"
    text, err = server.tool("env", action="set", key="", value="x")
    assert err and text == "Error: key is required for set"
    text, err = server.tool("env", action="unset")
    assert err and text == "Error: key is required for unset"


def test_env_and_sandboxes_survive_a_server_restart(server_factory):
    first = server_factory()
    first.tool("env", action="set", key="KEEP", value="me")
    first.tool("exec", command="echo rootfs-state > /tmp/state")
    first.close()
    second = server_factory()
    status, _ = second.tool("status")
    assert "default" in status
    out, _ = second.tool("exec", command='cat /tmp/state; echo "$KEEP"')
    assert out.startswith("rootfs-state\nme\n"), out
