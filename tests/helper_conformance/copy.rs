//! CopyIn and CopyOut: tar streams into and out of a VM, checked from
//! inside the VM with Exec and on the client side with the tar crate.
use super::*;

fn copy_req(msg: pb::copy_in_request::Msg) -> pb::CopyInRequest {
    pb::CopyInRequest { msg: Some(msg) }
}

pub(super) async fn copy_in(
    h: &mut Harness,
    id: &str,
    dest: &str,
    tar: Vec<u8>,
) -> Result<pb::CopyInResponse, tonic::Status> {
    let mut msgs =
        vec![copy_req(pb::copy_in_request::Msg::Start(pb::CopyInStart { vm_id: id.into(), dest_dir: dest.into() }))];
    msgs.extend(tar.chunks(256 * 1024).map(|c| copy_req(pb::copy_in_request::Msg::Data(c.to_vec()))));
    let r = h.client.copy_in(tokio_stream::iter(msgs)).await?;
    Ok(r.into_inner())
}

async fn copy_out(h: &mut Harness, id: &str, path: &str) -> Result<Vec<u8>, tonic::Status> {
    let mut stream = h.client.copy_out(pb::CopyOutRequest { vm_id: id.into(), path: path.into() }).await?.into_inner();
    let mut tar = Vec::new();
    while let Some(msg) = stream.next().await {
        tar.extend(msg?.data);
    }
    Ok(tar)
}

fn header() -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(1_700_000_000);
    header
}

pub(super) fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]) {
    let mut header = header();
    header.set_size(data.len() as u64);
    header.set_mode(mode);
    header.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut header, path, data).unwrap();
}

/// An entry whose name is written raw, so it may escape (the builder
/// itself refuses such names).
fn raw_file(b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]) {
    let mut header = header();
    header.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    b.append(&header, data).unwrap();
}

