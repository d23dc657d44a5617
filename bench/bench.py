#!/usr/bin/env python3
"""Latency benchmark of sandbox-mcp over a real MCP client (stdio).

Measures, on an isolated server (fresh XDG dirs, helper stopped at the end):
  (a) warm `exec echo hi` in one sandbox: p50/p99 over 500 calls after 5 warm-up calls;
  (b) sandbox create: p50 over 20 first calls (`exec true` in a new sandbox, which
      creates it), each sandbox destroyed afterwards (not timed); with the defaults
      (egress + host CA trust), with `trust_host_ca = false`, and with network `none`
      and no CA trust (profiles of the run's config file);
  (c) baseline: this Python process running `sh -c 'echo hi'` with subprocess, p50/p99;
  (g) relay overhead: warm `exec echo hi` from a minimal JSON-RPC client (no SDK), through a
      stdio front-end (`sandbox-mcp` relaying to the daemon) and directly on the daemon's
      socket, RELAY_CALLS each: the difference is what the front-end adds;
  (d) port forward throughput: a server in the sandbox (bg, python3) sends FORWARD_MIB MiB
      of zeros through expose(); this process reads them from localhost, FORWARD_RUNS times (MB/s);
  (f) egress (the helper's network stack; needs root for the test host, else skipped): host
      memory per idle EGRESS sandbox (the helper's RSS growth over EGRESS_VMS idle VMs, made
      over gRPC; egress runs no process of its own), and TCP throughput from a sandbox to a sink
      on a test host in a network namespace (scripts/test-host.sh), EGRESS_MIB MiB per run
      (MB/s measured inside the sandbox, connect to the sink's byte count);
  (h) the vm driver (qemu microVMs; skipped, saying why, without qemu or the vm assets):
      `sandbox-vm-helper vm-bench` on the bench image, from qemu's start to the agent's first
      Pong: cold boot, restore from the memory snapshot (target p50 <= 300 ms under TCG), a
      vm handed out by the warm pool (target p50 <= 150 ms), both again for an EGRESS vm (a
      network card, its stack started at hand-out), the RSS of qemu + virtiofsd per idle
      vm, the PSS per vm of 4 and of 16 idle vms together (target <= 64 MiB, qemu; printed after the
      PSS a namespace sandbox adds, its processes under the helper, over 4 idle ones), and warm
      exec on a booted vm (`sh -c 'echo hi'` through its agent, printed beside the namespace
      driver's warm exec);
  (e) sync latency: with sync_start running, a new file written on the host until it exists
      in the sandbox, SYNC_SAMPLES times (p50/p90). A python3 loop inside the sandbox polls for
      the file and prints the time it saw it (same clock as the host), so exec round trips do
      not blur the figure;
  (i) OCI images (skipped, saying why, without docker-registry or skopeo): a registry on loopback
      (Debian's docker-registry, plain HTTP, storage in a temp dir) holding two images built here
      that share a ~90 MB base layer of random bytes (with /bin/busybox as /bin/sh) under different
      small top layers. Over OCI_RUNS runs: `skopeo copy` of the first into an OCI layout, then
      `sandbox-mcp image pull` of it into a new store (MB/s of compressed bytes, split into download
      and unpack by its per-layer progress lines; target: at least skopeo's rate; GNU tar unpacking
      the layers skopeo fetched is printed beside the unpack part), then a pull of the
      second into the same store (target <= 10% of the first's time); then create + first
      `exec true` on the pulled image vs the built bench image, OCI_CREATES each, interleaved
      (target p50 within 10%).

Environment: SANDBOX_MCP_BIN (default target/release/sandbox-mcp),
SANDBOX_VM_HELPER_BIN (passed through), SANDBOX_MCP_BENCH_IMAGE_STORE and
SANDBOX_MCP_BENCH_IMAGE (default: the server's own store and default image).
`make bench` sets them all. `--only create` runs (b) alone; `--only exec` runs (a), (g) and (c);
`--only oci` runs (i) alone.
"""
from __future__ import annotations

