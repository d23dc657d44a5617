//! A QMP client: the JSON lines qemu speaks on its `-qmp` socket. Events
//! arriving between a command and its answer are skipped.
use std::os::fd::{AsFd as _, AsRawFd as _};
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use super::QemuError;

/// The line that runs `command` with `arguments`.
fn request(command: &str, arguments: Option<&Value>) -> Vec<u8> {
    let mut msg = json!({ "execute": command });
    if let Some(args) = arguments {
        msg["arguments"] = args.clone();
    }
    let mut bytes = msg.to_string().into_bytes();
    bytes.push(b'\n');
    bytes
}

/// A negotiated QMP connection.
pub struct Qmp {
    rd: BufReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
}

/// How often a migration's progress is polled.
const POLL: Duration = Duration::from_millis(10);

impl Qmp {
    /// Connects to `socket` (waiting up to `wait` for qemu to create it)
    /// and leaves capability negotiation.
    pub async fn connect(socket: &Path, wait: Duration) -> Result<Self, QemuError> {
        let deadline = tokio::time::Instant::now() + wait;
        let stream = loop {
            match UnixStream::connect(socket).await {
                Ok(s) => break s,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(QemuError::io(format!("connect to qmp at {}", socket.display()), e));
                }
                Err(_) => tokio::time::sleep(POLL).await,
            }
        };
        let (rd, wr) = stream.into_split();
        let mut qmp = Qmp { rd: BufReader::new(rd), wr };
        let greeting = qmp.line("greeting").await?;
        if greeting.get("QMP").is_none() {
            return Err(QemuError::Qmp { command: "greeting".into(), detail: format!("unexpected {greeting}") });
        }
        qmp.execute("qmp_capabilities", None).await?;
        Ok(qmp)
    }

    async fn line(&mut self, command: &str) -> Result<Value, QemuError> {
        let mut line = String::new();
        let n = self.rd.read_line(&mut line).await.map_err(|e| QemuError::io(format!("qmp {command}"), e))?;
        if n == 0 {
            return Err(QemuError::Qmp { command: command.into(), detail: "qemu closed the connection".into() });
        }
        serde_json::from_str(&line)
            .map_err(|e| QemuError::Qmp { command: command.into(), detail: format!("unreadable answer {line:?}: {e}") })
    }

    /// Runs `command` and returns its `return` value; qemu's `error` becomes
    /// [`QemuError::Qmp`] with its description.
    pub async fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, QemuError> {
        let bytes = request(command, arguments.as_ref());
        self.wr.write_all(&bytes).await.map_err(|e| QemuError::io(format!("qmp {command}"), e))?;
        self.answer(command).await
    }

    /// Sends all `commands` at once, then reads their answers in order:
    /// qemu runs one command at a time and keeps the rest in its input, so
    /// the sequence costs one round trip, not one per command. The first
    /// failure is returned (the commands after it still ran or failed: a
    /// caller whose attach failed kills the vm).
    pub async fn execute_all(&mut self, commands: &[(&str, Option<Value>)]) -> Result<(), QemuError> {
        let bytes: Vec<u8> =
            commands.iter().flat_map(|(command, arguments)| request(command, arguments.as_ref())).collect();
        self.wr.write_all(&bytes).await.map_err(|e| QemuError::io("qmp", e))?;
        let mut first = Ok(());
        for (command, _) in commands {
            let answer = self.answer(command).await;
            if let (Ok(()), Err(e)) = (&first, answer) {
                if matches!(e, QemuError::Io { .. }) {
                    return Err(e);
                }
                first = Err(e);
            }
        }
        first
    }

    async fn answer(&mut self, command: &str) -> Result<Value, QemuError> {
        loop {
            let v = self.line(command).await?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                let detail = e.get("desc").and_then(Value::as_str).unwrap_or("error").to_string();
                return Err(QemuError::Qmp { command: command.into(), detail });
            }
        }
    }

    /// Pauses the guest's CPUs.
    pub async fn stop(&mut self) -> Result<(), QemuError> {
        self.execute("stop", None).await.map(drop)
    }

    /// Resumes the guest's CPUs.
    pub async fn cont(&mut self) -> Result<(), QemuError> {
        self.execute("cont", None).await.map(drop)
    }

    /// Ends qemu at once (the guest gets no shutdown).
    pub async fn quit(&mut self) -> Result<(), QemuError> {
        self.execute("quit", None).await.map(drop)
    }

    /// The run state ("running", "paused", "inmigrate", …).
    pub async fn status(&mut self) -> Result<String, QemuError> {
        let r = self.execute("query-status", None).await?;
        Ok(r.get("status").and_then(Value::as_str).unwrap_or_default().to_string())
    }

    /// Hands qemu an open descriptor under `name` (QMP `getfd`): the file
    /// travels over the socket, so qemu never opens a path or spawns a
    /// process for it, which `-sandbox spawn=deny` would refuse.
    pub async fn send_fd(&mut self, name: &str, file: &std::fs::File) -> Result<(), QemuError> {
        let msg = format!("{}\n", json!({ "execute": "getfd", "arguments": { "fdname": name } }));
        let fds = [file.as_fd().as_raw_fd()];
        let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
        let sock = self.wr.as_ref();
        loop {
            sock.writable().await.map_err(|e| QemuError::io("qmp getfd", e))?;
            let iov = [std::io::IoSlice::new(msg.as_bytes())];
            let sent = sock.try_io(tokio::io::Interest::WRITABLE, || {
                nix::sys::socket::sendmsg::<()>(
                    sock.as_raw_fd(),
                    &iov,
                    &cmsg,
                    nix::sys::socket::MsgFlags::empty(),
                    None,
                )
                .map_err(std::io::Error::from)
            });
            match sent {
                Ok(n) if n == msg.len() => break,
                Ok(n) => {
                    // The descriptor went with the first byte; the rest of
                    // the line is plain data.
                    self.wr.write_all(&msg.as_bytes()[n..]).await.map_err(|e| QemuError::io("qmp getfd", e))?;
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(QemuError::io("qmp getfd", e)),
            }
        }
        self.answer("getfd").await.map(drop)
    }

    /// Pauses the guest and writes its state to `file`, waiting until the
    /// migration ends; the guest stays paused. Shared RAM (the guest's
    /// memory, a file of its own: see super::ram) is left out
    /// (`x-ignore-shared`): the state holds the devices and what little
    /// other RAM the machine has.
    pub async fn migrate_to_file(&mut self, file: &std::fs::File) -> Result<(), QemuError> {
        self.stop().await?;
        self.ignore_shared_ram().await?;
        self.send_fd("smcp-state", file).await?;
        self.execute("migrate", Some(json!({ "uri": "fd:smcp-state" }))).await?;
        loop {
            let r = self.execute("query-migrate", None).await?;
            match r.get("status").and_then(Value::as_str) {
                Some("completed") => return Ok(()),
                Some("failed") | Some("cancelled") => {
                    let detail = r.get("error-desc").and_then(Value::as_str).unwrap_or("migration failed").to_string();
                    return Err(QemuError::Qmp { command: "migrate".into(), detail });
                }
                _ => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// Both ends of a migration agree to leave shared RAM out of the
    /// stream (its contents are already where the other end maps them).
    async fn ignore_shared_ram(&mut self) -> Result<(), QemuError> {
        let caps = json!({ "capabilities": [{ "capability": "x-ignore-shared", "state": true }] });
        self.execute("migrate-set-capabilities", Some(caps)).await.map(drop)
    }

    /// Loads a state written by [`migrate_to_file`](Self::migrate_to_file)
    /// into a qemu started with `-incoming defer`; the guest stays paused
    /// until [`cont`](Self::cont).
    pub async fn migrate_from_file(&mut self, file: &std::fs::File) -> Result<(), QemuError> {
        self.ignore_shared_ram().await?;
        self.send_fd("smcp-state", file).await?;
        self.execute("migrate-incoming", Some(json!({ "uri": "fd:smcp-state" }))).await?;
        loop {
            match self.status().await?.as_str() {
                "inmigrate" => tokio::time::sleep(POLL).await,
                "paused" | "prelaunch" | "postmigrate" | "running" => return Ok(()),
                other => {
                    return Err(QemuError::Qmp {
                        command: "migrate-incoming".into(),
                        detail: format!("vm is {other}"),
                    });
                }
            }
        }
    }
}
