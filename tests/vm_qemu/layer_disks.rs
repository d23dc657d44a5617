//! Layer disks: each built once and then found in the cache, whole even
//! when several boots build one at once, and a missing layer named.
use super::*;

/// A layer's disk is built once (as the namespace's root, so the guest sees
/// the sandbox's ids) and then found in the cache.
#[test]
fn a_layer_disk_is_built_once_and_holds_the_layer() {
    let Ok(mapper) = IdMapper::detect() else {
        eprintln!("SKIP: no id map for this user (host-setup)");
        return;
    };
    let dir = TempDir::new("disk");
    let layer = dir.0.join("layer");
    std::fs::create_dir_all(layer.join("etc")).unwrap();
    std::fs::write(layer.join("etc/motd"), "hello from a layer\n").unwrap();
    let cache = dir.0.join("cache");
    let disk = disks::layer_disk(&layer, &cache, &mapper).expect("build the disk");
    assert_eq!(disk, disks::layer_disk_path(&layer, &cache).unwrap());
    let built = std::fs::metadata(&disk).unwrap().modified().unwrap();
    assert_eq!(disks::layer_disk(&layer, &cache, &mapper).unwrap(), disk);
    assert_eq!(std::fs::metadata(&disk).unwrap().modified().unwrap(), built, "the cached disk is reused");
    let out = std::process::Command::new("debugfs").args(["-R", "cat /etc/motd"]).arg(&disk).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from a layer\n");
}

/// Boots of one image at once build its layer's disk once: the builders
/// in one process (one helper, so one temp name) used to write one file
/// together and mke2fs failed midway (two vm tests failed so in CI).
#[test]
fn concurrent_builders_of_one_layer_disk_all_get_it_whole() {
    let Ok(mapper) = IdMapper::detect() else {
        eprintln!("SKIP: no id map for this user (host-setup)");
        return;
    };
    let dir = TempDir::new("diskrace");
    let layer = dir.0.join("layer");
    // Enough entries that mke2fs takes a while: the race needs overlap.
    for d in 0..40 {
        let sub = layer.join(format!("usr/share/d{d}"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..50 {
            std::fs::write(sub.join(format!("f{f}.gz")), format!("{d}/{f}\n")).unwrap();
        }
    }
    let cache = dir.0.join("cache");
    let disks: Vec<PathBuf> = std::thread::scope(|s| {
        let builders: Vec<_> =
            (0..4).map(|_| s.spawn(|| disks::layer_disk(&layer, &cache, &mapper).expect("build the disk"))).collect();
        builders.into_iter().map(|b| b.join().unwrap()).collect()
    });
    assert!(disks.iter().all(|d| *d == disks[0]), "{disks:?}");
    let out = std::process::Command::new("debugfs")
        .args(["-R", "cat /usr/share/d39/f49.gz"])
        .arg(&disks[0])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "39/49\n");
    let leftovers: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
}

#[test]
fn a_missing_layer_is_named() {
    let Ok(mapper) = IdMapper::detect() else {
        eprintln!("SKIP: no id map for this user (host-setup)");
        return;
    };
    let dir = TempDir::new("nolayer");
    let e = disks::layer_disk(&dir.0.join("gone"), &dir.0.join("cache"), &mapper).unwrap_err().to_string();
    assert!(e.contains("stat layer") && e.contains("gone"), "{e}");
    let e = disks::upper_disk(&dir.0.join("no/such/dir/upper.ext4"), 1 << 20).unwrap_err().to_string();
    assert!(e.contains("upper.ext4"), "{e}");
}
