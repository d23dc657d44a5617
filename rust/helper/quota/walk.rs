//! What a VM's files cost: a walk of each part's tree by directory fds,
//! and the files its processes hold open after unlinking them.
use std::collections::HashSet;
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
#[cfg(linux_host)]
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use nix::NixPath;
use nix::dir::Dir;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, fstat, fstatat};

use super::INODE_COST;

/// What the tree under `root` costs: st_blocks of every entry and at least
/// [`INODE_COST`] each, hard-linked files once, without following symlinks
/// below root or leaving its filesystem. Unreadable directories count as
/// empty.
///
/// Walked by directory fds (`openat` on the parent's fd with `O_NOFOLLOW`),
/// not by paths: a tree nested deeper than PATH_MAX is counted all the same,
/// and a directory swapped for a symlink mid-walk is never followed. One fd
/// is held per level of the directory being walked.
pub fn allocated(root: &Path) -> u64 {
    // The root is the host's (it may be a symlink to the workspace); only
    // what lies below it is the VM's.
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let Ok(fd) = openat(AT_FDCWD, root, flags, Mode::empty()) else { return 0 };
    let Ok(top) = fstat(&fd) else { return 0 };
    let mut walk = Walk { dev: top.st_dev, total: charge(&top), linked: HashSet::new() };
    let subdirs = walk.level(&fd);
    let mut stack = vec![(fd, subdirs)];
    while let Some((parent, pending)) = stack.last_mut() {
        let Some(name) = pending.pop() else {
            stack.pop();
            continue;
        };
        let Ok(fd) = open_dir(&*parent, name.as_c_str()) else { continue };
        let subdirs = walk.level(&fd);
        stack.push((fd, subdirs));
    }
    walk.total
}

/// The state of one [`allocated`] walk.
struct Walk {
    dev: libc::dev_t,
    total: u64,
    /// Inodes with several links, counted once.
    linked: HashSet<u64>,
}

impl Walk {
    /// Counts the entries of the directory `fd` and returns the names of its
    /// subdirectories on the same filesystem.
    fn level(&mut self, fd: &OwnedFd) -> Vec<CString> {
        // A duplicate to read with, so the walk keeps `fd` for the *at calls.
        let Some(dir) = fd.try_clone().ok().and_then(|dup| Dir::from_fd(dup).ok()) else { return Vec::new() };
        let mut subdirs = Vec::new();
        for entry in dir.into_iter().flatten() {
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let Ok(st) = fstatat(fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) else { continue };
            if st.st_dev != self.dev {
                continue;
            }
            let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
            if st.st_nlink > 1 && !is_dir && !self.linked.insert(st.st_ino) {
                continue;
            }
            self.total += charge(&st);
            if is_dir {
                subdirs.push(name.to_owned());
            }
        }
        subdirs
    }
}

fn open_dir<Fd: AsFd, P: ?Sized + NixPath>(at: Fd, path: &P) -> nix::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    openat(at, path, flags, Mode::empty())
}

/// An entry's cost against the quota: its blocks, at least [`INODE_COST`].
fn charge(st: &FileStat) -> u64 {
    (u64::try_from(st.st_blocks).unwrap_or(0) * 512).max(INODE_COST)
}

