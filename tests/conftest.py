"""Fixtures for the end-to-end tests: isolated environments and running servers.

Every test gets its own XDG directories in a fresh temp dir, so servers,
helpers and their state never meet across tests. The image store is shared
(building an image takes tens of seconds), read-only from the tests' side.
`make test` provides the environment these fixtures read; running pytest
without it fails loudly rather than skipping.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mcp_client import START_TIMEOUT, McpClient, McpError  # noqa: E402
from mcp.client.stdio import get_default_environment  # noqa: E402
from waiting import poll  # noqa: E402

# How long a helper gets between SIGTERM and SIGKILL at teardown.
HELPER_STOP_TIMEOUT = 5.0
# How long the orchestrator daemon gets between SIGTERM and SIGKILL at teardown.
DAEMON_STOP_TIMEOUT = 10.0
# How long an HTTP server gets between SIGTERM and SIGKILL.
HTTP_STOP_TIMEOUT = 10.0
# The driver the servers' sandboxes default to (`namespaces` when unset): `make test-vm` runs the MCP
# tool and security files again with `vm`.
TEST_ISOLATION = os.environ.get("SANDBOX_MCP_TEST_ISOLATION", "")
ON_VM = TEST_ISOLATION == "vm"
# Deadlines for work inside a sandbox scale by this: a vm under TCG runs guest code several times slower.
WAIT_SCALE = 6 if ON_VM else 1
# The line `serve --http` prints once it listens (port 0 gets a free port).
SERVING_LINE = re.compile(r"serving MCP at (http://(\S+)/mcp)")


def required_env(name: str) -> str:
    """The value of an environment variable `make test` sets, or a test failure."""
    value = os.environ.get(name, "")
    if not value:
        pytest.fail(f"{name} is not set: run `make test` (it builds the binaries and the test image)", pytrace=False)
    return value


def shared_image_store() -> str:
    """The shared test image store, checked to hold the test image."""
    store = required_env("SANDBOX_MCP_TEST_IMAGE_STORE")
    image = required_env("SANDBOX_MCP_TEST_IMAGE")
    if not (Path(store) / image / "image.json").is_file():
        pytest.fail(f"test image {image!r} missing from {store}: run `make test`", pytrace=False)
    return store


def new_env_dir() -> str:
    """A fresh, short temp dir: the runtime dir holds Unix sockets, whose
    paths are limited to 107 bytes."""
    return tempfile.mkdtemp(prefix="smcp-", dir="/tmp")


def remove_env_dir(base: str) -> None:
    """Removes a test's state dir. What an ordinary user's sandboxes leave there is not all removable by the
    user as itself (files of its subordinate ids, overlayfs's mode-0 work dirs): the rest goes as root of a
    user namespace with the same map as the sandboxes'. With SANDBOX_MCP_TEST_KEEP_LOGS=DIR, its daemon and
    helper logs are copied to DIR/<its name>/ first (to read after a failure)."""
    keep = os.environ.get("SANDBOX_MCP_TEST_KEEP_LOGS")
    if keep:
        for log in Path(base).rglob("*.log"):
            dest = Path(keep) / Path(base).name / log.relative_to(base)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copyfile(log, dest)
    shutil.rmtree(base, ignore_errors=True)
    if os.path.lexists(base) and os.geteuid() != 0:
        subprocess.run(["unshare", "--map-root-user", "--map-auto", "rm", "-rf", "--one-file-system", base],
                       check=False)


def vm_dir() -> Path:
    """Where the vm assets are: SANDBOX_MCP_VM_DIR, else the user's data dir (as the helper looks). A
    test's servers get it named, since their XDG_DATA_HOME is the test's own."""
    configured = os.environ.get("SANDBOX_MCP_VM_DIR")
    if configured:
        return Path(configured)
    data = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return Path(data) / "sandbox-mcp" / "vm"


def isolated_env(base: str) -> dict[str, str]:
    """Environment for a server (and the helper it starts) confined to `base`."""
    env = {
        "XDG_DATA_HOME": f"{base}/data",
        "XDG_STATE_HOME": f"{base}/state",
        "XDG_RUNTIME_DIR": f"{base}/run",
        "XDG_CONFIG_HOME": f"{base}/config",
        "SANDBOX_MCP_IMAGE_STORE": shared_image_store(),
        "SANDBOX_MCP_DEFAULT_IMAGE": required_env("SANDBOX_MCP_TEST_IMAGE"),
        "RUST_LOG": os.environ.get("RUST_LOG", "info"),
    }
    helper = os.environ.get("SANDBOX_VM_HELPER_BIN")
    if helper:
        env["SANDBOX_VM_HELPER_BIN"] = helper
    # The driver matrix (issue 12): the same test files run on vm sandboxes
    # when SANDBOX_MCP_TEST_ISOLATION=vm (`make test-vm`); the servers they
    # start default to it, and their helpers find the vm assets.
    if TEST_ISOLATION:
        env["SANDBOX_MCP_ISOLATION"] = TEST_ISOLATION
        env["SANDBOX_MCP_VM_DIR"] = str(vm_dir())
    for key in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME"):
        os.makedirs(env[key], mode=0o700, exist_ok=True)
    return env


def pids_of(program: str, arg: str | None = None, environ: str | None = None) -> list[int]:
    """Pids of the processes running `program` (the end of argv[0]), with `arg` inside one of their
    arguments and `environ` (`NAME=value`) in their environment, when given."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            env = (d / "environ").read_bytes().split(b"\0") if environ is not None else []
        except OSError:
            continue
        if not argv or not argv[0].endswith(program.encode()):
            continue
        if arg is not None and not any(arg.encode() in a for a in argv):
            continue
        if environ is not None and environ.encode() not in env:
            continue
        pids.append(int(d.name))
    return pids


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone; reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return Path(f"/proc/{pid}").exists() and _state(pid) != "Z"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def saved_state(env: dict[str, str]) -> str:
    """Everything the state database holds, as text (every row of every
    table), read as a separate process would: what a secret must never be in.
    Empty while there is no database yet."""
    path = Path(env["XDG_STATE_HOME"]) / "sandbox-mcp" / "state.db"
    if not path.exists():
        return ""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return "\n".join(repr(row) for t in tables for row in db.execute(f'SELECT * FROM "{t}"'))
    except sqlite3.Error:
        return ""
    finally:
        db.close()


def stop_servers(env: dict[str, str], timeout: float = HELPER_STOP_TIMEOUT) -> None:
    """Stops what front-ends started in `env`: the daemon first (its watchdog
    would start the helper again), then the helper (pid from its pid file):
    SIGTERM, then SIGKILL if still there after the timeout."""
    stop_daemon(env)
    _stop_by_pid_file(Path(env["XDG_RUNTIME_DIR"]) / "sandbox-mcp" / "helper.pid", timeout)


def stop_daemon(env: dict[str, str], timeout: float = DAEMON_STOP_TIMEOUT) -> None:
    """Stops the orchestrator daemon the front-ends started in `env` (it saves
    its state on the way out): SIGTERM, then SIGKILL after `timeout`. The next
    front-end in `env` starts a new daemon, as a restart did before daemons."""
    _stop_by_pid_file(Path(env["XDG_RUNTIME_DIR"]) / "sandbox-mcp" / "daemon.pid", timeout)


def _stop_by_pid_file(pid_file: Path, timeout: float) -> None:
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    """An isolated environment (fresh XDG dirs, the test image store); the
    helper started in it is stopped and the dirs removed afterwards."""
    base = new_env_dir()
    e = isolated_env(base)
    e["SANDBOX_MCP_TEST_TMP"] = base
    try:
        yield e
    finally:
        stop_servers(e)
        remove_env_dir(base)


class HttpServer:
    """A `sandbox-mcp serve --http ADDR` process; `url` is its MCP endpoint
    (the real port when ADDR asks for port 0) and `base` the URL without it.
    `token` is the bearer token it requires (None with --no-auth): the one
    given by --token or SANDBOX_MCP_TOKEN, else the one it stored."""

    def __init__(self, env: dict[str, str], log_path: str, addr: str = "127.0.0.1:0", args: tuple[str, ...] = (),
                 binary: str | None = None, cwd: str | None = None):
        self.log_path = log_path
        self._log = open(log_path, "a", buffering=1)
        self.proc = subprocess.Popen(
            [binary or required_env("SANDBOX_MCP_BIN"), "serve", "--http", addr, *args],
            env={**get_default_environment(), **env},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            match = SERVING_LINE.search(Path(log_path).read_text(errors="replace"))
            if match:
                # Tests reach a wildcard-bound server through loopback only.
                authority = match.group(2).replace("0.0.0.0:", "127.0.0.1:")
                self.base = f"http://{authority}"
                self.url = f"{self.base}/mcp"
                self.token = self._token(env, args)
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise McpError(f"HTTP server did not start:\n{Path(log_path).read_text(errors='replace')[-3000:]}")
            time.sleep(0.02)

    @staticmethod
    def _token(env: dict[str, str], args: tuple[str, ...]) -> str | None:
        if "--no-auth" in args:
            return None
        if "--token" in args:
            return args[args.index("--token") + 1]
        if env.get("SANDBOX_MCP_TOKEN"):
            return env["SANDBOX_MCP_TOKEN"]
        return (Path(env["XDG_CONFIG_HOME"]) / "sandbox-mcp" / "http-token").read_text().strip()

    @property
    def auth(self) -> dict[str, str]:
        """The Authorization header this server wants (empty with --no-auth)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    def client(self, headers: dict[str, str] | None = None) -> McpClient:
        """A new MCP session with this server, sending its token unless
        `headers` are given (`{}`: none at all)."""
        return McpClient(url=self.url, headers=self.auth if headers is None else headers, stderr_path=self.log_path)

    def stop(self, timeout: float = HTTP_STOP_TIMEOUT) -> None:
        """SIGTERM, then SIGKILL after `timeout`. Safe to call twice."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class HttpServerClient(McpClient):
    """A session over HTTP that owns its server: closing it stops the server,
    as closing a stdio client does, so restart tests read the same on both."""

    def __init__(self, server: HttpServer):
        self.server = server
        try:
            super().__init__(url=server.url, headers=server.auth, stderr_path=server.log_path)
        except BaseException:
            server.stop()
            raise

    def close(self, timeout: float = 15.0) -> None:
        super().close(timeout)
        self.server.stop()


@pytest.fixture
def http_server(env: dict[str, str]) -> Iterator[Callable[..., HttpServer]]:
    """Starts `sandbox-mcp serve --http` in `env` (default 127.0.0.1:0, extra
    CLI `args`, extra environment as keyword arguments); every server is
    stopped at teardown, before the `env` fixture stops the helper."""
    servers: list[HttpServer] = []

    def start(addr: str = "127.0.0.1:0", args: tuple[str, ...] = (), **extra_env: str) -> HttpServer:
        log = f"{env['SANDBOX_MCP_TEST_TMP']}/http-{len(servers)}.log"
        servers.append(HttpServer({**env, **extra_env}, log, addr, args))
        return servers[-1]

    try:
        yield start
    finally:
        for s in servers:
            s.stop()


@contextlib.contextmanager
def _sessions(env: dict[str, str], transport: str, log_name: str) -> Iterator[Callable[..., McpClient]]:
    """A function that starts a front-end (`$SANDBOX_MCP_BIN`, or `binary`)
    in `env`, started in `cwd` and with extra environment, over `transport`
    ("stdio" or "http" on a loopback port), its log `<log_name>-<n>.log` in the
    test's temp dir; every one is closed on the way out."""
    clients: list[McpClient] = []

    def start(binary: str | None = None, cwd: str | None = None, **extra_env: str) -> McpClient:
        log = f"{env['SANDBOX_MCP_TEST_TMP']}/{log_name}-{len(clients)}.log"
        if transport == "http":
            client: McpClient = HttpServerClient(HttpServer({**env, **extra_env}, log, binary=binary, cwd=cwd))
        else:
            client = McpClient(binary or required_env("SANDBOX_MCP_BIN"), env={**env, **extra_env},
                               stderr_path=log, cwd=cwd)
        clients.append(client)
        return client

    try:
        yield start
    finally:
        for c in clients:
            c.close()


# The transports are the same code over any driver: the vm matrix (TCG-slow) runs stdio only.
@pytest.fixture(params=["stdio"] if ON_VM else ["stdio", "http"])
def server_factory(request: pytest.FixtureRequest, env: dict[str, str]) -> Iterator[Callable[..., McpClient]]:
    """Starts `$SANDBOX_MCP_BIN` in `env`, over stdio or (second run of every
    test) Streamable HTTP on a loopback port; call it again for a second
    server on the same state (restart tests). Extra keyword arguments are
    added to the environment. Every client (and HTTP server) is closed at
    teardown, before the `env` fixture stops the helper."""
    with _sessions(env, request.param, "server") as start:
        yield start


@pytest.fixture
def front_end(env: dict[str, str]) -> Iterator[Callable[..., McpClient]]:
    """Starts a stdio front-end (`$SANDBOX_MCP_BIN`, or `binary`) in `env`,
    in `cwd`, with extra environment; every one is closed at teardown."""
    with _sessions(env, "stdio", "front-end") as start:
        yield start


@pytest.fixture
def server(server_factory: Callable[..., McpClient]) -> McpClient:
    """A running `sandbox-mcp` server in an isolated environment."""
    return server_factory()


@pytest.fixture
def roots() -> Iterator[Path]:
    """A temp dir to serve as the server's only host root."""
    d = tempfile.mkdtemp(prefix="smcp-roots-")
    try:
        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def srv(server_factory: Callable[..., McpClient], roots: Path) -> McpClient:
    """A server whose host roots are just `roots` (for upload, download, sync)."""
    return server_factory(SANDBOX_MCP_HOST_ROOTS=str(roots))


# ---------------------------------------------------------------- images
# Snapshots and built images are written into the image store, so tests that
# make them get a store of their own: a temp dir holding only a symlink to the
# shared test image (the helper reads a symlinked image through the link and
# never writes into it). Layers and new images land in the temp dir.


@pytest.fixture
def image_store(env: dict[str, str]) -> str:
    """A per-test image store in the test's temp dir with the shared test
    image symlinked in; removed with the temp dir."""
    shared = Path(shared_image_store())
    image = required_env("SANDBOX_MCP_TEST_IMAGE")
    store = Path(env["SANDBOX_MCP_TEST_TMP"]) / "images"
    store.mkdir()
    (store / image).symlink_to(shared / image)
    return str(store)


@pytest.fixture
def isrv(server_factory: Callable[..., McpClient], image_store: str, roots: Path) -> McpClient:
    """A server on a per-test image store, with `roots` as its host root
    (and so its project dir, where `.sandbox-mcp.toml` picks an image)."""
    return server_factory(SANDBOX_MCP_IMAGE_STORE=image_store, SANDBOX_MCP_HOST_ROOTS=str(roots))


# --- Child sandboxes and sandbox-ctl -----------------------------------------
# The server copies sandbox-ctl into every sandbox whose spawn policy has
# inject_ctl. The debug build carries ~150 MB of debug info, so tests hand the
# server a stripped copy (SANDBOX_CTL_BIN); the code under test is the same.


@pytest.fixture(scope="session")
def ctl_bin() -> Iterator[str]:
    """Path of a stripped copy of the sandbox-ctl built next to $SANDBOX_MCP_BIN."""
    built = Path(required_env("SANDBOX_MCP_BIN")).parent / "sandbox-ctl"
    if not built.is_file():
        pytest.fail(f"{built} missing: run `make test` (cargo build builds every binary)", pytrace=False)
    d = tempfile.mkdtemp(prefix="smcp-ctl-")
    copy = Path(d) / "sandbox-ctl"
    shutil.copy2(built, copy)
    strip = shutil.which("strip")
    if strip:
        subprocess.run([strip, str(copy)], check=True)
    try:
        yield str(copy)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def sandbox_key(name: str, project: str | os.PathLike[str] | None = None) -> str:
    """The orchestrator's key of sandbox `name` (its VM id and volume directory):
    `<tag>-<name>`, the tag the first 6 hex digits of the SHA-256 of the project
    directory's canonical path (default: the current directory, which servers
    started by these fixtures have as theirs unless given host roots)."""
    path = os.path.realpath(project if project is not None else os.getcwd())
    return f"{hashlib.sha256(path.encode()).hexdigest()[:6]}-{name}"


def volume_dir(env: dict[str, str], name: str, project: str | os.PathLike[str] | None = None) -> Path:
    """The volume directory (workspace and caches) of sandbox `name` of `project`."""
    return Path(env["XDG_DATA_HOME"]) / "sandbox-mcp" / "volumes" / sandbox_key(name, project)


def write_config(env: dict[str, str], text: str) -> Path:
    """Writes the server's config file (config.toml under XDG_CONFIG_HOME)."""
    path = Path(env["XDG_CONFIG_HOME"]) / "sandbox-mcp" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def pytest_configure(config: pytest.Config) -> None:
    # The security suite marks tests that load the whole machine for a few
    # seconds (fork bomb, memory hog): `pytest -m "not heavy"` leaves them out.
    config.addinivalue_line("markers", "heavy: loads the machine for seconds (fork bomb, memory hog)")


# Sends one raw payload (base64 in argv[1], or `big` for an oversize line)
# to the ctl socket and prints the response line.
CTL_RAW_CLIENT = r"""
import base64, socket, sys
if sys.argv[1] == "big":
    payload = b'{"id": 9, "method": "ping", "params": {"x": "' + b"a" * 70000 + b'"}}\n'
else:
    payload = base64.b64decode(sys.argv[1])
s = socket.socket(socket.AF_UNIX)
s.connect("/run/sandbox-ctl.sock")
s.sendall(payload)
s.shutdown(socket.SHUT_WR)
buf = b""
while not buf.endswith(b"\n"):
    chunk = s.recv(65536)
    if not chunk:
        break
    buf += chunk
sys.stdout.write(buf.decode())
"""


# --- Ordinary users (issue 10) -------------------------------------------------
# Root-only tests create throwaway login users to run things as; `host-setup`
# leaves a delegated cgroup per v1 controller for them, removed with the user.


def run_as(
    user: str, argv: list[str], env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Runs `argv` as `user` through runuser, with exactly `env` (plus PATH)."""
    clean = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", **(env or {})}
    return subprocess.run(
        ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in clean.items()), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def delegated_cgroups(user: str) -> list[Path]:
    """The `sandbox-mcp.<user>` groups host-setup may have made (v1 layout)."""
    root = Path("/sys/fs/cgroup")
    return [d / f"sandbox-mcp.{user}" for d in root.iterdir() if (d / f"sandbox-mcp.{user}").is_dir()]


# cgroup limits, and the counters `stats` and `health` show, need a root helper or cgroups delegated to the
# user (what `sandbox-mcp host-setup` sets up): an ordinary user's sandboxes otherwise start without them.
needs_cgroup_limits = pytest.mark.skipif(
    os.geteuid() != 0 and not delegated_cgroups(pwd.getpwuid(os.geteuid()).pw_name),
    reason="cgroup limits and counters: this user's sandboxes run without them (no cgroups delegated to it)",
)


def _remove_cgroup_tree(top: Path) -> None:
    for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        d.rmdir()
    top.rmdir()


@pytest.fixture
def new_user() -> Iterator[Callable[..., str]]:
    """Creates throwaway users (`subids=False`: without subordinate id
    ranges); skips unless root. Each is deleted afterwards with its home,
    delegated cgroups and subordinate ranges (tests stop what they start as it)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create users")
    made: list[str] = []

    def create(subids: bool = True) -> str:
        name = f"smcp-t{os.getpid() % 10000}{len(made)}"
        extra = [] if subids else ["-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0"]
        subprocess.run(["useradd", "-m", *extra, name], check=True, capture_output=True)
        made.append(name)
        return name

    try:
        yield create
    finally:
        for name in made:
            for top in delegated_cgroups(name):
                _remove_cgroup_tree(top)
            subprocess.run(["userdel", "-r", "-f", name], capture_output=True)


def user_env(user: str) -> dict[str, str]:
    """An isolated environment (see `isolated_env`) owned by `user`, for a
    server or doctor run as that user."""
    base = new_env_dir()
    env = isolated_env(base)
    shutil.chown(base, user)
    for key in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME"):
        shutil.chown(env[key], user)
    env["SANDBOX_MCP_TEST_TMP"] = base
    env["HOME"] = base
    return env


# --- Test hosts (egress) -------------------------------------------------------
# A network namespace behind a veth pair (scripts/test-host.sh) serving HTTP on port 8080 at NET.2, with
# the Rust suites' server (tests/support/host_server.py). On 10.214.N, apart from the Rust suites'
# 10.213.N hosts that may be up at the same time.
TEST_HOST_PORT = 8080
TEST_HOST_BODY = "hello from the test host"
_TEST_HOST_SERVER = (Path(__file__).resolve().parent / "support" / "host_server.py").read_text()


@pytest.fixture
def test_host() -> Iterator[Callable[[], str]]:
    """Brings up a test host per call and returns its address; all are removed at teardown. Skips when
    not root (`ip netns` needs it)."""
    if os.geteuid() != 0:
        pytest.skip("test hosts need root (ip netns)")
    script = str(Path(__file__).resolve().parent.parent / "scripts" / "test-host.sh")
    names: list[str] = []

    def up() -> str:
        n = (os.getpid() + len(names) * 7) % 250 + 1
        name, addr = f"smcpy{n}", f"10.214.{n}.2"
        subprocess.run([script, "down", name], check=False)
        subprocess.run([script, "up", name, str(n), f"10.214.{n}"], check=True)
        names.append(name)
        subprocess.Popen(["ip", "netns", "exec", name, "python3", "-c", _TEST_HOST_SERVER, addr],
                         stdin=subprocess.DEVNULL)
        probe = f"import socket; socket.create_connection(({addr!r}, {TEST_HOST_PORT}), timeout=1)"
        serving = lambda: subprocess.run(["ip", "netns", "exec", name, "python3", "-c", probe],  # noqa: E731
                                         stderr=subprocess.DEVNULL).returncode == 0
        assert poll(serving, bool, timeout=20), f"test host {name} does not serve"
        return addr

    try:
        yield up
    finally:
        for name in names:
            subprocess.run([script, "down", name], check=False)
