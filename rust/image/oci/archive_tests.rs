//! Tests of import and export: a round trip through a layout the test
//! writes, skopeo's view of an export, and malformed archives.
use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::*;
use crate::oci::layers::tests::{E, tar_of};
use crate::oci::unpack_image;
use crate::store::test_dir::TempDir;

fn mapper() -> IdMapper {
    IdMapper::detect().expect("an id map for the test user")
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// Writes an OCI image layout at `dir`: one image per entry of `images`
/// (its ref name and its uncompressed layers, stored gzipped), with a
/// config carrying `Env`, `WorkingDir` and `User`.
fn write_layout(dir: &Path, images: &[(&str, Vec<Vec<u8>>)]) {
    fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    let put = |bytes: &[u8]| {
        let d = sha256_of(bytes);
        fs::write(dir.join("blobs/sha256").join(digest_hex(&d).unwrap()), bytes).unwrap();
        d
    };
    let mut manifests = Vec::new();
    for (name, layers) in images {
        let gz: Vec<Vec<u8>> = layers.iter().map(|l| gzip(l)).collect();
        let config = serde_json::to_vec(&json!({
            "architecture": host_arch(), "os": "linux",
            "config": {"Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"], "WorkingDir": "/srv", "User": "33"},
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| sha256_of(l)).collect::<Vec<_>>()},
        }))
        .unwrap();
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": put(&config), "size": config.len()},
            "layers": gz.iter().map(|g| json!({"mediaType": OCI_TAR_GZIP, "digest": put(g), "size": g.len()})).collect::<Vec<_>>(),
        }))
        .unwrap();
        manifests.push(json!({
            "mediaType": media::OCI_MANIFEST, "digest": put(&manifest), "size": manifest.len(),
            "annotations": {REF_NAME: name},
            "platform": {"os": "linux", "architecture": if *name == "other-arch" { "s390x" } else { host_arch() }},
        }));
    }
    fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": manifests})).unwrap(),
    )
    .unwrap();
}

/// A tar of the directory `dir` (relative names), plus `extra` raw members.
fn tar_dir(dir: &Path, dest: &Path, extra: &[(&str, &[u8])]) {
    let mut b = tar::Builder::new(File::create(dest).unwrap());
    b.append_dir_all(".", dir).unwrap();
    for (name, data) in extra {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap();
}

fn base_layers() -> Vec<Vec<u8>> {
    let l1 = tar_of(
        &[
            E::Dir("./", 0o755),
            E::Dir("etc/", 0o755),
            E::File("etc/hostname", b"box", 0o644),
            E::File("etc/gone", b"x", 0o644),
            E::Owned("var/www", 33, 33, 0o750),
            E::File("usr/bin/tool", b"#!/bin/sh\n", 0o4755),
            E::Hard("usr/bin/tool2", "usr/bin/tool"),
            E::Sym("bin", "usr/bin"),
            E::Dir("opaque/", 0o755),
            E::File("opaque/lower", b"l", 0o644),
        ],
        (0, 0),
    );
    let l2 = tar_of(
        &[
            E::File("etc/.wh.gone", b"", 0o644),
            E::File("opaque/.wh..wh..opq", b"", 0o644),
            E::File("opaque/upper", b"u", 0o644),
        ],
        (0, 0),
    );
    vec![l1, l2]
}

/// Every entry below `root`: type, mode, owner, link target, content.
fn tree(root: &Path) -> BTreeMap<PathBuf, (u32, u32, u32, String)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap().flatten() {
            let md = fs::symlink_metadata(e.path()).unwrap();
            let detail = if md.file_type().is_symlink() {
                fs::read_link(e.path()).unwrap().display().to_string()
            } else if md.is_file() {
                format!("{} links, {:?}", md.nlink(), fs::read(e.path()).ok())
            } else {
                stack.push(e.path());
                String::new()
            };
            out.insert(e.path().strip_prefix(root).unwrap().to_path_buf(), (md.mode(), md.uid(), md.gid(), detail));
        }
    }
    out
}

fn unpack(image: &FetchedImage, blobs: &BlobStore, at: &Path) {
    unpack_image(image, blobs, &mapper(), at, &mut |_| {}).unwrap();
}

