//! Images (issue 4): CommitVm chains layers (deletions included) and leaves
//! mounted host directories out, DeleteImage guards parents and collects
//! layers, CreateVm clone_from copies a running VM, ProcessSpec.user and the
//! image config reach processes, BuildImage validates its request.
//!
//! Each test runs a helper on a store of its own whose base image is a
//! symlink to the shared test image, as the pytest suite sets it up.
use super::*;

async fn commit(h: &mut Harness, vm: &str, image: &str) -> Result<pb::Image, tonic::Status> {
    commit_with(h, vm, image, None).await
}

async fn commit_with(
    h: &mut Harness,
    vm: &str,
    image: &str,
    config: Option<pb::ImageConfig>,
) -> Result<pb::Image, tonic::Status> {
    let req = pb::CommitVmRequest {
        vm_id: vm.into(),
        image: image.into(),
        config,
        labels: HashMap::from([("kind".into(), "test".into())]),
        ..Default::default()
    };
    Ok(h.client.commit_vm(req).await?.into_inner().image.expect("image in response"))
}

async fn delete_image(h: &mut Harness, name: &str) -> Result<(), tonic::Status> {
    h.client.delete_image(pb::DeleteImageRequest { name: name.into() }).await.map(|_| ())
}

async fn images(h: &mut Harness) -> Vec<pb::Image> {
    h.client.list_images(pb::ListImagesRequest {}).await.unwrap().into_inner().images
}

