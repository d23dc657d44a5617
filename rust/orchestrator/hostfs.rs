//! Race-free file operations on the host, for every tool that takes a host
//! path (`upload`, `download`, `sync_start`, `collect_artifacts`,
//! `validate_config`).
//!
//! A path is never checked once and then reopened by name: a sandbox whose
//! `/workspace` volume is reachable could swap a directory for a symlink in
//! between. Instead everything walks from a directory fd, one component at a
//! time, with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)` (an `O_NOFOLLOW` `openat` where the kernel has no
//! openat2), and then works only through the fds it opened: `fstat` for type
//! and size, directories listed from their fd, files written under a fresh
//! `O_EXCL` temp name and renamed into place relative to the parent's fd.
//! No symlink is followed anywhere, the last component included.
//!
//! Every directory walked through is compared, by device and inode, with
//! sandbox-mcp's own directories ([`sandbox_base::paths::own_dirs`]): a walk that
//! reaches one of them stops, so no sandbox's volume is ever in reach.
//!
//! Every directory created and every file written is first put to the host
//! write guard ([`super::hostguard`]) its `Dir` carries, under each spelling
//! of its path, so no caller can write where the host would run or trust it.
use std::{
    ffi::{OsStr, OsString},
    fs::File,
    io::{self, Read},
    os::{
        fd::{AsFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Component, Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

#[cfg(linux_host)]
use std::sync::atomic::AtomicBool;

use super::hostguard::{ExecBits, HostGuard, Refusal, Refused};
use super::text::escaped_path;
use nix::{
    errno::Errno,
    fcntl::{AtFlags, OFlag, openat, readlinkat, renameat},
    sys::stat::{FileStat, Mode, SFlag, fstat, fstatat, mkdirat},
    unistd::{UnlinkatFlags, unlinkat},
};

/// Why a host path could not be used.
#[derive(Debug, thiserror::Error)]
pub enum HostFsError {
    /// The path is outside every configured host root.
    #[error(
        "host path {path} is outside the allowed host roots ({roots}); add a root with SANDBOX_MCP_HOST_ROOTS or host_roots in the config file"
    )]
    Denied {
        /// The path as given (made absolute).
        path: String,
        /// The roots.
        roots: String,
    },
    /// No path was given.
    #[error("host path must not be empty")]
    Empty,
    /// The path (or a directory on the way) does not exist.
    #[error("{0} does not exist on host")]
    Missing(String),
    /// A component is a symlink.
    #[error("{0} is a symlink; host-path tools do not follow symlinks")]
    Symlink(String),
    /// The walk reached one of sandbox-mcp's own directories.
    #[error("{path} is inside sandbox-mcp's own data ({dir}): host-path tools may not use it")]
    OwnData {
        /// The path asked for.
        path: String,
        /// The directory of sandbox-mcp's it reached.
        dir: String,
    },
    /// A directory was expected.
    #[error("{0} is not a directory")]
    NotADirectory(String),
    /// A regular file was expected.
    #[error("{0} is a directory")]
    IsADirectory(String),
    /// A fifo, socket or device node.
    #[error("{path} is {kind}: only regular files and directories are copied")]
    Special {
        /// The path.
        path: String,
        /// What it is ("a fifo", ...).
        kind: &'static str,
    },
    /// The host write guard denies the place.
    #[error("refused to write {path} on the host: {refusal}")]
    Refused {
        /// The path.
        path: String,
        /// The rule and how to allow it.
        refusal: Refusal,
    },
    /// Every entry a call would have written was refused.
    #[error("nothing was written: {0}")]
    AllRefused(Refused),
    /// A path component that could lead elsewhere (`..`, `/`, empty).
    #[error("invalid host path component {0:?} in {1}")]
    BadComponent(String, String),
    /// Anything else the system refused.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        source: io::Error,
    },
}

impl HostFsError {
    fn io(path: &Path, e: impl Into<io::Error>) -> Self {
        Self::Io { path: escaped_path(path), source: e.into() }
    }

    /// The same error naming `path` (the whole path the caller asked for)
    /// where it named a directory on the way.
    pub fn naming(self, path: &Path) -> Self {
        match self {
            Self::Missing(_) => Self::Missing(escaped_path(path)),
            Self::OwnData { dir, .. } => Self::OwnData { path: escaped_path(path), dir },
            other => other,
        }
    }

