//! The content-addressed blob store shared by every OCI image: manifests,
//! configs and layers at `<root>/sha256/<hex>`. A blob is written to a
//! temporary file beside its place, hashed as it is written, and renamed
//! into place only when its digest matches: an interrupted or corrupted
//! transfer leaves nothing a later pull trusts. Two writers of the same
//! blob at once serialize on a lock file, so it is fetched once.
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::OciError;

/// The blob store at a directory.
#[derive(Debug, Clone)]
pub struct BlobStore {
    root: PathBuf,
}

/// Checks `digest` is `sha256:` and 64 lowercase hex digits; returns the hex.
pub fn digest_hex(digest: &str) -> Result<&str, OciError> {
    let hex = digest.strip_prefix("sha256:").ok_or_else(|| OciError::BadDigest(digest.to_string()))?;
    if hex.len() == 64 && hex.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) {
        Ok(hex)
    } else {
        Err(OciError::BadDigest(digest.to_string()))
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hashes what passes through it.
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    /// Wraps `inner`.
    pub fn new(inner: R) -> Self {
        Self { inner, hasher: Sha256::new(), count: 0 }
    }

    /// `sha256:<hex>` of what was read, and how many bytes.
    pub fn finish(self) -> (String, u64) {
        (format!("sha256:{}", hex(&self.hasher.finalize())), self.count)
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

impl BlobStore {
    /// The store at `root` (created on first write).
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// Its directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where blob `digest` lies (whether or not it is there).
    pub fn path(&self, digest: &str) -> Result<PathBuf, OciError> {
        Ok(self.root.join("sha256").join(digest_hex(digest)?))
    }

    /// Whether blob `digest` is in the store (it was verified when written).
    pub fn contains(&self, digest: &str) -> bool {
        self.path(digest).is_ok_and(|p| p.is_file())
    }

    /// Reads a blob whole (manifests and configs: small).
    pub fn read(&self, digest: &str) -> Result<Vec<u8>, OciError> {
        let path = self.path(digest)?;
        fs::read(&path).map_err(|e| OciError::io(format!("reading blob {}", path.display()), e))
    }

    /// Stores `bytes` as blob `digest`, refusing them if they do not match.
    pub fn put_bytes(&self, what: &str, digest: &str, bytes: &[u8]) -> Result<PathBuf, OciError> {
        self.put(what, digest, |_| Ok(()), &mut &bytes[..])
    }

    /// Stores what `reader` yields as blob `digest`, unless the store has it
    /// (then nothing is read). `progress` is told the bytes written so far.
    /// Concurrent callers for one digest wait for each other: one writes,
    /// the others find it there.
    pub fn put(
        &self,
        what: &str,
        digest: &str,
        mut progress: impl FnMut(u64) -> Result<(), OciError>,
        reader: &mut dyn Read,
    ) -> Result<PathBuf, OciError> {
        let Some(mut writer) = self.writer(what, digest)? else {
            return self.path(digest);
        };
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = reader.read(&mut buf).map_err(|e| OciError::io(format!("reading {what}"), e))?;
            if n == 0 {
                break;
            }
            writer.write(&buf[..n])?;
            progress(writer.written())?;
        }
        writer.commit()
    }

    /// A writer for blob `digest`, or None when the store has it. Blocks
    /// while another writer of the same digest (in any process) holds its
    /// lock, so async callers run this on a blocking thread. The blob is
    /// kept only through [`BlobWriter::commit`]; a writer dropped before
    /// that removes what it wrote.
    pub fn writer(&self, what: &str, digest: &str) -> Result<Option<BlobWriter>, OciError> {
        let path = self.path(digest)?;
        let hex = digest_hex(digest)?;
        let dir = self.root.join("sha256");
        fs::create_dir_all(&dir).map_err(|e| OciError::io(format!("creating {}", dir.display()), e))?;
        let lock_path = dir.join(format!(".{hex}.lock"));
        let lock =
            File::create(&lock_path).map_err(|e| OciError::io(format!("creating {}", lock_path.display()), e))?;
        let lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| OciError::io(format!("locking {}", lock_path.display()), e.into()))?;
        if path.is_file() {
            return Ok(None);
        }
        // One name per process is enough: the lock keeps this process's
        // writers of a digest apart too (flock is per open file).
        let tmp = dir.join(format!(".{hex}.partial-{}", std::process::id()));
        let out = File::create(&tmp).map_err(|e| OciError::io(format!("creating {}", tmp.display()), e))?;
        Ok(Some(BlobWriter {
            what: what.to_string(),
            digest: digest.to_string(),
            path,
            tmp,
            out,
            hasher: Sha256::new(),
            count: 0,
            committed: false,
            _lock: lock,
        }))
    }
}

