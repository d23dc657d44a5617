//! The "go" handshake on the control port. Guest init boots to the point
//! where nothing sandbox-specific is attached (modules loaded, the image's
//! layers mounted: they are the shape's, not the sandbox's; no writable
//! disk, no `/workspace`), says [`READY`] on the virtio-serial port
//! [`CONTROL_PORT`], and blocks reading one [`Go`] line. A cold boot gets
//! its line at once; a template VM is saved to a memory snapshot while it
//! waits, so every VM restored from that snapshot wakes up here and gets its
//! own line: hostname, whether `/workspace` is attached, the host's clock,
//! a seed for the kernel's RNG (two restores of one snapshot would
//! otherwise share the RNG state the snapshot froze) and the sandbox's
//! [`GuestLimits`] (one snapshot serves every sandbox of its shape, whatever
//! their task limit or a memory limit below the shape's RAM).
//!
//! The handshake has a port of its own so the agent's port is never opened
//! twice or closed with the host's first request still buffered in it.
use std::io::{Read as _, Write as _};
use std::os::fd::AsRawFd as _;

use super::GuestError;

/// The control port's virtio-serial name.
pub const CONTROL_PORT: &str = "smcp-control";
/// What guest init writes once it waits for [`Go`].
pub const READY: &str = "smcp-ready\n";
/// What guest init writes once the sandbox's root is assembled and the
/// agent (started before the "go") has entered it.
pub const ROOTED: &str = "smcp-rooted\n";
/// How many seed bytes a [`Go`] carries (the kernel's CRNG key size).
pub const SEED_BYTES: usize = 32;

/// What the host tells a waiting guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Go {
    /// The sandbox's hostname (a VM name, checked by the orchestrator).
    pub hostname: String,
    /// Whether a writable disk and `/workspace` were attached (PCI, rescanned).
    pub workspace: bool,
    /// The host's wall clock, nanoseconds since the epoch.
    pub time_ns: u128,
    /// Entropy for the kernel's RNG.
    pub seed: [u8; SEED_BYTES],
    /// What the guest enforces on the sandbox's processes; optional words
    /// (`pids=`, `memory=`), so a line without them still parses.
    pub limits: GuestLimits,
}

/// The sandbox's limits as its guest enforces them, on the cgroup every
/// process the agent starts runs in ([`super::cgroup`]); `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuestLimits {
    /// Tasks (`pids.max`).
    pub pids: Option<u64>,
    /// Memory, bytes (`memory.max`).
    pub memory_bytes: Option<u64>,
}

impl Go {
    /// The line as sent (newline-terminated).
    pub fn encode(&self) -> String {
        let hostname: String = self
            .hostname
            .chars()
            .map(|ch| if ch.is_ascii_alphanumeric() || ch == '-' || ch == '.' { ch } else { '-' })
            .collect();
        let seed: String = self.seed.iter().map(|b| format!("{b:02x}")).collect();
        let mut line = format!(
            "smcp-go time={} seed={seed} hostname={hostname} workspace={}",
            self.time_ns,
            u8::from(self.workspace)
        );
        if let Some(n) = self.limits.pids {
            line.push_str(&format!(" pids={n}"));
        }
        if let Some(n) = self.limits.memory_bytes {
            line.push_str(&format!(" memory={n}"));
        }
        line.push('\n');
        line
    }

    /// Parses a line written by [`encode`](Self::encode).
    pub fn parse(line: &str) -> Result<Self, GuestError> {
        let bad = |what: String| GuestError::Config(format!("go line: {what}"));
        let mut words = line.trim_end().split(' ');
        if words.next() != Some("smcp-go") {
            return Err(bad(format!("{line:?} does not start with smcp-go")));
        }
        let (mut hostname, mut workspace, mut time_ns, mut seed) = (None, None, None, None);
        let mut limits = GuestLimits::default();
        let number = |k: &str, v: &str| v.parse::<u64>().map_err(|_| bad(format!("{k}={v} is not a number")));
        for word in words {
            let (k, v) = word.split_once('=').ok_or_else(|| bad(format!("{word:?} is not key=value")))?;
            match k {
                "hostname" => hostname = Some(v.to_string()),
                "workspace" => workspace = Some(v == "1"),
                "time" => time_ns = Some(v.parse().map_err(|_| bad(format!("time={v} is not a number")))?),
                "pids" => limits.pids = Some(number(k, v)?),
                "memory" => limits.memory_bytes = Some(number(k, v)?),
                "seed" => {
                    let bytes: Option<Vec<u8>> = (0..v.len())
                        .step_by(2)
                        .map(|i| v.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
                        .collect();
                    seed = Some(
                        bytes
                            .and_then(|b| <[u8; SEED_BYTES]>::try_from(b).ok())
                            .ok_or_else(|| bad(format!("seed is not {SEED_BYTES} hex bytes")))?,
                    );
                }
                _ => {}
            }
        }
        Ok(Go {
            hostname: hostname.ok_or_else(|| bad("hostname is missing".into()))?,
            workspace: workspace.ok_or_else(|| bad("workspace is missing".into()))?,
            time_ns: time_ns.ok_or_else(|| bad("time is missing".into()))?,
            seed: seed.ok_or_else(|| bad("seed is missing".into()))?,
            limits,
        })
    }
}

/// Says [`READY`] on the control port and waits for the host's [`Go`];
/// returns it with the port, on which [`say_rooted`] follows (the port is
/// closed after that: the agent has a port of its own).
pub fn wait_for_go() -> Result<(Go, std::fs::File), GuestError> {
    let port = super::agent::port(CONTROL_PORT)?;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&port)
        .map_err(|e| GuestError::io(format!("open {}", port.display()), e))?;
    f.write_all(READY.as_bytes()).map_err(|e| GuestError::io("write ready on the control port", e))?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while byte[0] != b'\n' {
        match f.read(&mut byte) {
            Ok(1) => line.push(byte[0]),
            // No host end yet (a snapshot being restored): wait for it.
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(GuestError::io("read go on the control port", e)),
        }
        if line.len() > 4096 {
            return Err(GuestError::Config("go line longer than 4096 bytes".into()));
        }
    }
    Ok((Go::parse(&String::from_utf8_lossy(&line))?, f))
}

