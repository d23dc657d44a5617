//! Tests of layer unpacking: the formats in-process on a temp dir (confined
//! by `openat2` alone), and the real path through the re-executed, mapped,
//! chrooted child. Hostile layers must leave the host untouched.
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::*;
use crate::oci::LayerRef;
use crate::oci::blobs::sha256_of;
use crate::store::test_dir::TempDir;

/// One tar entry of a test layer.
pub(crate) enum E {
    Dir(&'static str, u32),
    File(&'static str, &'static [u8], u32),
    Owned(&'static str, u32, u32, u32),
    Sym(&'static str, &'static str),
    Hard(&'static str, &'static str),
    Fifo(&'static str),
    Char(&'static str),
}

/// A tar of `entries`, owned by `ids` unless an entry says otherwise.
pub(crate) fn tar_of(entries: &[E], ids: (u32, u32)) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_uid(u64::from(ids.0));
        h.set_gid(u64::from(ids.1));
        h.set_mode(0o644);
        h.set_size(0);
        h.set_mtime(1_600_000_000);
        let (path, data): (&str, &[u8]) = match *e {
            E::Dir(p, mode) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(mode);
                (p, b"")
            }
            E::File(p, data, mode) => {
                h.set_mode(mode);
                h.set_size(data.len() as u64);
                (p, data)
            }
            E::Owned(p, uid, gid, mode) => {
                h.set_uid(u64::from(uid));
                h.set_gid(u64::from(gid));
                h.set_mode(mode);
                (p, b"")
            }
            E::Sym(p, target) | E::Hard(p, target) => {
                let kind = if matches!(e, E::Sym(..)) { tar::EntryType::Symlink } else { tar::EntryType::Link };
                h.set_entry_type(kind);
                h.set_link_name_literal(target).unwrap();
                (p, b"")
            }
            E::Fifo(p) => {
                h.set_entry_type(tar::EntryType::Fifo);
                (p, b"")
            }
            E::Char(p) => {
                h.set_entry_type(tar::EntryType::Char);
                (p, b"")
            }
        };
        // Raw names: the builder itself refuses `..` and absolute paths.
        let name = path.as_bytes();
        if name.len() <= 100 {
            h.as_old_mut().name[..name.len()].copy_from_slice(name);
            h.set_cksum();
            b.append(&h, data).unwrap();
        } else {
            b.append_data(&mut h, path, data).unwrap();
        }
    }
    b.into_inner().unwrap()
}

fn me() -> (u32, u32) {
    (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw())
}

/// A temp dir with a `rootfs` to apply into and a sentinel file beside it.
struct Scene {
    t: TempDir,
}

impl Scene {
    fn new(tag: &str) -> Self {
        let t = TempDir::new(tag);
        fs::create_dir(t.path().join("rootfs")).unwrap();
        fs::create_dir(t.path().join("outside")).unwrap();
        fs::write(t.path().join("outside/sentinel"), b"host").unwrap();
        Scene { t }
    }

    fn root(&self) -> PathBuf {
        self.t.path().join("rootfs")
    }

    fn outside(&self) -> PathBuf {
        self.t.path().join("outside")
    }

    /// Applies `layers` in-process; the first error, if any.
    fn apply(&self, layers: &[Vec<u8>]) -> Result<(), OciError> {
        let fd = open_path_dir(&self.root()).unwrap();
        for (i, l) in layers.iter().enumerate() {
            apply_layer(fd.as_fd(), &format!("layer {}", i + 1), &sha256_of(l), &l[..])?;
        }
        Ok(())
    }

