//! Exec: output and exit status exactly, binary-safe streams, cwd, env and
//! a secret's descriptor, interactive stdin, signals to the process group,
//! a client that goes away, background processes, and a terminal.
use super::*;

#[tokio::test]
async fn exec_reports_output_and_exit_status_exactly() {
    let mut h = Harness::new("exec").await;
    let id = h.running("vm", |_| {}).await;
    let o = h.run(process(&id, &["echo", "hi"]), b"").await.unwrap();
    assert_eq!((o.out(), o.code()), ("hi\n".to_string(), Some(0)));
    assert!(o.pid > 0);
    let o = h.sh(&id, "echo out; echo err >&2; exit 3").await;
    assert_eq!((o.out(), o.err(), o.code()), ("out\n".into(), "err\n".into(), Some(3)));
    let o = h.sh(&id, "kill -9 $$").await;
    assert_eq!(o.status, Some(pb::exited::Status::Signal(9)));
    let o = h.run(process(&id, &["cat"]), b"").await.unwrap();
    assert_eq!((o.stdout.len(), o.code()), (0, Some(0)), "no stdin given reads EOF at once");

    let err = h.run(process(&id, &[]), b"").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = h.run(process(&id, &["/no/such/program"]), b"").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
}

#[tokio::test]
async fn exec_is_binary_safe_both_ways() {
    let mut h = Harness::new("bin").await;
    let id = h.running("vm", |_| {}).await;
    let all: Vec<u8> = (0..=255u8).cycle().take(256 * 40).collect();
    let o = h.run(process(&id, &["cat"]), &all).await.unwrap();
    assert_eq!(o.stdout, all, "all 256 byte values round trip");

    let stdin = b"line one\nline two without newline".to_vec();
    let o = h.run(process(&id, &["cat"]), &stdin).await.unwrap();
    assert_eq!(o.stdout, stdin);

    let o = h.sh(&id, "head -c 1000000 /dev/zero | tr '\\0' a; echo").await;
    assert_eq!(o.stdout.len(), 1_000_001);
    assert!(o.stdout[..1_000_000].iter().all(|&b| b == b'a'));
}

#[tokio::test]
async fn exec_applies_cwd_and_env() {
    let mut h = Harness::new("env").await;
    let id = h.running("vm", |s| s.env = HashMap::from([("A".into(), "vm".into()), ("B".into(), "vm".into())])).await;
    let mut p = process(&id, &["sh", "-c", "echo $A $B $C $HOME; pwd"]);
    p.env = HashMap::from([("B".into(), "proc".into()), ("C".into(), "c".into())]);
    let o = h.run(p, b"").await.unwrap();
    assert_eq!(o.out(), "vm proc c /root\n/\n");

    let mut p = process(&id, &["pwd"]);
    p.cwd = "/tmp/new/deep".into();
    let err = h.run(p.clone(), b"").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("/tmp/new/deep"), "{}", err.message());
    p.create_cwd = true;
    assert_eq!(h.run(p, b"").await.unwrap().out(), "/tmp/new/deep\n");
}

#[tokio::test]
async fn a_secret_is_readable_once_on_its_descriptor_and_nowhere_else() {
    let mut h = Harness::new("secret").await;
    let id = h.running("vm", |_| {}).await;
    // Read on fd 3 by a child of the process (inherited), once; never in
    // the environment or argv of the process.
    let script = "grep -c 's3cr3t-va[l]ue' /proc/$$/environ /proc/$$/cmdline; sh -c 'cat <&3'; echo; cat <&3; echo end";
    let mut p = process(&id, &["sh", "-c", script]);
    p.secret = b"s3cr3t-value".to_vec();
    let o = h.run(p.clone(), b"").await.unwrap();
    assert_eq!(
        o.out(),
        "/proc/1/environ:0\n/proc/1/cmdline:0\ns3cr3t-value\nend\n".replace("/proc/1", &format!("/proc/{}", o.pid)),
        "{}",
        o.err()
    );
    // Another descriptor number; none without a secret.
    p.argv = vec!["sh".into(), "-c".into(), "cat <&7".into()];
    p.secret_fd = 7;
    assert_eq!(h.run(p.clone(), b"").await.unwrap().out(), "s3cr3t-value");
    p.secret = Vec::new();
    assert_ne!(h.run(p.clone(), b"").await.unwrap().code(), Some(0));
    // Bounds: the descriptor number and the size.
    p.secret = b"x".to_vec();
    p.secret_fd = 2;
    assert_eq!(h.run(p.clone(), b"").await.unwrap_err().code(), Code::InvalidArgument);
    p.secret_fd = 0;
    p.secret = vec![b'x'; 4097];
    assert_eq!(h.run(p, b"").await.unwrap_err().code(), Code::InvalidArgument);
}

