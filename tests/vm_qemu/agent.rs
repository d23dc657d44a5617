//! The agent over the serial port of a booted test-image vm: it answers,
//! `/workspace` files cross between host and guest, and the writable layer
//! comes out as a layer of the image store.
use super::*;

/// A booted test-image vm (with `/workspace` when asked) and the
/// multiplexed agent connection over its virtio-serial port.
struct Booted {
    dir: TempDir,
    vm: Instance,
    agent: Mux,
    workspace: PathBuf,
}

async fn boot_test_image(tag: &str, assets: &Assets, mapper: &IdMapper) -> Option<Booted> {
    let dir = TempDir::new(tag);
    let Some((layers, upper)) = disks_for_test_image(&dir.0, mapper) else {
        eprintln!("SKIP: no test image (SANDBOX_MCP_TEST_IMAGE_STORE)");
        return None;
    };
    let workspace = workspace_dir(&dir.0, mapper);
    let accel = tcg();
    let spec = boot_spec(tag, &dir.0, assets, &accel, mapper, (layers, upper), Some(workspace.clone()));
    let (vm, agent) = Instance::boot(spec).await.expect("boot");
    Some(Booted { dir, vm, agent, workspace })
}

#[tokio::test]
async fn the_agent_answers_on_the_serial_port_from_the_guest_kernel() {
    let Some(assets) = assets() else { return };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let Some(mut b) = boot_test_image("uname", &assets, &mapper).await else { return };
    ping(&b.agent).await;
    let (code, release) = exec(&b.agent, &["uname", "-r"]).await;
    assert_eq!(code, 0);
    let host = nix::sys::utsname::uname().unwrap().release().to_string_lossy().into_owned();
    assert_eq!(release.trim(), assets.release, "the guest runs the vm kernel");
    assert_ne!(release.trim(), host, "not the host's kernel");
    let exit = b.vm.stop(Duration::from_secs(10)).await;
    assert!(!exit.killed, "{exit:?}");
    drop(b.dir);
}

#[tokio::test]
async fn workspace_files_cross_between_host_and_guest() {
    let Some(assets) = assets() else { return };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let Some(mut b) = boot_test_image("ws", &assets, &mapper).await else { return };
    std::fs::write(b.workspace.join("from-host.txt"), "written by the host\n").unwrap();
    ping(&b.agent).await;
    let (code, seen) = exec(&b.agent, &["cat", "/workspace/from-host.txt"]).await;
    assert_eq!((code, seen.as_str()), (0, "written by the host\n"));
    let (code, _) = exec(&b.agent, &["sh", "-c", "echo written by the guest > /workspace/from-guest.txt"]).await;
    assert_eq!(code, 0);
    let back = b.workspace.join("from-guest.txt");
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "written by the guest\n");
    // The guest's root writes files the sandbox's root owns on the host
    // (the user, for an ordinary user's helper), as in a namespace sandbox.
    let (uid, _) = mapper.id_map().host_root();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&back).unwrap()), uid);
    b.vm.kill().await;
}

/// The guest's writable layer comes out as a layer in the image store's
/// format: files with the sandbox's owners, a deletion as a 0/0 character
/// device, a replaced directory marked opaque.
#[tokio::test]
async fn the_writable_layer_becomes_a_store_layer() {
    let Some(assets) = assets() else { return };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let Some(mut b) = boot_test_image("snap", &assets, &mapper).await else { return };
    ping(&b.agent).await;
    let change = "echo added > /etc/added && rm /etc/hostname && rm -r /usr/share/doc && mkdir /usr/share/doc \
        && echo new > /usr/share/doc/new && sync";
    assert_eq!(exec(&b.agent, &["sh", "-c", change]).await.0, 0);
    let argv = sandbox_guest::layer_archive::argv();
    let (code, tar) = exec_bytes(&b.agent, &argv.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(code, 0);
    b.vm.kill().await;
    let archive = b.dir.0.join("layer.tar");
    std::fs::write(&archive, tar).unwrap();
    let layer = b.dir.0.join("layer");
    snapshot::unpack_layer(&archive, &layer, &mapper).expect("unpack");

    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let (uid, _) = mapper.id_map().host_root();
    let added = std::fs::symlink_metadata(layer.join("etc/added")).unwrap();
    assert_eq!(std::fs::read_to_string(layer.join("etc/added")).unwrap(), "added\n");
    assert_eq!(added.uid(), uid, "root's file in the guest is the sandbox root's on the host");
    let whiteout = std::fs::symlink_metadata(layer.join("etc/hostname")).unwrap();
    assert!(whiteout.file_type().is_char_device() && whiteout.rdev() == 0, "{whiteout:?}");
    let doc = layer.join("usr/share/doc");
    let value = xattr(&doc, "user.overlay.opaque");
    assert_eq!(value.as_deref(), Some(&b"y"[..]), "the replaced directory is opaque");
    assert!(doc.join("new").is_file());
    // Unpacking into an existing directory is refused, naming it.
    let e = snapshot::unpack_layer(&archive, &layer, &mapper).unwrap_err().to_string();
    assert!(e.contains(&layer.display().to_string()), "{e}");
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = [0u8; 64];
    // SAFETY: valid C strings and a buffer of the given length.
    let len = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (len >= 0).then(|| buf[..len as usize].to_vec())
}