    /// The host around the rootfs is as it was.
    fn host_untouched(&self) {
        let names: Vec<_> = fs::read_dir(self.outside()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names, ["sentinel"], "nothing appeared outside the rootfs");
        assert_eq!(fs::read(self.outside().join("sentinel")).unwrap(), b"host");
        assert_eq!(fs::metadata(self.outside().join("sentinel")).unwrap().nlink(), 1, "no hard link to it");
        for top in fs::read_dir(self.t.path()).unwrap().flatten() {
            let name = top.file_name();
            assert!(["rootfs", "outside", "blobs", "unpacked", "blob"].iter().any(|n| name == *n), "{name:?}");
        }
    }
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

#[test]
fn a_layer_stack_unpacks_with_modes_links_and_whiteouts() {
    let s = Scene::new("ocifmt");
    let l1 = tar_of(
        &[
            E::Dir("./", 0o755),
            E::Dir("etc/", 0o755),
            E::File("etc/passwd", b"root:x:0:0", 0o644),
            E::File("etc/gone", b"x", 0o644),
            E::Dir("var/cache/", 0o755),
            E::File("var/cache/old", b"old", 0o600),
            E::Dir("var/cache/sub/", 0o700),
            E::File("bin/su", b"su", 0o4755),
            E::Sym("bin/sh", "dash"),
            E::Hard("bin/su2", "bin/su"),
            E::File("was-dir/x", b"x", 0o644),
            E::Fifo("run-fifo"),
            E::Char("dev/null"),
        ],
        me(),
    );
    let l2 = tar_of(
        &[
            E::File("etc/.wh.gone", b"", 0o644),
            E::File("var/cache/kept", b"new", 0o644),
            E::File("var/cache/.wh..wh..opq", b"", 0o644),
            E::File("var/cache/after", b"after", 0o644),
            E::File("was-dir", b"now a file", 0o640),
            E::File(".wh.nothing-there", b"", 0o644),
            E::File("new/.wh.x", b"", 0o644),
        ],
        me(),
    );
    s.apply(&[l1, l2]).unwrap();
    let r = s.root();
    assert_eq!(fs::read(r.join("etc/passwd")).unwrap(), b"root:x:0:0");
    assert!(!r.join("etc/gone").exists());
    let mut cache: Vec<_> = fs::read_dir(r.join("var/cache")).unwrap().flatten().map(|e| e.file_name()).collect();
    cache.sort();
    assert_eq!(cache, ["after", "kept"], "opaque hides the lower layer, keeps its own");
    let md = fs::metadata(r.join("bin/su")).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o4755, "setuid kept");
    assert_eq!(md.nlink(), 2);
    assert_eq!(md.ino(), fs::metadata(r.join("bin/su2")).unwrap().ino());
    assert_eq!(fs::read_link(r.join("bin/sh")).unwrap(), Path::new("dash"));
    assert_eq!(fs::read(r.join("was-dir")).unwrap(), b"now a file");
    assert_eq!(fs::metadata(r.join("was-dir")).unwrap().mode() & 0o777, 0o640);
    assert!(fs::symlink_metadata(r.join("run-fifo")).unwrap().file_type().is_fifo());
    assert!(!r.join("dev/null").exists(), "device nodes are skipped");
    assert_eq!(fs::metadata(r.join("etc/passwd")).unwrap().mtime(), 1_600_000_000);
    s.host_untouched();
}

use std::os::unix::fs::FileTypeExt as _;

#[test]
fn compressed_layers_are_read_by_media_type() {
    let s = Scene::new("ocicomp");
    let tar = tar_of(&[E::File("gz", b"gzip", 0o644)], me());
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    let gz = gz.finish().unwrap();
    let zst_tar = tar_of(&[E::File("zst", b"zstd", 0o644)], me());
    let zst = zstd::stream::encode_all(&zst_tar[..], 3).unwrap();
    let root = open_path_dir(&s.root()).unwrap();
    let blob = |bytes: &[u8]| {
        let p = s.t.path().join("blob");
        fs::write(&p, bytes).unwrap();
        File::open(&p).unwrap()
    };
    apply_blob(&root, "gz", "application/vnd.docker.image.rootfs.diff.tar.gzip", &sha256_of(&tar), blob(&gz)).unwrap();
    apply_blob(&root, "zst", "application/vnd.oci.image.layer.v1.tar+zstd", &sha256_of(&zst_tar), blob(&zst)).unwrap();
    assert_eq!(fs::read(s.root().join("gz")).unwrap(), b"gzip");
    assert_eq!(fs::read(s.root().join("zst")).unwrap(), b"zstd");
    // A truncated gzip fails, and so does an unknown media type.
    let err = apply_blob(
        &root,
        "cut",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        &sha256_of(&tar),
        blob(&gz[..gz.len() / 2]),
    )
    .unwrap_err();
    assert!(matches!(err, OciError::Malformed { .. } | OciError::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains("cut"), "{err}");
    let err = apply_blob(&root, "x", "application/x-rar", &sha256_of(&tar), blob(&tar)).unwrap_err();
    assert!(err.to_string().contains("not a tar, tar+gzip or tar+zstd layer"), "{err}");
}

#[test]
fn a_file_larger_than_the_free_space_is_refused_before_it_is_written() {
    let s = Scene::new("ocibomb");
    // A header declaring 1 EiB, and no data: refused on the declaration.
    let mut header = tar::Header::new_gnu();
    header.set_path("bomb").unwrap();
    header.set_size(1 << 60);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    let layer = header.as_bytes().to_vec();
    let err = s.apply(&[layer]).unwrap_err();
    assert!(matches!(err, OciError::Malformed { .. }), "{err}");
    assert!(err.to_string().contains(&format!("\"bomb\" declares {} bytes", 1u64 << 60)), "{err}");
    assert!(err.to_string().contains("free space, or use a smaller image"), "{err}");
    assert!(!s.root().join("bomb").exists(), "nothing of it was written");
    s.host_untouched();
}

#[test]
fn entries_that_climb_out_are_refused() {
    for (entries, says) in [
        (vec![E::File("../x", b"x", 0o644)], "climbs out"),
        (vec![E::File("a/../../x", b"x", 0o644)], "climbs out"),
        (vec![E::File("/abs", b"x", 0o644)], "absolute"),
        (vec![E::Hard("h", "/etc/shadow")], "absolute"),
        (vec![E::Hard("h", "../outside/sentinel")], "climbs out"),
        (vec![E::File(".wh...", b"", 0o644)], "does not name an entry"),
        (vec![E::File(".wh..", b"", 0o644)], "does not name an entry"),
        (vec![E::File("etc/.wh.", b"", 0o644)], "does not name an entry"),
        (vec![E::File("/.wh.etc", b"", 0o644)], "absolute"),
    ] {
        let s = Scene::new("ociclimb");
        let err = s.apply(&[tar_of(&entries, me())]).expect_err(says);
        assert!(matches!(err, OciError::Malformed { .. }), "{err}");
        assert!(err.to_string().contains(says), "{err}");
        s.host_untouched();
    }
}

type SymlinkCase = (Vec<Vec<E>>, Result<&'static str, &'static str>);

/// Symlink attacks, as (layers, where the write lands inside the root, or
/// what the error says), for a scene whose outside dir is `outside`.
fn symlink_cases(outside: &'static str) -> Vec<SymlinkCase> {
    let inside = leak(format!("{}/", outside.trim_start_matches('/')));
    let via = leak(format!("../../../../../../../..{outside}"));
    vec![
        (vec![vec![E::Sym("etc", "/"), E::File("etc/passwd", b"p", 0o644)]], Ok("passwd")),
        (vec![vec![E::Sym("etc", "/")], vec![E::File("etc/passwd", b"p", 0o644)]], Ok("passwd")),
        (vec![vec![E::Dir(inside, 0o755), E::Sym("esc", outside)], vec![E::File("esc/p", b"p", 0o644)]], Ok("p")),
        (vec![vec![E::Dir(inside, 0o755), E::Sym("rel", via), E::File("rel/p", b"p", 0o644)]], Ok("p")),
        // Dangling inside the root: the host directory is never used.
        (vec![vec![E::Sym("esc", outside), E::File("esc/p", b"p", 0o644)]], Err("creating the directory of")),
        (
            vec![vec![E::Sym("esc", outside)], vec![E::File("esc/sentinel", b"p", 0o644)]],
            Err("creating the directory of"),
        ),
        (vec![vec![E::Sym("esc", outside), E::Hard("h", "esc/sentinel")]], Err("linking to \"esc/sentinel\"")),
        (vec![vec![E::Sym("esc", outside)], vec![E::Sym("esc/sentinel", "/x")]], Err("creating the directory of")),
    ]
}

#[test]
fn symlinks_are_resolved_inside_the_root_within_and_across_layers() {
    for i in 0..symlink_cases("/").len() {
        let s = Scene::new("ocisym");
        let outside = leak(s.outside().display().to_string());
        let (layers, want) = symlink_cases(outside).swap_remove(i);
        let tars: Vec<Vec<u8>> = layers.iter().map(|l| tar_of(l, me())).collect();
        let got = s.apply(&tars);
        match want {
            Ok(file) => {
                got.unwrap();
                let dir = if file == "passwd" { s.root() } else { s.root().join(outside.trim_start_matches('/')) };
                assert_eq!(fs::read(dir.join(file)).unwrap(), b"p", "case {i}");
            }
            Err(says) => {
                let err = got.unwrap_err();
                assert!(err.to_string().contains(says), "case {i}: {err}");
            }
        }
        s.host_untouched();
    }
}

#[test]
fn whiteouts_never_reach_outside_and_an_opaque_root_keeps_the_root() {
    let s = Scene::new("ociwh");
    let outside = leak(s.outside().display().to_string());
    let l1 = tar_of(&[E::Sym("esc", outside), E::File("lower", b"l", 0o644)], me());
    let l2 = tar_of(
        &[E::File("esc/.wh.sentinel", b"", 0o644), E::File(".wh..wh..opq", b"", 0o644), E::File("upper", b"u", 0o644)],
        me(),
    );
    s.apply(&[l1, l2]).unwrap();
    let names: Vec<_> = fs::read_dir(s.root()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(names, ["upper"]);
    s.host_untouched();
}

#[test]
fn a_layer_whose_diff_id_differs_fails() {
    let s = Scene::new("ocidiff");
    let l = tar_of(&[E::File("f", b"x", 0o644)], me());
    let fd = open_path_dir(&s.root()).unwrap();
    let err = apply_layer(fd.as_fd(), "layer 1", &sha256_of(b"other"), &l[..]).unwrap_err();
    assert!(matches!(err, OciError::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains("layer 1, uncompressed (its diff_id)"), "{err}");
    // Trailing bytes after the archive's end count too.
    let mut padded = l.clone();
    padded.extend_from_slice(&[0; 512]);
    let err = apply_layer(fd.as_fd(), "layer 1", &sha256_of(&l), &padded[..]).unwrap_err();
    assert!(matches!(err, OciError::DigestMismatch { .. }), "{err}");
}

/// A test image of `layers` (plain tars) in a blob store under `dir`.
pub(crate) fn image_of(dir: &Path, layers: &[Vec<u8>]) -> (FetchedImage, BlobStore) {
    let blobs = BlobStore::new(dir.join("blobs"));
    let layers = layers
        .iter()
        .map(|l| {
            let digest = sha256_of(l);
            blobs.put_bytes("a test layer", &digest, l).unwrap();
            LayerRef {
                digest: digest.clone(),
                media_type: "application/vnd.oci.image.layer.v1.tar".into(),
                size: l.len() as u64,
                diff_id: digest,
            }
        })
        .collect();
    let image = FetchedImage {
        source: "test".into(),
        manifest_digest: sha256_of(b"manifest"),
        config_digest: sha256_of(b"config"),
        layers,
        run: Default::default(),
    };
    (image, blobs)
}

fn mapper() -> IdMapper {
    IdMapper::detect().expect("an id map for the test user")
}

fn host_id(map: &[sandbox_userns::IdExtent], inside: u32) -> u32 {
    map.iter()
        .find(|e| e.inside <= inside && inside - e.inside < e.count)
        .map(|e| e.outside + inside - e.inside)
        .unwrap()
}

#[test]
fn the_confined_child_unpacks_through_the_id_map() {
    let s = Scene::new("ocimapped");
    let l1 = tar_of(
        &[
            E::Dir("./", 0o755),
            E::Owned("var/www", 33, 33, 0o640),
            E::Owned("usr/bin/passwd", 0, 0, 0o4755),
            E::Dir("root/", 0o700),
            E::File("root/secret", b"s", 0o600),
            E::Sym("etc", "/"),
        ],
        (0, 0),
    );
    let l2 = tar_of(&[E::File("etc/passwd", b"through", 0o644), E::File("root/.wh.secret", b"", 0o644)], (0, 0));
    let (image, blobs) = image_of(s.t.path(), &[l1, l2]);
    let rootfs = s.t.path().join("unpacked");
    let (m, mut lines) = (mapper(), Vec::new());
    unpack_image(&image, &blobs, &m, &rootfs, &mut |l| lines.push(l.to_string())).unwrap();
    let map = m.id_map();
    let owner =
        |p: &str| fs::symlink_metadata(rootfs.join(p)).map(|md| (md.uid(), md.gid(), md.mode() & 0o7777)).unwrap();
    assert_eq!(owner("var/www"), (host_id(&map.uids, 33), host_id(&map.gids, 33), 0o640));
    let (ruid, rgid) = map.host_root();
    assert_eq!(owner("usr/bin/passwd"), (ruid, rgid, 0o4755));
    assert_eq!(owner("root"), (ruid, rgid, 0o700));
    assert_eq!(owner("."), (ruid, rgid, 0o755));
    assert!(lines.iter().any(|l| l.contains("layer 2/2") && l.contains("2 entries applied")), "{lines:?}");
    assert!(!rootfs.join("root/secret").exists());
    s.host_untouched();
    sandbox_userns::remove_tree(&rootfs).unwrap();
}

#[test]
fn the_confined_child_keeps_hostile_layers_inside_and_cleans_up_on_failure() {
    let s = Scene::new("ocihostile");
    let outside = leak(s.outside().display().to_string());
    let l1 = tar_of(&[E::Sym("esc", outside), E::Sym("etc", "/")], (0, 0));
    let l2 = tar_of(&[E::File("etc/passwd", b"x", 0o644)], (0, 0));
    let (image, blobs) = image_of(s.t.path(), &[l1.clone(), l2]);
    let rootfs = s.t.path().join("unpacked");
    unpack_image(&image, &blobs, &mapper(), &rootfs, &mut |_| {}).unwrap();
    assert_eq!(fs::read(rootfs.join("passwd")).unwrap(), b"x");
    s.host_untouched();
    sandbox_userns::remove_tree(&rootfs).unwrap();

    // A failing layer: the error crosses over typed, and no rootfs stays.
    for (bad, says) in [
        (tar_of(&[E::Hard("h", "esc/sentinel")], (0, 0)), "linking to"),
        (tar_of(&[E::File("../x", b"x", 0o644)], (0, 0)), "climbs out"),
        (tar_of(&[E::File("esc/pwned", b"x", 0o644)], (0, 0)), "creating the directory of"),
    ] {
        let (image, blobs) = image_of(s.t.path(), &[l1.clone(), bad]);
        let err = unpack_image(&image, &blobs, &mapper(), &rootfs, &mut |_| {}).unwrap_err();
        assert!(matches!(err, OciError::Malformed { .. }), "{err}");
        assert!(err.to_string().contains(says) && err.to_string().contains("layer 2/2"), "{err}");
        assert!(!rootfs.exists(), "a failed unpack leaves no rootfs");
        s.host_untouched();
    }
    let (mut image, blobs) = image_of(s.t.path(), &[l1]);
    image.layers[0].diff_id = sha256_of(b"not this layer");
    let err = unpack_image(&image, &blobs, &mapper(), &rootfs, &mut |_| {}).unwrap_err();
    assert!(matches!(err, OciError::DigestMismatch { .. }), "{err}");
    assert!(!rootfs.exists());
    s.host_untouched();
}
