"""OCI images end to end (issue 23): `sandbox-mcp image pull` from a registry on loopback, `image import` of
OCI layouts (directory and tar) and `docker save` archives, `image export` of images and snapshots, and
sandboxes booted on what came in, on both drivers.

The images are made here from /bin/busybox (tests/registry_support.py): two layers, the top one deleting a file
of the base with a whiteout and adding one, a config with Env and WorkingDir. Each test pulls into an image
store of its own (the `image_store` fixture) and serves MCP from it. Without docker-registry, skopeo or
busybox-static the tests skip, saying which is missing (`make deps TEST_TOOLS=1` installs them).
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import required_env
from registry_support import (AUTH_PASSWORD, AUTH_USER, Entry, Registry, auth_file, busybox_base, busybox_layout,
                              docker_archive, free_port, missing_tools, oci_archive, push, skopeo, tree,
                              write_layout)
from test_vm_isolation import VM_CALL_TIMEOUT, missing_vm_driver

pytestmark = pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))

# What a sandbox on the busybox image shows: the whiteout applied, the file of the top layer, the config's env,
# busybox's sh. (exec runs in /workspace unless told otherwise, whatever the image's WorkingDir.)
BOOT_CHECK = ('test -e /etc/gone && echo gone-present || echo gone-absent; cat /etc/added; echo "$GREETING"; '
              'readlink /bin/sh')
BOOTED = "gone-absent\nadded by layer 2\nhello from oci\nbusybox\n"


def cli(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`sandbox-mcp ARGS` in the test's environment (its config dir, REGISTRY_AUTH_FILE if set)."""
    got = subprocess.run([required_env("SANDBOX_MCP_BIN"), *args], env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=600)
    if check:
        assert got.returncode == 0, (args, got.stdout, got.stderr)
    return got


def failure(got: subprocess.CompletedProcess[str]) -> str:
    """The error a failed command printed: exit status 1, one `sandbox-mcp: ` line after any progress."""
    assert got.returncode == 1 and not got.stdout, (got.returncode, got.stdout, got.stderr)
    errors = [line for line in got.stderr.splitlines() if line.startswith("sandbox-mcp: ")]
    assert len(errors) == 1 and got.stderr.endswith(errors[0] + "\n"), got.stderr
    return errors[0].removeprefix("sandbox-mcp: ")


def run(client, command: str, sandbox: str = "default") -> str:
    """The output of `command`, without exec's closing `(N ms)` line."""
    text, err = client.tool("exec", _timeout=VM_CALL_TIMEOUT, command=command, sandbox=sandbox)
    assert not err, text
    return text.rsplit("(", 1)[0]


def boot(front_end, roots: Path, store: str, image: str, isolation: str = "namespaces"):
    """A stdio server on `store` whose project runs `image` (no network: nothing here needs it)."""
    (roots / ".sandbox-mcp.toml").write_text(f'image = "{image}"\nisolation = "{isolation}"\nnetwork = "none"\n')
    extra = {}
    if isolation == "vm":
        extra["SANDBOX_MCP_VM_DIR"] = os.environ.get("SANDBOX_MCP_VM_DIR", "")
    return front_end(SANDBOX_MCP_IMAGE_STORE=store, SANDBOX_MCP_HOST_ROOTS=str(roots), **extra)


def blob_count(store: str) -> int:
    """Blobs in the store's blob store (its lock files aside)."""
    return sum(len(p.name) == 64 for p in (Path(store) / "blobs" / "sha256").iterdir())


@pytest.fixture
def tmp(env: dict[str, str]) -> Path:
    """A scratch dir in the test's temp dir (removed with it)."""
    d = Path(env["SANDBOX_MCP_TEST_TMP"]) / "scratch"
    d.mkdir()
    return d


