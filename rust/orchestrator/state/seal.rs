//! Env values at rest: every value the `env` tool sets is sealed (XChaCha20-
//! Poly1305) before it reaches the state database, so the file, its WAL, a
//! backup or a bug report never hold it readably, and opened again only when
//! the database is read back at start. The key is 32 random bytes in
//! `state.key` beside the database: the user's alone (0600), made once,
//! atomically, by whichever server process needs it first.
//!
//! Every value is sealed, not only secret-looking ones: the env tool gives a
//! bare value with no shape to judge, and a name rule misses secrets under
//! plain names (`FOO=hunter2`). Values are applied to commands from memory;
//! the database is read only when a server starts, so sealing costs nothing
//! per command.
//!
//! What this protects against is a copy of the database without the key
//! file; code running as the same user reads both.
use std::{
    fs::{File, OpenOptions},
    io::{Read as _, Write as _},
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use base64::{Engine as _, engine::general_purpose::STANDARD};
use chacha20poly1305::{
    KeyInit as _, XChaCha20Poly1305, XNonce,
    aead::{Aead as _, Generate as _, Key, Payload},
};

/// What marks a sealed value, and which scheme sealed it.
const PREFIX: &str = "sealed:v1:";
/// Bytes of a key.
const KEY_LEN: usize = 32;
/// Bytes of an XChaCha20 nonce: random per value, far too many to repeat.
const NONCE_LEN: usize = 24;

/// Why the key could not be had, or a value not opened.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// Reading, creating or publishing the key file failed.
    #[error("{what} the env key file {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The key file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The key file is a symlink: it could point anywhere, so it is not used.
    #[error("the env key file {path} is a symlink; it must be a regular file (remove it and a new key is made)")]
    Symlink {
        /// The key file.
        path: PathBuf,
    },
    /// Others may read the key file (or it is not ours, or not a file).
    #[error(
        "the env key file {path} is {why}; it must be a regular file of this user readable by no one else (chmod 600 {path})"
    )]
    Exposed {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The key file does not hold a key.
    #[error("the env key file {path} holds {len} bytes, not a {KEY_LEN}-byte key")]
    Malformed {
        /// The key file.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
    /// A value too long for the cipher (over 256 GiB).
    #[error("an env value too long to seal")]
    TooLong,
    /// The system's random source failed.
    #[error("no random bytes for sealing env values: {0}")]
    Random(String),
    /// A stored value is not one this key sealed for this place (another
    /// key, tampered, truncated).
    #[error("a sealed env value could not be opened: it was sealed with another key or damaged")]
    Unopenable,
}

/// The key env values are sealed with.
pub struct SealKey {
    cipher: XChaCha20Poly1305,
}

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

/// The key file of the database at `db`.
pub fn key_path(db: &Path) -> PathBuf {
    db.with_file_name("state.key")
}

/// Whether `stored` is a sealed value (anything else is plaintext from a
/// database written before values were sealed).
pub fn is_sealed(stored: &str) -> bool {
    stored.starts_with(PREFIX)
}

/// Binds a value to its sandbox and name: a sealed value copied into another
/// row does not open.
fn aad(sandbox: &str, name: &str) -> Vec<u8> {
    [sandbox.as_bytes(), b"\0", name.as_bytes()].concat()
}

impl SealKey {
    /// The key at `path`, made first when there is none. An existing file is
    /// used only when it is a regular file of this user that nobody else
    /// can read.
    pub fn load_or_create(path: &Path) -> Result<Self, SealError> {
        loop {
            match Self::load(path) {
                Err(SealError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
                loaded => return loaded,
            }
            // Another process may publish its key first; then that one is read.
            create(path)?;
        }
    }

    fn load(path: &Path) -> Result<Self, SealError> {
        let io = |what| move |source| SealError::Io { what, path: path.to_path_buf(), source };
        let file = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path);
        let file = match file {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(SealError::Symlink { path: path.to_path_buf() });
            }
            Err(e) => return Err(io("opening")(e)),
        };
        let meta = file.metadata().map_err(io("inspecting"))?;
        let exposed = |why: String| SealError::Exposed { path: path.to_path_buf(), why };
        if !meta.is_file() {
            return Err(exposed("not a regular file".into()));
        }
        if meta.uid() != nix::unistd::geteuid().as_raw() {
            return Err(exposed(format!("owned by uid {}, not this user", meta.uid())));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(exposed(format!("mode {:04o}, readable or writable by others", meta.mode() & 0o7777)));
        }
        let mut bytes = Vec::with_capacity(KEY_LEN);
        // One byte more than a key: a longer file is malformed, not cut.
        (&file).take(KEY_LEN as u64 + 1).read_to_end(&mut bytes).map_err(io("reading"))?;
        let key = Key::<XChaCha20Poly1305>::try_from(bytes.as_slice())
            .map_err(|_| SealError::Malformed { path: path.to_path_buf(), len: bytes.len() })?;
        Ok(Self { cipher: XChaCha20Poly1305::new(&key) })
    }

    /// `value` sealed for env `name` of `sandbox`, as stored: `sealed:v1:`
    /// and the base64 of nonce and ciphertext.
    pub fn seal(&self, sandbox: &str, name: &str, value: &str) -> Result<String, SealError> {
        let nonce = XNonce::try_generate().map_err(|e| SealError::Random(e.to_string()))?;
        let aad = aad(sandbox, name);
        let sealed = self
            .cipher
            .encrypt(&nonce, Payload { msg: value.as_bytes(), aad: &aad })
            .map_err(|_| SealError::TooLong)?;
        Ok(format!("{PREFIX}{}", STANDARD.encode([nonce.as_slice(), &sealed].concat())))
    }

    /// The value a [`Self::seal`] of env `name` of `sandbox` stored.
    pub fn open(&self, sandbox: &str, name: &str, stored: &str) -> Result<String, SealError> {
        let bytes = stored
            .strip_prefix(PREFIX)
            .and_then(|b| STANDARD.decode(b).ok())
            .filter(|b| b.len() >= NONCE_LEN)
            .ok_or(SealError::Unopenable)?;
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = XNonce::try_from(nonce).map_err(|_| SealError::Unopenable)?;
        let aad = aad(sandbox, name);
        let plain =
            self.cipher.decrypt(&nonce, Payload { msg: sealed, aad: &aad }).map_err(|_| SealError::Unopenable)?;
        String::from_utf8(plain).map_err(|_| SealError::Unopenable)
    }
}