#[tokio::test]
async fn exec_stdin_streams_interactively() {
    let mut h = Harness::new("stdin").await;
    let id = h.running("vm", |_| {}).await;
    let (tx, mut out) = h.open(process(&id, &["cat"])).await.unwrap();
    assert!(matches!(out.next().await.unwrap().unwrap().msg, Some(pb::exec_response::Msg::Started(_))));
    for word in ["ping\n", "pong\n"] {
        tx.send(req(pb::exec_request::Msg::Stdin(word.as_bytes().to_vec()))).await.unwrap();
        match out.next().await.unwrap().unwrap().msg {
            Some(pb::exec_response::Msg::Stdout(b)) => assert_eq!(b, word.as_bytes()),
            other => panic!("expected echo, got {other:?}"),
        }
    }
    tx.send(req(pb::exec_request::Msg::CloseStdin(pb::CloseStdin {}))).await.unwrap();
    let rest = collect(&mut out).await.unwrap();
    assert_eq!(rest.code(), Some(0));
}

#[tokio::test]
async fn signals_reach_the_process_group() {
    let mut h = Harness::new("sig").await;
    let id = h.running("vm", |_| {}).await;
    let (tx, mut out) = h.open(process(&id, &["sh", "-c", "sleep 1000 & echo $!; wait"])).await.unwrap();
    let mut bg = String::new();
    while !bg.ends_with('\n') {
        if let Some(pb::exec_response::Msg::Stdout(b)) = out.next().await.unwrap().unwrap().msg {
            bg.push_str(&String::from_utf8_lossy(&b));
        }
    }
    let bg = bg.trim().to_string();
    tx.send(req(pb::exec_request::Msg::Signal(pb::Signal { signal: 15, process_group: true }))).await.unwrap();
    let o = collect(&mut out).await.unwrap();
    assert_eq!(o.status, Some(pb::exited::Status::Signal(15)));
    assert!(wait_gone(&mut h, &id, &bg).await, "background sleep {bg} survived a group signal");

    let (tx, mut out) = h.open(process(&id, &["sleep", "1000"])).await.unwrap();
    assert!(matches!(out.next().await.unwrap().unwrap().msg, Some(pb::exec_response::Msg::Started(_))));
    tx.send(req(pb::exec_request::Msg::Signal(pb::Signal { signal: 2, process_group: false }))).await.unwrap();
    assert_eq!(collect(&mut out).await.unwrap().status, Some(pb::exited::Status::Signal(2)));
}

#[tokio::test]
async fn client_disconnect_kills_the_process() {
    let mut h = Harness::new("disc").await;
    let id = h.running("vm", |_| {}).await;
    let (tx, mut out) = h.open(process(&id, &["sh", "-c", "echo ready; exec sleep 1000"])).await.unwrap();
    let mut pid = 0;
    loop {
        match out.next().await.unwrap().unwrap().msg {
            Some(pb::exec_response::Msg::Started(s)) => pid = s.pid,
            Some(pb::exec_response::Msg::Stdout(_)) => break,
            _ => {}
        }
    }
    drop(tx);
    drop(out);
    assert!(wait_gone(&mut h, &id, &pid.to_string()).await, "process {pid} survived its client");
}

#[tokio::test]
async fn background_processes_survive_a_finished_exec() {
    let mut h = Harness::new("bg").await;
    let id = h.running("vm", |_| {}).await;
    let o = h.sh(&id, "sleep 1000 >/dev/null 2>&1 & echo $!").await;
    assert_eq!(o.code(), Some(0));
    let pid = o.out().trim().to_string();
    assert_eq!(h.sh(&id, &format!("kill -0 {pid}")).await.code(), Some(0), "detached child still runs");
}
#[tokio::test]
async fn tty_exec_runs_on_a_terminal() {
    let mut h = Harness::new("tty").await;
    let id = h.running("vm", |_| {}).await;
    let mut p = process(&id, &["sh", "-c", "tty; echo $TERM; stty size"]);
    p.tty = true;
    p.tty_cols = 100;
    p.tty_rows = 30;
    let o = h.run(p, b"").await.unwrap();
    let out = o.out();
    assert!(out.starts_with("/dev/pts/"), "{out:?}");
    assert!(out.contains("xterm-256color") && out.contains("30 100"), "{out:?}");
    assert!(o.stderr.is_empty());
}
