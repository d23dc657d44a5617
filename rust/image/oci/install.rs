//! Installing a fetched OCI image as an image of the store: its layers are
//! unpacked (confined, through the sandbox's id map) into a build directory
//! staged like an mmdebstrap build's, inspected, and renamed into place.
use crate::build::BuildDir;
use crate::layers::LAYERS_DIR;
use crate::store::{BLOBS_DIR, INFO_FILE, ROOTFS_DIR, write_info};
use crate::{ImageConfig, ImageError, ImageInfo, ImageStore, inspect, validate_name};
use sandbox_userns::IdMapper;

use std::fs::File;
use std::io::Read as _;
use std::path::Path;

use sandbox_base::size::human_size;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};

use super::layers::{open_path_dir, unpack_image};
use super::{BlobStore, FetchedImage};

impl ImageStore {
    /// The blob store every OCI image of this store shares, `<root>/blobs`.
    pub fn blobs(&self) -> BlobStore {
        BlobStore::new(self.root.join(BLOBS_DIR))
    }

    /// Installs `image` (its blobs in `blobs`) as image `name` for sandboxes
    /// mapped by `mapper`. An existing image of that name is replaced only
    /// with `force`, and never while images are committed on it. An image
    /// without /bin/sh is installed all the same (its shell is what
    /// inspection finds). Blocks for the whole unpack.
    pub fn add_oci(
        &self,
        name: &str,
        image: &FetchedImage,
        blobs: &BlobStore,
        mapper: &IdMapper,
        force: bool,
        progress: &mut dyn FnMut(&str),
    ) -> Result<ImageInfo, ImageError> {
        validate_name(name)?;
        if name == LAYERS_DIR || name == BLOBS_DIR {
            return Err(ImageError::InvalidName(name.to_string()));
        }
        self.check_replaceable(name, force)?;
        std::fs::create_dir_all(&self.root)
            .map_err(|e| ImageError::io(format!("creating {}", self.root.display()), e))?;
        self.remove_stale_builds(name);
        let work = BuildDir::create(self.root.join(format!(".{name}.building-{}", std::process::id())))?;
        let rootfs = work.0.join(ROOTFS_DIR);
        progress(&format!("installing {} as image {name}", image.source));
        unpack_image(image, blobs, mapper, &rootfs, progress)?;
        let run = &image.run;
        let info = ImageInfo {
            name: name.to_string(),
            size_bytes: inspect::disk_usage(&rootfs),
            created_at_ms: sandbox_base::clock::unix_ms(),
            shell: inspect::shell(&rootfs),
            package_manager: inspect::package_manager(&rootfs),
            id_map: mapper.id_map().clone(),
            config: ImageConfig {
                env: run.env.clone(),
                workdir: run.workdir.clone(),
                user: user_in_image(&rootfs, &run.user, progress),
                entrypoint: run.entrypoint.clone(),
                cmd: run.cmd.clone(),
                exposed_ports: run.exposed_ports.clone(),
            },
            labels: run.labels.clone(),
            source: image.source.clone(),
            ..ImageInfo::default()
        };
        write_info(&work.0.join(INFO_FILE), &info)?;
        {
            // Checked again under the lock: a commit on the old image may
            // have landed during the unpack.
            let _guard = self.lock();
            self.check_replaceable(name, force)?;
            self.install(work, name, force)?;
        }
        progress(&format!("image {name} ready ({})", human_size(info.size_bytes)));
        if force { Ok(info) } else { self.get(name) }
    }

