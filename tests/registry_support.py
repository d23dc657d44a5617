"""A registry on loopback and small OCI images for the OCI image tests (issue 23).

`Registry` runs Debian's `docker-registry` (distribution v2) on a free 127.0.0.1 port, in a temp dir of its
own, over plain HTTP (sandbox-mcp reaches loopback registries that way), optionally behind htpasswd basic
auth. `busybox_layout` writes an OCI image layout of a two-layer image made from /bin/busybox
(busybox-static) in pure Python, and `push` copies a layout into a registry with skopeo. Nothing here needs
root or reaches beyond loopback; `missing_tools` says what is not installed (`make deps TEST_TOOLS=1`).
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

REGISTRY_BIN = "/usr/bin/docker-registry"
SKOPEO_BIN = "/usr/bin/skopeo"
BUSYBOX = "/bin/busybox"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
REF_NAME = "org.opencontainers.image.ref.name"
APPLETS = ("ls", "cat", "echo", "id", "env", "pwd", "rm", "mkdir", "sleep", "true", "test", "stat", "printf")
# docker-registry accepts bcrypt only in htpasswd files, and neither htpasswd (apache2-utils) nor a Python
# bcrypt is a test dependency: this is bcrypt("s3cret-pw") at cost 4, made once with libcrypt.
AUTH_USER, AUTH_PASSWORD = "tester", "s3cret-pw"
AUTH_HTPASSWD = f"{AUTH_USER}:$2b$04$BfWFbZc4F4Lm2YZJQXwEue3kCr4j.uNrC47ykCkcY8dPyZqWYHhI.\n"


def missing_tools() -> str | None:
    """Why these tests cannot run here, or None."""
    for path, package in ((REGISTRY_BIN, "docker-registry"), (SKOPEO_BIN, "skopeo"), (BUSYBOX, "busybox-static")):
        if not os.path.isfile(path):
            return f"{path} is not installed (apt-get install {package}, or make deps TEST_TOOLS=1)"
    return None


def clean_env() -> dict[str, str]:
    """This environment without REGISTRY_*: docker-registry reads those as configuration (REGISTRY_AUTH_FILE
    would be its `auth.file`), and skopeo would read a test's auth file."""
    return {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """`with Registry() as host:` a docker-registry at `host` ("127.0.0.1:PORT"), with basic auth for
    AUTH_USER/AUTH_PASSWORD if `auth`; stopped and its storage removed on exit."""

    def __init__(self, auth: bool = False):
        self.auth = auth
        self.dir = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = ""

    def __enter__(self) -> str:
        self.dir = tempfile.mkdtemp(prefix="smcp-registry-")
        auth = ""
        if self.auth:
            htpasswd = Path(self.dir) / "htpasswd"
            htpasswd.write_text(AUTH_HTPASSWD)
            auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {htpasswd}\n"
        log_path = Path(self.dir) / "registry.log"
        # A port taken between choosing and binding it makes the registry exit: another is tried.
        for _ in range(5):
            port = free_port()
            config = Path(self.dir) / "config.yml"
            config.write_text(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
                              f"    rootdirectory: {self.dir}/storage\nhttp:\n  addr: 127.0.0.1:{port}\n{auth}")
            with open(log_path, "wb") as log:
                self.proc = subprocess.Popen([REGISTRY_BIN, "serve", str(config)], env=clean_env(),
                                             stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            # Bounded by tries: the registry is up when it accepts.
            for _ in range(400):
                if self.proc.poll() is not None:
                    break
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    self.host = f"127.0.0.1:{port}"
                    return self.host
                except OSError:
                    time.sleep(0.05)
            self._stop()
        text = log_path.read_text(errors="replace")
        shutil.rmtree(self.dir, ignore_errors=True)
        raise RuntimeError(f"docker-registry did not start: {text}")

    def _stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def __exit__(self, *exc: object) -> None:
        self._stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def auth_file(path: Path, host: str, user: str = AUTH_USER, password: str = AUTH_PASSWORD) -> Path:
    """Writes a containers auth.json (what REGISTRY_AUTH_FILE names) with credentials for `host`."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {host: {"auth": token}}}))
    return path


def skopeo(*args: str) -> subprocess.CompletedProcess[str]:
    """skopeo with a clean environment and no signature policy to read (the host may have none)."""
    return subprocess.run([SKOPEO_BIN, "--insecure-policy", *args], env=clean_env(), capture_output=True, text=True)


def push(src: str, dest: str, *extra: str) -> None:
    """`skopeo copy` of `src` (a skopeo name: `oci:DIR:TAG`, `oci-archive:PATH`) to docker://`dest`
    (HOST/repo:tag), over plain HTTP."""
    got = skopeo("copy", "--dest-tls-verify=false", *extra, src, f"docker://{dest}")
    assert got.returncode == 0, f"skopeo copy {src} {dest}: {got.stderr}"


# ---------------------------------------------------------------- layouts


def goarch() -> str:
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Entry:
    """One member of a layer tar: a file (`data`), a dir, a symlink or a hard link (`link`)."""
    name: str
    kind: str = "file"
    data: bytes = b""
    mode: int = 0o644
    link: str = ""


def layer_tar(entries: list[Entry]) -> bytes:
    """An uncompressed layer tar of `entries`, root-owned and dated 0, so the same entries make the same
    bytes (a base layer two images share has one digest). Names are written as given, `..` and `/` too."""
    kinds = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.type = kinds[e.kind]
            info.mode = e.mode
            info.mtime = 0
            info.uname = info.gname = "root"
            info.linkname = e.link
            info.size = len(e.data) if e.kind == "file" else 0
            tar.addfile(info, io.BytesIO(e.data) if e.kind == "file" else None)
    return out.getvalue()


@dataclass
class Layout:
    """An OCI image layout written by `write_layout`."""
    dir: Path
    tag: str
    manifest: str
    config: str
    layers: list[str]


def _put_blob(dir: Path, data: bytes, media_type: str) -> dict[str, object]:
    digest = sha256(data)
    blobs = dir / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / digest.removeprefix("sha256:")).write_bytes(data)
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def write_layout(dir: Path, tag: str, layers: list[list[Entry]], config: dict[str, object]) -> Layout:
    """Writes an OCI image layout at `dir` holding one image named `tag`: `layers` (bottom first) gzipped,
    with their diff_ids, and `config` as the image config's `config`."""
    dir.mkdir(parents=True, exist_ok=True)
    descriptors, diff_ids = [], []
    for entries in layers:
        tar = layer_tar(entries)
        diff_ids.append(sha256(tar))
        descriptors.append(_put_blob(dir, gzip.compress(tar, mtime=0), OCI_LAYER_GZIP))
    image_config = {
        "architecture": goarch(), "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": f"registry_support layer {i + 1}"} for i in range(len(layers))],
    }
    config_desc = _put_blob(dir, json.dumps(image_config).encode(), OCI_CONFIG)
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config_desc, "layers": descriptors}
    manifest_desc = _put_blob(dir, json.dumps(manifest).encode(), OCI_MANIFEST)
    manifest_desc["annotations"] = {REF_NAME: tag}
    (dir / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (dir / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [manifest_desc]}))
    return Layout(dir, tag, str(manifest_desc["digest"]), str(config_desc["digest"]),
                  [str(d["digest"]) for d in descriptors])