/// Committed layer directories in the helper's own store.
fn layer_dirs(h: &Harness) -> Vec<String> {
    let Some(store) = h.own_store() else { return Vec::new() };
    std::fs::read_dir(store.join("layers"))
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

fn unique(h: &Harness, name: &str) -> String {
    // Image names are global to an external helper's store: keep them apart.
    format!("{}-{name}", h.prefix.to_lowercase()).replace('_', "-")
}

async fn on_image(h: &mut Harness, name: &str, image: &str) -> String {
    let image = image.to_string();
    h.running(name, move |s| s.image = image).await
}

#[tokio::test]
async fn commit_chains_layers_keeps_deletions_and_leaves_mounts_out() {
    let mut h = Harness::with_own_store("imgchain").await;
    let caps = h.caps().await;
    for cap in ["images.commit", "vm.clone", "process.user"] {
        assert!(caps.iter().any(|c| c == cap), "missing {cap}: {caps:?}");
    }
    let ws = h.tmp.0.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let ws_str = ws.display().to_string();
    let a = h.running("a", |s| s.mounts = vec![mount(&ws_str, "/workspace")]).await;
    let setup = "echo one > /root/a.txt && rm /etc/debian_version && mkdir -p /opt/d && echo old > /opt/d/old \
                 && echo ws > /workspace/w";
    assert_eq!(h.sh(&a, setup).await.code(), Some(0));
    let (img1, img2) = (unique(&h, "one"), unique(&h, "two"));
    let i1 = commit(&mut h, &a, &img1).await.unwrap();
    assert_eq!((i1.name.as_str(), i1.parent.as_str(), i1.layer_count), (img1.as_str(), h.image.as_str(), 2));
    assert_eq!(i1.labels.get("kind").map(String::as_str), Some("test"));
    assert!(i1.size_bytes > 0 && i1.created_at_ms > 0 && !i1.shell.is_empty());
    assert_eq!(h.sh(&a, "cat /root/a.txt").await.out(), "one\n", "the VM runs on after its commit");

    let b = on_image(&mut h, "b", &img1).await;
    let seen = h.sh(&b, "cat /root/a.txt /opt/d/old; test -e /etc/debian_version || echo gone; ls -A /workspace").await;
    assert_eq!(seen.out(), "one\nold\ngone\n", "{}", seen.err());
    let change = "echo two > /root/b.txt && rm -rf /opt/d && mkdir /opt/d && echo new > /opt/d/new";
    assert_eq!(h.sh(&b, change).await.code(), Some(0));
    let i2 = commit(&mut h, &b, &img2).await.unwrap();
    assert_eq!((i2.parent.as_str(), i2.layer_count), (img1.as_str(), 3));
    assert!(i2.size_bytes >= i1.size_bytes);

    let c = on_image(&mut h, "c", &img2).await;
    let seen = h.sh(&c, "cat /root/a.txt /root/b.txt; ls /opt/d; test -e /etc/debian_version || echo gone").await;
    assert_eq!(seen.out(), "one\ntwo\nnew\ngone\n", "both generations' changes: {}", seen.err());

    let listed = images(&mut h).await;
    let l2 = listed.iter().find(|i| i.name == img2).expect("img2 listed");
    assert_eq!((l2.parent.as_str(), l2.layer_count), (img1.as_str(), 3));
    let base = listed.iter().find(|i| i.name == h.image).expect("base listed");
    assert_eq!((base.parent.as_str(), base.layer_count), ("", 1));

    let err = delete_image(&mut h, &img1).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains(&format!("'{img2}'")), "{}", err.message());
    let base_image = h.image.clone();
    let err = delete_image(&mut h, &base_image).await.unwrap_err();
    assert!(err.message().contains(&format!("'{img1}'")), "{}", err.message());

    // C keeps running on the layers of a deleted image.
    delete_image(&mut h, &img2).await.unwrap();
    assert_eq!(h.sh(&c, "cat /root/b.txt").await.out(), "two\n");
    assert_eq!(h.stop(&c).await.unwrap().state, pb::VmState::Stopped as i32);
    h.start(&c).await.expect("restart after its image is gone");
    assert_eq!(h.sh(&c, "ls /opt/d").await.out(), "new\n");
    delete_image(&mut h, &img1).await.unwrap();
    assert!(!images(&mut h).await.iter().any(|i| i.name == img1 || i.name == img2));
    assert_eq!(delete_image(&mut h, &img1).await.unwrap_err().code(), Code::NotFound);

    if h.own_store().is_some() {
        assert_eq!(layer_dirs(&h).len(), 2, "layers of running VMs stay: {:?}", layer_dirs(&h));
        for id in [&a, &b, &c] {
            h.delete(id).await.unwrap();
        }
        assert!(layer_dirs(&h).is_empty(), "unused layers are collected: {:?}", layer_dirs(&h));
        assert!(h.own_store().unwrap().join(&h.image).join("rootfs").is_dir(), "the shared base is untouched");
    }
}