/// Make a key file at `path`: written whole under a private name (O_EXCL,
/// 0600), then published by a hard link, which fails when the name exists:
/// no process ever reads a half-written key, and a key once published is
/// never replaced.
fn create(path: &Path) -> Result<(), SealError> {
    let io = |what, p: &Path| {
        let path = p.to_path_buf();
        move |source| SealError::Io { what, path, source }
    };
    let key = Key::<XChaCha20Poly1305>::try_generate().map_err(|e| SealError::Random(e.to_string()))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = path.with_file_name(format!(".{name}.{}.new", std::process::id()));
    // Left over by this pid before (a crash mid-way): never published, so stale.
    let _ = std::fs::remove_file(&temp);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&temp)
        .and_then(|mut f| {
            f.write_all(key.as_slice())?;
            f.sync_all()
        });
    let published = written.map_err(io("writing", &temp)).and_then(|()| match std::fs::hard_link(&temp, path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io("publishing", path)(e)),
    });
    let _ = std::fs::remove_file(&temp);
    published?;
    // The link itself must outlive a power cut, or values sealed with the
    // key would outlive the key.
    if let Some(dir) = path.parent() {
        File::open(dir).and_then(|d| d.sync_all()).map_err(io("syncing the directory of", path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;
    use sandbox_base::test_support::scratch_dir;

    #[test]
    fn values_round_trip_and_are_bound_to_their_place() {
        let dir = scratch_dir("seal-roundtrip");
        let key = SealKey::load_or_create(&dir.join("state.key")).unwrap();
        let stored = key.seal("sb", "API_TOKEN", "tok-123 ünï").unwrap();
        assert!(is_sealed(&stored) && !stored.contains("tok-123"), "{stored}");
        assert_eq!(key.open("sb", "API_TOKEN", &stored).unwrap(), "tok-123 ünï");
        // A fresh nonce each time: the same value never looks the same.
        assert_ne!(key.seal("sb", "API_TOKEN", "tok-123 ünï").unwrap(), stored);
        for (sandbox, name) in [("other", "API_TOKEN"), ("sb", "OTHER")] {
            assert!(matches!(key.open(sandbox, name, &stored), Err(SealError::Unopenable)));
        }
        let mut tampered = stored.clone();
        tampered
            .replace_range(PREFIX.len()..PREFIX.len() + 1, if &stored[PREFIX.len()..][..1] == "A" { "B" } else { "A" });
        for bad in [tampered.as_str(), "sealed:v1:", "sealed:v1:!!", "plain"] {
            assert!(matches!(key.open("sb", "API_TOKEN", bad), Err(SealError::Unopenable)), "{bad}");
        }
        assert_eq!(key.seal("sb", "E", "").map(|s| key.open("sb", "E", &s).unwrap()).unwrap(), "");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_key_file_is_private_made_once_and_kept() {
        let dir = scratch_dir("seal-keyfile");
        let path = dir.join("state.key");
        let first = SealKey::load_or_create(&path).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.is_file());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), KEY_LEN as u64);
        // Another process (or a restart) reads the same key.
        let stored = first.seal("sb", "K", "v").unwrap();
        assert_eq!(SealKey::load_or_create(&path).unwrap().open("sb", "K", &stored).unwrap(), "v");
        // No temporary file is left behind.
        let names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["state.key"]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_exposed_symlinked_or_malformed_key_file_is_refused_with_a_reason() {
        let dir = scratch_dir("seal-refused");
        let path = dir.join("state.key");
        drop(SealKey::load_or_create(&path).unwrap());
        for (mode, shown) in [(0o640, "mode 0640"), (0o604, "mode 0604"), (0o620, "mode 0620")] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = SealKey::load_or_create(&path).unwrap_err();
            assert!(matches!(err, SealError::Exposed { .. }), "{err}");
            assert!(err.to_string().contains(shown) && err.to_string().contains("chmod 600"), "{err}");
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();

        let link = dir.join("linked.key");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let err = SealKey::load_or_create(&link).unwrap_err();
        assert!(matches!(err, SealError::Symlink { .. }) && err.to_string().contains("symlink"), "{err}");

        let short = dir.join("short.key");
        std::fs::write(&short, b"too short").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = SealKey::load_or_create(&short).unwrap_err();
        assert!(matches!(err, SealError::Malformed { len: 9, .. }), "{err}");

        let not_file = dir.join("dir.key");
        std::fs::create_dir(&not_file).unwrap();
        std::fs::set_permissions(&not_file, std::fs::Permissions::from_mode(0o700)).unwrap();
        let err = SealKey::load_or_create(&not_file).unwrap_err();
        assert!(matches!(err, SealError::Exposed { .. }) && err.to_string().contains("regular file"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