    /// Whether the entry simply is not there (a vanished path to skip).
    pub fn is_missing(&self) -> bool {
        matches!(self, Self::Missing(_))
    }
}

/// What a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symlink.
    Symlink,
    /// A fifo.
    Fifo,
    /// A Unix socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
}

impl Kind {
    fn from_mode(mode: libc::mode_t) -> Self {
        match SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFDIR => Self::Dir,
            SFlag::S_IFLNK => Self::Symlink,
            SFlag::S_IFIFO => Self::Fifo,
            SFlag::S_IFSOCK => Self::Socket,
            SFlag::S_IFCHR => Self::CharDevice,
            SFlag::S_IFBLK => Self::BlockDevice,
            _ => Self::File,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Dir => "a directory",
            Self::File => "a regular file",
            Self::Symlink => "a symlink",
            Self::Fifo => "a fifo",
            Self::Socket => "a socket",
            Self::CharDevice => "a character device",
            Self::BlockDevice => "a block device",
        }
    }

    /// The error for finding this where a regular file was wanted.
    pub fn not_a_file(self, path: &Path) -> HostFsError {
        let shown = escaped_path(path);
        match self {
            Self::Dir => HostFsError::IsADirectory(shown),
            Self::Symlink => HostFsError::Symlink(shown),
            other => HostFsError::Special { path: shown, kind: other.describe() },
        }
    }

    /// The error for finding this where a directory was wanted.
    fn not_a_dir(self, path: &Path) -> HostFsError {
        match self {
            Self::Symlink => HostFsError::Symlink(escaped_path(path)),
            _ => HostFsError::NotADirectory(escaped_path(path)),
        }
    }
}

impl From<nix::dir::Type> for Kind {
    fn from(t: nix::dir::Type) -> Self {
        use nix::dir::Type;
        match t {
            Type::Directory => Self::Dir,
            Type::Symlink => Self::Symlink,
            Type::Fifo => Self::Fifo,
            Type::Socket => Self::Socket,
            Type::CharacterDevice => Self::CharDevice,
            Type::BlockDevice => Self::BlockDevice,
            Type::File => Self::File,
        }
    }
}

/// What `fstat` said about an entry.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    /// Its type.
    pub kind: Kind,
    /// Permission bits.
    pub mode: u32,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    dev: u64,
    ino: u64,
}

impl From<FileStat> for Stat {
    // The casts are no-ops on Linux and widen on macOS (below).
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    fn from(st: FileStat) -> Self {
        Self {
            kind: Kind::from_mode(st.st_mode),
            // mode_t is u16 and dev_t i32 on macOS; the conversions are
            // std's own (`MetadataExt::mode`, `dev`), so a dev read here
            // equals one read through std.
            mode: u32::from(st.st_mode & 0o7777),
            size: u64::try_from(st.st_size).unwrap_or(0),
            mtime: st.st_mtime,
            dev: st.st_dev as u64,
            ino: st.st_ino,
        }
    }
}

/// sandbox-mcp's own directories, by device and inode (taken when an
/// operation starts, so directories created later are covered next time).
#[derive(Debug, Default)]
pub struct OwnDirs(Vec<(u64, u64, PathBuf)>);

impl OwnDirs {
    /// `dirs` (sandbox-mcp's own: [`sandbox_base::paths::own_dirs`]), created if
    /// missing: one that does not exist yet has no inode to recognise, and
    /// a host-path tool must not be the one to create it (a `download` to
    /// `~/.config/sandbox-mcp/config.toml` would plant a configuration).
    pub fn prepare(dirs: &[PathBuf]) -> Self {
        use std::os::unix::fs::DirBuilderExt;
        for d in dirs {
            if let Err(e) = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(d) {
                tracing::warn!("cannot create {}: {e}", d.display());
            }
        }
        Self::of(dirs.iter().cloned())
    }

    /// The given directories that exist (symlinks to them resolved: what a
    /// walk meets is the real directory).
    pub fn of(dirs: impl IntoIterator<Item = PathBuf>) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self(
            dirs.into_iter()
                .filter_map(|d| std::fs::metadata(&d).ok().filter(|m| m.is_dir()).map(|m| (m.dev(), m.ino(), d)))
                .collect(),
        )
    }

    fn find(&self, st: &Stat) -> Option<&Path> {
        self.0.iter().find(|(dev, ino, _)| *dev == st.dev && *ino == st.ino).map(|(_, _, p)| p.as_path())
    }
}

