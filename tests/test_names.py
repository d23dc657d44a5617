"""Name squatting through sandbox-ctl and spawn (issue 9, finding 3 and the
workspace takeover): a child's full name is `<parent>..<name>`, a form no
top-level name can take, so in-sandbox code can never plant a child where
the user's `default`, another sandbox, a destroyed sandbox's workspace, a
profile or a spawn policy will be looked up."""
import os
import re

from conftest import write_config

IMAGE = os.environ.get("SANDBOX_MCP_TEST_IMAGE", "mcp-test")
LONG = "p" * 48

CONFIG = f"""
[defaults]
network = "none"

[profiles.open]
network = "egress"

[spawn_policies.default]
inject_ctl = true
max_concurrent = 8
max_total = 30
total_child_cpus = 8
total_child_memory_mb = 2048
child_max_cpus = 1
child_max_memory = "128M"
allowed_images = ["{IMAGE}"]
child_ttl = 0

[spawn_policies.boss]
inject_ctl = true
child_can_spawn = true
allowed_images = ["{IMAGE}"]

[spawn_policies.{LONG}]
allowed_images = ["{IMAGE}"]
"""


def sh(srv, command: str, sandbox: str = "default") -> tuple[str, str, int]:
    r = srv.call_raw("exec", command=command, sandbox=sandbox, timeout=120, call_timeout=150)
    out = r.structured_content
    assert out is not None, r
    return out["stdout"], out["stderr"], out["exit_code"]


def ctl_spawn(srv, name: str) -> tuple[str, str, int]:
    return sh(srv, f"sandbox-ctl spawn --name '{name}'")


def status_names(srv) -> dict[str, str]:
    """Each sandbox in `status` with its line."""
    text, _ = srv.tool("status")
    return {m.group(1): m.group(0) for m in re.finditer(r"^  (\S+)\s.*$", text, re.M)}


def test_a_child_named_default_never_becomes_the_users_default(server_factory, env, ctl_bin):
    write_config(env, CONFIG)
    srv = server_factory(SANDBOX_CTL_BIN=ctl_bin)
    assert sh(srv, "echo parent > /root/who")[2] == 0
    for squat in ("default", "default.", "default-"):
        out, err, code = ctl_spawn(srv, squat)
        assert (out, err, code) == (f"default..{squat}\n", "", 0), (squat, err)
        # The user's `default` is still the parent, not the attacker's child.
        assert sh(srv, "cat /root/who") == ("parent\n", "", 0), squat
        assert re.search(rf"parent:default\b", status_names(srv)[f"default..{squat}"]), squat
    assert "parent:" not in status_names(srv)["default"]
    # Only by case different from a sibling: the same name, refused.
    _, err, code = ctl_spawn(srv, "DEFAULT")
    assert code == 1 and err == "sandbox-ctl: INVALID_REQUEST: Sandbox 'default..DEFAULT' already exists\n", err
    # The child has its own root: the marker is not there.
    _, _, code = sh(srv, "cat /root/who", sandbox="default..default")
    assert code != 0
    # Each command went where it was sent: the user's to the parent.
    text, _ = srv.tool("history", sandbox="default")
    assert "cat /root/who" in text, text
    text, _ = srv.tool("history", sandbox="default..default")
    assert "cat /root/who" in text and text.count("cat /root/who") == 1, text


def test_names_differing_by_case_or_dots_and_bad_names_are_refused_or_namespaced(server_factory, env, ctl_bin):
    write_config(env, CONFIG)
    srv = server_factory(SANDBOX_CTL_BIN=ctl_bin)
    assert ctl_spawn(srv, "kid") == ("default..kid\n", "", 0)
    # One name whatever its case: volume directories may be case-insensitive.
    _, err, code = ctl_spawn(srv, "KID")
    assert code == 1 and err == "sandbox-ctl: INVALID_REQUEST: Sandbox 'default..KID' already exists\n", err
    for bad in ("..default", ".default", "a..b", "default..kid", "x/y", "a b", "-x", "k" * 49):
        _, err, code = ctl_spawn(srv, bad)
        assert code == 1 and err == f"sandbox-ctl: INVALID_REQUEST: Invalid child name: {bad}\n", (bad, err)
    # Nothing but the one child was made, and no top-level name was touched.
    assert set(status_names(srv)) == {"default", "default..kid"}, status_names(srv)

    # A full name too long for a VM id (with the project's 7-character tag) is refused with its length.
    sh(srv, "true", sandbox=LONG)
    text, err = srv.call("spawn", parent=LONG, name="c" * 7, call_timeout=120)
    assert err and text == (
        f"Error: ValueError: Child name '{'c' * 7}' is too long: its full name '{LONG}..{'c' * 7}' has 57 "
        "characters, at most 56 (63 less the project's tag)"), text
    text, err = srv.call("spawn", parent=LONG, name="c" * 6, call_timeout=120)
    assert not err and text.startswith(f"Spawned child '{LONG}..{'c' * 6}'"), text


