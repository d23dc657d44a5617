"""Child sandboxes through a real MCP client: spawn, children, destroy_child,
every spawn-policy check of internals §8 in order, TTL expiry, grandchildren
under derived policies, subtree cascades and concurrent spawns against budgets."""
import os
import re
import subprocess
import threading

from conftest import sandbox_key, write_config
from waiting import wait_for

IMAGE = os.environ.get("SANDBOX_MCP_TEST_IMAGE", "mcp-test")
SPAWN_TIMEOUT = 120.0


def names(srv) -> set[str]:
    """Names of every sandbox in `status`."""
    text, _ = srv.tool("status")
    return {m.group(1) for m in re.finditer(r"^  (\S+)\s", text, re.M)}


def spawn(srv, **args) -> tuple[str, bool]:
    return srv.call("spawn", call_timeout=SPAWN_TIMEOUT, **args)


def test_spawn_defaults_overrides_and_children(server_factory):
    srv = server_factory()
    text, err = srv.tool("children")
    assert not err and text == "No active children for 'default' (0/10 lifetime spawns used)", text
    text, err = spawn(srv)
    assert err and text == "Error: ValueError: No active sandbox 'default'", text
    srv.tool("exec", command="true")

    text, err = spawn(srv)
    assert not err, text
    lines = text.split("\n")
    assert lines[:5] == [
        "Spawned child 'default..child-0001': default..child-0001",
        "  Parent: default",
        f"  Image: {IMAGE}",
        "  Resources: 2 CPUs, 512MB",
        "  Isolation: namespaces",
    ], text
    assert re.fullmatch(r"  TTL: (29\d|300)s remaining", lines[5]), text

    text, err = spawn(srv, name="kid", cpus=5, memory="256M")
    assert not err and "  Resources: 2 CPUs, 256MB" in text, text
    text, err = spawn(srv, name="small", cpus=1, memory="1G")
    assert not err and "  Resources: 1 CPUs, 512MB" in text, text

    text, err = srv.tool("children")
    assert not err, text
    lines = text.split("\n")
    assert lines[0] == "Children of 'default' (3 active):", text
    assert re.fullmatch(r"  default\.\.kid: default\.\.kid \(2 CPUs, 256MB, image=" + IMAGE + r"\) \[TTL=\d+s\] idle=\d+s", lines[2]), text
    assert lines[-1] == "Lifetime spawns: 3/10", text
    # status shows a child's real size.
    assert re.search(r"^  default\.\.small .*  1cpu/512M", srv.tool("status")[0], re.M)

    out, err = srv.tool("exec", command="echo in-child", sandbox="default..kid")
    assert not err and out.startswith("in-child"), out
    text, err = srv.tool("destroy", sandbox="default..kid")
    assert err and text == "Error: use destroy_child to destroy child sandboxes", text
    text, err = srv.tool("reset", sandbox="default..kid")
    assert err and text == "Error: reset not permitted on child sandboxes (use destroy_child instead)", text
    text, err = srv.tool("expose", port=8080, host_port=18931, sandbox="default..kid")
    assert err and text == "Error: port forwarding not permitted on child sandboxes", text

    text, err = srv.tool("destroy_child", name="default..kid")
    assert not err and text == f"Destroyed sandbox 'default..kid' ({sandbox_key('default..kid')})", text
    text, err = srv.tool("destroy_child", name="default..kid")
    assert err and text == "Error: no active sandbox 'default..kid'", text
    text, err = srv.tool("destroy_child", name="default")
    assert err and text == "Error: 'default' is not a child sandbox (use destroy instead)", text
    srv.tool("destroy_child", name="default..small")
    srv.tool("destroy_child", name="default..child-0001")
    text, _ = srv.tool("children")
    assert text == "No active children for 'default' (3/10 lifetime spawns used)", text
    srv.tool("exec", command="true", sandbox="plain")
    text, _ = srv.tool("children", parent="plain")
    assert text == "No active children for 'plain' (no spawn policy configured)", text