@pytest.mark.parametrize("isolation", ["namespaces", "vm"])
def test_pull_by_tag_and_digest_and_boot(isolation, env, front_end, roots, image_store, tmp):
    if isolation == "vm" and missing_vm_driver():
        pytest.skip(str(missing_vm_driver()))
    layout = busybox_layout(tmp / "layout")
    with Registry() as host:
        push(f"oci:{layout.dir}:v1", f"{host}/test/busybox:v1")
        got = cli(env, "image", "pull", f"{host}/test/busybox:v1", "--store", image_store)
        source = f"{host}/test/busybox:v1@{layout.manifest}"
        # Its size as every answer prints it (sandbox_base::size), as the images tool shows it too.
        assert re.fullmatch(rf"image busybox-v1 ready from {re.escape(source)} \(\d+(\.\d)?[KMG]?B\)\n", got.stdout), got.stdout
        lines = got.stderr.splitlines()
        assert f"layer 1/2 sha256:{layout.layers[0][7:19]}… 1.0 MB done" in lines, got.stderr
        assert any(line.startswith(f"layer 2/2 sha256:{layout.layers[1][7:19]}… ") for line in lines), got.stderr
        by_digest = f"{host}/test/busybox@{layout.manifest}"
        got = cli(env, "image", "pull", by_digest, "--name", "pinned", "--store", image_store)
        assert got.stdout.startswith(f"image pinned ready from {by_digest} ("), got.stdout
        assert sum("already present" in line for line in got.stderr.splitlines()) == 2, got.stderr

    listed = cli(env, "image", "list", "--store", image_store).stdout.splitlines()
    row = next(line.split("\t") for line in listed if line.startswith("busybox-v1\t"))
    assert row[-2:] == ["/bin/sh", source], row

    client = boot(front_end, roots, image_store, "busybox-v1", isolation)
    assert run(client, BOOT_CHECK) == BOOTED
    assert run(client, "echo hi > /tmp/x; cat /tmp/x; id -u") == "hi\n0\n"
    rows = client.tool("images")[0].splitlines()
    assert next(r for r in rows if r.startswith("busybox-v1 ")).endswith(f"from {source}"), rows


def test_a_second_image_fetches_only_its_own_layer(env, image_store, tmp):
    first = busybox_layout(tmp / "one", added="first\n")
    second = busybox_layout(tmp / "two", added="second\n")
    assert first.layers[0] == second.layers[0] and first.layers[1] != second.layers[1]
    with Registry() as host:
        push(f"oci:{first.dir}:v1", f"{host}/test/one:v1")
        push(f"oci:{second.dir}:v1", f"{host}/test/two:v1")
        cli(env, "image", "pull", f"{host}/test/one:v1", "--store", image_store)
        before = blob_count(image_store)
        got = cli(env, "image", "pull", f"{host}/test/two:v1", "--store", image_store)
    lines = got.stderr.splitlines()
    assert f"layer 1/2 sha256:{first.layers[0][7:19]}… already present" in lines, got.stderr
    assert not any(line.startswith("layer 2/2") and "already present" in line for line in lines), got.stderr
    # Its own layer, config and manifest.
    assert blob_count(image_store) == before + 3


@pytest.mark.parametrize("form", ["layout-dir", "layout-tar", "docker-save"])
def test_import_and_boot(form, env, front_end, roots, image_store, tmp):
    layout = busybox_layout(tmp / "layout")
    path = {
        "layout-dir": lambda: layout.dir,
        "layout-tar": lambda: oci_archive(layout, tmp / "layout.tar"),
        "docker-save": lambda: docker_archive(layout, tmp / "saved.tar", "test/busybox:v1"),
    }[form]()
    got = cli(env, "image", "import", str(path), "--name", "imported", "--store", image_store)
    assert got.stdout.startswith(f"image imported ready from {path}@sha256:"), got.stdout
    listed = cli(env, "image", "list", "--store", image_store).stdout
    assert f"\t{path}@sha256:" in listed, listed
    client = boot(front_end, roots, image_store, "imported")
    assert run(client, BOOT_CHECK) == BOOTED


