"""Section (i) of bench/bench.py: OCI image pulls from a registry on loopback (issue 23).

`Registry` runs Debian's `docker-registry` (distribution v2) on a free 127.0.0.1 port over plain HTTP,
with its storage in a temp dir; `write_images` writes an OCI image layout holding two images that share
a ~90 MB base layer (random bytes, so compressed ~= uncompressed, plus /bin/busybox as /bin/sh) and
differ in a small top layer; `push` copies them into the registry with skopeo. `skopeo_pull` and
`cli_pull` time a pull of one image by skopeo (into an OCI layout: download and store only) and by
`sandbox-mcp image pull` (download into the store's blobs, then unpack and install), the latter split
into download and unpack by the progress lines it prints on stderr.
"""
from __future__ import annotations

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

REGISTRY_BIN = "/usr/bin/docker-registry"
SKOPEO_BIN = "/usr/bin/skopeo"
BUSYBOX = "/bin/busybox"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
REF_NAME = "org.opencontainers.image.ref.name"
# The base layer's payload: BASE_FILES files of BASE_MIB MiB in all.
BASE_MIB = 90
BASE_FILES = 6
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


def missing_tools() -> str | None:
    """Why the pulls cannot be measured here, or None."""
    for path, package in ((REGISTRY_BIN, "docker-registry"), (SKOPEO_BIN, "skopeo")):
        if not os.path.isfile(path):
            return f"{path} is not installed (apt-get install {package}, or make deps TEST_TOOLS=1)"
    return None


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without REGISTRY_* (docker-registry reads them as configuration, skopeo reads
    REGISTRY_AUTH_FILE) and without proxies (everything here is loopback), plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("REGISTRY_") and k.lower() not in PROXY_VARS}
    env.update(extra or {})
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """`with Registry(tmp) as host:` a docker-registry at `host` ("127.0.0.1:PORT") storing under `tmp`;
    killed on exit (the caller removes `tmp`)."""

    def __init__(self, tmp: Path):
        self.dir = tmp / "registry"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> str:
        self.dir.mkdir(parents=True)
        log_path = self.dir / "registry.log"
        # A port taken between choosing and binding it makes the registry exit: another is tried.
        for _ in range(5):
            port = free_port()
            config = self.dir / "config.yml"
            config.write_text(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
                              f"    rootdirectory: {self.dir}/storage\nhttp:\n  addr: 127.0.0.1:{port}\n")
            with open(log_path, "ab") as log:
                self.proc = subprocess.Popen([REGISTRY_BIN, "serve", str(config)], env=clean_env(),
                                             stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            for _ in range(400):
                if self.proc.poll() is not None:
                    break
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    return f"127.0.0.1:{port}"
                except OSError:
                    time.sleep(0.05)
            self.stop()
        raise RuntimeError(f"docker-registry did not start: {log_path.read_text(errors='replace')[-500:]}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def __exit__(self, *exc: object) -> None:
        self.stop()


def goarch() -> str:
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer_tar(entries: list[tuple]) -> bytes:
    """A layer tar of (name, kind, data-or-link, mode) entries, root-owned and dated 0."""
    kinds = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data, mode in entries:
            info = tarfile.TarInfo(name)
            info.type = kinds[kind]
            info.mode = mode
            info.mtime = 0
            info.uname = info.gname = "root"
            if kind == "symlink":
                info.linkname = data
            info.size = len(data) if kind == "file" else 0
            tar.addfile(info, io.BytesIO(data) if kind == "file" else None)
    return out.getvalue()


def base_entries(busybox: bool) -> list[tuple]:
    """The shared base: a minimal root (with busybox as /bin/sh when there is one) and BASE_MIB MiB of
    random bytes in BASE_FILES files under /opt/data."""
    entries: list[tuple] = [(d, "dir", b"", 0o755) for d in ("bin", "etc", "opt", "opt/data", "usr", "usr/bin")]
    entries += [("tmp", "dir", b"", 0o1777), ("root", "dir", b"", 0o700)]
    if busybox:
        entries.append(("bin/busybox", "file", Path(BUSYBOX).read_bytes(), 0o755))
        entries += [(f"bin/{a}", "symlink", "busybox", 0o777) for a in ("sh", "true", "echo", "cat", "ls")]
    entries += [("etc/passwd", "file", b"root:x:0:0:root:/root:/bin/sh\n", 0o644),
                ("etc/group", "file", b"root:x:0:\n", 0o644)]
    per_file = (BASE_MIB << 20) // BASE_FILES
    entries += [(f"opt/data/blob{i}", "file", os.urandom(per_file), 0o644) for i in range(BASE_FILES)]
    return entries


@dataclass
class Images:
    """The layout at `dir` holding tags "1" and "2"; compressed bytes of each image's blobs (config and
    layers) and of the shared base layer."""
    dir: Path
    sizes: dict[str, int]
    base_bytes: int


def _put_blob(dir: Path, data: bytes, media_type: str) -> dict[str, object]:
    digest = sha256(data)
    blobs = dir / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / digest.removeprefix("sha256:")).write_bytes(data)
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def write_images(dir: Path, busybox: bool) -> Images:
    """Writes the layout: tags "1" and "2", the same base layer (gzip level 1) under different top layers."""
    dir.mkdir(parents=True)
    base_tar = layer_tar(base_entries(busybox))
    base = _put_blob(dir, gzip.compress(base_tar, compresslevel=1, mtime=0), OCI_LAYER_GZIP)
    base_diff = sha256(base_tar)
    del base_tar
    manifests, sizes = [], {}
    for tag in ("1", "2"):
        top_tar = layer_tar([("etc", "dir", b"", 0o755),
                             ("etc/bench-tag", "file", f"bench image {tag}\n".encode() * 64, 0o644)])
        top = _put_blob(dir, gzip.compress(top_tar, mtime=0), OCI_LAYER_GZIP)
        config = {
            "architecture": goarch(), "os": "linux",
            "config": {"Env": ["PATH=/bin:/usr/bin"], "WorkingDir": "/root", "Cmd": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": [base_diff, sha256(top_tar)]},
            "history": [{"created_by": "bench base"}, {"created_by": f"bench top {tag}"}],
        }
        config_desc = _put_blob(dir, json.dumps(config).encode(), OCI_CONFIG)
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config_desc, "layers": [base, top]}
        desc = _put_blob(dir, json.dumps(manifest).encode(), OCI_MANIFEST)
        desc["annotations"] = {REF_NAME: tag}
        manifests.append(desc)
        sizes[tag] = int(config_desc["size"]) + int(base["size"]) + int(top["size"])
    (dir / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (dir / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": manifests}))
    return Images(dir, sizes, int(base["size"]))


def skopeo(*args: str) -> subprocess.CompletedProcess[str]:
    """skopeo with a clean environment and no signature policy to read."""
    return subprocess.run([SKOPEO_BIN, "--insecure-policy", *args], env=clean_env(), capture_output=True, text=True)


def push(images: Images, host: str) -> None:
    """Pushes tags 1 and 2 as HOST/bench/big:1 and :2 over plain HTTP."""
    for tag in ("1", "2"):
        got = skopeo("copy", "--dest-tls-verify=false", f"oci:{images.dir}:{tag}", f"docker://{host}/bench/big:{tag}")
        if got.returncode != 0:
            raise RuntimeError(f"skopeo copy to {host}/bench/big:{tag}: {got.stderr.strip()}")


def skopeo_pull(host: str, tag: str, dest: Path) -> float:
    """Seconds `skopeo copy` takes to pull HOST/bench/big:TAG into a new OCI layout at `dest`."""
    t = time.perf_counter()
    got = skopeo("copy", "--src-tls-verify=false", f"docker://{host}/bench/big:{tag}", f"oci:{dest}:x")
    elapsed = time.perf_counter() - t
    if got.returncode != 0:
        raise RuntimeError(f"skopeo copy from {host}/bench/big:{tag}: {got.stderr.strip()}")
    return elapsed


@dataclass
class Pull:
    """One `image pull`: total seconds, and the part until the last layer was in the store (download,
    with the manifest and config) and after it (unpack and install)."""
    total: float
    download: float
    unpack: float
    log: list[str]


def cli_pull(binary: str, env: dict[str, str], reference: str, name: str, store: Path | None) -> Pull:
    """Runs `sandbox-mcp image pull REFERENCE --name NAME [--store STORE]` (no store: the one `env`
    names, as the server's), timing its stderr lines: the download ends at the last layer's "done" or
    "already present" line."""
    argv = [binary, "image", "pull", reference, "--name", name]
    if store is not None:
        argv += ["--store", str(store)]
    t = time.perf_counter()
    proc = subprocess.Popen(argv,
                            env=clean_env(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines, downloaded = [], None
    assert proc.stderr is not None
    for line in proc.stderr:
        at = time.perf_counter() - t
        lines.append(f"{at * 1000:8.0f} ms  {line.rstrip()}")
        head = line.split()
        if len(head) >= 2 and head[0] == "layer" and "/" in head[1]:
            n, of = head[1].split("/", 1)
            if n == of and (line.rstrip().endswith(" done") or "already present" in line):
                downloaded = at
    out = proc.stdout.read() if proc.stdout else ""
    proc.wait()
    total = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"image pull {reference} failed ({proc.returncode}): " + "\n".join(lines[-10:]))
    lines.append(f"{total * 1000:8.0f} ms  {out.strip()}")
    download = downloaded if downloaded is not None else total
    return Pull(total, download, total - download, lines)


def tar_unpack(layout: Path, dest: Path) -> float:
    """Seconds GNU tar takes to unpack the layers of the image in `layout` (as skopeo wrote it, one
    manifest) into `dest`, bottom first: a reference for the unpack part of a pull."""
    index = json.loads((layout / "index.json").read_text())
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / index["manifests"][0]["digest"].removeprefix("sha256:")).read_bytes())
    dest.mkdir(parents=True)
    t = time.perf_counter()
    for layer in manifest["layers"]:
        blob = blobs / layer["digest"].removeprefix("sha256:")
        subprocess.run(["tar", "-xzf", str(blob), "-C", str(dest)], check=True)
    return time.perf_counter() - t


def temp_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