#[tokio::test]
async fn commit_and_delete_errors_have_their_codes() {
    let mut h = Harness::with_own_store("imgerr").await;
    let name = unique(&h, "x");
    let ghost = h.id("ghost");
    assert_eq!(commit(&mut h, &ghost, &name).await.unwrap_err().code(), Code::NotFound);
    let created = h.spec("created");
    let created_id = created.id.clone();
    h.create(created).await.unwrap();
    assert_eq!(commit(&mut h, &created_id, &name).await.unwrap_err().code(), Code::FailedPrecondition);
    let vm = h.running("vm", |_| {}).await;
    for bad in ["Bad", "a/b", "", "-x", "layers"] {
        let err = commit(&mut h, &vm, bad).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{bad:?}: {err:?}");
    }
    let base_image = h.image.clone();
    let err = commit(&mut h, &vm, &base_image).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert_eq!(h.stop(&vm).await.unwrap().state, pb::VmState::Stopped as i32);
    assert_eq!(commit(&mut h, &vm, &name).await.unwrap_err().code(), Code::FailedPrecondition);
    assert!(layer_dirs(&h).is_empty(), "failed commits leave nothing: {:?}", layer_dirs(&h));
    assert!(!images(&mut h).await.iter().any(|i| i.name == name));
    assert_eq!(delete_image(&mut h, &name).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(delete_image(&mut h, "Bad/name").await.unwrap_err().code(), Code::InvalidArgument);
}

#[tokio::test]
async fn clone_copies_a_running_vm_and_then_diverges() {
    let mut h = Harness::with_own_store("clone").await;
    let a = h.running("a", |_| {}).await;
    assert_eq!(h.sh(&a, "echo a > /root/x && rm /etc/debian_version").await.code(), Some(0));
    let a_id = a.clone();
    let b = h
        .running("b", move |s| {
            s.image.clear();
            s.clone_from = a_id;
        })
        .await;
    assert_eq!(h.get(&b).await.unwrap().spec.unwrap().image, h.image);
    let seen = h.sh(&b, "cat /root/x; test -e /etc/debian_version || echo gone").await;
    assert_eq!(seen.out(), "a\ngone\n", "{}", seen.err());
    assert_eq!(h.sh(&a, "echo a2 > /root/x").await.code(), Some(0));
    assert_eq!(h.sh(&b, "echo b > /root/y").await.code(), Some(0));
    assert_eq!(h.sh(&a, "cat /root/x; test -e /root/y || echo none").await.out(), "a2\nnone\n");
    assert_eq!(h.sh(&b, "cat /root/x /root/y").await.out(), "a\nb\n");

    let mut spec = h.spec("ghost-clone");
    spec.clone_from = h.id("ghost");
    assert_eq!(h.create(spec).await.unwrap_err().code(), Code::NotFound);
    let mut spec = h.spec("mismatch");
    spec.image = "another-image".into();
    spec.clone_from = a.clone();
    let err = h.create(spec).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("spec.image"), "{}", err.message());
    h.stop(&a).await.unwrap();
    let mut spec = h.spec("from-stopped");
    spec.clone_from = a.clone();
    assert_eq!(h.create(spec).await.unwrap_err().code(), Code::FailedPrecondition);
}

#[tokio::test]
async fn processes_run_as_the_given_user_with_the_image_config() {
    let mut h = Harness::with_own_store("user").await;
    let vm = h.running("vm", |_| {}).await;
    let as_user = |user: &str, script: &str| {
        let mut p = process(&vm, &["sh", "-c", script]);
        p.user = user.into();
        p
    };
    let o = h.run(as_user("nobody", "id -u; id -g; echo $HOME $USER $LOGNAME"), b"").await.unwrap();
    assert_eq!(o.out(), "65534\n65534\n/nonexistent nobody nobody\n", "{}", o.err());
    let o = h.run(as_user("1000:1000", "id -u; id -g"), b"").await.unwrap();
    assert_eq!(o.out(), "1000\n1000\n", "{}", o.err());
    let mut p = as_user("nobody", "touch f && stat -c %U .. . f");
    p.cwd = "/srv/made/here".into();
    p.create_cwd = true;
    let o = h.run(p, b"").await.unwrap();
    assert_eq!(o.out(), "nobody\nnobody\nnobody\n", "created cwd dirs belong to the user: {}", o.err());
    assert_eq!(h.sh(&vm, "id -u").await.out(), "0\n", "root by default");
    let err = h.run(as_user("ghost", "true"), b"").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("no user 'ghost' in VM"), "{}", err.message());
    let start = pb::StartBackgroundRequest { name: "bg".into(), process: Some(as_user("ghost", "sleep 1")) };
    assert_eq!(h.client.start_background(start).await.unwrap_err().code(), Code::InvalidArgument);

    let image = unique(&h, "cfg");
    let config = pb::ImageConfig {
        env: HashMap::from([("FROM_IMAGE".into(), "image".into()), ("OVERRIDE".into(), "image".into())]),
        workdir: "/srv".into(),
        user: "nobody".into(),
        entrypoint: vec!["/bin/sh".into(), "-c".into()],
        cmd: vec!["serve".into()],
        exposed_ports: vec!["8080/tcp".into()],
    };
    let committed = commit_with(&mut h, &vm, &image, Some(config.clone())).await.unwrap();
    assert_eq!(committed.config.as_ref(), Some(&config));
    let image2 = image.clone();
    let booted = h
        .running("booted", move |s| {
            s.image = image2;
            s.env = HashMap::from([("OVERRIDE".into(), "vm".into())]);
        })
        .await;
    let o = h.sh(&booted, "id -u; printenv FROM_IMAGE OVERRIDE").await;
    assert_eq!(o.out(), "65534\nimage\nvm\n", "{}", o.err());
    let mut p = process(&booted, &["sh", "-c", "id -u; printenv OVERRIDE"]);
    p.user = "root".into();
    p.env = HashMap::from([("OVERRIDE".into(), "process".into())]);
    assert_eq!(h.run(p, b"").await.unwrap().out(), "0\nprocess\n");
}