/// Says [`ROOTED`] on the control port: the sandbox's root is assembled
/// and the agent runs in it, so the host's requests may come.
pub fn say_rooted(control: &mut std::fs::File) -> Result<(), GuestError> {
    control.write_all(ROOTED.as_bytes()).map_err(|e| GuestError::io("write rooted on the control port", e))
}

/// Sets the wall clock to the host's and reseeds the kernel's RNG with the
/// host's seed: RNDADDENTROPY mixes it in (credited), RNDRESEEDCRNG makes
/// the CRNG take a new key from the pool now rather than at its next
/// scheduled reseed, so the first random bytes after a restore differ.
pub fn apply(go: &Go) -> Result<(), GuestError> {
    let now = libc::timespec {
        tv_sec: libc::time_t::try_from(go.time_ns / 1_000_000_000).unwrap_or(libc::time_t::MAX),
        tv_nsec: (go.time_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: clock_settime reads the timespec we pass.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &now) } != 0 {
        return Err(GuestError::io("set the clock to the host's", std::io::Error::last_os_error()));
    }
    let random = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/random")
        .map_err(|e| GuestError::io("open /dev/random", e))?;
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info = Vec::with_capacity(8 + SEED_BYTES);
    info.extend_from_slice(&((SEED_BYTES * 8) as i32).to_ne_bytes());
    info.extend_from_slice(&(SEED_BYTES as i32).to_ne_bytes());
    info.extend_from_slice(&go.seed);
    const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
    const RNDRESEEDCRNG: libc::c_ulong = 0x5207;
    // SAFETY: the ioctls read `info` (a rand_pool_info of the stated size)
    // or nothing; the descriptor is open.
    unsafe {
        if libc::ioctl(random.as_raw_fd(), RNDADDENTROPY, info.as_ptr()) != 0 {
            return Err(GuestError::io("RNDADDENTROPY", std::io::Error::last_os_error()));
        }
        if libc::ioctl(random.as_raw_fd(), RNDRESEEDCRNG) != 0 {
            return Err(GuestError::io("RNDRESEEDCRNG", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Makes the kernel find the PCI devices the host attached after a restore
/// (the writable disk, `/workspace`): a rescan of the bus, which is cheap
/// and harmless when they were there from the start.
pub fn rescan_pci() -> Result<(), GuestError> {
    std::fs::write("/sys/bus/pci/rescan", "1").map_err(|e| GuestError::io("rescan the PCI bus", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_round_trips_and_sanitizes_the_hostname() {
        let go = Go {
            hostname: "a b".into(),
            workspace: true,
            time_ns: 1_700_000_000_123_456_789,
            seed: [7; SEED_BYTES],
            limits: GuestLimits { pids: Some(77), memory_bytes: Some(256 << 20) },
        };
        let line = go.encode();
        assert!(line.ends_with('\n') && line.contains(" hostname=a-b "), "{line}");
        assert!(line.contains(" pids=77") && line.contains(" memory=268435456"), "{line}");
        assert_eq!(Go::parse(&line).unwrap(), Go { hostname: "a-b".into(), ..go });
        let unlimited = Go { limits: GuestLimits::default(), ..go };
        let line = unlimited.encode();
        assert!(!line.contains("pids=") && !line.contains("memory="), "{line}");
        assert_eq!(Go::parse(&line).unwrap(), Go { hostname: "a-b".into(), ..unlimited });
    }

    #[test]
    fn a_go_line_without_limits_parses_with_none() {
        // What a host from before the limits writes.
        let seed = "07".repeat(SEED_BYTES);
        let go = Go::parse(&format!("smcp-go time=5 seed={seed} hostname=h workspace=0\n")).unwrap();
        assert_eq!(go.limits, GuestLimits { pids: None, memory_bytes: None });
        let go = Go::parse(&format!("smcp-go time=5 seed={seed} hostname=h workspace=0 pids=9\n")).unwrap();
        assert_eq!(go.limits, GuestLimits { pids: Some(9), memory_bytes: None });
    }

    #[test]
    fn go_names_what_is_wrong() {
        let e = Go::parse("hello").unwrap_err().to_string();
        assert!(e.contains("smcp-go"), "{e}");
        let e = Go::parse("smcp-go time=1 seed=00 hostname=x workspace=0").unwrap_err().to_string();
        assert!(e.contains("seed is not 32 hex bytes"), "{e}");
        let e = Go::parse("smcp-go time=x").unwrap_err().to_string();
        assert!(e.contains("time=x"), "{e}");
        let e = Go::parse("smcp-go pids=many").unwrap_err().to_string();
        assert!(e.contains("pids=many is not a number"), "{e}");
        let e = Go::parse("smcp-go memory=-1").unwrap_err().to_string();
        assert!(e.contains("memory=-1 is not a number"), "{e}");
    }
}
