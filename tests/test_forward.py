"""expose, unexpose and network_info through a real MCP client: an HTTP
server inside the sandbox reached from the host, concurrency, errors, reset,
and the isolation of forwards from other sandboxes."""
import re
import socket
import threading
import time
import urllib.request

import pytest

from waiting import wait_for

SERVER_PORT = 8000
BIG = 4 * 1024 * 1024


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_http(server, sandbox="default"):
    """An http.server in /workspace of `sandbox` (bg), with an index and a big file."""
    server.tool("exec", sandbox=sandbox,
                command=f"echo hello-from-{sandbox} > index.html && head -c {BIG} /dev/urandom > big.bin")
    text, err = server.tool("bg", sandbox=sandbox, name="http",
                            command=f"exec python3 -m http.server {SERVER_PORT} --bind 127.0.0.1")
    assert not err, text
    probe = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {SERVER_PORT}), 1)\""
    assert wait_for(lambda: "[exit code" not in server.tool("exec", sandbox=sandbox, command=probe)[0]), \
        "server never listened"


def get(hp, path="/index.html"):
    with urllib.request.urlopen(f"http://127.0.0.1:{hp}{path}", timeout=30) as r:
        return r.read()


def test_expose_serves_http_to_concurrent_clients_and_unexpose_stops(server):
    start_http(server)
    hp = free_port()
    text, err = server.tool("expose", port=SERVER_PORT, host_port=hp)
    assert not err, text
    assert text == (f"Forwarding localhost:{hp} -> 'default':{SERVER_PORT}\n"
                    f"  URL:  http://localhost:{hp}\n  curl: curl http://localhost:{hp}"), text
    assert get(hp) == b"hello-from-default\n"
    want, _ = server.tool("exec", command="sha256sum big.bin | cut -c1-64")
    results = []

    def fetch():
        import hashlib
        results.append(hashlib.sha256(get(hp, "/big.bin")).hexdigest())

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [want.split("\n")[0]] * 2
    info, _ = server.tool("network_info")
    assert re.search(rf"^default\s+default  net:(egress|none)  shell:alive$", info, re.M), info
    assert f"  forward localhost:{hp} -> :{SERVER_PORT} (" in info
    assert "isolated from each other" in info
    text, err = server.tool("unexpose", port=hp)
    assert not err
    m = re.fullmatch(rf"Stopped forwarding localhost:{hp} -> 'default':{SERVER_PORT} \((\d+) connections served\)", text)
    assert m and int(m.group(1)) >= 3, text
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", hp), timeout=5)


def test_expose_warns_when_nothing_listens(server):
    hp = free_port()
    text, err = server.tool("expose", port=9, host_port=hp)
    assert not err
    assert text.endswith("\n  Warning: port 9 is not yet listening in the sandbox"), text
    # The connection is accepted on the host and closed, not hung, when the
    # sandbox refuses it.
    with socket.create_connection(("127.0.0.1", hp), timeout=5) as s:
        s.settimeout(10)
        assert s.recv(1) == b""
    server.tool("unexpose", port=hp)


def test_errors(server):
    for args, msg in [
        (dict(port=0), "Error: port must be between 1 and 65535 (got 0)"),
        (dict(port=70000), "Error: port must be between 1 and 65535 (got 70000)"),
        (dict(port=80, host_port=-1), "Error: host_port must be between 1 and 65535, or 0 for the same as port (got -1)"),
        (dict(port=80, host_port=65536), "Error: host_port must be between 1 and 65535, or 0 for the same as port (got 65536)"),
    ]:
        text, err = server.tool("expose", **args)
        assert err and text == msg, (args, text)
    hp = free_port()
    text, err = server.tool("expose", port=8000, host_port=hp)
    assert not err, text
    text, err = server.tool("expose", port=8001, host_port=hp, sandbox="other")
    assert err and text == f"Error: localhost:{hp} already forwarding to 'default':8000. Use unexpose({hp}) first."
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        text, err = server.tool("expose", port=8000, host_port=busy)
        assert err and text.startswith(f"Error: could not bind localhost:{busy}: ") and "in use" in text, text
    text, err = server.tool("unexpose", port=1)
    assert err and text == f"Error: no forward on localhost:1. Active: {hp}"
    server.tool("unexpose", port=hp)
    text, err = server.tool("unexpose", port=hp)
    assert err and text == f"Error: no forward on localhost:{hp}. Active: none"


def test_forward_survives_reset(server):
    start_http(server)
    hp = free_port()
    server.tool("expose", port=SERVER_PORT, host_port=hp)
    assert get(hp) == b"hello-from-default\n"
    text, err = server.tool("reset")
    assert not err, text
    start_http(server)
    assert get(hp) == b"hello-from-default\n"
    server.tool("unexpose", port=hp)


def test_other_sandboxes_cannot_reach_a_forward(server):
    start_http(server)
    hp = free_port()
    server.tool("expose", port=SERVER_PORT, host_port=hp)
    assert get(hp) == b"hello-from-default\n"
    script = (
        "import socket, struct\n"
        "gw = None\n"
        "for line in open('/proc/net/route').read().splitlines()[1:]:\n"
        "    f = line.split()\n"
        "    if f[1] == '00000000':\n"
        "        gw = socket.inet_ntoa(struct.pack('<L', int(f[2], 16)))\n"
        "for host in ['127.0.0.1'] + ([gw] if gw else []):\n"
        "    try:\n"
        f"        socket.create_connection((host, {hp}), 3).close()\n"
        "        print(host, 'REACHED')\n"
        "    except OSError as e:\n"
        "        print(host, 'blocked', type(e).__name__)\n"
    )
    text, err = server.tool("python", code=script, sandbox="intruder")
    assert not err, text
    assert "127.0.0.1 blocked" in text, text
    assert "REACHED" not in text, text
    info, _ = server.tool("network_info")
    assert re.search(r"^intruder\s+intruder  net:", info, re.M), info
    server.tool("unexpose", port=hp)