/// One blob being written: hashed as it goes, renamed into place by
/// `commit` only if it matches its digest, removed if dropped before.
pub struct BlobWriter {
    what: String,
    digest: String,
    path: PathBuf,
    tmp: PathBuf,
    out: File,
    hasher: Sha256,
    count: u64,
    committed: bool,
    // Held until the blob is in place or its partial is gone (dropped
    // after `Drop::drop` has removed the partial).
    _lock: nix::fcntl::Flock<File>,
}

impl BlobWriter {
    /// Appends `bytes`.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), OciError> {
        self.out.write_all(bytes).map_err(|e| OciError::io(format!("writing {}", self.tmp.display()), e))?;
        self.hasher.update(bytes);
        self.count += bytes.len() as u64;
        Ok(())
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.count
    }

    /// Checks the digest, syncs and renames the blob into place.
    pub fn commit(mut self) -> Result<PathBuf, OciError> {
        let actual = format!("sha256:{}", hex(&std::mem::take(&mut self.hasher).finalize()));
        if actual != self.digest {
            return Err(OciError::DigestMismatch { what: self.what.clone(), expected: self.digest.clone(), actual });
        }
        self.out.sync_all().map_err(|e| OciError::io(format!("syncing {}", self.tmp.display()), e))?;
        fs::rename(&self.tmp, &self.path)
            .map_err(|e| OciError::io(format!("renaming into {}", self.path.display()), e))?;
        self.committed = true;
        Ok(self.path.clone())
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_dir::TempDir;

    #[test]
    fn a_blob_is_kept_only_when_it_matches_its_digest() {
        let t = TempDir::new("blobs");
        let store = BlobStore::new(t.path().join("blobs"));
        let good = sha256_of(b"hello");
        let path = store.put_bytes("a test blob", &good, b"hello").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"hello");
        assert!(store.contains(&good));
        let bad = sha256_of(b"other");
        let err = store.put_bytes("a test blob", &bad, b"hello").unwrap_err();
        assert!(matches!(err, OciError::DigestMismatch { .. }), "{err}");
        assert!(!store.contains(&bad));
        let left: Vec<_> = fs::read_dir(t.path().join("blobs/sha256"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("partial"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_writer_dropped_or_refused_leaves_nothing() {
        let t = TempDir::new("blobwriter");
        let store = BlobStore::new(t.path().join("blobs"));
        let digest = sha256_of(b"abcdef");
        let mut w = store.writer("a test blob", &digest).unwrap().unwrap();
        w.write(b"abc").unwrap();
        drop(w);
        let mut w = store.writer("a test blob", &digest).unwrap().unwrap();
        w.write(b"abcdeX").unwrap();
        assert!(matches!(w.commit(), Err(OciError::DigestMismatch { .. })));
        assert!(!store.contains(&digest));
        let mut w = store.writer("a test blob", &digest).unwrap().unwrap();
        w.write(b"abc").unwrap();
        w.write(b"def").unwrap();
        assert_eq!(w.written(), 6);
        assert_eq!(fs::read(w.commit().unwrap()).unwrap(), b"abcdef");
        assert!(store.writer("a test blob", &digest).unwrap().is_none());
        let names: Vec<_> = fs::read_dir(t.path().join("blobs/sha256"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(".lock"))
            .collect();
        assert_eq!(names, [digest_hex(&digest).unwrap()]);
    }

    #[test]
    fn digests_are_checked_before_they_name_a_path() {
        let store = BlobStore::new(PathBuf::from("/nonexistent"));
        for bad in ["sha256:../../etc/passwd", "md5:abc", "sha256:ABCDEF", &format!("sha256:{}", "a".repeat(63))] {
            assert!(matches!(store.path(bad), Err(OciError::BadDigest(_))), "{bad}");
        }
    }
}