def test_export_an_image_and_a_snapshot_and_pull_them_back(env, front_end, roots, image_store, tmp):
    layout = busybox_layout(tmp / "layout")
    with Registry() as host:
        push(f"oci:{layout.dir}:v1", f"{host}/test/busybox:v1")
        cli(env, "image", "pull", f"{host}/test/busybox:v1", "--name", "bb", "--store", image_store)
        exported = tmp / "bb.tar"
        got = cli(env, "image", "export", "bb", str(exported), "--store", image_store)
        assert got.stdout == f"image 'bb' written to {exported}\n", got.stdout
        inspected = skopeo("inspect", f"oci-archive:{exported}")
        assert inspected.returncode == 0, inspected.stderr
        again = failure(cli(env, "image", "export", "bb", str(exported), "--store", image_store, check=False))
        assert "refusing to overwrite it" in again, again

        client = boot(front_end, roots, image_store, "bb")
        run(client, "echo kept > /root/written.txt; rm /etc/added")
        text, err = client.tool("snapshot", snapshot_name="snap1")
        assert not err, text
        snap = tmp / "snap.tar"
        got = cli(env, "image", "export", "--snapshot", "snap1", str(snap), "--store", image_store)
        assert got.stdout == f"snapshot 'snap1' written to {snap}\n", got.stdout
        assert skopeo("inspect", f"oci-archive:{snap}").returncode == 0

        push(f"oci-archive:{snap}", f"{host}/test/snap:1")
        cli(env, "image", "pull", f"{host}/test/snap:1", "--name", "back", "--store", image_store)
    client = boot(front_end, roots, image_store, "back")
    assert run(client, 'cat /root/written.txt; test -e /etc/added || echo added-gone; echo "$GREETING"') == (
        "kept\nadded-gone\nhello from oci\n")


def hostile_layers(sentinel: Path) -> dict[str, tuple[list[Entry], str]]:
    """Layers that try to write outside the rootfs, each with what its refusal names: a `..` name, an absolute
    name under a symlink that points out, a relative one under it (resolved inside the rootfs, so the symlink
    points at the rootfs's own path of that name), a hard link to a host file."""
    out = "/" + "../" * 16 + str(sentinel).lstrip("/")
    return {
        "dotdot": ([Entry("../" * 8 + "escape", data=b"out\n")], 'climbs out with `..`'),
        "absolute-via-symlink": ([Entry("link", "symlink", link=out), Entry("/link/planted", data=b"out\n")],
                                 '"/link/planted": is an absolute path'),
        "relative-via-symlink": ([Entry("link", "symlink", link=out), Entry("link/planted", data=b"out\n")], ""),
        "hardlink-to-host": ([Entry("stolen", "hardlink", link=str(sentinel / "host.txt"))],
                             '"stolen" -> "' + str(sentinel / "host.txt") + '": is an absolute path'),
    }


@pytest.mark.parametrize("kind", ["dotdot", "absolute-via-symlink", "relative-via-symlink", "hardlink-to-host"])
def test_hostile_archives_stay_inside_the_store(kind, env, image_store, tmp):
    sentinel = tmp / "sentinel"
    sentinel.mkdir()
    (sentinel / "host.txt").write_text("host file\n")
    layer, refusal = hostile_layers(sentinel)[kind]
    layout = write_layout(tmp / "hostile", "v1", [busybox_base(), layer], {"Env": ["PATH=/bin"]})
    # The test's temp dir holds the sentinel, the store and the layout: nothing new may appear beside them.
    outside = Path(image_store).parent
    before = sorted(os.listdir(outside))
    sentinel_before = list(tree(sentinel))

    got = cli(env, "image", "import", str(layout.dir), "--name", "hostile", "--store", image_store, check=False)
    if refusal:
        message = failure(got)
        assert refusal in message, message
        assert "hostile" not in cli(env, "image", "list", "--store", image_store).stdout
    elif got.returncode:
        assert failure(got)
    else:
        inside = Path(image_store) / "hostile" / "rootfs" / str(sentinel).lstrip("/") / "planted"
        assert inside.read_text() == "out\n"
    assert list(tree(sentinel)) == sentinel_before
    assert sorted(os.listdir(outside)) == before
    assert not Path("/escape").exists()