def test_a_child_never_takes_another_live_sandbox(server_factory, env, ctl_bin):
    write_config(env, CONFIG)
    srv = server_factory(SANDBOX_CTL_BIN=ctl_bin)
    assert sh(srv, "echo mine > /root/who", sandbox="other")[2] == 0
    assert sh(srv, "true")[2] == 0
    assert ctl_spawn(srv, "other") == ("default..other\n", "", 0)
    assert sh(srv, "cat /root/who", sandbox="other") == ("mine\n", "", 0)
    assert "parent:" not in status_names(srv)["other"]


def test_a_child_never_reads_a_destroyed_sandboxs_workspace(server_factory, env, ctl_bin):
    write_config(env, CONFIG)
    srv = server_factory(SANDBOX_CTL_BIN=ctl_bin)
    assert sh(srv, "echo top-secret > /workspace/secret", sandbox="victim")[2] == 0
    assert not srv.tool("destroy", sandbox="victim")[1]
    assert ctl_spawn(srv, "victim") == ("default..victim\n", "", 0)
    out, err, code = sh(srv, "ls -A /workspace; cat /workspace/secret", sandbox="default..victim")
    assert code != 0 and "top-secret" not in out, (out, err)
    # The preserved workspace is still the user's when the name comes back.
    assert sh(srv, "cat /workspace/secret", sandbox="victim") == ("top-secret\n", "", 0)


def test_an_earlier_childs_workspace_is_not_handed_to_a_new_one(server_factory, env, ctl_bin):
    write_config(env, CONFIG)
    srv = server_factory(SANDBOX_CTL_BIN=ctl_bin)
    assert ctl_spawn(srv, "w")[2] == 0
    assert sh(srv, "echo left > /workspace/f", sandbox="default..w")[2] == 0
    assert sh(srv, "sandbox-ctl destroy w") == ("w\n", "", 0)
    assert ctl_spawn(srv, "w")[2] == 0
    assert sh(srv, "ls -A /workspace", sandbox="default..w") == ("", "", 0)


def test_a_child_never_takes_a_profile_or_policy_by_its_name(server_factory, env, ctl_bin):
    write_config(env, CONFIG)
    srv = server_factory(SANDBOX_CTL_BIN=ctl_bin)
    # Top level, `open` has egress and `boss` sandbox-ctl by their names.
    assert sh(srv, "ls /sys/class/net", sandbox="open")[0] != "lo\n"
    assert sh(srv, "test -S /run/sandbox-ctl.sock", sandbox="boss")[2] == 0
    for name in ("open", "boss"):
        assert ctl_spawn(srv, name) == (f"default..{name}\n", "", 0)
    # The children run under their root's profile (network none) and no policy.
    assert sh(srv, "ls /sys/class/net", sandbox="default..open") == ("lo\n", "", 0)
    assert sh(srv, "test -e /run/sandbox-ctl.sock", sandbox="default..boss")[2] == 1
    text, err = srv.call("spawn", parent="default..boss", call_timeout=120)
    assert err and text == "Error: PermissionError: Sandbox 'default..boss' is not permitted to spawn children", text
    text, _ = srv.tool("children", parent="default..boss")
    assert text == "No active children for 'default..boss' (no spawn policy configured)", text


def test_tools_never_create_a_sandbox_under_a_childs_name(server_factory, env):
    srv = server_factory()
    text, err = srv.tool("exec", command="true", sandbox="default..ghost")
    assert err and text == "Error: no active sandbox 'default..ghost'", text
    text, err = srv.tool("reset", sandbox="default..ghost")
    assert err and text.startswith("Error: invalid sandbox name 'default..ghost'"), text
    srv.tool("exec", command="true")
    text, err = srv.tool("clone", source="default", target="default..copy")
    assert err and "invalid sandbox name 'default..copy'" in text, text
    assert set(status_names(srv)) == {"default"}, status_names(srv)
    # Profiles and policies cannot be named like a child.
    write_config(env, "[profiles.\"default..kid\"]\ncpus = 1\n")
    from mcp.client.stdio import get_default_environment
    import subprocess

    proc = subprocess.run(
        [os.environ["SANDBOX_MCP_BIN"], "serve"], env={**get_default_environment(), **env},
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "invalid sandbox name 'default..kid'" in proc.stderr, proc.stderr


def test_racing_spawns_of_one_name_in_different_cases_make_one_child(server_factory, env, ctl_bin):
    import threading

    write_config(env, CONFIG)
    srv = server_factory(SANDBOX_CTL_BIN=ctl_bin)
    sh(srv, "true")
    results: list[tuple[str, bool]] = []
    lock = threading.Lock()

    def one(name: str) -> None:
        r = srv.call("spawn", name=name, call_timeout=120)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=one, args=(n,)) for n in ("race", "RACE", "Race", "rACE")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [t for t, err in results if not err]
    refused = [t for t, err in results if err]
    assert len(ok) == 1, results
    assert all(re.fullmatch(r"Error: ValueError: Sandbox 'default\.\.\w+' already exists", t) for t in refused), refused
    assert len([n for n in status_names(srv) if n.lower() == "default..race"]) == 1, status_names(srv)