import argparse
import base64
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from mcp_client import McpClient  # noqa: E402
from test_crash_safety import _descendants  # noqa: E402
from test_persistence import helper_pid  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oci_image  # noqa: E402

WARM_CALLS = 500
WARMUP = 5
CREATES = 20
BASELINE_CALLS = 500
# Creating a sandbox can include the helper's first start.
CREATE_TIMEOUT = 120.0
FORWARD_MIB = 1024
FORWARD_RUNS = 5
FORWARD_PORT = 9000
SYNC_SAMPLES = 20
EGRESS_VMS = 10
EGRESS_MIB = 1024
EGRESS_RUNS = 3
# The sink on the test host: reads each connection to EOF, answers its byte count.
EGRESS_SINK = """
import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 9100))
s.listen(8)
def serve(c):
    n = 0
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        n += len(b)
    c.sendall(str(n).encode())
    c.close()
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
"""
# In the sandbox: send argv[2] MiB to the sink at argv[1], print MB/s.
EGRESS_SENDER = """
import socket, sys, time
block = bytes(1 << 20)
t = time.monotonic()
c = socket.create_connection((sys.argv[1], 9100), timeout=30)
for _ in range(int(sys.argv[2])):
    c.sendall(block)
c.shutdown(socket.SHUT_WR)
n = int(c.recv(100))
print(n / (time.monotonic() - t) / 1e6)
"""
LIFECYCLE_SAMPLES = 10
# Create variants: sandbox name prefix, its profile in the run's config file (None:
# the defaults), the row's label.
CREATE_VARIANTS = [
    ("bench", None, "sandbox create (egress + CA trust)"),
    ("bench-notrust", "trust_host_ca = false", "sandbox create (egress, no CA trust)"),
    ("bench-none", 'network = "none"\ntrust_host_ca = false', "sandbox create (none, no CA trust)"),
]
OCI_RUNS = 3
OCI_CREATES = 10
# The pulled image's name in the server's store; sandboxes OCI_PULLED-n run on it (a profile each).
OCI_IMAGE = "bench-oci"
OCI_PULLED = "oci-pulled"
OCI_BUILT = "oci-built"


def percentile(samples: list[float], p: float) -> float:
    """Nearest-rank percentile, in the samples' unit."""
    s = sorted(samples)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def timed(fn: Callable[[], object]) -> float:
    """Wall time of one call in milliseconds."""
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def checked(client: McpClient, tool: str, timeout: float = 60.0, **args: object) -> str:
    """Calls a tool and fails the benchmark if the tool reports an error."""
    text, is_error = client.call(tool, call_timeout=timeout, **args)
    if is_error:
        raise SystemExit(f"bench: {tool} {args} failed: {text}")
    return text


def server_env(base: str) -> dict[str, str]:
    env = {
        "XDG_DATA_HOME": f"{base}/data",
        "XDG_STATE_HOME": f"{base}/state",
        "XDG_RUNTIME_DIR": f"{base}/run",
        "XDG_CONFIG_HOME": f"{base}/config",
        "RUST_LOG": os.environ.get("RUST_LOG", "warn"),
        "SANDBOX_MCP_HOST_ROOTS": f"{base}/host",
    }
    os.makedirs(env["SANDBOX_MCP_HOST_ROOTS"], exist_ok=True)
    for key in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME"):
        os.makedirs(env[key], mode=0o700, exist_ok=True)
    # Profiles are per sandbox name: one per create variant and sample.
    config = Path(env["XDG_CONFIG_HOME"]) / "sandbox-mcp" / "config.toml"
    config.parent.mkdir(mode=0o700)
    config.write_text("".join(
        f"[profiles.{prefix}-{n}]\n{profile}\n"
        for prefix, profile, _ in CREATE_VARIANTS if profile for n in range(CREATES)) + "".join(
        f'[profiles.{OCI_PULLED}-{n}]\nimage = "{OCI_IMAGE}"\n' for n in range(OCI_CREATES + 1)))
    passthrough = {
        "SANDBOX_VM_HELPER_BIN": "SANDBOX_VM_HELPER_BIN",
        "SANDBOX_MCP_BENCH_IMAGE_STORE": "SANDBOX_MCP_IMAGE_STORE",
        "SANDBOX_MCP_BENCH_IMAGE": "SANDBOX_MCP_DEFAULT_IMAGE",
    }
    for src, dst in passthrough.items():
        if os.environ.get(src):
            env[dst] = os.environ[src]
    # Snapshots land in the image store: give the run a store of its own that
    # links the base images instead of writing into the shared one.
    shared = Path(env.get("SANDBOX_MCP_IMAGE_STORE") or Path(env["XDG_DATA_HOME"]).parent / "none")
    if shared.is_dir():
        own = Path(base) / "images"
        own.mkdir()
        for image in shared.iterdir():
            if (image / "image.json").is_file():
                (own / image.name).symlink_to(image)
        env["SANDBOX_MCP_IMAGE_STORE"] = str(own)
    return env