/// (path, kind, mode, size, link target) of each entry, sorted.
fn entries(tar: &[u8]) -> Vec<(String, char, u32, u64, String)> {
    let mut out: Vec<_> = tar::Archive::new(tar)
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let kind = match e.header().entry_type() {
                tar::EntryType::Directory => 'd',
                tar::EntryType::Symlink => 'l',
                tar::EntryType::Regular => 'f',
                other => panic!("unexpected entry type {other:?}"),
            };
            let link = e.link_name().unwrap().map(|l| l.display().to_string()).unwrap_or_default();
            let path = e.path().unwrap().display().to_string();
            let path = path.trim_end_matches('/').to_string();
            (path, kind, e.header().mode().unwrap() & 0o7777, e.size(), link)
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn copy_in_writes_trees_with_modes_and_counts() {
    let mut h = Harness::new("cpin").await;
    let id = h.running("vm", |_| {}).await;
    let big: Vec<u8> = (0..10_000_000u32).map(|i| (i % 251) as u8).collect();
    let mut b = tar::Builder::new(Vec::new());
    file(&mut b, "a/b/c/deep.txt", 0o640, b"deep\n");
    file(&mut b, "run.sh", 0o755, b"#!/bin/sh\necho ran\n");
    file(&mut b, "empty", 0o600, b"");
    file(&mut b, "big.bin", 0o644, &big);
    let r = copy_in(&mut h, &id, "/dst/new", b.into_inner().unwrap()).await.unwrap();
    assert_eq!((r.files, r.bytes), (4, 5 + 19 + 10_000_000));
    let o = h
        .sh(
            &id,
            "cd /dst/new && stat -c '%n %a %s %U' a/b/c/deep.txt run.sh empty big.bin && ./run.sh && cat a/b/c/deep.txt && cksum < big.bin",
        )
        .await;
    let local = {
        let mut c = Command::new("cksum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        std::io::Write::write_all(&mut c.stdin.take().unwrap(), &big).unwrap();
        String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap()
    };
    assert_eq!(
        o.out(),
        format!(
            "a/b/c/deep.txt 640 5 root\nrun.sh 755 19 root\nempty 600 0 root\nbig.bin 644 10000000 root\nran\ndeep\n{local}"
        ),
        "{}",
        o.err()
    );
}

#[tokio::test]
async fn copy_in_rejects_entries_escaping_the_destination() {
    let mut h = Harness::new("cpesc").await;
    let id = h.running("vm", |_| {}).await;
    for (bad, tag) in [("../evil.txt", "dotdot"), ("/abs-evil.txt", "abs")] {
        let mut b = tar::Builder::new(Vec::new());
        file(&mut b, "before.txt", 0o644, b"ok");
        raw_file(&mut b, bad, b"evil");
        file(&mut b, "after.txt", 0o644, b"late");
        let dest = format!("/dst/{tag}");
        let e = copy_in(&mut h, &id, &dest, b.into_inner().unwrap()).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad}: {e}");
        let o = h
            .sh(
                &id,
                &format!("ls {dest}; ls /dst/evil.txt /evil.txt /abs-evil.txt {dest}/abs-evil.txt 2>/dev/null; true"),
            )
            .await;
        assert_eq!(o.out(), "before.txt\n", "{bad}: nothing after it, nothing outside");
    }
    let e = copy_in(&mut h, &id, "relative/dir", Vec::new()).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = copy_in(&mut h, &id, "/x", b"definitely not a tar archive".repeat(40)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
}

#[tokio::test]
async fn copy_out_archives_files_dirs_and_symlinks_without_following() {
    let mut h = Harness::new("cpout").await;
    let id = h.running("vm", |_| {}).await;
    let setup = "mkdir -p /data/d/sub && echo hi > /data/d/sub/f && chmod 750 /data/d/sub \
                 && ln -s /etc/passwd /data/d/link && echo top > /data/f1 && chmod 600 /data/f1";
    assert_eq!(h.sh(&id, setup).await.code(), Some(0));

    let dir = entries(&copy_out(&mut h, &id, "/data/d").await.unwrap());
    assert_eq!(
        dir,
        vec![
            ("link".into(), 'l', 0o777, 0, "/etc/passwd".into()),
            ("sub".into(), 'd', 0o750, 0, String::new()),
            ("sub/f".into(), 'f', 0o644, 3, String::new()),
        ]
    );
    let one = entries(&copy_out(&mut h, &id, "/data/f1").await.unwrap());
    assert_eq!(one, vec![("f1".into(), 'f', 0o600, 4, String::new())]);
    let link = entries(&copy_out(&mut h, &id, "/data/d/link").await.unwrap());
    assert_eq!(link, vec![("link".into(), 'l', 0o777, 0, "/etc/passwd".into())]);
    let content = copy_out(&mut h, &id, "/data/d").await.unwrap();
    let mut ar = tar::Archive::new(content.as_slice());
    let mut f = ar.entries().unwrap().map(|e| e.unwrap()).find(|e| e.path().unwrap().ends_with("sub/f")).unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut f, &mut text).unwrap();
    assert_eq!(text, "hi\n");

    let e = copy_out(&mut h, &id, "/data/missing").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    let e = copy_out(&mut h, &id, "data/d").await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
}

#[tokio::test]
async fn copy_out_then_copy_in_round_trips() {
    let mut h = Harness::new("cprt").await;
    let id = h.running("vm", |_| {}).await;
    let setup = "mkdir -p /src/a/b /src/empty-dir && head -c 3000000 /dev/urandom > /src/a/b/rand \
                 && : > /src/a/zero && chmod 711 /src/a && ln -s ../a/zero /src/a/b/rel \
                 && printf 'x' > /src/x && chmod 604 /src/x";
    assert_eq!(h.sh(&id, setup).await.code(), Some(0));
    let tar = copy_out(&mut h, &id, "/src").await.unwrap();
    let r = copy_in(&mut h, &id, "/copy", tar).await.unwrap();
    assert_eq!(r.files, 3);
    let listing = "cd $0 && find . -printf '%p %y %m %l\\n' | sort && find . -type f | sort | xargs md5sum";
    let a = h.sh(&id, &listing.replace("$0", "/src")).await;
    let b = h.sh(&id, &listing.replace("$0", "/copy")).await;
    assert_eq!(a.code(), Some(0), "{}", a.err());
    assert_eq!(a.out(), b.out());
}
