"""pull_image and build_image FROM a registry, through a real MCP client (stdio and HTTP), against a real
registry on loopback (Debian's docker-registry, filled by skopeo): layer progress, the pulled image booted with
its whiteout applied and its Env set, layers fetched once, errors an agent can act on, and a cancelled call
that stops the helper's download."""
from __future__ import annotations

import concurrent.futures
import os
import re
import socket
import subprocess
import threading
from pathlib import Path
from typing import Iterator

import pytest

from registry_support import Registry, auth_file, busybox_base, busybox_layout, missing_tools, push, write_layout
from waiting import poll

SIZE = r"\d+(\.\d)?[KMG]?B"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, object]]:
    """A plain registry on loopback holding test/busybox:v1 and test/busybox:v2 (same base, other top)."""
    missing = missing_tools()
    if missing:
        pytest.skip(missing)
    d = tmp_path_factory.mktemp("layouts")
    with Registry() as host:
        v1 = busybox_layout(d / "v1", "v1")
        v2 = busybox_layout(d / "v2", "v2", added="the second image's top\n")
        push(f"oci:{v1.dir}:v1", f"{host}/test/busybox:v1")
        push(f"oci:{v2.dir}:v2", f"{host}/test/busybox:v2")
        yield host, v1


def pull(srv, _timeout: float = 300, **args) -> tuple[str, bool, list[tuple[float, float | None, str]]]:
    """pull_image with a progress token: (text, is_error, progress reports)."""
    seen: list[tuple[float, float | None, str]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message or ""))

    result = srv._run(lambda s: s.call_tool("pull_image", args, progress_callback=on_progress), _timeout, "pull")
    text = "\n".join(c.text for c in result.content if getattr(c, "text", None))
    return text, bool(result.is_error), seen


def out(srv, command: str, sandbox: str = "default") -> str:
    text, err = srv.tool("exec", command=command, sandbox=sandbox)
    assert not err, text
    return text


def test_pull_image_reports_layers_and_boots_the_image(isrv, roots, registry):
    host, v1 = registry
    text, err, seen = pull(isrv, reference=f"{host}/test/busybox:v1")
    pattern = (rf"Pulled image 'busybox-v1' from {re.escape(host)}/test/busybox:v1@{v1.manifest} "
               rf"\(2 layers: 2 fetched, 0 already present; {SIZE}, \d+ms\)")
    assert not err and re.fullmatch(pattern, text), text
    messages = [m for _, _, m in seen]
    assert any(m.startswith("layer 1/2 sha256:") for m in messages), messages
    assert any(m.startswith("layer 2/2 sha256:") for m in messages), messages
    values = [v for v, _, _ in seen]
    assert values == sorted(values) and len(set(values)) == len(values), f"progress must increase: {seen}"

    (roots / ".sandbox-mcp.toml").write_text('image = "busybox-v1"\n')
    got = out(isrv, 'cat /etc/added; ls /etc/gone 2>&1; echo "$GREETING"; busybox | head -1', sandbox="onpulled")
    assert got.startswith("added by layer 2\n"), got
    assert "/etc/gone: No such file or directory\n" in got and "hello from oci\n" in got, got
    assert "BusyBox v" in got, got
    rows = isrv.tool("images")[0].split("\n")
    row = next(r for r in rows if r.startswith("busybox-v1 "))
    assert row.split()[-2:] == ["from", f"{host}/test/busybox:v1@{v1.manifest}"], row
    detail = rows[rows.index(row) + 1]
    assert detail == ('  workdir "/root"  entrypoint ["/bin/sh","-c"]  cmd ["echo $GREETING"]  ports ["8080/tcp"]  '
                      'labels {"org.opencontainers.image.title":"busybox test image","test.tag":"v1"}'), detail

    # The second image shares the base: only its top layer is fetched.
    text, err, _ = pull(isrv, reference=f"{host}/test/busybox:v2", name="second")
    assert not err and "(2 layers: 1 fetched, 1 already present;" in text, text
    # Pulled again under another name: nothing is fetched.
    text, err, _ = pull(isrv, reference=f"{host}/test/busybox:v1@{v1.manifest}", name="pinned")
    assert not err and "(2 layers: 0 fetched, 2 already present;" in text, text
    assert out(isrv, "cat /etc/added", sandbox="onpulled").startswith("added by layer 2\n")