#[test]
fn an_export_imports_back_to_the_same_tree_and_skopeo_reads_it() {
    let t = TempDir::new("ociround");
    let layout = t.path().join("layout");
    write_layout(&layout, &[("base", base_layers())]);
    let store = ImageStore::new(t.path().join("images"));
    let blobs = store.blobs();
    let m = mapper();
    let image = import(&layout, &blobs, None, &mut |_| {}).unwrap();
    assert_eq!(image.run.env["LANG"], "C.UTF-8");
    assert_eq!((image.run.workdir.as_str(), image.run.user.as_str()), ("/srv", "33"));
    assert_eq!(image.layers.len(), 2);
    assert_eq!(image.layers[0].media_type, OCI_TAR_GZIP);
    store.add_oci("base", &image, &blobs, &m, false, &mut |_| {}).unwrap();
    let original = tree(&store.rootfs("base"));
    assert!(original.contains_key(Path::new("opaque/upper")) && !original.contains_key(Path::new("opaque/lower")));
    assert!(!original.contains_key(Path::new("etc/gone")));

    let dest = t.path().join("base.tar");
    let mut lines = Vec::new();
    export(&store, "base", &m, &dest, &mut |l| lines.push(l.to_string())).unwrap();
    assert!(lines.last().unwrap().contains("exported image base"), "{lines:?}");
    let err = export(&store, "base", &m, &dest, &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("refusing to overwrite"), "{err}");
    let names: Vec<_> = fs::read_dir(t.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(names.len(), 3, "no temp files left: {names:?}");

    let again_blobs = BlobStore::new(t.path().join("blobs2"));
    let back = import(&dest, &again_blobs, Some("base"), &mut |_| {}).unwrap();
    assert_eq!(back.run.env, image.run.env);
    assert_eq!((back.run.workdir.as_str(), back.run.user.as_str()), ("/srv", "33"));
    let unpacked = t.path().join("unpacked");
    unpack(&back, &again_blobs, &unpacked);
    assert_eq!(tree(&unpacked), original, "the export holds the image's tree");
    sandbox_userns::remove_tree(&unpacked).unwrap();

    let skopeo = Path::new("/usr/bin/skopeo");
    if !skopeo.exists() {
        eprintln!("skopeo not installed: its half of the test skipped");
        return;
    }
    let run = |args: &[&str]| {
        let out = std::process::Command::new(skopeo).arg("--insecure-policy").args(args).output().unwrap();
        assert!(out.status.success(), "skopeo {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let archive = format!("oci-archive:{}", dest.display());
    let inspected = run(&["inspect", &archive]);
    assert!(inspected.contains("\"Os\": \"linux\""), "{inspected}");
    let docker = t.path().join("docker.tar");
    run(&["copy", "-q", &archive, &format!("docker-archive:{}:example/base:1", docker.display())]);
    let from_docker = import(&docker, &again_blobs, None, &mut |_| {}).unwrap();
    assert_eq!(from_docker.run.env, image.run.env);
    unpack(&from_docker, &again_blobs, &unpacked);
    assert_eq!(tree(&unpacked), original, "skopeo's docker-save archive holds the same tree");
    sandbox_userns::remove_tree(&unpacked).unwrap();
}

#[test]
fn an_index_of_several_images_picks_by_tag_or_platform() {
    let t = TempDir::new("ocipick");
    let layout = t.path().join("layout");
    let one = |f: &'static str| vec![tar_of(&[E::File(f, b"x", 0o644)], (0, 0))];
    write_layout(&layout, &[("other-arch", one("s390x")), ("a", one("a")), ("b", one("b"))]);
    let blobs = BlobStore::new(t.path().join("blobs"));
    let b = import(&layout, &blobs, Some("b"), &mut |_| {}).unwrap();
    let want = sha256_of(&one("b")[0]);
    assert_eq!(b.layers[0].diff_id, want);
    let first_for_host = import(&layout, &blobs, None, &mut |_| {}).unwrap();
    assert_eq!(first_for_host.layers[0].diff_id, sha256_of(&one("a")[0]));
    let err = import(&layout, &blobs, Some("zzz"), &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("no image named \"zzz\" (it has: other-arch, a, b)"), "{err}");
}

#[test]
fn an_old_docker_save_archive_imports() {
    let t = TempDir::new("ocidocker");
    let dir = t.path().join("save");
    let layer = tar_of(&[E::File("hello", b"world", 0o644)], (0, 0));
    let config = serde_json::to_vec(&json!({
        "config": {"Env": ["A=1"], "User": "nobody"},
        "rootfs": {"type": "layers", "diff_ids": [sha256_of(&layer)]},
    }))
    .unwrap();
    let config_name = format!("{}.json", digest_hex(&sha256_of(&config)).unwrap());
    fs::create_dir_all(dir.join("abc")).unwrap();
    fs::write(dir.join("abc/layer.tar"), &layer).unwrap();
    fs::write(dir.join(&config_name), &config).unwrap();
    let list = json!([{"Config": config_name, "RepoTags": ["example/x:1"], "Layers": ["abc/layer.tar"]}]);
    fs::write(dir.join("manifest.json"), serde_json::to_vec(&list).unwrap()).unwrap();
    let archive = t.path().join("save.tar");
    tar_dir(&dir, &archive, &[]);
    let blobs = BlobStore::new(t.path().join("blobs"));
    let image = import(&archive, &blobs, Some("1"), &mut |_| {}).unwrap();
    assert_eq!((image.run.env["A"].as_str(), image.run.user.as_str()), ("1", "nobody"));
    assert_eq!(
        (image.layers[0].digest.as_str(), image.layers[0].media_type.as_str()),
        (image.layers[0].diff_id.as_str(), OCI_TAR)
    );
    assert!(blobs.contains(&image.manifest_digest) && blobs.contains(&image.config_digest));
    let unpacked = t.path().join("unpacked");
    unpack(&image, &blobs, &unpacked);
    assert_eq!(fs::read(unpacked.join("hello")).unwrap(), b"world");
    sandbox_userns::remove_tree(&unpacked).unwrap();
}

/// The blobs left in a store.
fn blob_count(blobs: &BlobStore) -> usize {
    fs::read_dir(blobs.root().join("sha256"))
        .map(|d| d.flatten().filter(|e| !e.file_name().to_string_lossy().starts_with('.')).count())
        .unwrap_or(0)
}

#[test]
fn malformed_archives_fail_clearly_and_leave_no_blob() {
    let t = TempDir::new("ocibad");
    let good = t.path().join("good");
    write_layout(&good, &[("x", base_layers())]);
    let blobs = BlobStore::new(t.path().join("blobs"));
    let case = |name: &str, change: &dyn Fn(&Path)| {
        let dir = t.path().join(name);
        fs::create_dir(&dir).unwrap();
        std::process::Command::new("cp").arg("-a").arg(good.join(".")).arg(&dir).status().unwrap();
        change(&dir);
        dir
    };
    let biggest = |dir: &Path| {
        fs::read_dir(dir.join("blobs/sha256"))
            .unwrap()
            .flatten()
            .max_by_key(|e| e.metadata().unwrap().len())
            .unwrap()
            .path()
    };
    let no_index = case("noindex", &|d| fs::remove_file(d.join("index.json")).unwrap());
    let no_blob = case("noblob", &|d| fs::remove_file(biggest(d)).unwrap());
    let altered = case("altered", &|d| {
        let p = biggest(d);
        let mut bytes = fs::read(&p).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&p, bytes).unwrap();
    });
    let linked = case("linked", &|d| {
        fs::remove_file(d.join("index.json")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", d.join("index.json")).unwrap();
    });
    let climbing = t.path().join("climbing.tar");
    tar_dir(&good, &climbing, &[("../x", b"x")]);
    let cases: [(&Path, &str); 6] = [
        (&no_index, "no index.json"),
        (&no_blob, "is missing"),
        (&altered, "does not match its digest"),
        (&linked, "opening index.json: Too many levels of symbolic links"),
        (&climbing, "member \"../x\" climbs out"),
        (&t.path().join("absent"), "absent"),
    ];
    for (path, says) in cases {
        let err = import(path, &blobs, None, &mut |_| {}).unwrap_err();
        assert!(err.to_string().contains(says), "{}: {err}", path.display());
        assert_eq!(blob_count(&blobs), 0, "{}: no blob kept", path.display());
    }
    // The same layout as a tar imports, in one piece.
    let whole = t.path().join("whole.tar");
    tar_dir(&good, &whole, &[]);
    let image = import(&whole, &blobs, None, &mut |_| {}).unwrap();
    assert_eq!(blob_count(&blobs), 4, "manifest, config, two layers");
    assert!(image.layers.iter().all(|l| blobs.contains(&l.digest)));
}