def test_errors_name_the_problem(env, image_store, tmp):
    def pull(*args: str) -> str:
        return failure(cli(env, "image", "pull", *args, "--store", image_store, check=False))

    assert pull("Bad:Ref") == 'invalid image reference "Bad:Ref": the repository name must be lowercase'
    closed = f"127.0.0.1:{free_port()}"
    got = pull(f"{closed}/x:1")
    assert got.startswith(f"registry {closed}: ") and "Connection refused" in got, got

    layout = busybox_layout(tmp / "layout")
    with Registry() as host:
        push(f"oci:{layout.dir}:v1", f"{host}/test/busybox:v1")
        got = pull(f"{host}/test/busybox:nope")
        assert got.startswith(f"registry {host}: ") and "not found" in got, got
        cli(env, "image", "pull", f"{host}/test/busybox:v1", "--name", "taken", "--store", image_store)
        got = pull(f"{host}/test/busybox:v1", "--name", "taken")
        assert got == 'image "taken" already exists: pass --force to replace it', got
        got = cli(env, "image", "pull", f"{host}/test/busybox:v1", "--name", "taken", "--force", "--store",
                  image_store)
        assert got.stdout.startswith("image taken ready from "), got.stdout
    # A name in the snapshots' namespace would be listed and deleted as one.
    reserved = "image names starting with 'mcp-snap-' are reserved for snapshots"
    assert pull(f"{closed}/x:1", "--name", "mcp-snap-x") == reserved
    got = failure(cli(env, "image", "import", str(layout.dir), "--name", "mcp-snap-x", "--store", image_store,
                      check=False))
    assert got == reserved, got
    assert "mcp-snap-x" not in cli(env, "image", "list", "--store", image_store).stdout
    got = failure(cli(env, "image", "import", str(tmp / "nothing"), "--name", "x", "--store", image_store,
                      check=False))
    assert got.startswith(f"cannot import {tmp / 'nothing'}: "), got
    got = failure(cli(env, "image", "export", "absent", str(tmp / "x.tar"), "--store", image_store, check=False))
    assert got.startswith("cannot export image 'absent': ") and "not found" in got, got


def test_ctrl_c_cancels_a_pull(env, image_store):
    # A "registry" that accepts and never answers: the pull waits on it until SIGINT (what Ctrl-C sends).
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        host = f"127.0.0.1:{silent.getsockname()[1]}"
        pull = subprocess.Popen([required_env("SANDBOX_MCP_BIN"), "image", "pull", f"{host}/x:1", "--store",
                                 image_store], env={**os.environ, **env}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        conn, _ = silent.accept()
        pull.send_signal(signal.SIGINT)
        out, err = pull.communicate(timeout=60)
        conn.close()
    assert (pull.returncode, out) == (1, ""), (out, err)
    assert err.endswith('sandbox-mcp: cancelled: nothing was installed as image "x-1"\n'), err
    assert sorted(os.listdir(image_store)) == [required_env("SANDBOX_MCP_TEST_IMAGE")]


def test_a_registry_with_basic_auth(env, front_end, roots, image_store, tmp):
    layout = busybox_layout(tmp / "layout")
    with Registry(auth=True) as host:
        push(f"oci:{layout.dir}:v1", f"{host}/test/private:v1", f"--dest-creds={AUTH_USER}:{AUTH_PASSWORD}")
        reference = f"{host}/test/private:v1"
        # No credentials anywhere the pull looks: the test's own (empty) auth file.
        empty = tmp / "empty-auth.json"
        empty.write_text("{}")
        got = failure(cli({**env, "REGISTRY_AUTH_FILE": str(empty)}, "image", "pull", reference, "--store",
                          image_store, check=False))
        assert got.startswith(f"registry {host} refused access to test/private") and "log in" in got, got
        wrong = auth_file(tmp / "wrong.json", host, password="wrong")
        got = failure(cli({**env, "REGISTRY_AUTH_FILE": str(wrong)}, "image", "pull", reference, "--store",
                          image_store, check=False))
        assert "refused access" in got and "wrong" not in got.split("(")[0], got
        good = auth_file(tmp / "auth.json", host)
        got = cli({**env, "REGISTRY_AUTH_FILE": str(good)}, "image", "pull", reference, "--name", "private",
                  "--store", image_store)
        assert got.stdout.startswith(f"image private ready from {reference}@"), got.stdout
    client = boot(front_end, roots, image_store, "private")
    assert run(client, BOOT_CHECK) == BOOTED