def test_a_hostile_config_is_shown_escaped_and_claims_nothing_of_ours(isrv, roots, registry, tmp_path):
    host, _ = registry
    config = {
        "Env": ["PATH=/bin", "OK=1", "NUL\u0000KEY=x", "NOEQUALS"],
        "User": "nobody",
        "Cmd": ["echo hi\n\x1b[2J\u202egnp.exe"],
        "Labels": {"sandbox-mcp.kind": "snapshot", "sandbox-mcp.source": "default", "note": "line\nbreak"},
    }
    layout = write_layout(tmp_path / "hostile", "h", [busybox_base()], config)
    push(f"oci:{layout.dir}:h", f"{host}/test/hostile:h")
    text, err, _ = pull(isrv, reference=f"{host}/test/hostile:h")
    assert not err, text
    rows = isrv.tool("images")[0].split("\n")
    row = next(r for r in rows if r.startswith("hostile-h "))
    assert " from " in row and "snapshot" not in row, row  # its labels do not make it a snapshot
    detail = rows[rows.index(row) + 1]
    assert detail == ('  cmd ["echo hi\\n\\u001b[2J\\u202egnp.exe"]  labels {"note":"line\\nbreak"}'), detail
    assert not any(r.startswith("hostile-h") for r in isrv.tool("list_snapshots")[0].split("\n"))
    # Its User is not in its /etc/passwd: processes run as root rather than failing; the unusable env is left out.
    (roots / ".sandbox-mcp.toml").write_text('image = "hostile-h"\n')
    got = out(isrv, "id -u; echo \"$OK\"; env | grep -c NOEQUALS", sandbox="onhostile")
    assert got.startswith("0\n1\n0\n"), got


def test_pull_image_errors_say_what_to_do(isrv, registry, env):
    host, _ = registry
    assert not pull(isrv, reference=f"{host}/test/busybox:v1", name="taken")[1]
    text, err, _ = pull(isrv, reference=f"{host}/test/busybox:v2", name="taken")
    assert err and text.startswith("Error pulling image: ") and "already exists" in text, text
    text, err, _ = pull(isrv, reference=f"{host}/test/busybox:v2", name="taken", force=True)
    assert not err and text.startswith("Pulled image 'taken' "), text

    text, err, _ = pull(isrv, reference=f"{host}/test/busybox:nope")
    assert err and text.startswith(f"Error pulling image: registry {host}: ") and "not found" in text, text
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    text, err, _ = pull(isrv, reference=f"127.0.0.1:{closed}/x/y:1")
    assert err and text.startswith(f"Error pulling image: registry 127.0.0.1:{closed}: "), text
    text, err, _ = pull(isrv, reference="Bad:Ref")
    assert err and text.startswith("Error pulling image: invalid image reference \"Bad:Ref\": "), text
    text, err, _ = pull(isrv, reference=f"{host}/test/busybox:v1", name="mcp-snap-x")
    assert (text, err) == ("Error pulling image: image names starting with 'mcp-snap-' are reserved for snapshots",
                           True)
    # The server is unharmed by all of that.
    assert out(isrv, "echo alive").startswith("alive\n")


def test_pull_image_from_a_registry_that_wants_a_login(server_factory, image_store, roots, tmp_path):
    missing = missing_tools()
    if missing:
        pytest.skip(missing)
    layouts = tmp_path / "layouts"
    with Registry(auth=True) as host:
        v1 = busybox_layout(layouts / "v1", "v1")
        creds = auth_file(tmp_path / "auth.json", host)
        push(f"oci:{v1.dir}:v1", f"{host}/private/busybox:v1", "--dest-authfile", str(creds))
        anonymous = server_factory(SANDBOX_MCP_IMAGE_STORE=image_store, SANDBOX_MCP_HOST_ROOTS=str(roots),
                                   REGISTRY_AUTH_FILE=str(tmp_path / "none.json"))
        text, err, _ = pull(anonymous, reference=f"{host}/private/busybox:v1")
        assert err and text.startswith(f"Error pulling image: registry {host} refused access to private/busybox"), text
        assert f"docker login {host}" in text, text
        anonymous.close()


