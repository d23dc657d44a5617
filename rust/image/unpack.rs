//! Unpacking mmdebstrap's tarball through the sandbox's id map.
//!
//! tar runs as root of a user namespace carrying the helper's map, with the
//! owners the tarball records (the ids inside the chroot): every file gets
//! exactly the host ids a sandbox of this helper maps, hard links, symlinks,
//! setuid bits and extended attributes included, and no file is ever chowned
//! by host id. The same works for root and for an ordinary user.
use std::path::Path;
use std::process::{Command, Stdio};

use super::ImageError;
use sandbox_userns::{IdMapper, pass_fds, run_mapped};

/// Lines of tar's complaints kept in the error.
const TAIL_LINES: usize = 10;

/// Unpacks `tarball` into the new directory `rootfs`.
pub(super) fn unpack(mapper: &IdMapper, tarball: &Path, rootfs: &Path) -> Result<(), ImageError> {
    std::fs::create_dir(rootfs).map_err(|e| ImageError::io(format!("creating {}", rootfs.display()), e))?;
    // The top directory is made out here; it must belong to root inside for
    // tar (as that root) to restore its owner and mode.
    let (uid, gid) = mapper.id_map().host_root();
    std::os::unix::fs::chown(rootfs, Some(uid), Some(gid))
        .map_err(|e| ImageError::io(format!("handing {} to the sandbox's root", rootfs.display()), e))?;
    // Both are handed over open: on a stock Debian host the store lies
    // under root's 0700 home, which the namespace's root cannot traverse.
    let open = |p: &Path| std::fs::File::open(p).map_err(|e| ImageError::io(format!("opening {}", p.display()), e));
    let (file, dir) = (open(tarball)?, open(rootfs)?);
    let mut tar = Command::new("tar");
    let paths = pass_fds(&mut tar, &[&file, &dir]);
    tar.arg("--extract")
        .arg("--file")
        .arg(&paths[0])
        .arg("--directory")
        .arg(&paths[1])
        // Device nodes cannot be made in a user namespace, and a sandbox
        // gets its own /dev anyway.
        .args(["--numeric-owner", "--same-owner", "--preserve-permissions", "--xattrs", "--xattrs-include=*"])
        .args(["--exclude=./dev/*"])
        .stdin(Stdio::null());
    let out = run_mapped(mapper, tar).map_err(|e| ImageError::Unpack(e.to_string()))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(TAIL_LINES).collect();
    Err(ImageError::Unpack(format!("tar {}: {}", out.status, tail.into_iter().rev().collect::<Vec<_>>().join("\n"))))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;
    use crate::store::test_dir::TempDir;

    fn mapper() -> IdMapper {
        IdMapper::detect().expect("an id map for the test user")
    }

    #[test]
    fn files_get_the_host_ids_the_map_gives_their_owners() {
        let t = TempDir::new("unpack");
        let tarball = t.path().join("t.tar");
        let mut b = tar::Builder::new(std::fs::File::create(&tarball).unwrap());
        for (name, uid, gid, mode) in
            [("./", 0, 0, 0o755), ("./root-file", 0, 0, 0o600), ("./apt-file", 42, 42, 0o4750)]
        {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(if name.ends_with('/') { tar::EntryType::Directory } else { tar::EntryType::Regular });
            h.set_size(0);
            h.set_uid(uid);
            h.set_gid(gid);
            h.set_mode(mode);
            b.append_data(&mut h, name, std::io::empty()).unwrap();
        }
        b.into_inner().unwrap();
        let (m, rootfs) = (mapper(), t.path().join("rootfs"));
        unpack(&m, &tarball, &rootfs).unwrap();
        let map = m.id_map();
        let owner = |p: &Path| std::fs::symlink_metadata(p).map(|md| (md.uid(), md.gid(), md.mode() & 0o7777)).unwrap();
        let (ruid, rgid) = map.host_root();
        assert_eq!(owner(&rootfs), (ruid, rgid, 0o755));
        assert_eq!(owner(&rootfs.join("root-file")), (ruid, rgid, 0o600));
        let host = |ids: &[sandbox_userns::IdExtent]| {
            ids.iter().find(|e| e.inside <= 42 && 42 - e.inside < e.count).map(|e| e.outside + 42 - e.inside).unwrap()
        };
        assert_eq!(owner(&rootfs.join("apt-file")), (host(&map.uids), host(&map.gids), 0o4750), "setuid kept");
    }

    #[test]
    fn unpacks_where_the_namespace_root_cannot_traverse() {
        // Debian's /root is 0700: a store under it is out of the mapped
        // root's reach by path (as root, the map's root is another host id).
        let t = TempDir::new("unpack0700");
        let private = t.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let tarball = private.join("t.tar");
        let mut b = tar::Builder::new(std::fs::File::create(&tarball).unwrap());
        let mut h = tar::Header::new_gnu();
        h.set_size(2);
        h.set_mode(0o644);
        b.append_data(&mut h, "./file", &b"hi"[..]).unwrap();
        b.into_inner().unwrap();
        let rootfs = private.join("rootfs");
        unpack(&mapper(), &tarball, &rootfs).unwrap();
        assert_eq!(std::fs::read(rootfs.join("file")).unwrap(), b"hi");
    }

    #[test]
    fn a_broken_tarball_fails_with_tars_complaint() {
        let t = TempDir::new("unpackbad");
        let tarball = t.path().join("t.tar");
        std::fs::write(&tarball, b"not a tarball at all").unwrap();
        let err = unpack(&mapper(), &tarball, &t.path().join("rootfs")).unwrap_err();
        assert!(matches!(err, ImageError::Unpack(_)), "{err}");
        assert!(
            err.to_string().starts_with("unpacking the image as the sandbox's ids failed: tar exit status"),
            "{err}"
        );
    }
}