/// Bytes allocated to regular files that the VM's processes (PID 1 and every
/// process below it) hold open after unlinking them: the walk cannot see
/// them, yet they take the host's disk until closed. Counted when on one of
/// `devs` (the parts' filesystems and the overlay root's), each inode once.
#[cfg(linux_host)]
pub fn unlinked(pid1: i32, devs: &HashSet<u64>) -> u64 {
    let mut seen = HashSet::new();
    let mut total = 0;
    let pids = std::iter::once(pid1).chain(sandbox_agent::tree::descendants(pid1).into_keys());
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        for fd in fds.flatten() {
            // Follows the fd's magic link: the open file itself, by no path.
            let Ok(meta) = std::fs::metadata(fd.path()) else { continue };
            if meta.nlink() == 0
                && meta.is_file()
                && devs.contains(&meta.dev())
                && seen.insert((meta.dev(), meta.ino()))
            {
                total += meta.blocks() * 512;
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::io::Write as _;
    use std::os::unix::fs::MetadataExt as _;

    use super::super::tests::Scratch;
    use super::*;

    #[test]
    fn allocated_counts_blocks_and_hard_links_once() {
        let root = std::env::temp_dir().join(format!("quota-test-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let dir = Scratch(root);
        let empty = allocated(dir.path());
        let data = vec![1u8; 1 << 20];
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a"), &data).unwrap();
        std::fs::hard_link(dir.path().join("sub/a"), dir.path().join("b")).unwrap();
        std::os::unix::fs::symlink("/usr", dir.path().join("link")).unwrap();
        // Sparse: a large size with nothing allocated.
        std::fs::File::create(dir.path().join("sparse")).unwrap().set_len(1 << 30).unwrap();
        let grown = allocated(dir.path()) - empty;
        assert!((1 << 20..(1 << 20) + (64 << 10)).contains(&grown), "{grown}");
    }

    #[test]
    fn every_inode_costs_at_least_a_block() {
        let dir = Scratch(std::env::temp_dir().join(format!("quota-inodes-{}", std::process::id())));
        std::fs::create_dir_all(dir.path()).unwrap();
        let empty = allocated(dir.path());
        for i in 0..100 {
            std::fs::File::create(dir.path().join(format!("e{i}"))).unwrap();
        }
        std::os::unix::fs::symlink("e0", dir.path().join("link")).unwrap();
        let grown = allocated(dir.path()) - empty;
        // 101 inodes, and what the directory itself grew by.
        assert!((101 * INODE_COST..101 * INODE_COST + (64 << 10)).contains(&grown), "{grown}");
    }

    #[test]
    fn allocated_counts_a_tree_deeper_than_path_max() {
        let dir = Scratch(std::env::temp_dir().join(format!("quota-deep-{}", std::process::id())));
        std::fs::create_dir_all(dir.path()).unwrap();
        let empty = allocated(dir.path());
        // 25 levels of 200-character names: 5000 bytes, past PATH_MAX, so
        // made relative to each level's fd.
        let name = "d".repeat(200);
        let mut fd = open_dir(AT_FDCWD, dir.path()).unwrap();
        for _ in 0..25 {
            nix::sys::stat::mkdirat(&fd, name.as_str(), Mode::from_bits_truncate(0o755)).unwrap();
            fd = open_dir(&fd, name.as_str()).unwrap();
        }
        let file = openat(&fd, "f", OFlag::O_WRONLY | OFlag::O_CREAT, Mode::from_bits_truncate(0o644)).unwrap();
        std::fs::File::from(file).write_all(&vec![1u8; 1 << 20]).unwrap();
        let grown = allocated(dir.path()) - empty;
        assert!(grown >= 1 << 20, "{grown}");
        // Scratch's remove_dir_all walks by fds too, so it removes this.
    }

    #[test]
    fn unlinked_counts_open_deleted_files_once() {
        let dir = Scratch(std::env::temp_dir().join(format!("quota-unlinked-{}", std::process::id())));
        std::fs::create_dir_all(dir.path()).unwrap();
        let dev = std::fs::metadata(dir.path()).unwrap().dev();
        let me = i32::try_from(std::process::id()).unwrap();
        let before = unlinked(me, &HashSet::from([dev]));
        let path = dir.path().join("x");
        let mut f = std::fs::File::create(&path).unwrap();
        let _again = std::fs::File::open(&path).unwrap();
        f.write_all(&vec![1u8; 1 << 20]).unwrap();
        f.sync_all().unwrap();
        std::fs::remove_file(&path).unwrap();
        let grown = unlinked(me, &HashSet::from([dev])) - before;
        assert!((1 << 20..(1 << 20) + (64 << 10)).contains(&grown), "{grown}");
        assert_eq!(unlinked(me, &HashSet::new()), 0);
    }
}