/// Set once openat2 turned out to be missing (ENOSYS): from then on the
/// walk uses `openat(O_NOFOLLOW)` per component, which is as strict for
/// single names.
#[cfg(linux_host)]
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// How a directory on the walk is held: Linux's `O_PATH` needs no read
/// permission; elsewhere (macOS) there is none, and a directory the walk
/// passes must be readable.
#[cfg(linux_host)]
const DIR_HANDLE: OFlag = OFlag::O_PATH;
#[cfg(not(linux_host))]
const DIR_HANDLE: OFlag = OFlag::O_RDONLY;

/// Open one path component `name` under `dir`, never through a symlink and
/// never outside `dir`. Without openat2 (older kernels, macOS) the component
/// check and `O_NOFOLLOW` are the whole guard, which is as strict for one
/// plain name.
fn open_component(dir: impl AsFd, name: &OsStr, flags: OFlag, mode: Mode) -> nix::Result<OwnedFd> {
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    #[cfg(linux_host)]
    if !NO_OPENAT2.load(Ordering::Relaxed) && !forced_fallback() {
        use nix::fcntl::{OpenHow, ResolveFlag, openat2};
        let resolve =
            ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS;
        match openat2(dir.as_fd(), name, OpenHow::new().flags(flags).mode(mode).resolve(resolve)) {
            Err(Errno::ENOSYS) => {
                NO_OPENAT2.store(true, Ordering::Relaxed);
                tracing::info!("openat2 is not available; host paths are walked with openat(O_NOFOLLOW)");
            }
            other => return other,
        }
    }
    openat(dir, name, flags, mode)
}

#[cfg(all(linux_host, not(test)))]
fn forced_fallback() -> bool {
    false
}

/// Unit tests run the walker both ways on one kernel.
#[cfg(all(linux_host, test))]
fn forced_fallback() -> bool {
    tests::FALLBACK.with(std::cell::Cell::get)
}

/// `name` if it is one plain component (not empty, `.`, `..`, no `/`).
fn component<'a>(name: &'a OsStr, at: &Path) -> Result<&'a OsStr, HostFsError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') || bytes.contains(&0) {
        return Err(HostFsError::BadComponent(name.to_string_lossy().into_owned(), escaped_path(at)));
    }
    Ok(name)
}

/// Temp names are unique per process and call.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// An open directory on the host, reached from `/` or from another `Dir`
/// without following a symlink and without passing through sandbox-mcp's
/// own directories. `path` is only for messages.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
    /// The path actually walked from `/` (`path` may spell the root the way
    /// it was configured): the guard checks both.
    real: PathBuf,
    own: Arc<OwnDirs>,
    /// What writes below this directory are checked against.
    guard: Arc<HostGuard>,
}

impl Dir {
    /// Walk to the absolute `path` from `/`, component by component (so an
    /// own directory on the way is seen even when `path` lies below it).
    pub fn open_absolute(path: &Path, own: Arc<OwnDirs>) -> Result<Dir, HostFsError> {
        let root = Path::new("/");
        let fd = nix::fcntl::open(root, DIR_HANDLE | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| HostFsError::io(root, e))?;
        let dir =
            Dir { fd, path: root.to_path_buf(), real: root.to_path_buf(), own, guard: HostGuard::shared_builtin() };
        dir.check_own(&dir.stat()?)?;
        dir.walk(path.strip_prefix("/").unwrap_or(path))
    }

    /// The same directory, named `path` in messages.
    pub fn named(self, path: PathBuf) -> Self {
        Self { path, ..self }
    }

    /// The same directory, its writes (and those of every `Dir` opened from
    /// it) checked against `guard` instead of the built-in rules.
    pub fn guarded(self, guard: Arc<HostGuard>) -> Self {
        Self { guard, ..self }
    }

    /// Whether the guard lets a file or directory be written at `rel`
    /// below this directory (for callers that skip refused entries instead
    /// of failing; the writes check again).
    pub fn may_write(&self, rel: &Path) -> Result<(), Refusal> {
        self.guard.check(&[&self.path.join(rel), &self.real.join(rel)])
    }

    /// [`Self::may_write`] as the error a write fails with.
    fn check_write(&self, name: &OsStr) -> Result<(), HostFsError> {
        self.may_write(Path::new(name))
            .map_err(|refusal| HostFsError::Refused { path: escaped_path(&self.path.join(name)), refusal })
    }

