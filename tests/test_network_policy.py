"""Egress policies, disk quotas and host CA trust as configuration, through a
real MCP client: every form of `network`, `disk` and `trust_host_ca` in the
user config and `.sandbox-mcp.toml`, every error naming its key (in
validate_config and on a real server), the settings reaching the helper
(GetVm over gRPC), network_info's policy lines, and the rule that a child's
network is its parent's, tried by a hostile parent through every way it has
to start a child."""
import base64
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import CTL_RAW_CLIENT as RAW_CLIENT, sandbox_key, write_config
from test_grpc import SERVICE, grpcurl_path

IMAGE = os.environ.get("SANDBOX_MCP_TEST_IMAGE", "mcp-test")
SPAWN_TIMEOUT = 120.0
DEFAULT_POLICY = "  policy: default: public internet; never the host, loopback or private ranges"


def sh(srv, command: str, sandbox: str = "default", timeout: int = 60) -> tuple[str, str, int]:
    r = srv.call_raw("exec", command=command, sandbox=sandbox, timeout=timeout, call_timeout=timeout + 60)
    out = r.structured_content
    assert out is not None, r
    return out["stdout"], out["stderr"], out["exit_code"]


def assert_disk(spec: dict, want: int) -> None:
    """The disk quota GetVm echoes. A helper without disk quotas (before
    wp-hardening's) leaves the field out: then VmSpec.disk_bytes is covered by
    helper_client's unit test only."""
    if "diskBytes" in spec:
        assert int(spec["diskBytes"]) == want, spec