def stop_helper(env: dict[str, str]) -> None:
    """Stops the daemon, then the helper, the front-end started (TERM, then KILL after 5 s)."""
    for name in ("daemon.pid", "helper.pid"):
        stop_pid_file(Path(env["XDG_RUNTIME_DIR"]) / "sandbox-mcp" / name)


def stop_pid_file(pid_file: Path) -> None:
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 15)
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    try:
        os.kill(pid, 9)
    except OSError:
        pass


def bench_warm_exec(client: McpClient) -> list[float]:
    for _ in range(WARMUP):
        checked(client, "exec", timeout=CREATE_TIMEOUT, command="echo hi", sandbox="bench")
    return [timed(lambda: checked(client, "exec", command="echo hi", sandbox="bench")) for _ in range(WARM_CALLS)]


def bench_create(client: McpClient, prefix: str) -> list[float]:
    samples = []
    for n in range(CREATES):
        name = f"{prefix}-{n}"
        samples.append(timed(lambda: checked(client, "exec", timeout=CREATE_TIMEOUT, command="true", sandbox=name)))
        checked(client, "destroy", sandbox=name)
    return samples


def bench_baseline() -> list[float]:
    return [timed(lambda: subprocess.run(["sh", "-c", "echo hi"], capture_output=True, check=True))
            for _ in range(BASELINE_CALLS)]


# Sends the number of MiB asked for (a decimal line) of zeros, then closes;
# expose's probe connects and sends nothing.
ZERO_SERVER = f"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {FORWARD_PORT}))
s.listen()
block = bytes(1 << 20)
while True:
    c, _ = s.accept()
    line = c.makefile().readline().strip()
    for _ in range(int(line) if line.isdigit() else 0):
        c.sendall(block)
    c.close()
