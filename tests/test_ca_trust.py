"""Host CA trust (trust_host_ca) through a real MCP client. Networks that
re-sign TLS with a CA the host trusts (companies, and this machine's) break
HTTPS in sandboxes unless the sandbox trusts the host's bundle too. These
tests talk HTTPS to the package registries, the one place test traffic may go
besides loopback."""
import hashlib
import re
from pathlib import Path

import pytest

from conftest import write_config

BUNDLE = "/etc/sandbox-mcp/ca-bundle.crt"
SYSTEM = "/etc/ssl/certs/ca-certificates.crt"
LOCAL = "/usr/local/share/ca-certificates/sandbox-mcp-host.crt"
VARIABLES = ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE"]
CURL = "curl -sSf https://pypi.org/simple/six/ -o /dev/null"
PIP = "python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check -d /tmp/x six"
NET_TIMEOUT = 120
PEM = re.compile(r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.S)
HOST_BUNDLES = ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"]


# Prints, for each file given, a line of the sha256 of each certificate in it
# (its base64 body without whitespace): bundles are larger than exec's output cap.
CERT_DIGESTS = r"""
import hashlib, re, sys
for path in sys.argv[1:]:
    text = open(path, errors="replace").read()
    bodies = re.findall(r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", text, re.S)
    print(" ".join(hashlib.sha256("".join(b.split()).encode()).hexdigest()[:16] for b in bodies))
"""


def certs(text: str) -> list[str]:
    """The certificates of a PEM text, as digests of their bodies."""
    return [hashlib.sha256("".join(m.split()).encode()).hexdigest()[:16] for m in PEM.findall(text)]


def host_certs() -> list[str]:
    """The certificates of the bundle the server reads: the test servers run
    without SSL_CERT_FILE (the MCP SDK passes on only a few variables), so
    the first of the usual places."""
    for path in HOST_BUNDLES:
        if Path(path).is_file():
            return certs(Path(path).read_text(errors="replace"))
    pytest.fail("this host has no CA bundle", pytrace=False)


def sh(srv, command: str, sandbox: str = "default", timeout: int = 60) -> tuple[str, str, int]:
    r = srv.call_raw("exec", command=command, sandbox=sandbox, timeout=timeout, call_timeout=timeout + 30)
    out = r.structured_content
    assert out is not None, r
    return out["stdout"], out["stderr"], out["exit_code"]


def digests(srv, path: str, sandbox: str = "default") -> list[str]:
    """The certificates in a sandbox file, as digests (see CERT_DIGESTS)."""
    out, err, code = sh(srv, f"python3 - {path} <<'EOF'\n{CERT_DIGESTS}\nEOF", sandbox)
    assert code == 0, err
    return out.split()


def digest(srv, path: str, sandbox: str = "default") -> str:
    """sha256 of a sandbox file."""
    out, err, code = sh(srv, f"sha256sum {path}", sandbox)
    assert code == 0, err
    return out.split()[0]


def image_lacks_host_certs(srv) -> bool:
    """Whether the host trusts a CA the image does not (a re-signing
    network): only then can an untrusting sandbox fail where the host works."""
    return bool(set(host_certs()) - set(digests(srv, SYSTEM)))


def test_trust_is_on_by_default(srv):
    out, err, code = sh(srv, "env")
    assert code == 0, err
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    for key in VARIABLES:
        assert env.get(key) == BUNDLE, (key, out)
    # The system store is the same bundle; it has every host certificate,
    # each once.
    assert digest(srv, SYSTEM) == digest(srv, BUNDLE)
    inside = digests(srv, BUNDLE)
    assert set(host_certs()) <= set(inside)
    assert len(inside) == len(set(inside)), "a certificate appears twice"
    out, _, code = sh(srv, f"stat -c '%a %u %F' {SYSTEM}; readlink {BUNDLE}")
    assert out.splitlines() == ["644 0 regular file", SYSTEM], out

    out, err, code = sh(srv, CURL, timeout=NET_TIMEOUT)
    assert code == 0, (out, err)
    out, err, code = sh(srv, PIP, timeout=NET_TIMEOUT)
    assert code == 0, (out, err)
    out, _, _ = sh(srv, "ls /tmp/x")
    assert re.search(r"^six-.*\.whl$", out, re.M), out


def test_update_ca_certificates_inside_keeps_the_host_certificates(srv):
    """A package install may rebuild the system store; the host's
    certificates come back from /usr/local/share/ca-certificates."""
    out, err, code = sh(srv, "update-ca-certificates --fresh", timeout=NET_TIMEOUT)
    assert code == 0, (out, err)
    assert set(host_certs()) <= set(digests(srv, BUNDLE))
    out, err, code = sh(srv, CURL, timeout=NET_TIMEOUT)
    assert code == 0, (out, err)


