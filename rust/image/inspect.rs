//! What a built root filesystem provides: its shell, its package manager and
//! its size. Paths are looked up without following a final symlink, so an
//! absolute link in the image can never make us read the host instead.
use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// True if `rel` exists in the tree (as any kind of file, symlinks included).
#[cfg(linux_host)]
fn present(rootfs: &Path, rel: &[&str]) -> bool {
    rel.iter().any(|r| fs::symlink_metadata(rootfs.join(r)).is_ok())
}

/// `/bin/bash` if the image has bash, else `/bin/sh`.
#[cfg(linux_host)]
pub(super) fn shell(rootfs: &Path) -> String {
    if present(rootfs, &["usr/bin/bash", "bin/bash"]) { "/bin/bash" } else { "/bin/sh" }.to_string()
}

/// "apt", "apk", "dnf" or "" (the image cannot install packages).
#[cfg(linux_host)]
pub(super) fn package_manager(rootfs: &Path) -> String {
    let managers: [(&str, &[&str]); 3] = [
        ("apt", &["usr/bin/apt-get", "bin/apt-get"]),
        ("apk", &["sbin/apk", "usr/sbin/apk", "usr/bin/apk"]),
        ("dnf", &["usr/bin/dnf", "bin/dnf"]),
    ];
    managers.iter().find(|(_, paths)| present(rootfs, paths)).map(|(name, _)| name.to_string()).unwrap_or_default()
}

/// Disk usage like `du -s --block-size=1`: allocated blocks, each hard-linked
/// inode counted once. Unreadable directories (possible when the tree belongs
/// to another id range) are skipped, since a size is informational.
pub fn disk_usage(root: &Path) -> u64 {
    let mut seen = HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![root.to_path_buf()];
    if let Ok(m) = fs::symlink_metadata(root) {
        total += m.blocks() * 512;
    }
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let Ok(m) = entry.metadata() else { continue };
            if m.nlink() > 1 && !m.is_dir() && !seen.insert((m.dev(), m.ino())) {
                continue;
            }
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_dir::TempDir;
    use std::os::unix::fs::symlink;

    #[test]
    #[cfg(linux_host)]
    fn detects_shell_and_package_manager_through_merged_usr() {
        let t = TempDir::new("inspect");
        let r = t.path();
        assert_eq!(shell(r), "/bin/sh");
        assert_eq!(package_manager(r), "");
        fs::create_dir_all(r.join("usr/bin")).unwrap();
        symlink("usr/bin", r.join("bin")).unwrap();
        fs::write(r.join("usr/bin/bash"), b"").unwrap();
        fs::write(r.join("usr/bin/apt-get"), b"").unwrap();
        assert_eq!(shell(r), "/bin/bash");
        assert_eq!(package_manager(r), "apt");
    }

    #[test]
    fn disk_usage_counts_hard_links_once() {
        let t = TempDir::new("du");
        let r = t.path();
        fs::create_dir(r.join("d")).unwrap();
        fs::write(r.join("d/big"), vec![7u8; 256 * 1024]).unwrap();
        let one = disk_usage(r);
        assert!(one >= 256 * 1024, "{one}");
        fs::hard_link(r.join("d/big"), r.join("d/again")).unwrap();
        assert_eq!(disk_usage(r), one);
        assert_eq!(disk_usage(&r.join("absent")), 0);
    }
}