"""


RELAY_CALLS = 500


def raw_exec_calls(write: Callable[[bytes], None], readline: Callable[[], bytes]) -> list[float]:
    """One MCP session over newline-delimited JSON-RPC: initialize, then
    RELAY_CALLS warm `exec echo hi` calls, timed one by one (ms)."""
    ids = iter(range(1, 1 << 30))

    def rpc(method: str, params: dict) -> dict:
        n = next(ids)
        write(json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}).encode() + b"\n")
        while True:
            line = readline()
            if not line:
                raise SystemExit(f"bench: the connection closed during {method}")
            message = json.loads(line)
            if message.get("id") == n:
                if "error" in message or message.get("result", {}).get("isError"):
                    raise SystemExit(f"bench: {method} failed: {message}")
                return message

    rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "bench", "version": "0"}})
    write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
    call = {"name": "exec", "arguments": {"command": "echo hi", "sandbox": "bench"}}
    for _ in range(WARMUP):
        rpc("tools/call", call)
    return [timed(lambda: rpc("tools/call", call)) for _ in range(RELAY_CALLS)]


def bench_relay(binary: str, env: dict[str, str]) -> list[str]:
    """Warm exec through a stdio front-end and directly on the daemon socket."""
    proc = subprocess.Popen([binary], env={**os.environ, **env}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)

    def write(b: bytes) -> None:
        proc.stdin.write(b)
        proc.stdin.flush()

    try:
        through = raw_exec_calls(write, proc.stdout.readline)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(Path(env["XDG_RUNTIME_DIR"]) / "sandbox-mcp" / "daemon.sock"))
    stream = sock.makefile("rb")
    source = {"vars": {k: v for k, v in env.items() if k.startswith("SANDBOX_MCP_")}, "cwd": os.getcwd()}
    sock.sendall(json.dumps({"build": {"version": "0", "written_ns": 0}, "source": source, "mode": "stdio"}).encode() + b"\n")
    reply = json.loads(stream.readline())
    if reply.get("error"):
        raise SystemExit(f"bench: the daemon refused the session: {reply['error']}")
    try:
        direct = raw_exec_calls(sock.sendall, stream.readline)
    finally:
        sock.close()
    added = statistics.median(through) - statistics.median(direct)
    return [row("exec (raw client, via front-end)", through), row("exec (raw client, daemon socket)", direct),
            f"{'relay adds (p50 difference)':<34} {'':>5} {added:9.3f}"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_through(port: int, mib: int) -> float:
    """Reads `mib` MiB from the forward; returns MB/s (10^6 bytes per second)."""
    buf = bytearray(4 << 20)
    view = memoryview(buf)
    got = 0
    t = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(f"{mib}\n".encode())
        while True:
            n = c.recv_into(view)
            if n == 0:
                break
            got += n
    elapsed = time.perf_counter() - t
    if got != mib << 20:
        raise SystemExit(f"bench: forward delivered {got} bytes, expected {mib << 20}")
    return got / elapsed / 1e6


def bench_forward(client: McpClient) -> list[float]:
    checked(client, "bg", timeout=CREATE_TIMEOUT, sandbox="bench-net", name="zeros",
            command=f"exec python3 -c '{ZERO_SERVER}'")
    port = free_port()
    deadline = time.monotonic() + 30
    while "Warning" in checked(client, "expose", sandbox="bench-net", port=FORWARD_PORT, host_port=port):
        checked(client, "unexpose", port=port)
        if time.monotonic() > deadline:
            raise SystemExit("bench: the zero server never listened")
        time.sleep(0.1)
    read_through(port, 64)
    samples = [read_through(port, FORWARD_MIB) for _ in range(FORWARD_RUNS)]
    checked(client, "unexpose", port=port)
    return samples


def bench_sync(client: McpClient, host_root: str) -> list[float]:
    local = Path(host_root) / "sync"
    local.mkdir()
    started = checked(client, "sync_start", timeout=CREATE_TIMEOUT, sandbox="bench-sync", local_dir=str(local),
                      sandbox_dir="/workspace/sync")
    job = started.split("[", 1)[1].split("]", 1)[0]
    samples = []
    for n in range(SYNC_SAMPLES + 1):
        name = f"f{n}"
        waiter = ("import os, time\n"
                  f"while not os.path.exists('/workspace/sync/{name}'): time.sleep(0.0002)\n"
                  "print(time.time_ns())")
        result: list[str] = []
        t = threading.Thread(target=lambda: result.append(checked(client, "python", sandbox="bench-sync",
                                                                  code=waiter, timeout=30)))
        t.start()
        # Give the waiter time to start, so it sees the file as soon as it lands.
        time.sleep(0.3)
        written = time.time_ns()
        (local / name).write_text("x\n")
        t.join(60)
        seen = int(result[0].split("\n")[0])
        if n > 0:
            samples.append((seen - written) / 1e6)
    checked(client, "sync_stop", job_id=job)
    return samples


def grpcurl(env: dict[str, str], method: str, data: object) -> str:
    """One call to the helper the server started, over its Unix socket."""
    tool = Path(sys.executable).parent / "grpcurl"
    sock = Path(env["XDG_RUNTIME_DIR"]) / "sandbox-mcp" / "helper.sock"
    payload = "\n".join(json.dumps(d) for d in data) if isinstance(data, list) else json.dumps(data)
    out = subprocess.run(
        [str(tool if tool.exists() else "grpcurl"), "-plaintext", "-unix", "-authority", "localhost",
         "-max-time", "600", "-d", "@", str(sock), f"sandbox_mcp.helper.v1.VmHelper/{method}"],
        input=payload, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{method}: {out.stderr.strip()}")
    return out.stdout


def helper_rss_kib(env: dict[str, str]) -> int:
    for line in Path(f"/proc/{helper_pid(env)}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def pss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in text.splitlines() if line.startswith("Pss:")), 0)
    return total


DENSITY_SANDBOXES = 4


def bench_namespace_density(client: McpClient, env: dict[str, str]) -> list[str]:
    """Host memory per idle namespace sandbox: the PSS of every process under the helper (launcher, the
    sandbox's init and agent) that DENSITY_SANDBOXES idle sandboxes add, per sandbox; beside the vm's."""
    before = pss_kib(list(_descendants(helper_pid(env))))
    names = [f"density{i}" for i in range(DENSITY_SANDBOXES)]
    for name in names:
        checked(client, "exec", timeout=CREATE_TIMEOUT, command="true", sandbox=name)
    time.sleep(2)
    per = (pss_kib(list(_descendants(helper_pid(env)))) - before) / DENSITY_SANDBOXES / 1024
    for name in names:
        checked(client, "destroy", sandbox=name)
    return [f"{'namespace PSS per idle sandbox':<34} {DENSITY_SANDBOXES:>5} {per:>9.1f}"
            "             (MiB: its launcher, init and agent; beside the vm's)"]


def egress_vm(env: dict[str, str], vm_id: str, allow: list[str]) -> None:
    image = env.get("SANDBOX_MCP_DEFAULT_IMAGE", "mcp-dev")
    spec = {"id": vm_id, "image": image, "network": "NETWORK_MODE_EGRESS", "network_policy": {"allow": allow}}
    grpcurl(env, "CreateVm", {"spec": spec})
    grpcurl(env, "StartVm", {"id": vm_id})


VM_RUNS = 10


VM_EXEC_LABEL = "vm exec `sh -c 'echo hi'` (warm)"


def bench_vm() -> list[str]:
    helper = os.environ.get("SANDBOX_VM_HELPER_BIN") or str(ROOT / "target/release/sandbox-vm-helper")
    store = os.environ.get("SANDBOX_MCP_BENCH_IMAGE_STORE")
    image = os.environ.get("SANDBOX_MCP_BENCH_IMAGE")
    if not store or not image:
        return ["vm driver: skipped (no SANDBOX_MCP_BENCH_IMAGE_STORE / SANDBOX_MCP_BENCH_IMAGE)"]
    if shutil.which("qemu-system-x86_64") is None:
        return ["vm driver: skipped (qemu-system-x86_64 is not installed: make vm)"]
    run = subprocess.run([helper, "vm-bench", "--store", store, "--image", image, "--runs", str(VM_RUNS)],
                         capture_output=True, text=True, timeout=3600)
    if run.returncode != 0:
        return [f"vm driver: skipped ({run.stderr.strip()[-300:]})"]
    f = json.loads(run.stdout)
    return [
        row("vm create, cold boot", f["cold_ms"]),
        row("vm create, from the state file", f["snapshot_ms"]) + "  (target p50 <= 300, TCG)",
        row("vm create, from the warm pool", f["pool_ms"]) + "  (target p50 <= 150, TCG)",
        row("vm create, EGRESS, state file", f["egress_snapshot_ms"]) + "  (with its network stack)",
        row("vm create, EGRESS, warm pool", f["egress_pool_ms"]) + "  (with its network stack)",
        row(VM_EXEC_LABEL, f["warm_exec_ms"]) + "  (through the agent, TCG)",
        f"{'vm host RSS per idle vm':<34} {len(f['idle_rss_mib']):>5} {statistics.median(f['idle_rss_mib']):>9.1f}"
        "             (MiB: qemu + virtiofsd)",
        *(f"{'vm PSS per idle vm, ' + str(d['vms']) + ' idle':<34} {d['vms']:>5} {d['qemu_pss_mib']:>9.1f}"
          f"             (MiB, qemu; target <= 64; {d['total_pss_mib']:.1f} with virtiofsd)" for d in f["density"]),
    ]


def bench_egress(env: dict[str, str]) -> list[str]:
    """Memory per idle EGRESS VM and egress TCP throughput to a test host."""
    script = str(ROOT / "scripts" / "test-host.sh")
    if os.geteuid() != 0:
        return ["egress: skipped (the test host needs root)"]
    n = os.getpid() % 200 + 40
    name = f"smcpb{n}"
    addr = f"10.213.{n}.2"
    subprocess.run([script, "down", name], capture_output=True)
    subprocess.run([script, "up", name, str(n)], check=True)
    sink = subprocess.Popen(["ip", "netns", "exec", name, "python3", "-c", EGRESS_SINK, addr])
    ids: list[str] = []
    rows = []
    try:
        before = helper_rss_kib(env)
        for i in range(EGRESS_VMS):
            ids.append(f"bench-egress-{i}")
            egress_vm(env, ids[-1], [addr])
        time.sleep(1)
        per_vm = (helper_rss_kib(env) - before) / EGRESS_VMS / 1024
        rows.append(f"{'helper RSS per idle egress VM':<34} {EGRESS_VMS:>5} {per_vm:>9.2f}             (MiB; target <= 5)")
        samples = []
        for _ in range(EGRESS_RUNS):
            start = {"start": {"vm_id": ids[0], "argv": ["python3", "-c", EGRESS_SENDER, addr, str(EGRESS_MIB)]}}
            out = grpcurl(env, "Exec", [start, {"close_stdin": {}}])
            text = ""
            for msg in split_json(out):
                if "stdout" in msg:
                    text += base64.b64decode(msg["stdout"]).decode()
            samples.append(float(text.strip()))
        rows.append(throughput_row(f"egress TCP {EGRESS_MIB} MiB to test host", samples) + "  (target >= 500)")
    finally:
        for vm_id in ids:
            try:
                grpcurl(env, "DeleteVm", {"id": vm_id})
            except RuntimeError:
                pass
        sink.kill()
        sink.wait()
        subprocess.run([script, "down", name], capture_output=True)
    return rows


def split_json(text: str) -> list[dict]:
    """The JSON objects grpcurl prints one after another."""
    dec, i, out = json.JSONDecoder(), 0, []
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        obj, i = dec.raw_decode(text, i)
        out.append(obj)
    return out


def bench_lifecycle(client: McpClient) -> list[str]:
    """snapshot, restore, clone and spawn of a sandbox with a small change in
    its root filesystem and a small workspace."""
    checked(client, "exec", timeout=CREATE_TIMEOUT, sandbox="default",
            command="mkdir -p /opt/app && head -c 1000000 /dev/urandom > /opt/app/blob && "
                    "seq 1 1000 > /workspace/numbers")
    snap, restore, clone, spawn = [], [], [], []
    for n in range(LIFECYCLE_SAMPLES):
        snap.append(timed(lambda: checked(client, "snapshot", snapshot_name=f"bench-{n}", sandbox="default")))
        restore.append(timed(lambda: checked(client, "restore", snapshot_name=f"bench-{n}", sandbox="bench-dst")))
        clone.append(timed(lambda: checked(client, "clone", source="default", target=f"bench-clone-{n}")))
        checked(client, "destroy", sandbox=f"bench-clone-{n}")
        spawn.append(timed(lambda: checked(client, "spawn", parent="default", name=f"bench-child-{n}")))
        checked(client, "destroy_child", name=f"default..bench-child-{n}")
    checked(client, "destroy", sandbox="bench-dst")
    for n in reversed(range(LIFECYCLE_SAMPLES)):
        checked(client, "delete_snapshot", snapshot_name=f"bench-{n}")
    checked(client, "destroy", sandbox="default")
    return [
        spread_row("snapshot (1 MB rootfs change)", snap),
        spread_row("restore (into another sandbox)", restore),
        spread_row("clone (rootfs + workspace)", clone),
        spread_row("spawn child", spawn),
    ]


def bench_oci(binary: str, env: dict[str, str], client: McpClient) -> list[str]:
    """Section (i): pulls from a loopback registry against skopeo, a second pull sharing the base, and
    create + first exec on the pulled image against the built one."""
    missing = oci_image.missing_tools()
    if missing:
        return [f"OCI images: skipped ({missing})"]
    tmp = oci_image.temp_dir("smcp-bench-oci-")
    try:
        with oci_image.Registry(tmp) as host:
            return oci_rows(binary, env, client, host, tmp)
    finally:
        oci_image.remove(tmp)


def oci_rows(binary: str, env: dict[str, str], client: McpClient, host: str, tmp: Path) -> list[str]:
    busybox = os.path.isfile(oci_image.BUSYBOX)
    t = time.perf_counter()
    images = oci_image.write_images(tmp / "layout", busybox)
    oci_image.push(images, host)
    setup = time.perf_counter() - t
    oci_image.remove(images.dir)
    size = images.sizes["1"]
    skopeo_s, tar_s, first, second = [], [], [], []
    for run in range(OCI_RUNS):
        dest = tmp / f"skopeo-{run}"
        skopeo_s.append(oci_image.skopeo_pull(host, "1", dest))
        tar_s.append(oci_image.tar_unpack(dest, tmp / f"tar-{run}"))
        oci_image.remove(dest)
        oci_image.remove(tmp / f"tar-{run}")
        # The last run pulls into the server's own store (no --store), for the sandboxes below.
        last = run == OCI_RUNS - 1
        store = None if last else tmp / f"store-{run}"
        name = OCI_IMAGE if last else "big"
        first.append(oci_image.cli_pull(binary, env, f"{host}/bench/big:1", name, store))
        second.append(oci_image.cli_pull(binary, env, f"{host}/bench/big:2", f"{name}-2", store))
        if store is not None:
            oci_image.remove(store)
    if os.environ.get("SANDBOX_MCP_BENCH_VERBOSE"):
        for label, pull in (("first pull", first[-1]), ("second pull", second[-1])):
            print(f"-- {label}:", *pull.log, sep="\n  ", file=sys.stderr)
    mb = size / 1e6

    def rate(seconds: list[float]) -> list[float]:
        return [mb / s for s in seconds]

    ours = statistics.median(p.total for p in first)
    ours_download = statistics.median(p.download for p in first)
    theirs = statistics.median(skopeo_s)
    again = statistics.median(p.total for p in second)
    rows = [
        f"OCI images: {mb:.1f} MB compressed ({images.base_bytes / 1e6:.1f} MB shared base), "
        f"registry {host}, built and pushed in {setup:.1f} s",
        throughput_row("OCI pull (image pull, total)", rate([p.total for p in first])),
        throughput_row("OCI pull, download part", rate([p.download for p in first]))
        + f"  (download {ours_download * 1000:.0f} ms, unpack {statistics.median(p.unpack for p in first) * 1000:.0f} ms p50)",
        throughput_row("skopeo copy (same image)", rate(skopeo_s)),
        spread_row("tar -xzf of its layers (reference)", [x * 1000 for x in tar_s]) + "  (beside the unpack part)",
        f"{'OCI pull rate / skopeo rate':<34} {OCI_RUNS:>5} {theirs / ours:>9.2f}             "
        f"(total; download only {theirs / ours_download:.2f}; target >= 1.0)",
        spread_row("OCI second pull (shared base)", [p.total * 1000 for p in second])
        + f"  ({again / ours * 100:.1f}% of the first; target <= 10%)",
    ]
    if not busybox:
        return rows + [f"OCI create + exec: skipped ({oci_image.BUSYBOX} is missing: apt-get install busybox-static)"]
    rows.extend(oci_create_rows(client))
    return rows


def oci_create_rows(client: McpClient) -> list[str]:
    """Create + first `exec true` on the pulled image and on the built one, interleaved; one of each first
    to take one-time costs (the helper's start, an image's first use) out of the samples."""
    built, pulled = [], []
    for n in range(OCI_CREATES + 1):
        for prefix, samples in ((OCI_BUILT, built), (OCI_PULLED, pulled)):
            name = f"{prefix}-{n}"
            ms = timed(lambda: checked(client, "exec", timeout=CREATE_TIMEOUT, command="true", sandbox=name))
            checked(client, "destroy", sandbox=name)
            if n > 0:
                samples.append(ms)
    diff = (statistics.median(pulled) / statistics.median(built) - 1) * 100
    return [
        spread_row("create + exec true (built image)", built),
        spread_row("create + exec true (pulled image)", pulled) + f"  ({diff:+.1f}% vs built; target within 10%)",
    ]


def throughput_row(label: str, samples: list[float]) -> str:
    return f"{label:<34} {len(samples):>5} {statistics.median(samples):>9.0f} {max(samples):>9.0f}   (MB/s: median, best)"


def spread_row(label: str, samples: list[float]) -> str:
    return (f"{label:<34} {len(samples):>5} {statistics.median(samples):>9.2f} "
            f"{percentile(samples, 90):>9.2f} {max(samples):>9.2f}   (ms: p50, p90, max)")


def row(label: str, samples: list[float]) -> str:
    return (f"{label:<34} {len(samples):>5} {statistics.median(samples):>9.2f} "
            f"{percentile(samples, 99):>9.2f} {max(samples):>9.2f}")


def create_rows(client: McpClient) -> list[str]:
    return [row(label, bench_create(client, prefix)) for prefix, _, label in CREATE_VARIANTS]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", choices=["create", "exec", "oci"], help="run only this part")
    only = parser.parse_args().only
    binary = os.environ.get("SANDBOX_MCP_BIN") or str(ROOT / "target/release/sandbox-mcp")
    if not os.access(binary, os.X_OK):
        print(f"bench: {binary} is not executable: run `make bench`", file=sys.stderr)
        return 1
    base = tempfile.mkdtemp(prefix="smcp-bench-", dir="/tmp")
    env = server_env(base)
    rows = []
    extra: list[str] = []
    try:
        with McpClient(binary, env=env, stderr_path=f"{base}/server.log") as client:
            if only == "oci":
                return report(binary, [], bench_oci(binary, env, client))
            if only == "create":
                # The helper's first start is not a create: take it out of the samples.
                checked(client, "exec", timeout=CREATE_TIMEOUT, command="true", sandbox="warmup")
                checked(client, "destroy", sandbox="warmup")
                rows.extend(create_rows(client))
                return report(binary, rows, [])
            rows.append(row("exec `echo hi` (warm, MCP)", bench_warm_exec(client)))
            rows.extend(bench_relay(binary, env))
            if only == "exec":
                rows.append(row("baseline subprocess sh -c echo", bench_baseline()))
                return report(binary, rows, [])
            rows.extend(create_rows(client))
            checked(client, "destroy", sandbox="bench")
            extra = [
                throughput_row(f"forward {FORWARD_MIB} MiB (expose)", bench_forward(client)),
                spread_row("sync host write -> in sandbox", bench_sync(client, env["SANDBOX_MCP_HOST_ROOTS"])),
                *bench_lifecycle(client),
                *bench_egress(env),
                *bench_namespace_density(client, env),
                *bench_vm(),
                *bench_oci(binary, env, client),
            ]
            # The vm's warm exec goes beside the namespace driver's.
            vm_exec = [r for r in extra if r.startswith(VM_EXEC_LABEL)]
            extra = [r for r in extra if r not in vm_exec]
            rows[1:1] = vm_exec
    finally:
        stop_helper(env)
        shutil.rmtree(base, ignore_errors=True)
    rows.append(row("baseline subprocess sh -c echo", bench_baseline()))
    return report(binary, rows, extra)


def report(binary: str, rows: list[str], extra: list[str]) -> int:
    print(f"sandbox-mcp bench: {binary}")
    print(f"{'measure':<34} {'n':>5} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    for r in rows:
        print(r)
    for r in extra:
        print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