def test_build_image_from_a_registry_reference(isrv, roots, registry):
    host, v1 = registry
    containerfile = f"FROM {host}/test/busybox:v1\nRUN echo built > /built\nENV STAGE=two\n"
    text, err = isrv.tool("build_image", _timeout=600, name="onbusybox", containerfile=containerfile)
    assert not err and text.startswith("Built image 'onbusybox' (3 steps, "), text
    rows = isrv.tool("images")[0].split("\n")
    assert any(r.startswith("busybox-v1 ") for r in rows), rows
    # Built again: the pulled base is taken as it is, not pulled twice.
    text, err = isrv.tool("build_image", _timeout=600, name="again", containerfile=containerfile)
    assert not err, text
    assert sum(r.startswith("busybox-v1 ") for r in isrv.tool("images")[0].split("\n")) == 1
    (roots / ".sandbox-mcp.toml").write_text('image = "onbusybox"\n')
    got = out(isrv, 'cat /built /etc/added; echo "$GREETING/$STAGE"', sandbox="built")
    assert got.startswith("built\nadded by layer 2\nhello from oci/two\n"), got


class StallingRegistry:
    """A loopback server that accepts connections, reads what arrives and never answers: a pull from it waits
    until cancelled. Counts the connections the client closed."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.host = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.opened = 0
        self.closed = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.opened += 1
            threading.Thread(target=self._drain, args=(conn,), daemon=True).start()

    def _drain(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    if not conn.recv(65536):
                        break
                except OSError:
                    break
        with self.lock:
            self.closed += 1

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.opened, self.closed

    def close(self) -> None:
        self.sock.close()


def test_cancelling_pull_image_stops_the_download(isrv):
    stall = StallingRegistry()
    try:
        def cancelled_pull() -> None:
            try:
                isrv._run(lambda s: s.call_tool("pull_image", {"reference": f"{stall.host}/slow/image:1"},
                                                read_timeout_seconds=3), 60, "cancelled pull")
            except AssertionError:
                pass  # the client gave up: it sends notifications/cancelled

        caller = threading.Thread(target=cancelled_pull)
        caller.start()
        assert poll(stall.counts, lambda c: c[0] >= 1, timeout=20), "the pull never reached the registry"
        caller.join()
        # Cancelled, the helper drops its requests: the registry sees every connection closed.
        done = poll(stall.counts, lambda c: c[1] == c[0], timeout=20)
        assert done, f"the helper kept its connections to the registry open after the cancel: {stall.counts()}"
        assert not any(r.startswith("image-1 ") for r in isrv.tool("images")[0].split("\n"))
        assert out(isrv, "echo alive").startswith("alive\n")
    finally:
        stall.close()


def test_pulls_and_boots_of_one_image_raced_by_three_clients(env, front_end, http_server, image_store, roots,
                                                             registry):
    """Six `image pull`s of one name race: exactly one installs it, the rest are told the name exists and leave
    nothing behind. Then two stdio front-ends and an HTTP session boot it at once, on shared and on separate
    sandboxes, and all see the pulled image."""
    host, v1 = registry
    mcp = os.environ["SANDBOX_MCP_BIN"]
    pulls = [subprocess.Popen([mcp, "image", "pull", f"{host}/test/busybox:v1", "--name", "raced",
                               "--store", image_store], env={**env, "SANDBOX_MCP_IMAGE_STORE": image_store},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    results = [(p.wait(timeout=300), *p.communicate()) for p in pulls]
    assert sum(code == 0 for code, _, _ in results) == 1, results
    assert all("already exists" in err for code, _, err in results if code != 0), results
    left = sorted(n for n in os.listdir(image_store) if n.startswith("."))
    assert left in ([], [".lock"]), left

    (roots / ".sandbox-mcp.toml").write_text('image = "raced"\n')
    extra = {"SANDBOX_MCP_IMAGE_STORE": image_store, "SANDBOX_MCP_HOST_ROOTS": str(roots)}
    clients = [front_end(**extra), front_end(**extra), http_server(**extra).client()]

    def boot(n_client):
        n, client = n_client
        return [client.tool("exec", command="cat /etc/added; echo $GREETING", sandbox=sandbox)
                for sandbox in ("shared", f"own{n}", "shared")]

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = [a for per_client in pool.map(boot, enumerate(clients)) for a in per_client]
    for text, err in answers:
        assert not err and text.startswith("added by layer 2\nhello from oci\n"), text
    for client in clients:
        row = next(r for r in client.tool("images")[0].split("\n") if r.startswith("raced "))
        assert row.split()[-2:] == ["from", f"{host}/test/busybox:v1@{v1.manifest}"], row
