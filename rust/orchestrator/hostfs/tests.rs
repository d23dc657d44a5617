//! Tests of `hostfs`.
use std::os::unix::fs::symlink;

use super::*;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("smcp-hostfs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("root/a/b")).unwrap();
    std::fs::create_dir_all(d.join("outside")).unwrap();
    std::fs::write(d.join("outside/secret"), "secret").unwrap();
    std::fs::write(d.join("root/a/b/f"), "inside").unwrap();
    d
}

fn open(d: &Path) -> Dir {
    Dir::open_absolute(&d.join("root"), Arc::default()).unwrap()
}

thread_local! {
    pub(super) static FALLBACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` once with openat2 and once with the O_NOFOLLOW fallback.
fn both_walkers(f: impl Fn()) {
    f();
    FALLBACK.with(|c| c.set(true));
    f();
    FALLBACK.with(|c| c.set(false));
}

#[test]
fn symlinks_refused_at_every_position() {
    both_walkers(|| {
        let d = tmp("positions");
        symlink(d.join("outside"), d.join("root/first")).unwrap();
        symlink(d.join("outside"), d.join("root/a/middle")).unwrap();
        symlink(d.join("outside/secret"), d.join("root/a/b/last")).unwrap();
        let root = open(&d);
        // First component: the directory itself is a symlink.
        let e = root.try_clone().unwrap().walk(Path::new("first")).unwrap_err();
        assert!(matches!(e, HostFsError::Symlink(ref p) if p.ends_with("root/first")), "{e}");
        // Middle component.
        let e = root.try_clone().unwrap().walk(Path::new("a/middle/x")).unwrap_err();
        assert!(matches!(e, HostFsError::Symlink(_)), "{e}");
        // Last component, opened as a file.
        let b = root.try_clone().unwrap().walk(Path::new("a/b")).unwrap();
        let e = b.open_file(OsStr::new("last")).unwrap_err();
        assert!(matches!(e, HostFsError::Symlink(_)), "{e}");
        let mut text = String::new();
        b.open_file(OsStr::new("f")).unwrap().0.read_to_string(&mut text).unwrap();
        assert_eq!(text, "inside");
        // The symlink the root itself would be reached through.
        let e = Dir::open_absolute(&d.join("root/first"), Arc::default()).unwrap_err();
        assert!(matches!(e, HostFsError::Symlink(_)), "{e}");
        std::fs::remove_dir_all(d).unwrap();
    });
}

#[test]
fn beneath_escapes_refused() {
    both_walkers(|| {
        let d = tmp("beneath");
        let root = open(&d);
        for bad in ["..", ".", "", "a/../..", "/etc"] {
            assert!(matches!(root.open_dir(OsStr::new(bad)), Err(HostFsError::BadComponent(..))), "{bad}");
        }
        let e = root.try_clone().unwrap().walk(Path::new("a/../../outside")).unwrap_err();
        assert!(matches!(e, HostFsError::BadComponent(..)), "{e}");
        let e = root.try_clone().unwrap().walk(Path::new("/outside")).unwrap_err();
        assert!(matches!(e, HostFsError::BadComponent(..)), "{e}");
        let e = root.write_file(OsStr::new("../x"), &mut "x".as_bytes(), 0o644, ExecBits::Strip).unwrap_err();
        assert!(matches!(e, HostFsError::BadComponent(..)), "{e}");
        assert!(!d.join("x").exists());
        std::fs::remove_dir_all(d).unwrap();
    });
    // openat2 itself refuses to leave the directory, should a name ever
    // get past the component check.
    let d = tmp("beneath-raw");
    let root = open(&d);
    use nix::fcntl::{OpenHow, ResolveFlag, openat2};
    let how = OpenHow::new().flags(OFlag::O_PATH).resolve(ResolveFlag::RESOLVE_BENEATH);
    assert_eq!(openat2(&root.fd, "../outside", how).unwrap_err(), Errno::EXDEV);
    assert_eq!(openat2(&root.fd, "/etc", how).unwrap_err(), Errno::EXDEV);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn writes_go_through_an_exclusive_temp_and_a_rename() {
    both_walkers(|| {
        let d = tmp("write");
        let root = open(&d);
        let b = root.create_dirs(Path::new("a/b/new/deeper")).unwrap();
        assert_eq!(b.write_file(OsStr::new("out"), &mut "one".as_bytes(), 0o600, ExecBits::Strip).unwrap(), 3);
        assert_eq!(std::fs::read_to_string(d.join("root/a/b/new/deeper/out")).unwrap(), "one");
        // A hard link to a file outside: replaced, the outside file untouched.
        std::fs::hard_link(d.join("outside/secret"), d.join("root/a/b/new/deeper/linked")).unwrap();
        b.write_file(OsStr::new("linked"), &mut "two".as_bytes(), 0o644, ExecBits::Strip).unwrap();
        assert_eq!(std::fs::read_to_string(d.join("outside/secret")).unwrap(), "secret");
        assert_eq!(std::fs::read_to_string(d.join("root/a/b/new/deeper/linked")).unwrap(), "two");
        // A symlink at the name is refused and left alone.
        symlink(d.join("outside/secret"), d.join("root/a/b/new/deeper/planted")).unwrap();
        let e = b.write_file(OsStr::new("planted"), &mut "evil".as_bytes(), 0o644, ExecBits::Strip).unwrap_err();
        assert!(matches!(e, HostFsError::Symlink(_)), "{e}");
        assert_eq!(std::fs::read_to_string(d.join("outside/secret")).unwrap(), "secret");
        // A temp name already taken (here by a symlink) is skipped over.
        let next = TEMP_COUNTER.load(Ordering::Relaxed);
        for n in next..next + 3 {
            let squat = format!(".out.{}-{n}.smcp-tmp", std::process::id());
            symlink(d.join("outside/secret"), d.join("root/a/b/new/deeper").join(squat)).unwrap();
        }
        b.write_file(OsStr::new("out"), &mut "three".as_bytes(), 0o644, ExecBits::Strip).unwrap();
        assert_eq!(std::fs::read_to_string(d.join("root/a/b/new/deeper/out")).unwrap(), "three");
        assert_eq!(std::fs::read_to_string(d.join("outside/secret")).unwrap(), "secret");
        // Creating directories never follows a symlink either.
        symlink(d.join("outside"), d.join("root/a/evil")).unwrap();
        let e = open(&d).create_dirs(Path::new("a/evil/sub")).unwrap_err();
        assert!(matches!(e, HostFsError::Symlink(_)), "{e}");
        assert!(!d.join("outside/sub").exists());
        let leftovers: Vec<_> = std::fs::read_dir(d.join("root/a/b/new/deeper"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".smcp-tmp") && !n.starts_with(".out."))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        std::fs::remove_dir_all(d).unwrap();
    });
}

#[test]
fn fifos_and_devices_refused_without_blocking() {
    both_walkers(|| {
        let d = tmp("special");
        nix::unistd::mkfifo(&d.join("root/fifo"), Mode::from_bits_truncate(0o644)).unwrap();
        let root = open(&d);
        let e = root.open_file(OsStr::new("fifo")).unwrap_err();
        assert!(matches!(e, HostFsError::Special { kind: "a fifo", .. }), "{e}");
        let e = root.write_file(OsStr::new("fifo"), &mut "x".as_bytes(), 0o644, ExecBits::Strip).unwrap_err();
        assert!(matches!(e, HostFsError::Special { kind: "a fifo", .. }), "{e}");
        // /dev/null is a character device reached from a Dir on /dev.
        let dev = Dir::open_absolute(Path::new("/dev"), Arc::default()).unwrap();
        let e = dev.open_file(OsStr::new("null")).unwrap_err();
        assert!(matches!(e, HostFsError::Special { kind: "a character device", .. }), "{e}");
        let e = root.open_dir(OsStr::new("fifo")).unwrap_err();
        assert!(matches!(e, HostFsError::NotADirectory(_)), "{e}");
        let e = root.open_file(OsStr::new("a")).unwrap_err();
        assert!(matches!(e, HostFsError::IsADirectory(_)), "{e}");
        std::fs::remove_dir_all(d).unwrap();
    });
}

#[test]
fn own_directories_stop_the_walk() {
    let d = tmp("own");
    std::fs::create_dir_all(d.join("root/data/sandbox-mcp/volumes/x/workspace")).unwrap();
    let own = Arc::new(OwnDirs::of([d.join("root/data/sandbox-mcp")]));
    let root = Dir::open_absolute(&d.join("root"), own.clone()).unwrap();
    let e = root.walk(Path::new("data/sandbox-mcp/volumes/x/workspace")).unwrap_err();
    assert!(matches!(e, HostFsError::OwnData { ref dir, .. } if dir.ends_with("data/sandbox-mcp")), "{e}");
    // A root inside them is refused on the way to it.
    let e = Dir::open_absolute(&d.join("root/data/sandbox-mcp/volumes/x"), own).unwrap_err();
    assert!(matches!(e, HostFsError::OwnData { .. }), "{e}");
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn guarded_places_refused_before_anything_is_made() {
    use std::os::unix::fs::PermissionsExt;
    let d = tmp("guard");
    std::fs::create_dir_all(d.join("root/.GIT/hooks")).unwrap();
    let root = open(&d);
    // An existing directory in any case, a new one, and a file name.
    let e = root.try_clone().unwrap().create_dirs(Path::new(".git/hooks")).unwrap_err();
    assert!(matches!(e, HostFsError::Refused { ref refusal, .. } if refusal.rule == ".git/"), "{e}");
    let e = root.try_clone().unwrap().create_dirs(Path::new("a/.vscode")).unwrap_err();
    assert!(e.to_string().starts_with(&format!("refused to write {}/root/a/.vscode on the host: ", d.display())));
    assert!(!d.join("root/a/.vscode").exists());
    let e = root.write_file(OsStr::new(".envrc"), &mut "x".as_bytes(), 0o644, ExecBits::Strip).unwrap_err();
    assert!(matches!(e, HostFsError::Refused { .. }), "{e}");
    // A walk into a denied directory (reading is fine) cannot write there.
    let hooks = root.try_clone().unwrap().walk(Path::new(".GIT/hooks")).unwrap();
    let e = hooks.write_file(OsStr::new("pre-commit"), &mut "x".as_bytes(), 0o755, ExecBits::Keep).unwrap_err();
    assert!(matches!(e, HostFsError::Refused { .. }), "{e}");
    assert_eq!(std::fs::read_dir(d.join("root/.GIT/hooks")).unwrap().count(), 0);
    // The root's own real path is checked too, however it is named.
    std::fs::create_dir_all(d.join("root/.ssh")).unwrap();
    let ssh = Dir::open_absolute(&d.join("root/.ssh"), Arc::default()).unwrap().named(d.join("alias"));
    assert!(matches!(ssh.create_dir(OsStr::new("x")), Err(HostFsError::Refused { .. })));
    // Exec bits only when asked; never setuid.
    root.write_file(OsStr::new("plain"), &mut "x".as_bytes(), 0o4755, ExecBits::Strip).unwrap();
    root.write_file(OsStr::new("tool"), &mut "x".as_bytes(), 0o4755, ExecBits::Keep).unwrap();
    let mode = |n: &str| std::fs::metadata(d.join("root").join(n)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("plain") & 0o7111, 0);
    assert_eq!((mode("tool") & 0o7000, mode("tool") & 0o100), (0, 0o100));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn lists_from_the_fd() {
    let d = tmp("list");
    symlink("/etc", d.join("root/a/l")).unwrap();
    let a = open(&d).walk(Path::new("a")).unwrap();
    let mut names = a.list().unwrap();
    names.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(names, [(OsString::from("b"), Some(Kind::Dir)), (OsString::from("l"), Some(Kind::Symlink))]);
    assert_eq!(a.read_link(OsStr::new("l")).unwrap(), PathBuf::from("/etc"));
    std::fs::remove_dir_all(d).unwrap();
}

/// Names a sandbox made reach messages escaped: a fifo, a symlink and a
/// missing entry named with a terminal escape and a newline cannot paint
/// the agent's screen or forge a line of the message.
#[test]
fn sandbox_made_names_are_escaped_in_messages() {
    let d = tmp("escaped");
    let (fifo, link) = (OsStr::new("p\x1b[2Jq"), OsStr::new("l\nERROR: forged"));
    nix::unistd::mkfifo(&d.join("root").join(fifo), Mode::from_bits_truncate(0o644)).unwrap();
    symlink("a", d.join("root").join(link)).unwrap();
    let root = open(&d);
    let messages = [
        root.open_file(fifo).unwrap_err().to_string(),
        root.open_file(link).unwrap_err().to_string(),
        root.open_dir(fifo).unwrap_err().to_string(),
        root.open_file(OsStr::new("gone\x07")).unwrap_err().to_string(),
    ];
    for m in &messages {
        assert!(!m.chars().any(char::is_control), "{m:?}");
    }
    assert!(messages[0].contains("p\\u{1b}[2Jq is a fifo"), "{}", messages[0]);
    assert!(messages[1].contains("l\\nERROR: forged is a symlink"), "{}", messages[1]);
    std::fs::remove_dir_all(d).unwrap();
}