    /// Where this directory is (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn check_own(&self, st: &Stat) -> Result<(), HostFsError> {
        match self.own.find(st) {
            Some(dir) => Err(HostFsError::OwnData { path: escaped_path(&self.path), dir: escaped_path(dir) }),
            None => Ok(()),
        }
    }

    /// `fstat` of this directory.
    pub fn stat(&self) -> Result<Stat, HostFsError> {
        fstat(&self.fd).map(Stat::from).map_err(|e| HostFsError::io(&self.path, e))
    }

    /// `name` in this directory without following it, or `None` if it does
    /// not exist.
    pub fn child(&self, name: &OsStr) -> Result<Option<Stat>, HostFsError> {
        let name = component(name, &self.path)?;
        match fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st.into())),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(HostFsError::io(&self.path.join(name), e)),
        }
    }

    /// The subdirectory `name`.
    pub fn open_dir(&self, name: &OsStr) -> Result<Dir, HostFsError> {
        let name = component(name, &self.path)?;
        let path = self.path.join(name);
        let fd = match open_component(&self.fd, name, DIR_HANDLE | OFlag::O_DIRECTORY, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Err(HostFsError::Missing(escaped_path(&path))),
            Err(Errno::ELOOP) => return Err(HostFsError::Symlink(escaped_path(&path))),
            Err(Errno::ENOTDIR) => {
                return Err(match self.child(name)? {
                    Some(st) => st.kind.not_a_dir(&path),
                    None => HostFsError::Missing(escaped_path(&path)),
                });
            }
            Err(e) => return Err(HostFsError::io(&path, e)),
        };
        let real = self.real.join(name);
        let dir = Dir { fd, path, real, own: self.own.clone(), guard: self.guard.clone() };
        let st = dir.stat()?;
        if st.kind != Kind::Dir {
            return Err(st.kind.not_a_dir(&dir.path));
        }
        dir.check_own(&st)?;
        Ok(dir)
    }

    /// The directory `rel` below this one (plain components only).
    pub fn walk(self, rel: &Path) -> Result<Dir, HostFsError> {
        let mut dir = self;
        for c in rel.components() {
            match c {
                Component::Normal(name) => dir = dir.open_dir(name)?,
                Component::CurDir => {}
                other => {
                    let shown = other.as_os_str().to_string_lossy().into_owned();
                    return Err(HostFsError::BadComponent(shown, escaped_path(rel)));
                }
            }
        }
        Ok(dir)
    }

    /// A second handle on this directory (for walks that consume a `Dir`).
    pub fn try_clone(&self) -> Result<Dir, HostFsError> {
        let fd = self.fd.try_clone().map_err(|e| HostFsError::io(&self.path, e))?;
        Ok(Dir {
            fd,
            path: self.path.clone(),
            real: self.real.clone(),
            own: self.own.clone(),
            guard: self.guard.clone(),
        })
    }

    /// The subdirectory `name`, created (mode 0755 before umask) if missing,
    /// if the guard allows writing there (an existing one too: it is about
    /// to be written into).
    pub fn create_dir(&self, name: &OsStr) -> Result<Dir, HostFsError> {
        let name = component(name, &self.path)?;
        self.check_write(name)?;
        match mkdirat(&self.fd, name, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => self.open_dir(name),
            Err(e) => Err(HostFsError::io(&self.path.join(name), e)),
        }
    }

    /// The directory `rel` below this one, creating what is missing.
    pub fn create_dirs(self, rel: &Path) -> Result<Dir, HostFsError> {
        let mut dir = self;
        for c in rel.components() {
            match c {
                Component::Normal(name) => dir = dir.create_dir(name)?,
                Component::CurDir => {}
                other => {
                    let shown = other.as_os_str().to_string_lossy().into_owned();
                    return Err(HostFsError::BadComponent(shown, escaped_path(rel)));
                }
            }
        }
        Ok(dir)
    }

    /// Open the regular file `name` for reading, with its `fstat`. Anything
    /// else (symlink, directory, fifo, device) is refused without being
    /// opened for reading; a fifo swapped in meanwhile cannot block the open
    /// (`O_NONBLOCK`) and is refused after its `fstat`.
    pub fn open_file(&self, name: &OsStr) -> Result<(File, Stat), HostFsError> {
        let path = self.path.join(name);
        match self.child(name)? {
            None => return Err(HostFsError::Missing(escaped_path(&path))),
            Some(st) if st.kind != Kind::File => return Err(st.kind.not_a_file(&path)),
            Some(_) => {}
        }
        let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
        let fd = match open_component(&self.fd, name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Err(HostFsError::Missing(escaped_path(&path))),
            Err(Errno::ELOOP) => return Err(HostFsError::Symlink(escaped_path(&path))),
            Err(e) => return Err(HostFsError::io(&path, e)),
        };
        let st = Stat::from(fstat(&fd).map_err(|e| HostFsError::io(&path, e))?);
        if st.kind != Kind::File {
            return Err(st.kind.not_a_file(&path));
        }
        Ok((File::from(fd), st))
    }

    /// The whole regular file `name` as text, or `None` if it does not exist.
    pub fn read_to_string(&self, name: &OsStr) -> Result<Option<String>, HostFsError> {
        let (mut file, _) = match self.open_file(name) {
            Ok(f) => f,
            Err(e) if e.is_missing() => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(|e| HostFsError::io(&self.path.join(name), e))?;
        Ok(Some(text))
    }

    /// Where the symlink `name` points (read with `readlinkat`, never followed).
    pub fn read_link(&self, name: &OsStr) -> Result<PathBuf, HostFsError> {
        let name = component(name, &self.path)?;
        readlinkat(&self.fd, name).map(PathBuf::from).map_err(|e| HostFsError::io(&self.path.join(name), e))
    }

    /// The entries of this directory (without `.` and `..`), with their
    /// type where the file system reports it.
    pub fn list(&self) -> Result<Vec<(OsString, Option<Kind>)>, HostFsError> {
        let err = |e| HostFsError::io(&self.path, e);
        // "." of our own fd: a readable handle on exactly this directory.
        let fd = openat(&self.fd, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(err)?;
        let mut listing = nix::dir::Dir::from_fd(fd).map_err(err)?;
        let mut out = Vec::new();
        for entry in listing.iter() {
            let entry = entry.map_err(err)?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name != "." && name != ".." {
                out.push((name.to_os_string(), entry.file_type().map(Kind::from)));
            }
        }
        Ok(out)
    }

    /// Write `data` from a sandbox as the regular file `name`, with `mode`
    /// as [`ExecBits`] leaves it (before umask): into a new `O_EXCL` temp
    /// file beside it, renamed over `name` when complete. The rename
    /// replaces the name and never writes through it, so a symlink or hard
    /// link planted there cannot redirect the write; an existing symlink,
    /// directory or special file is refused as before, and so is a place
    /// the guard denies. Returns the bytes written.
    pub fn write_file(&self, name: &OsStr, data: &mut dyn Read, mode: u32, exec: ExecBits) -> Result<u64, HostFsError> {
        let name = component(name, &self.path)?;
        self.check_write(name)?;
        let mode = exec.apply(mode);
        let path = self.path.join(name);
        if let Some(st) = self.child(name)?
            && st.kind != Kind::File
        {
            return Err(st.kind.not_a_file(&path));
        }
        let (temp, fd) = self.create_temp(name, mode)?;
        let mut file = File::from(fd);
        let written = io::copy(data, &mut file).map_err(|e| HostFsError::io(&path, e));
        drop(file);
        let renamed = written.and_then(|n| match renameat(&self.fd, temp.as_os_str(), &self.fd, name) {
            Ok(()) => Ok(n),
            Err(Errno::EISDIR) => Err(HostFsError::IsADirectory(escaped_path(&path))),
            Err(e) => Err(HostFsError::io(&path, e)),
        });
        if renamed.is_err() {
            let _ = unlinkat(&self.fd, temp.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
        renamed
    }

    /// A new, empty temp file beside `name`, created `O_EXCL|O_NOFOLLOW`.
    fn create_temp(&self, name: &OsStr, mode: u32) -> Result<(OsString, OwnedFd), HostFsError> {
        // Keep the temp name within NAME_MAX whatever the length of `name`.
        let stem: String = name.to_string_lossy().chars().take(64).collect();
        loop {
            let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let temp = OsString::from(format!(".{stem}.{}-{n}.smcp-tmp", std::process::id()));
            let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL;
            match open_component(&self.fd, &temp, flags, Mode::from_bits_truncate((mode & 0o777) as libc::mode_t)) {
                Ok(fd) => return Ok((temp, fd)),
                Err(Errno::EEXIST) => continue,
                Err(e) => return Err(HostFsError::io(&self.path.join(name), e)),
            }
        }
    }
}

#[cfg(test)]
mod tests;