#[tokio::test]
async fn build_image_rejects_bad_requests_up_front() {
    let mut h = Harness::with_own_store("build").await;
    let build = |name: &str, packages: &[&str], force: bool| pb::BuildImageRequest {
        name: name.into(),
        release: String::new(),
        packages: packages.iter().map(|p| p.to_string()).collect(),
        force,
    };
    let err = h.client.build_image(build("Bad Name", &[], false)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = h.client.build_image(build("ok", &["--option"], false)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let mut bad_release = build("ok", &[], false);
    bad_release.release = "../x".into();
    assert_eq!(h.client.build_image(bad_release).await.unwrap_err().code(), Code::InvalidArgument);
    let existing = build(&h.image, &[], false);
    let err = h.client.build_image(existing).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
}

/// An image unpacked for other host ids than this helper's sandboxes map
/// (built by another user, or before the id ranges changed) would show wrong
/// or unmapped owners inside: CreateVm refuses it and names the rebuild.
#[tokio::test]
async fn image_built_for_another_id_map_is_refused_with_the_rebuild_command() {
    let mut h = Harness::with_own_store("imgmap").await;
    let Some(store) = h.own_store() else {
        eprintln!("skipped: needs an image store of its own; an external helper's is not ours to change");
        return;
    };
    let shared = std::fs::canonicalize(store.join(&h.image)).unwrap();
    let name = unique(&h, "othermap");
    std::fs::create_dir(store.join(&name)).unwrap();
    std::os::unix::fs::symlink(shared.join("rootfs"), store.join(&name).join("rootfs")).unwrap();
    // image.json as written before id maps were recorded: one range.
    let info = format!(
        r#"{{"name":"{name}","size_bytes":1,"created_at_ms":1,"shell":"/bin/bash","package_manager":"apt",
            "uid_base":3000000,"id_count":65536}}"#
    );
    std::fs::write(store.join(&name).join("image.json"), info).unwrap();
    let mut spec = h.spec("vm");
    spec.image = name.clone();
    let err = h.create(spec).await.expect_err("an image for another id map must be refused");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    let msg = err.message();
    assert!(msg.contains(&format!("sandbox-mcp image build --name {name} --force")), "{msg}");
    assert!(msg.contains("0->3000000 (65536)"), "names the map it was built for: {msg}");
    // The image this helper built itself still runs.
    h.running("ok", |_| {}).await;
}