@pytest.mark.parametrize("where", ["project", "config"])
def test_trust_off_leaves_the_image_store_alone(server_factory, env, roots, where):
    if where == "project":
        (roots / ".sandbox-mcp.toml").write_text("trust_host_ca = false\n")
    else:
        write_config(env, "[defaults]\ntrust_host_ca = false\n")
    srv = server_factory(SANDBOX_MCP_HOST_ROOTS=str(roots))
    out, _, _ = sh(srv, "env")
    assert not any(line.split("=", 1)[0] in VARIABLES for line in out.splitlines()), out
    _, _, code = sh(srv, f"test -e {BUNDLE}")
    assert code == 1
    text, err = srv.tool("validate_config")
    assert not err and "trust_host_ca=false" in text, text
    if not image_lacks_host_certs(srv):
        pytest.skip("the host trusts no CA the image lacks: untrusting sandboxes reach the registries too")
    out, err, code = sh(srv, CURL, timeout=NET_TIMEOUT)
    assert code == 60, (code, out, err)
    out, err, code = sh(srv, PIP, timeout=NET_TIMEOUT)
    assert code != 0 and "CERTIFICATE_VERIFY_FAILED" in out + err, (code, out, err)


def test_reset_restore_and_children_trust_again(server_factory, env, image_store, roots):
    write_config(env, "[spawn_policies.default]\nchild_ttl = 0\n")
    srv = server_factory(SANDBOX_MCP_IMAGE_STORE=image_store, SANDBOX_MCP_HOST_ROOTS=str(roots))
    before = digest(srv, BUNDLE)
    # A sandbox can spoil its own store; a reset makes a new one.
    sh(srv, f": > {SYSTEM}; rm {BUNDLE}")
    text, err = srv.tool("reset")
    assert not err, text
    assert digest(srv, BUNDLE) == before and digest(srv, SYSTEM) == before
    # A snapshot carries the bundle; restoring adds nothing twice.
    text, err = srv.tool("snapshot", snapshot_name="trusted")
    assert not err, text
    text, err = srv.call("restore", snapshot_name="trusted", sandbox="again", call_timeout=120)
    assert not err, text
    assert digest(srv, BUNDLE, "again") == before
    # Children trust the host too.
    text, err = srv.call("spawn", call_timeout=120)
    assert not err, text
    child = re.search(r"Spawned child '([^']+)'", text).group(1)
    assert digest(srv, BUNDLE, child) == before
    out, _, _ = sh(srv, "echo $SSL_CERT_FILE", child)
    assert out == f"{BUNDLE}\n"


def test_a_symlinked_store_is_replaced_not_followed(server_factory, image_store, roots):
    """A snapshot whose system store is a symlink (to the sandbox's own
    /etc/passwd, or out into its workspace volume on the host) gets a
    regular file there: the bundle is never written through the link."""
    srv = server_factory(SANDBOX_MCP_IMAGE_STORE=image_store, SANDBOX_MCP_HOST_ROOTS=str(roots))
    passwd = digest(srv, "/etc/passwd")
    sh(srv, f"ln -sf /etc/passwd {SYSTEM} && ln -sf /workspace/planted {BUNDLE}")
    text, err = srv.tool("snapshot", snapshot_name="linked")
    assert not err, text
    text, err = srv.call("restore", snapshot_name="linked", sandbox="victim", call_timeout=120)
    assert not err, text
    assert digest(srv, "/etc/passwd", "victim") == passwd
    out, _, _ = sh(srv, f"stat -c %F {SYSTEM}; readlink {BUNDLE}; ls /workspace", "victim")
    assert out.splitlines()[:2] == ["regular file", SYSTEM], out
    assert "planted" not in out, out
    assert set(host_certs()) <= set(digests(srv, SYSTEM, "victim"))


def fake_cert(body: str) -> str:
    return f"-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n"


def test_later_sandboxes_of_an_image_get_the_same_trust(server_factory, image_store, roots):
    """The first sandbox of an image merges its bundle after its start; later
    ones get the files placed before they start. Both must hold the same
    store, and a snapshot rebuilt under the same name must not get the files
    made for its old build."""
    srv = server_factory(SANDBOX_MCP_IMAGE_STORE=image_store, SANDBOX_MCP_HOST_ROOTS=str(roots))
    show = f"stat -c '%a %u %F' {SYSTEM}; readlink {BUNDLE}; cat {LOCAL} | sha256sum; sha256sum {SYSTEM} {BUNDLE}"
    first, err, code = sh(srv, show)
    assert code == 0, err
    for name in ("second", "third"):
        out, err, code = sh(srv, show, name)
        assert code == 0 and out == first, (name, out, first, err)
    assert first.splitlines()[:2] == ["644 0 regular file", SYSTEM], first
    assert set(host_certs()) <= set(digests(srv, SYSTEM, "third"))
    # A snapshot "rebuilt": same name, another bundle in its layer.
    for n, cert in enumerate(["Zmlyc3Q=", "c2Vjb25k"]):
        sh(srv, f"printf '%s' '{fake_cert(cert)}' >> {SYSTEM}", "default")
        if n:
            text, err = srv.tool("delete_snapshot", snapshot_name="rebuilt")
            assert not err, text
        text, err = srv.tool("snapshot", snapshot_name="rebuilt", sandbox="default")
        assert not err, text
        text, err = srv.call("restore", snapshot_name="rebuilt", sandbox=f"from-{n}", call_timeout=120)
        assert not err, text
    got = digests(srv, SYSTEM, "from-1")
    want = certs(fake_cert("Zmlyc3Q=") + fake_cert("c2Vjb25k"))
    assert set(want) <= set(got), "the second build's bundle is what the sandbox has"
    assert set(host_certs()) <= set(got)
    out, _, _ = sh(srv, f"readlink {BUNDLE}", "from-1")
    assert out == f"{SYSTEM}\n", out