def test_every_policy_error_in_order(server_factory, env):
    write_config(
        env,
        f"""
[spawn_policies.boss]
max_concurrent = 2
max_total = 3
total_child_cpus = 3
total_child_memory_mb = 900
child_max_cpus = 2
child_max_memory = "512M"
allowed_images = ["{IMAGE}"]
child_ttl = 0

[spawn_policies.noimg]
allowed_images = []
""",
    )
    srv = server_factory()
    for name in ("boss", "noimg", "plain", "default"):
        srv.tool("exec", command="true", sandbox=name)

    def refused(expected: str, **args):
        text, err = spawn(srv, **{"parent": "boss", **args})
        assert err and text == f"Error: {expected}", text

    refused("ValueError: No active sandbox 'ghost'", parent="ghost")
    refused("PermissionError: Sandbox 'plain' is not permitted to spawn children", parent="plain")
    refused("PermissionError: Sandbox 'default' is not permitted to spawn children", parent="default")
    refused("PermissionError: Sandbox 'noimg' has no allowed child images configured", parent="noimg")
    refused("PermissionError: Image 'other' not allowed for children of 'boss'", image="other")
    refused("ValueError: cpus must be >= 1", cpus=-1)
    refused("ValueError: Invalid memory string: lots", memory="lots")
    refused("ValueError: memory must be >= 64M", memory="32M")
    refused("ValueError: Invalid child name: bad name!", name="bad name!")
    refused("ValueError: Invalid child name: a..b", name="a..b")
    refused("ValueError: Invalid child name: " + "c" * 49, name="c" * 49)

    text, err = spawn(srv, parent="boss", name="c1", cpus=2, memory="512M")
    assert not err and "  Resources: 2 CPUs, 512MB" in text and "TTL" not in text, text
    refused("SpawnLimitError: Aggregate child CPU budget exceeded", cpus=2)
    refused("SpawnLimitError: Aggregate child memory budget exceeded", cpus=1, memory="512M")
    text, err = spawn(srv, parent="boss", name="c2", cpus=1, memory="256M")
    assert not err, text
    refused("SpawnLimitError: Concurrent child limit reached", cpus=1, memory="64M")
    srv.tool("destroy_child", name="boss..c2")
    text, err = spawn(srv, parent="boss", cpus=1, memory="64M")
    assert not err and text.startswith("Spawned child 'boss..child-0003'"), text
    srv.tool("destroy_child", name="boss..child-0003")
    refused("SpawnLimitError: Lifetime spawn limit reached", cpus=1, memory="64M")
    text, _ = srv.tool("children", parent="boss")
    assert text.split("\n")[-1] == "Lifetime spawns: 3/3", text