def get_vm(env: dict[str, str], name: str) -> dict:
    """The helper's view of sandbox `name`'s VM (GetVm over gRPC; its id is the sandbox's key)."""
    sock = Path(env["XDG_RUNTIME_DIR"]) / "sandbox-mcp" / "helper.sock"
    vm_id = sandbox_key(name)
    cmd = [grpcurl_path(), "-plaintext", "-unix", "-authority", "localhost", "-d", json.dumps({"id": vm_id}),
           str(sock), f"{SERVICE}/GetVm"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["vm"]


def interfaces(srv, sandbox: str) -> list[str]:
    out, err, code = sh(srv, "ls /sys/class/net", sandbox)
    assert code == 0, err
    return out.split()


def block(info: str, name: str) -> list[str]:
    """network_info's lines for one sandbox: its row and the indented lines under it."""
    lines = info.split("\n")
    start = next(i for i, line in enumerate(lines) if re.match(rf"{re.escape(name)}\s+{re.escape(name)}  net:", line))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return lines[start:end]


# ------------------------------------------------------------ every form


@pytest.mark.parametrize(
    "text, summary",
    [
        ('network = "none"\n', "network=none disk=10G trust_host_ca=true"),
        ('network = "egress"\n', "network=egress disk=10G trust_host_ca=true"),
        ("network = {}\n", "network=egress disk=10G trust_host_ca=true"),
        ('network = { allow = ["PyPI.org", "*.pythonhosted.org:443"], deny = ["203.0.113.0/24"] }\ndisk = "20G"\n',
         "network=egress allow=pypi.org,*.pythonhosted.org:443 deny=203.0.113.0/24 disk=20G trust_host_ca=true"),
        ('trust_host_ca = false\ndisk = "512M"\n[network]\ndeny = ["[2001:db8::1]:443"]\n',
         "network=egress deny=[2001:db8::1]:443 disk=512M trust_host_ca=false"),
    ],
)
def test_validate_config_shows_every_form(srv, roots, text, summary):
    (roots / ".sandbox-mcp.toml").write_text(text)
    out, err = srv.tool("validate_config")
    assert not err and out.startswith(f"Config OK: image={IMAGE} cpus=2 memory=512M {summary} ("), out


def test_validate_config_names_every_problem(srv, roots):
    path = roots / ".sandbox-mcp.toml"
    path.write_text(
        'disk = "lots"\ntrust_host_ca = "yes"\n'
        '[network]\nallow = ["pypi.org", "not a rule", 3, "10.0.0.0/33", "example.org:99999"]\ndeny = "x"\nports = []\n'
    )
    text, err = srv.tool("validate_config")
    assert err, text
    lines = text.split("\n")
    assert lines[0] == f"Error: {path.resolve()} has 5 problem(s):", text
    for want in [
        "  disk: invalid disk size 'lots' (use e.g. 10G or 512M)",
        '  trust_host_ca: expected true or false, not "yes"',
        "  network.allow[2]: expected a rule string, not 3",
        "  network.deny: expected a list of rule strings",
        "  network.ports: is not supported (allowed: allow, deny)",
    ]:
        assert want in lines, (want, text)
    # Once the lists have the right shape, each bad rule is named.
    path.write_text('disk = 20\n[network]\nallow = ["pypi.org", "not a rule", "10.0.0.0/33", "example.org:99999"]\n')
    text, err = srv.tool("validate_config")
    lines = text.split("\n")
    assert err and lines[0].endswith("has 4 problem(s):"), text
    assert '  disk: expected a size string such as "20G", not 20' in lines, text
    for i, rule in [(1, "not a rule"), (2, "10.0.0.0/33"), (3, "example.org:99999")]:
        assert any(line.startswith(f"  network.allow[{i}]: ") and rule in line for line in lines), (i, text)
    for bad, want in [
        ("network = 7\n", '  network: must be "egress", "none" or a table { allow = [...], deny = [...] }, not 7'),
        ('network = ["egress"]\n', '  network: must be "egress", "none" or a table'),
        ('network = "wifi"\n', '  network: must be "egress", "none" or a table'),
        ('disk = "1M"\n', "  disk: disk must be at least 64M (got '1M')"),
        ("trust_host_ca = 1\n", "  trust_host_ca: expected true or false, not 1"),
    ]:
        path.write_text(bad)
        text, err = srv.tool("validate_config")
        assert err and text.split("\n")[1].startswith(want), (bad, text)


def test_a_bad_rule_in_the_project_file_refuses_creation(srv, roots):
    (roots / ".sandbox-mcp.toml").write_text('network = { allow = ["pypi.org", "not a rule"] }\n')
    text, err = srv.tool("exec", command="true")
    assert err and "is invalid (see validate_config): network.allow[1]: " in text and "not a rule" in text, text
    assert srv.tool("status")[0].startswith("No active sandboxes")


@pytest.mark.parametrize(
    "config, extra_env, message",
    [
        ('[profiles.x]\nnetwork = { allow = ["ok.org", "not a rule"] }\n', {}, "config profiles.x.network.allow[1]: "),
        ("[profiles.x.network]\ndeny = [1]\n", {}, "config profiles.x.network.deny[0]: expected a rule string, not 1"),
        ('[profiles.x.network]\nallow = "ok.org"\n', {}, "config profiles.x.network.allow: expected a list"),
        ("[profiles.x.network]\nports = [443]\n", {}, "config profiles.x.network.ports: is not supported"),
        ("[defaults]\nnetwork = 1\n", {}, 'config defaults.network: must be "egress", "none" or a table'),
        ('[defaults]\ndisk = "huge"\n', {}, "config defaults.disk: invalid disk size 'huge'"),
        ("[defaults]\ndisk = 20\n", {}, 'config defaults.disk: expected a size string such as "20G", not 20'),
        ('[profiles.x]\ntrust_host_ca = "yes"\n', {}, "config profiles.x.trust_host_ca: expected true or false"),
        ("", {"SANDBOX_MCP_NETWORK": "wifi"}, "config SANDBOX_MCP_NETWORK: must be 'egress' or 'none', not 'wifi'"),
    ],
)
def test_bad_user_config_stops_the_server(server_factory, env, config, extra_env, message):
    write_config(env, config)
    with pytest.raises(AssertionError) as e:
        server_factory(**extra_env)
    assert "did not start" in str(e.value) and message in str(e.value), str(e.value)


# ------------------------------------------------------------ reaching the helper

POLICY_CONFIG = """
[defaults]
disk = "20G"
[profiles.pypi.network]
allow = ["PyPI.org", "*.pythonhosted.org:443"]
deny = ["203.0.113.0/24"]
[profiles.off]
network = "none"
disk = "1G"
[profiles.plain]
trust_host_ca = false
"""


def test_settings_reach_the_helper_and_network_info(server_factory, env):
    write_config(env, POLICY_CONFIG)
    srv = server_factory()
    for name in ["pypi", "off", "plain"]:
        assert sh(srv, "true", name)[2] == 0

    spec = get_vm(env, "pypi")["spec"]
    assert spec["network"] == "NETWORK_MODE_EGRESS"
    policy = {"allow": ["pypi.org", "*.pythonhosted.org:443"], "deny": ["203.0.113.0/24"]}
    assert spec["networkPolicy"] == policy, spec
    assert_disk(spec, 20 << 30)
    assert json.loads(spec["labels"]["sandbox-mcp.network"]) == {"egress": policy}, spec
    assert spec["env"]["SSL_CERT_FILE"] == "/etc/sandbox-mcp/ca-bundle.crt", spec
    spec = get_vm(env, "off")["spec"]
    assert spec["network"] == "NETWORK_MODE_NONE" and "networkPolicy" not in spec, spec
    assert_disk(spec, 1 << 30)
    spec = get_vm(env, "plain")["spec"]
    # The default policy is sent unset, as the contract says; no CA variables.
    assert spec["network"] == "NETWORK_MODE_EGRESS" and "networkPolicy" not in spec, spec
    assert "SSL_CERT_FILE" not in spec.get("env", {}), spec
    assert interfaces(srv, "off") == ["lo"]
    assert len(interfaces(srv, "pypi")) > 1

    info, err = srv.tool("network_info")
    assert not err, info
    assert block(info, "pypi") == [
        "pypi          pypi  net:egress  shell:alive",
        "  policy: deny rules first, then allow; never the host or loopback",
        "  allow: pypi.org, *.pythonhosted.org:443",
        "  deny: 203.0.113.0/24",
    ], info
    assert block(info, "off") == ["off           off  net:none  shell:alive", "  policy: loopback only"], info
    assert block(info, "plain")[:2] == ["plain         plain  net:egress  shell:alive", DEFAULT_POLICY], info
    status, _ = srv.tool("status")
    assert "pypi(2cpu/512M, egress (outbound only, allow=pypi.org,*.pythonhosted.org:443 deny=203.0.113.0/24))" in status


def host_address() -> str:
    """One of the host's own global addresses (the helper refuses them all)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True).stdout
    found = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/", out)
    if not found:
        pytest.skip("this host has no global IPv4 address")
    return found.group(1)


def test_network_info_shows_refused_connections(server_factory):
    """A connection to the host's own address is refused at once, and
    network_info says so with the reason."""
    srv = server_factory()
    addr = host_address()
    code = f"import socket\ntry:\n    socket.create_connection(('{addr}', 9), timeout=10)\n    print('connected')\n" \
           "except OSError as e:\n    print('refused', e)\n"
    out, err = srv.tool("python", code=code)
    assert not err and out.startswith("refused"), out
    info, err = srv.tool("network_info")
    assert not err, info
    lines = block(info, "default")
    assert lines[:2] == ["default       default  net:egress  shell:alive", DEFAULT_POLICY], info
    refused = [line for line in lines if line.startswith("  refused tcp ")]
    assert refused and refused[-1].startswith(f"  refused tcp {addr}:9 \u2014 "), info
    assert re.search(r"^  \d+ refused, \d+ allowed since start$", info, re.M), info


# ------------------------------------------------------------ children

CHILD_CONFIG = f"""
[profiles.boss]
network = "none"
[profiles.policed.network]
allow = ["pypi.org"]
[profiles.wide]
network = "egress"
[spawn_policies.boss]
inject_ctl = true
allowed_images = ["{IMAGE}"]
child_ttl = 0
max_concurrent = 8
max_total = 20
total_child_memory_mb = 4096
child_max_cpus = 1
total_child_cpus = 8
[spawn_policies.policed]
allowed_images = ["{IMAGE}"]
child_ttl = 0
"""

# Sends one raw sandbox-ctl request (base64 in argv[1]) and prints the answer.
def ctl(srv, command: str) -> tuple[str, str, int]:
    return sh(srv, command, "boss", timeout=int(SPAWN_TIMEOUT))


def test_a_child_never_gets_a_wider_network_than_its_parent(server_factory, env, ctl_bin):
    """`boss` has no network; the default, a profile named `wide` and the
    env override all say egress. Every way boss has to start a child gives
    one with loopback only. A parent under a policy gives its child that policy."""
    write_config(env, CHILD_CONFIG)
    srv = server_factory(SANDBOX_CTL_BIN=ctl_bin, SANDBOX_MCP_NETWORK="egress")
    assert interfaces(srv, "boss") == ["lo"]

    out, err, code = ctl(srv, "sandbox-ctl spawn")
    assert code == 0, err
    plain = out.strip()
    out, err, code = ctl(srv, f"sandbox-ctl exec {plain} -- ls /sys/class/net")
    assert (out, code) == ("lo\n", 0), (out, err)
    # Asking for a name with a wider profile: refused, or still no network.
    out, err, code = ctl(srv, "sandbox-ctl spawn --name wide")
    if code == 0:
        out, err, code = ctl(srv, f"sandbox-ctl exec {out.strip()} -- ls /sys/class/net")
        assert (out, code) == ("lo\n", 0), (out, err)
    # A throwaway child.
    out, err, code = ctl(srv, "sandbox-ctl run -- ls /sys/class/net")
    assert (out, code) == ("lo\n", 0), (out, err)
    # A raw request asking for egress in every spelling the protocol could take.
    srv.call("write_file", path="/workspace/raw.py", content=RAW_CLIENT, sandbox="boss")
    request = {"id": 1, "method": "spawn",
               "params": {"network": "egress", "network_policy": {"allow": ["0.0.0.0/0"]}, "trust_host_ca": True}}
    payload = base64.b64encode(json.dumps(request).encode() + b"\n").decode()
    out, err, code = ctl(srv, f"python3 /workspace/raw.py {payload}")
    answer = json.loads(out)
    if "result" in answer:
        child = answer["result"]["name"]
        out, err, code = ctl(srv, f"sandbox-ctl exec {child} -- ls /sys/class/net")
        assert (out, code) == ("lo\n", 0), (out, err)
    # Through the spawn tool.
    text, err = srv.call("spawn", parent="boss", call_timeout=SPAWN_TIMEOUT)
    assert not err, text
    tool_child = re.search(r"Spawned child '([^']+)'", text).group(1)
    assert interfaces(srv, tool_child) == ["lo"]
    info, _ = srv.tool("network_info")
    assert block(info, tool_child)[:2] == [f"{tool_child:<12}  {tool_child}  net:none  shell:alive",
                                           "  policy: loopback only"], info
    assert get_vm(env, tool_child)["spec"]["network"] == "NETWORK_MODE_NONE"

    # Under a policy: the child gets exactly the parent's.
    text, err = srv.call("exec", command="true", sandbox="policed")
    assert not err, text
    text, err = srv.call("spawn", parent="policed", call_timeout=SPAWN_TIMEOUT)
    assert not err, text
    kid = re.search(r"Spawned child '([^']+)'", text).group(1)
    parent_spec, kid_spec = get_vm(env, "policed")["spec"], get_vm(env, kid)["spec"]
    assert kid_spec["network"] == "NETWORK_MODE_EGRESS"
    assert kid_spec["networkPolicy"] == parent_spec["networkPolicy"] == {"allow": ["pypi.org"]}, kid_spec
    assert kid_spec["labels"]["sandbox-mcp.network"] == parent_spec["labels"]["sandbox-mcp.network"]
    info, _ = srv.tool("network_info")
    assert "  allow: pypi.org" in block(info, kid), info

    # A new server reads the parent's network back from its VM.
    srv.close()
    srv = server_factory(SANDBOX_CTL_BIN=ctl_bin, SANDBOX_MCP_NETWORK="egress")
    out, err, code = ctl(srv, "sandbox-ctl spawn")
    assert code == 0, err
    out, err, code = ctl(srv, f"sandbox-ctl exec {out.strip()} -- ls /sys/class/net")
    assert (out, code) == ("lo\n", 0), (out, err)
    text, err = srv.call("spawn", parent="policed", call_timeout=SPAWN_TIMEOUT)
    assert not err, text
    kid2 = re.search(r"Spawned child '([^']+)'", text).group(1)
    assert get_vm(env, kid2)["spec"]["labels"]["sandbox-mcp.network"] == parent_spec["labels"]["sandbox-mcp.network"]
