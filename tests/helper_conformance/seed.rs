//! VmSpec.files: files placed in a new VM's writable layer before its first
//! start, checked from inside the VM with Exec.
use super::*;

fn regular(path: &str, content: &str, mode: u32) -> pb::RootfsFile {
    pb::RootfsFile { path: path.into(), content: content.into(), mode, ..Default::default() }
}

fn symlink(path: &str, target: &str) -> pb::RootfsFile {
    pb::RootfsFile { path: path.into(), symlink_target: target.into(), ..Default::default() }
}

#[tokio::test]
async fn files_are_in_place_at_the_first_start() {
    let mut h = Harness::new("seed").await;
    let mut spec = h.spec("vm");
    spec.files = vec![
        // Replaces the image's file.
        regular("/etc/ssl/certs/ca-certificates.crt", "bundle\n", 0),
        // A directory the image lacks, a mode of its own.
        regular("/etc/seed-new/secret", "s\n", 0o600),
        // /lib is a symlink to usr/lib in the image: followed inside it.
        regular("/lib/seed-test/x", "x\n", 0),
        symlink("/etc/seed-new/link", "/etc/ssl/certs/ca-certificates.crt"),
    ];
    let id = spec.id.clone();
    let created = h.create(spec).await.expect("create");
    assert!(created.spec.as_ref().unwrap().files.is_empty(), "files are not echoed back");
    let images = h.client.list_images(pb::ListImagesRequest {}).await.unwrap().into_inner().images;
    let image = images.iter().find(|i| i.name == h.image).expect("the test image");
    assert_eq!(created.image_created_at_ms, image.created_at_ms);
    h.start(&id).await.expect("start");
    let out = h
        .sh(
            &id,
            "cat /etc/ssl/certs/ca-certificates.crt /etc/seed-new/secret /usr/lib/seed-test/x /etc/seed-new/link; \
             stat -c '%a %u %g' /etc/ssl/certs/ca-certificates.crt /etc/seed-new /etc/seed-new/secret /etc/ssl; \
             readlink /etc/seed-new/link; test -L /lib && echo lib-still-a-link",
        )
        .await;
    assert_eq!(
        out.out(),
        "bundle\ns\nx\nbundle\n644 0 0\n755 0 0\n600 0 0\n755 0 0\n/etc/ssl/certs/ca-certificates.crt\nlib-still-a-link\n",
        "{}",
        out.err()
    );
    assert_eq!(h.get(&id).await.unwrap().image_created_at_ms, image.created_at_ms);
}

#[tokio::test]
async fn bad_files_are_refused_and_leave_nothing_behind() {
    let mut h = Harness::new("seedbad").await;
    let cases: [(pb::RootfsFile, &str); 5] = [
        (regular("etc/x", "", 0), "spec.files[0].path"),
        (regular("/etc/../x", "", 0), "spec.files[0].path"),
        (pb::RootfsFile { symlink_target: "/y".into(), ..regular("/etc/x", "data", 0) }, "spec.files[0].content"),
        (regular("/etc", "", 0), "is a directory in the image"),
        (regular("/etc/passwd/x", "", 0), "/etc/passwd is not a directory in the image"),
    ];
    for (file, want) in cases {
        let mut spec = h.spec("vm");
        spec.files = vec![file.clone()];
        let err = h.create(spec).await.expect_err(want);
        assert_eq!(err.code(), Code::InvalidArgument, "{file:?}: {err:?}");
        assert!(err.message().contains(want), "{file:?}: {}", err.message());
    }
    // The id is free again: nothing was registered.
    let id = h.running("vm", |_| {}).await;
    // A clone's layer was used: never written from outside.
    let mut spec = h.spec("clone");
    spec.clone_from = id;
    spec.files = vec![regular("/etc/x", "", 0)];
    let err = h.create(spec).await.expect_err("files with clone_from");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("spec.files"), "{}", err.message());
}

#[tokio::test]
async fn directories_made_for_files_get_the_image_owners_inside_the_vm() {
    let mut h = Harness::new("seedown").await;
    let mut spec = h.spec("vm");
    spec.files = vec![
        // /var/mail is root:mail 2775 in the image, apt's partial dir
        // _apt:root 0700; seed-new is not in the image: the VM's root's, 0755.
        regular("/var/mail/seed-new/x", "x\n", 0),
        regular("/var/cache/apt/archives/partial/y", "y\n", 0),
    ];
    let id = spec.id.clone();
    h.create(spec).await.expect("create");
    h.start(&id).await.expect("start");
    let out = h
        .sh(
            &id,
            "stat -c '%n %a %U %G' /var/mail /var/mail/seed-new /var/mail/seed-new/x /var/cache/apt/archives/partial \
             /var/cache/apt/archives/partial/y",
        )
        .await;
    assert_eq!(
        out.out(),
        "/var/mail 2775 root mail\n/var/mail/seed-new 755 root root\n/var/mail/seed-new/x 644 root root\n\
         /var/cache/apt/archives/partial 700 _apt root\n/var/cache/apt/archives/partial/y 644 root root\n",
        "{}",
        out.err()
    );
}