def test_bad_policy_config_is_refused_naming_the_key(env):
    from mcp.client.stdio import get_default_environment

    for body, key in [
        ('child_network_peers = "some"', "spawn_policies.boss.child_network_peers"),
        ("max_kids = 3", "max_kids"),
    ]:
        write_config(env, f"[spawn_policies.boss]\n{body}\n")
        proc = subprocess.run(
            [os.environ["SANDBOX_MCP_BIN"], "serve"],
            env={**get_default_environment(), **env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0 and key in proc.stderr, proc.stderr


def test_child_ttl_expiry_destroys_the_child(server_factory, env):
    write_config(env, f'[spawn_policies.default]\nchild_ttl = 2\nallowed_images = ["{IMAGE}"]\n')
    srv = server_factory()
    srv.tool("exec", command="true")
    text, err = spawn(srv, name="brief")
    assert not err and re.search(r"  TTL: [12]s remaining", text), text
    assert wait_for(lambda: "default..brief" not in names(srv), timeout=30), srv.tool("status")[0]
    assert "default" in names(srv)
    text, _ = srv.tool("children")
    assert text == "No active children for 'default' (1/10 lifetime spawns used)", text


GRAND_CONFIG = f"""
[spawn_policies.boss]
max_concurrent = 4
max_total = 10
total_child_cpus = 4
total_child_memory_mb = 2048
child_max_cpus = 1
child_max_memory = "256M"
allowed_images = ["{IMAGE}"]
child_ttl = 600
child_can_spawn = true
"""


def test_grandchildren_derived_policy_and_subtree_cascades(server_factory, env):
    write_config(env, GRAND_CONFIG)
    srv = server_factory()
    srv.tool("exec", command="true", sandbox="boss")
    assert not spawn(srv, parent="boss", name="kid")[1]
    # The derived policy: halved numbers.
    text, _ = srv.tool("children", parent="boss..kid")
    assert text == "No active children for 'boss..kid' (0/5 lifetime spawns used)", text
    text, err = spawn(srv, parent="boss..kid", name="grand", memory="128M")
    assert not err and "  Parent: boss..kid" in text and "  Resources: 1 CPUs, 128MB" in text, text
    text, err = spawn(srv, parent="boss..kid..grand")
    assert err and text == "Error: PermissionError: Sandbox 'boss..kid..grand' is at generation 2 (max spawn depth is 2)", text
    # Derived max_concurrent is 4 // 2 = 2; total_child_cpus 2.
    assert not spawn(srv, parent="boss..kid", name="grand2")[1]
    text, err = spawn(srv, parent="boss..kid")
    assert err and text == "Error: SpawnLimitError: Concurrent child limit reached", text
    text, _ = srv.tool("children", parent="boss..kid")
    assert text.split("\n")[0] == "Children of 'boss..kid' (2 active):" and text.endswith("Lifetime spawns: 2/5"), text

    # Tree-wide: kid + grand + grand2 use 3 of boss's 4 CPUs; a second
    # direct child fits, a third does not, though boss's direct sum would.
    assert not spawn(srv, parent="boss", name="kid2")[1]
    text, err = spawn(srv, parent="boss")
    assert err and text == "Error: SpawnLimitError: CPU budget exceeded", text

    text, err = srv.tool("destroy_child", name="boss..kid..grand2")
    assert not err and text == f"Destroyed sandbox 'boss..kid..grand2' ({sandbox_key('boss..kid..grand2')})", text

    # reset of the root destroys the whole subtree, grandchildren included.
    text, err = srv.tool("reset", sandbox="boss")
    assert not err, text
    assert names(srv) == {"boss"}, srv.tool("status")[0]

    assert not spawn(srv, parent="boss", name="kid")[1]
    assert not spawn(srv, parent="boss..kid", name="grand")[1]
    text, err = srv.tool("destroy", sandbox="boss")
    assert not err, text
    assert names(srv) == set(), srv.tool("status")[0]


def test_concurrent_spawns_never_exceed_budgets(server_factory, env):
    write_config(
        env,
        f"""
[spawn_policies.boss]
max_concurrent = 3
max_total = 30
total_child_cpus = 4
total_child_memory_mb = 1024
child_max_cpus = 1
child_max_memory = "256M"
allowed_images = ["{IMAGE}"]
child_ttl = 0
child_can_spawn = true
""",
    )
    srv = server_factory()
    srv.tool("exec", command="true", sandbox="boss")
    assert not spawn(srv, parent="boss", name="kid")[1]
    results: list[tuple[str, bool]] = []
    lock = threading.Lock()

    def one(parent: str) -> None:
        r = spawn(srv, parent=parent)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=one, args=("boss" if i % 3 else "boss..kid",)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    ok = [t for t, err in results if not err]
    refused = [t for t, err in results if err]
    assert all(t.startswith("Error: SpawnLimitError: ") for t in refused), refused
    # boss: 2 more direct children (max_concurrent 3 with kid); kid: 1
    # (derived max_concurrent 1); 4 CPUs and 1024 MB for the whole tree.
    assert len(ok) == 3, results
    tree = names(srv) - {"boss"}
    assert len(tree) == 4, tree
    boss_children = srv.tool("children", parent="boss")[0]
    assert boss_children.startswith("Children of 'boss' (3 active):"), boss_children
    kid_children = srv.tool("children", parent="boss..kid")[0]
    assert kid_children.startswith("Children of 'boss..kid' (1 active):"), kid_children


def test_child_expose_follows_the_parent_policy(server_factory, env):
    write_config(env, f'[spawn_policies.default]\nchild_allow_port_forward = true\nallowed_images = ["{IMAGE}"]\n')
    srv = server_factory()
    srv.tool("exec", command="true")
    assert not spawn(srv, name="web")[1]
    text, err = srv.tool("expose", port=8080, host_port=18977, sandbox="default..web")
    assert not err and text.startswith("Forwarding localhost:18977 -> 'default..web':8080"), text
    # The forward goes with the child.
    assert not srv.tool("destroy_child", name="default..web")[1]
    assert wait_for(lambda: srv.tool("unexpose", port=18977)[1])


def test_a_child_lease_cannot_be_extended_past_its_ttl(server_factory):
    srv = server_factory()
    srv.tool("exec", command="true")
    text, err = spawn(srv, name="kid")
    assert not err, text
    text, err = srv.tool("extend_ttl", sandbox="default..kid", minutes=5)
    assert err and "'default..kid' is a child sandbox" in text and "child_ttl" in text, text
    # status names the parent of a child.
    assert re.search(r"^  default\.\.kid .*parent:default", srv.tool("status")[0], re.M)


def _vm_init_above(tag: str) -> int | None:
    """Host pid of the `sandbox-vm-init` process above the sandbox process
    whose argv is `sleep <tag>`. Callers poll: the exec that put `sleep` in
    the background answers once its shell is done, maybe before the forked
    child has exec'd sleep (a loaded machine missed it so)."""
    want = f"sleep\0{tag}\0".encode()
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and open(f"/proc/{d}/cmdline", "rb").read() == want:
                pid = d
                while pid not in ("0", "1"):
                    pid = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]
                    if open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"sandbox-vm-init"):
                        return int(pid)
        except OSError:
            continue
    return None