/// An image recorded as an OCI reference (`sandbox-mcp image pull`, for a
/// Mac's helper) is listed with it; a driver that cannot pull refuses to
/// create a VM from it, naming the image, the reference and the way to get
/// one it can boot. A driver that pulls (the macOS helper's) boots it; that
/// part runs on a Mac (`make conformance HELPER_SOCKET=…`).
#[tokio::test]
async fn an_image_recorded_as_a_reference_is_listed_and_refused_by_a_driver_that_cannot_pull() {
    let mut h = Harness::with_own_store("imgref").await;
    let Some(store) = h.own_store() else {
        eprintln!("skipped: needs an image store of its own; an external helper's is not ours to change");
        return;
    };
    let name = unique(&h, "pulled");
    let reference = "docker.io/library/python:3.12-bookworm";
    sandbox_image::ImageStore::new(store)
        .add_reference(&name, reference, "/bin/bash", "apt", false)
        .expect("record the reference");
    let listed = images(&mut h).await.into_iter().find(|i| i.name == name).expect("the record is listed");
    assert_eq!((listed.reference.as_str(), listed.layer_count), (reference, 0));
    let info = h.client.get_info(pb::GetInfoRequest {}).await.unwrap().into_inner();
    let default = info.drivers.iter().find(|d| d.is_default).expect("a default driver");
    if default.capabilities.as_ref().is_some_and(|c| c.pull_images) {
        eprintln!("skipped the refusal: the driver under test pulls images");
        return;
    }
    let mut spec = h.spec("vm");
    spec.image = name.clone();
    let err = h.create(spec).await.expect_err("a driver that cannot pull refuses the reference");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    let msg = err.message();
    assert!(msg.contains(&name) && msg.contains(reference), "names the image and its reference: {msg}");
    assert!(msg.contains("sandbox-mcp image build"), "says how to get an image it boots: {msg}");
    // The record goes like any image.
    delete_image(&mut h, &name).await.expect("delete the record");
    assert!(!images(&mut h).await.iter().any(|i| i.name == name));
}

/// Issue 9: code in the VM swaps a directory of its layer for a symlink to a
/// host directory in a tight loop while CommitVm and clone_from copy the
/// layer. No copy may ever hold the host file: each either succeeds without
/// it or fails naming the change. (The freeze usually stops the swapper; the
/// copy itself is proven immune by the attack test in rust/image/copy.rs.)
#[tokio::test]
async fn commit_and_clone_never_copy_host_files_through_a_swapped_directory() {
    const MARKER: &str = "host-secret-marker";
    let mut h = Harness::with_own_store("snaprace").await;
    let host = h.tmp.0.join("host-dir");
    std::fs::create_dir(&host).unwrap();
    std::fs::write(host.join("SECRET"), MARKER).unwrap();
    let vm = h.running("swapper", |_| {}).await;
    // One process that never forks: the freeze refuses to copy while new
    // processes keep appearing, so a shell loop of mv/ln would never be copied.
    let script = format!(
        "import os\nos.makedirs('/root/d')\nopen('/root/d/SECRET', 'w').write('sandbox')\n\
         open('/root/started', 'w').close()\nwhile True:\n    os.rename('/root/d', '/root/d.x')\n    \
         os.symlink('{}', '/root/d')\n    os.remove('/root/d')\n    os.rename('/root/d.x', '/root/d')\n",
        host.display()
    );
    let swapper =
        pb::StartBackgroundRequest { process: Some(process(&vm, &["python3", "-c", &script])), name: "swap".into() };
    h.client.start_background(swapper).await.unwrap();
    let started = h.sh(&vm, "for i in $(seq 100); do test -e /root/started && exit 0; sleep 0.1; done; exit 1").await;
    assert_eq!(started.code(), Some(0), "the swapper never started: {}", started.err());

    let refused = |e: &tonic::Status| assert!(e.message().contains("changed while being copied"), "{}", e.message());
    for i in 0..10 {
        let image = unique(&h, &format!("race{i}"));
        if let Err(e) = commit(&mut h, &vm, &image).await {
            refused(&e);
        }
    }
    if let Some(store) = h.own_store() {
        assert_no_file_holds(&store.join("layers"), MARKER);
    }
    for i in 0..3 {
        let mut spec = h.spec(&format!("race-clone{i}"));
        spec.image.clear();
        spec.clone_from = vm.clone();
        let id = spec.id.clone();
        match h.create(spec).await {
            Ok(_) => {
                h.start(&id).await.unwrap();
                // grep -r does not follow symlinks: it reads only what was copied.
                let found = h.sh(&id, &format!("grep -rl {MARKER} /root; true")).await;
                assert_eq!(found.out(), "", "host file copied into the clone");
                h.delete(&id).await.unwrap();
            }
            Err(e) => refused(&e),
        }
    }
}

