//! Background processes: owned by the VM, listable from any connection,
//! with a bounded output ring and group-wide stops.
use super::*;

fn bg(id: &str, name: &str, script: &str) -> pb::StartBackgroundRequest {
    pb::StartBackgroundRequest { process: Some(process(id, &["sh", "-c", script])), name: name.into() }
}

async fn log(
    client: &mut VmHelperClient<Channel>,
    id: &str,
    name: &str,
    tail_lines: u32,
) -> Result<pb::ReadBackgroundLogResponse, tonic::Status> {
    let r = client
        .read_background_log(pb::ReadBackgroundLogRequest { vm_id: id.into(), name: name.into(), tail_lines })
        .await?;
    Ok(r.into_inner())
}

/// Polls the log (bounded) until `done` holds.
async fn wait_log(
    h: &mut Harness,
    id: &str,
    name: &str,
    done: impl Fn(&pb::ReadBackgroundLogResponse) -> bool,
) -> pb::ReadBackgroundLogResponse {
    let mut last = None;
    let mut poll = Poll::every(Duration::from_millis(20));
    while poll.again().await {
        let r = log(&mut h.client, id, name, 0).await.unwrap();
        if done(&r) {
            return r;
        }
        last = Some(r);
    }
    panic!("log of {name} never got there: {last:?}");
}

fn exit_code(p: &pb::BackgroundProcess) -> Option<i32> {
    match p.exit.as_ref()?.status {
        Some(pb::exited::Status::Code(c)) => Some(c),
        _ => None,
    }
}

#[tokio::test]
async fn background_processes_outlive_the_connection_that_started_them() {
    let mut h = Harness::new("bgsurv").await;
    let id = h.running("vm", |_| {}).await;
    let mut first = connect(&h.socket).await.unwrap();
    let started = first
        .start_background(bg(&id, "web", "echo one; echo two; echo three; exec sleep 1000"))
        .await
        .unwrap()
        .into_inner()
        .process
        .unwrap();
    assert!(started.running && started.pid > 0 && started.started_at_ms > 0);
    assert_eq!(started.argv[0], "sh");
    drop(first);

    let mut second = connect(&h.socket).await.unwrap();
    let list =
        second.list_background(pb::ListBackgroundRequest { vm_id: id.clone() }).await.unwrap().into_inner().processes;
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].name.as_str(), list[0].running), ("web", true));
    assert_eq!(list[0].pid, started.pid);
    wait_log(&mut h, &id, "web", |r| r.output.ends_with(b"three\n")).await;
    let tail = log(&mut second, &id, "web", 2).await.unwrap();
    assert_eq!(tail.output, b"two\nthree\n");
    assert_eq!(tail.dropped_bytes, 0);
    let pid = started.pid.to_string();
    assert_eq!(h.sh(&id, &format!("kill -0 {pid}")).await.code(), Some(0));
}

#[tokio::test]
async fn background_output_is_a_bounded_ring() {
    let mut h = Harness::new("bgring").await;
    let id = h.running("vm", |_| {}).await;
    let script = "python3 -c \"import sys; sys.stdout.write('x' * (3 << 20)); sys.stdout.flush()\"; echo; echo end >&2";
    h.client.start_background(bg(&id, "flood", script)).await.unwrap();
    let r = wait_log(&mut h, &id, "flood", |r| {
        r.process.as_ref().is_some_and(|p| !p.running) && r.output.ends_with(b"end\n")
    })
    .await;
    assert!(r.output.len() <= 1 << 20, "{}", r.output.len());
    assert!(r.dropped_bytes > 0);
    assert_eq!(r.output.len() as u64 + r.dropped_bytes, (3 << 20) + 5);
}

#[tokio::test]
async fn stop_kills_the_whole_group_and_returns_the_tail() {
    let mut h = Harness::new("bgstop").await;
    let id = h.running("vm", |_| {}).await;
    h.client.start_background(bg(&id, "tree", "trap '' TERM; sleep 1000 & echo child=$!; wait")).await.unwrap();
    let r = wait_log(&mut h, &id, "tree", |r| r.output.starts_with(b"child=")).await;
    let child = String::from_utf8_lossy(&r.output[6..]).trim().to_string();
    let stopped = h
        .client
        .stop_background(pb::StopBackgroundRequest {
            vm_id: id.clone(),
            name: "tree".into(),
            grace_ms: 300,
            tail_lines: 1,
        })
        .await
        .unwrap()
        .into_inner();
    let p = stopped.process.unwrap();
    assert!(!p.running);
    assert_eq!(p.exit.unwrap().status, Some(pb::exited::Status::Signal(9)), "TERM was ignored");
    assert_eq!(stopped.output, format!("child={child}\n").as_bytes());
    assert!(wait_gone(&mut h, &id, &child).await, "child sleep {child} survived");
    let e = log(&mut h.client, &id, "tree", 0).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "the record is gone after a stop");
}

#[tokio::test]
async fn exited_processes_keep_their_status_and_names_are_checked() {
    let mut h = Harness::new("bgexit").await;
    let id = h.running("vm", |_| {}).await;
    h.client.start_background(bg(&id, "job", "echo bye; exit 7")).await.unwrap();
    let r = wait_log(&mut h, &id, "job", |r| r.process.as_ref().is_some_and(|p| !p.running)).await;
    assert_eq!(exit_code(r.process.as_ref().unwrap()), Some(7));
    assert_eq!(r.output, b"bye\n");
    // An exited record is replaced by a new start with its name.
    h.client.start_background(bg(&id, "job", "exec sleep 1000")).await.unwrap();
    let e = h.client.start_background(bg(&id, "job", "true")).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e}");

    let e = log(&mut h.client, &id, "nope", 0).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    let stop_unknown = pb::StopBackgroundRequest { vm_id: id.clone(), name: "nope".into(), ..Default::default() };
    let e = h.client.stop_background(stop_unknown).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    for bad in ["", "-x", "a b", "a/b"] {
        let e = h.client.start_background(bg(&id, bad, "true")).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}: {e}");
    }
    let mut tty = bg(&id, "tty", "true");
    tty.process.as_mut().unwrap().tty = true;
    let e = h.client.start_background(tty).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    let e = h
        .client
        .start_background(pb::StartBackgroundRequest {
            process: Some(process(&id, &["/no/such/program"])),
            name: "missing".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    let e = h.client.list_background(pb::ListBackgroundRequest { vm_id: "no-such-vm".into() }).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
}

#[tokio::test]
async fn exited_records_are_capped() {
    let mut h = Harness::new("bgcap").await;
    let id = h.running("vm", |_| {}).await;
    for i in 0..70 {
        h.client.start_background(bg(&id, &format!("j{i}"), "true")).await.unwrap();
    }
    wait_log(&mut h, &id, "j69", |r| r.process.as_ref().is_some_and(|p| !p.running)).await;
    let list =
        h.client.list_background(pb::ListBackgroundRequest { vm_id: id.clone() }).await.unwrap().into_inner().processes;
    assert!(list.len() <= 64, "{}", list.len());
    assert_eq!(list.last().unwrap().name, "j69", "the newest is kept");
}
