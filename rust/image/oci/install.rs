//! Installing a fetched OCI image as an image of the store: its layers are
//! unpacked (confined, through the sandbox's id map) into a build directory
//! staged like an mmdebstrap build's, inspected, and renamed into place.
use crate::helper::userns::IdMapper;
use crate::image::build::BuildDir;
use crate::image::layers::LAYERS_DIR;
use crate::image::store::{BLOBS_DIR, INFO_FILE, ROOTFS_DIR, write_info};
use crate::image::{ImageConfig, ImageError, ImageInfo, ImageStore, inspect, validate_name};

use super::{BlobStore, FetchedImage, layers::unpack_image};

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
            created_at_ms: crate::clock::unix_ms(),
            shell: inspect::shell(&rootfs),
            package_manager: inspect::package_manager(&rootfs),
            id_map: mapper.id_map().clone(),
            config: ImageConfig { env: run.env.clone(), workdir: run.workdir.clone(), user: run.user.clone() },
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
        progress(&format!("image {name} ready ({} MB)", info.size_bytes / 1_000_000));
        if force { Ok(info) } else { self.get(name) }
    }

    /// `AlreadyExists` for a taken name without `force`; `HasChildren` for
    /// one images are committed on.
    pub(crate) fn check_replaceable(&self, name: &str, force: bool) -> Result<(), ImageError> {
        match self.get(name) {
            Ok(_) if !force => Err(ImageError::AlreadyExists(name.to_string())),
            Ok(_) => self.refuse_with_children(name),
            Err(ImageError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::image::oci::layers::tests::{E, image_of, tar_of};
    use crate::image::store::test_dir::TempDir;

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
    fn a_failed_unpack_installs_nothing() {
        let t = TempDir::new("addocifail");
        let store = ImageStore::new(t.path().join("images"));
        let (mut image, blobs) = image_of(t.path(), &[tar_of(&[E::File("f", b"x", 0o644)], (0, 0))]);
        image.layers[0].diff_id = crate::image::oci::blobs::sha256_of(b"else");
        let err = store.add_oci("bad", &image, &blobs, &mapper(), false, &mut |_| {}).unwrap_err();
        assert!(matches!(err, ImageError::Oci(super::super::OciError::DigestMismatch { .. })), "{err}");
        assert!(matches!(store.get("bad"), Err(ImageError::NotFound(_))));
        assert_eq!(fs::read_dir(store.root()).unwrap().count(), 0, "no build dir left");
    }
}