def test_a_parent_whose_vm_dies_takes_its_children(server_factory):
    # The parent is reported lost; its children used to keep running outside
    # any budget, and a reset of the name adopted them as its own.
    srv = server_factory()
    text, err = srv.tool("exec", command="sleep 4243 >/dev/null 2>&1 &")
    assert not err, text
    text, err = spawn(srv, name="kid")
    assert not err, text
    init = wait_for(lambda: _vm_init_above("4243"), timeout=20)
    assert init, "the parent's VM init process was not found"
    os.kill(init, 9)
    gone = wait_for(lambda: "default..kid" not in names(srv) and "default" not in names(srv), timeout=20)
    assert gone, srv.tool("status")[0]
    # The parent comes back on its next call; its children do not.
    text, err = srv.tool("exec", command="true")
    assert not err and text.startswith("Note: sandbox 'default' was lost and was started again"), text
    assert "default..kid" not in names(srv)
    assert not srv.tool("reset")[1]
    text, err = srv.tool("children")
    assert text == "No active children for 'default' (1/10 lifetime spawns used)", text


def test_a_lost_child_is_acknowledged_by_destroy_child(server_factory):
    # The fault suite's find: a child whose VM went away (here its init
    # killed; there its helper) answered destroy_child with the loss, whose
    # message offered reset, which children refuse.
    srv = server_factory()
    assert not srv.tool("exec", command="true")[1]
    text, err = spawn(srv, name="kid")
    assert not err, text
    text, err = srv.tool("exec", command="sleep 4244 >/dev/null 2>&1 &", sandbox="default..kid")
    assert not err, text
    init = wait_for(lambda: _vm_init_above("4244"), timeout=20)
    assert init, "the child's VM init process was not found"
    os.kill(init, 9)

    def lost() -> str | None:
        text, err = srv.tool("exec", command="true", sandbox="default..kid")
        return text if err and "was lost" in text else None

    text = wait_for(lost, timeout=20)
    assert text and "destroy_child(name='default..kid') forgets it" in text and "reset(" not in text, text
    text, err = srv.tool("destroy_child", name="default..kid")
    assert not err and "Forgot child sandbox 'default..kid'" in text, text
    assert "default..kid" not in srv.tool("status")[0]
    assert not srv.tool("exec", command="true")[1]