    /// `AlreadyExists` for a taken name without `force`; `HasChildren` for
    /// one images are committed on.
    pub fn check_replaceable(&self, name: &str, force: bool) -> Result<(), ImageError> {
        match self.get(name) {
            Ok(_) if !force => Err(ImageError::AlreadyExists(name.to_string())),
            Ok(_) => self.refuse_with_children(name),
            Err(ImageError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The image's `User` when the image has it: numeric ids always, names only
/// when its /etc/passwd (and /etc/group for a `user:group`) lists them, read
/// inside the image so that a link there cannot point at the host's. Else
/// its processes run as root, and `progress` says why: a missing user would
/// make every exec fail.
fn user_in_image(rootfs: &Path, user: &str, progress: &mut dyn FnMut(&str)) -> String {
    if user.is_empty() {
        return String::new();
    }
    let (name, group) = match user.split_once(':') {
        Some((name, group)) => (name, Some(group)),
        None => (user, None),
    };
    let listed = |file: &str, id: &str| {
        id.parse::<u32>().is_ok()
            || read_in_image(rootfs, file).is_some_and(|text| text.lines().any(|l| l.split(':').next() == Some(id)))
    };
    if listed("etc/passwd", name) && group.is_none_or(|g| listed("etc/group", g)) {
        return user.to_string();
    }
    progress(&format!("the image's User {user:?} is not in its /etc/passwd or /etc/group: its processes run as root"));
    String::new()
}

/// A regular file of the image (at most 1 MiB of it), resolved inside it.
fn read_in_image(rootfs: &Path, rel: &str) -> Option<String> {
    let root = open_path_dir(rootfs).ok()?;
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let file = File::from(openat2(&root, rel, how).ok()?);
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    file.take(1 << 20).read_to_string(&mut text).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::oci::layers::tests::{E, image_of, tar_of};
    use crate::store::test_dir::TempDir;

    fn mapper() -> IdMapper {
        IdMapper::detect().expect("an id map for the test user")
    }

    #[test]
    fn an_image_is_installed_inspected_and_replaced_only_with_force() {
        let t = TempDir::new("addoci");
        let store = ImageStore::new(t.path().join("images"));
        let layer = tar_of(
            &[E::Dir("usr/bin/", 0o755), E::File("usr/bin/bash", b"#!", 0o755), E::File("usr/bin/apt-get", b"", 0o755)],
            (0, 0),
        );
        let blobs = store.blobs();
        let (mut image, staged) = image_of(t.path(), &[layer]);
        for l in &image.layers {
            let bytes = staged.read(&l.digest).unwrap();
            blobs.put_bytes("layer", &l.digest, &bytes).unwrap();
        }
        image.source = format!("docker.io/library/test:1@{}", image.manifest_digest);
        image.run.env.insert("PATH".into(), "/usr/bin".into());
        image.run.workdir = "/srv".into();
        image.run.user = "33:33".into();
        let m = mapper();
        let info = store.add_oci("py", &image, &blobs, &m, false, &mut |_| {}).unwrap();
        assert_eq!(info.shell, "/bin/bash");
        assert_eq!(info.package_manager, "apt");
        assert_eq!(&info.id_map, m.id_map());
        assert_eq!(info.source, format!("docker.io/library/test:1@{}", image.manifest_digest));
        assert!(info.reference.is_empty(), "not a VM layer's reference");
        assert_eq!(info.config.workdir, "/srv");
        assert_eq!(info.config.user, "33:33");
        assert_eq!(info.config.env["PATH"], "/usr/bin");
        assert!(info.size_bytes > 0);
        assert_eq!(store.get("py").unwrap(), info);
        assert!(store.rootfs("py").join("usr/bin/bash").exists());
        let err = store.add_oci("py", &image, &blobs, &m, false, &mut |_| {}).unwrap_err();
        assert!(matches!(err, ImageError::AlreadyExists(_)), "{err}");
        // Without /bin/sh: installed all the same, with the shell inspection finds.
        let (bare, _) = image_of(t.path(), &[tar_of(&[E::File("hello", b"hi", 0o755)], (0, 0))]);
        for l in &bare.layers {
            blobs.put_bytes("layer", &l.digest, &staged.read(&l.digest).unwrap()).unwrap();
        }
        let again = store.add_oci("py", &bare, &blobs, &m, true, &mut |_| {}).unwrap();
        assert_eq!((again.shell.as_str(), again.package_manager.as_str()), ("/bin/sh", ""));
        assert!(store.rootfs("py").join("hello").exists() && !store.rootfs("py").join("usr").exists());
        // The blob store is neither an image nor a layer to collect.
        assert_eq!(store.list().unwrap().len(), 1);
        assert!(store.gc().unwrap().is_empty());
        assert!(blobs.contains(&bare.layers[0].digest));
        for reserved in ["blobs", "layers"] {
            let err = store.add_oci(reserved, &bare, &blobs, &m, true, &mut |_| {}).unwrap_err();
            assert!(matches!(err, ImageError::InvalidName(_)), "{err}");
        }
        let mut left: Vec<_> = fs::read_dir(store.root()).unwrap().flatten().map(|e| e.file_name()).collect();
        left.sort();
        assert_eq!(left, [".lock", "blobs", "py"], "no build dirs left");
    }

    #[test]
    fn the_images_user_is_kept_only_when_the_image_has_it() {
        let t = TempDir::new("ociuser");
        let root = t.path().join("rootfs");
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::write(root.join("etc/passwd"), "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/app:/bin/sh\n").unwrap();
        fs::write(root.join("etc/group"), "root:x:0:\nstaff:x:50:\n").unwrap();
        let mut said = Vec::new();
        let mut user = |u: &str| user_in_image(&root, u, &mut |line| said.push(line.to_string()));
        for kept in ["", "app", "1000", "1000:50", "app:staff", "4242:4242"] {
            assert_eq!(user(kept), kept);
        }
        for dropped in ["nobody", "app:wheel", "ro"] {
            assert_eq!(user(dropped), "");
        }
        assert_eq!(said.len(), 3, "{said:?}");
        assert!(said[0].contains("\"nobody\" is not in its /etc/passwd"), "{said:?}");
        // A passwd that is a link to the host's is read inside the image: no such file there.
        fs::remove_file(root.join("etc/passwd")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("etc/passwd")).unwrap();
        assert_eq!(user_in_image(&root, "root", &mut |_| {}), "");
    }

    #[test]
    fn a_failed_unpack_installs_nothing() {
        let t = TempDir::new("addocifail");
        let store = ImageStore::new(t.path().join("images"));
        let (mut image, blobs) = image_of(t.path(), &[tar_of(&[E::File("f", b"x", 0o644)], (0, 0))]);
        image.layers[0].diff_id = crate::oci::blobs::sha256_of(b"else");
        let err = store.add_oci("bad", &image, &blobs, &mapper(), false, &mut |_| {}).unwrap_err();
        assert!(matches!(err, ImageError::Oci(super::super::OciError::DigestMismatch { .. })), "{err}");
        assert!(matches!(store.get("bad"), Err(ImageError::NotFound(_))));
        assert_eq!(fs::read_dir(store.root()).unwrap().count(), 0, "no build dir left");
    }
}