def busybox_base() -> list[Entry]:
    """The bottom layer: busybox as /bin/sh and a few applets, root in /etc/passwd and /etc/group, /etc/gone
    (which the top layer deletes), /tmp and /root. The same bytes every time."""
    entries = [Entry(d, "dir", mode=0o755) for d in ("bin", "etc", "usr", "usr/bin")]
    entries += [Entry("tmp", "dir", mode=0o1777), Entry("root", "dir", mode=0o700)]
    entries.append(Entry("bin/busybox", data=Path(BUSYBOX).read_bytes(), mode=0o755))
    entries += [Entry(f"bin/{applet}", "symlink", link="busybox") for applet in ("sh", *APPLETS)]
    entries += [Entry("etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\n"),
                Entry("etc/group", data=b"root:x:0:\n"),
                Entry("etc/gone", data=b"deleted by the layer above\n")]
    return entries


def busybox_layout(dir: Path, tag: str = "v1", env: dict[str, str] | None = None, workdir: str = "/root",
                   added: str = "added by layer 2\n") -> Layout:
    """Writes the two-layer busybox image as layout `dir`, named `tag`: the base layer (`busybox_base`),
    then /etc/gone whited out and /etc/added (`added`, so two images can share the base and differ above).
    Its config has PATH and GREETING=hello from oci (plus `env`), `workdir`, an entrypoint and cmd, an
    exposed port and labels."""
    top = [Entry("etc", "dir", mode=0o755), Entry("etc/.wh.gone"), Entry("etc/added", data=added.encode())]
    variables = {"PATH": "/bin:/usr/bin", "GREETING": "hello from oci", **(env or {})}
    config = {
        "Env": [f"{k}={v}" for k, v in variables.items()],
        "WorkingDir": workdir,
        "Entrypoint": ["/bin/sh", "-c"],
        "Cmd": ["echo $GREETING"],
        "ExposedPorts": {"8080/tcp": {}},
        "Labels": {"org.opencontainers.image.title": "busybox test image", "test.tag": tag},
    }
    return write_layout(dir, tag, [busybox_base(), top], config)


def docker_archive(layout: Layout, dest: Path, name: str) -> Path:
    """The layout's image as a `docker save` archive at `dest`, tagged `name` (repo:tag)."""
    got = skopeo("copy", f"oci:{layout.dir}:{layout.tag}", f"docker-archive:{dest}:{name}")
    assert got.returncode == 0, got.stderr
    return dest


def oci_archive(layout: Layout, dest: Path) -> Path:
    """The layout directory as a tar (an OCI layout tar, as `image import` takes)."""
    with tarfile.open(dest, "w") as tar:
        for path in sorted(layout.dir.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(layout.dir)), recursive=False)
    return dest


def tree(root: Path) -> Iterator[tuple[str, str]]:
    """Every path under `root` with what it is (a file's SHA-256, a link's target, `dir`), sorted: a
    before/after comparison shows anything created, changed or removed."""
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            yield str(path), "-> " + os.readlink(path)
        elif path.is_dir():
            yield str(path), "dir"
        else:
            yield str(path), hashlib.sha256(path.read_bytes()).hexdigest()