/// Fails if any regular file under `dir` (symlinks not followed) is `marker`.
fn assert_no_file_holds(dir: &Path, marker: &str) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let ty = std::fs::symlink_metadata(&path).unwrap().file_type();
        if ty.is_dir() {
            assert_no_file_holds(&path, marker);
        } else if ty.is_file() {
            assert!(std::fs::read(&path).unwrap() != marker.as_bytes(), "host file copied into {}", path.display());
        }
    }
}

/// Sets the helper's file size limit (soft; the hard one stays): a child it
/// forks from then on inherits it.
fn limit_file_size(helper: u32, bytes: libc::rlim_t) {
    let mut old = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: prlimit on our own child, with valid pointers.
    assert_eq!(unsafe { libc::prlimit(helper as i32, libc::RLIMIT_FSIZE, std::ptr::null(), &mut old) }, 0);
    let new = libc::rlimit { rlim_cur: bytes.min(old.rlim_max), rlim_max: old.rlim_max };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::prlimit(helper as i32, libc::RLIMIT_FSIZE, &new, std::ptr::null_mut()) }, 0);
}

#[tokio::test]
async fn a_layer_copy_that_fails_says_so_leaves_nothing_and_thaws_the_vm() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        eprintln!("skipped: a root helper copies layers itself; only an ordinary user's runs `__copy-layer`");
        return;
    }
    if !on_namespaces() {
        // The limit below would end the helper itself, not a copy.
        eprintln!("skipped: `__copy-layer` is the namespace driver's; a vm's layer is the guest's archive");
        return;
    }
    let mut h = Harness::with_own_store("copyfail").await;
    let Some(helper) = h.helper.as_ref().map(|p| p.0.id()) else {
        eprintln!("skipped: an external helper's limits are not ours to change");
        return;
    };
    let vm = h.running("vm", |_| {}).await;
    assert_eq!(h.sh(&vm, "head -c 4194304 /dev/zero > /big && echo written").await.out(), "written\n");
    // The VM is running, so only the copy (a child forked from now on)
    // meets the limit: it dies of SIGXFSZ 1 MiB into /big, a real failure
    // midway through the layer.
    limit_file_size(helper, 1 << 20);
    let name = unique(&h, "copyfail");
    let err = commit(&mut h, &vm, &name).await.expect_err("commit with the copy failing");
    assert!(err.message().contains("copying") && err.message().contains("SIGXFSZ"), "{}", err.message());
    let mut spec = h.spec("clone");
    spec.clone_from = vm.clone();
    let clone = spec.id.clone();
    let err = h.create(spec).await.expect_err("clone with the copy failing");
    assert!(err.message().contains("copying") && err.message().contains("SIGXFSZ"), "{}", err.message());
    limit_file_size(helper, libc::RLIM_INFINITY);
    assert!(layer_dirs(&h).is_empty(), "no partial layer: {:?}", layer_dirs(&h));
    assert!(!images(&mut h).await.iter().any(|i| i.name == name));
    assert_eq!(h.get(&clone).await.unwrap_err().code(), Code::NotFound, "no clone registered");
    let vms = std::fs::read_dir(h.tmp.0.join("state/sandbox-mcp/vms")).unwrap();
    let left: Vec<_> = vms.flatten().map(|e| e.file_name()).filter(|n| n.to_string_lossy().contains("clone")).collect();
    assert!(left.is_empty(), "the clone's directory is gone: {left:?}");
    // Thawed: the VM runs on and its layer is whole.
    assert_eq!(h.sh(&vm, "stat -c %s /big").await.out(), "4194304\n");
}
