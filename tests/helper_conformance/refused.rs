//! Boots the VM layer refuses, ids it does not know, and hostile input:
//! each gets an error that names the problem, and the helper keeps serving.
//! Through the bridge (`SANDBOX_MCP_CONFORMANCE_BRIDGE=1`) the refusal
//! comes back across it, from the layer.
use super::*;

/// The helper still creates, starts and runs a VM.
async fn still_serves(h: &mut Harness, name: &str) {
    let id = h.running(name, |_| {}).await;
    assert_eq!(h.sh(&id, "echo up").await.out(), "up\n", "the helper serves on");
}

#[tokio::test]
async fn a_boot_the_layer_refuses_names_the_problem_and_the_helper_stays_up() {
    let mut h = Harness::new("refusedboot").await;
    // Valid when created, gone when the layer mounts it.
    let ws = h.tmp.0.join("gone-workspace");
    std::fs::create_dir_all(&ws).unwrap();
    let mut spec = h.spec("vm");
    spec.mounts = vec![mount(ws.to_str().unwrap(), "/workspace")];
    let id = spec.id.clone();
    h.create(spec).await.expect("create");
    std::fs::remove_dir(&ws).unwrap();
    let e = h.start(&id).await.expect_err("a start whose workspace is gone");
    assert!(e.message().contains("gone-workspace"), "the error names the missing dir: {e:?}");
    if through_bridge() {
        assert!(e.message().contains("vm layer"), "the refusal came back across the bridge: {e:?}");
    }
    assert_ne!(h.get(&id).await.unwrap().state, pb::VmState::Running as i32, "the refused vm does not run");
    still_serves(&mut h, "after").await;
}

#[tokio::test]
async fn an_unknown_id_is_not_found_everywhere_and_the_helper_stays_up() {
    let mut h = Harness::new("unknownid").await;
    let id = h.id("never-created");
    assert_eq!(h.start(&id).await.unwrap_err().code(), tonic::Code::NotFound);
    assert_eq!(h.stop(&id).await.unwrap_err().code(), tonic::Code::NotFound);
    assert_eq!(h.get(&id).await.unwrap_err().code(), tonic::Code::NotFound);
    assert_eq!(h.delete(&id).await.unwrap_err().code(), tonic::Code::NotFound);
    still_serves(&mut h, "after").await;
}

#[tokio::test]
async fn ids_and_paths_with_nul_or_huge_strings_are_refused_and_the_helper_stays_up() {
    let mut h = Harness::new("hostile").await;
    let nul = format!("{}\0../../etc", h.id("nul"));
    let mut spec = h.spec("x");
    spec.id = nul.clone();
    let e = h.create(spec).await.expect_err("an id with a NUL");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let e = h.start(&nul).await.expect_err("start of an id with a NUL");
    assert!(matches!(e.code(), tonic::Code::InvalidArgument | tonic::Code::NotFound), "{e:?}");

    let mut spec = h.spec("hostname");
    spec.hostname = "a\0b".into();
    assert_eq!(h.create(spec).await.unwrap_err().code(), tonic::Code::InvalidArgument);

    let mut spec = h.spec("mountnul");
    spec.mounts = vec![mount("/tmp\0/etc", "/workspace")];
    assert_eq!(h.create(spec).await.unwrap_err().code(), tonic::Code::InvalidArgument);

    // An id no VM could have reaches the checks, and its echo in the
    // error must not end the client's connection (a trailer past hyper's
    // header list limit does); one near the 4 MiB message limit too.
    let long = "v".repeat(64 << 10);
    let mut spec = h.spec("long");
    spec.id = long.clone();
    let e = h.create(spec).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let e = h.start(&long).await.unwrap_err();
    assert!(matches!(e.code(), tonic::Code::NotFound | tonic::Code::InvalidArgument), "{e:?}");
    let huge = "v".repeat(3 << 20);
    let mut spec = h.spec("huge");
    spec.id = huge.clone();
    let e = h.create(spec).await.expect_err("a 3 MiB id");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let e = h.start(&huge).await.unwrap_err();
    assert!(matches!(e.code(), tonic::Code::NotFound | tonic::Code::InvalidArgument), "{e:?}");
    still_serves(&mut h, "after").await;
}
