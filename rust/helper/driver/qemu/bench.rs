//! `sandbox-vm-helper vm-bench`: the vm driver's create figures for
//! `make bench`, measured on the driver's own steps (as its `create` takes
//! them), from qemu's start to the agent's first Pong: a cold boot, a
//! restore from the shape's memory snapshot, and a vm taken from the pool
//! (restored ahead and its agent pinged, untimed; then only attach, "go" and the Pong), the
//! two restores also for a shape with a network card (EGRESS; its stack started at hand-out, as
//! the driver does). Also the
//! host memory of an idle vm (the RSS of its qemu and virtiofsd), the PSS
//! per vm of 4 and of 16 idle vms together, and warm
//! exec on a booted vm: `sh -c 'echo hi'` through its agent, from the
//! stream's open to the exit status.
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::QemuError;
use super::assets::{Assets, vm_dir};
use super::instance::{Attach, Instance, Shape, Start};
use super::template::Template;
use super::{disks, probe};
use crate::netstack::events::Events;
use sandbox_agent::mux::Mux;
use sandbox_agent::protocol::{ExitStatus, Frame, StartSpec};
use sandbox_guest::handshake::GuestLimits;
use sandbox_net::policy::NetworkPolicy;
use sandbox_userns::IdMapper;

/// The samples, in milliseconds and MiB.
#[derive(Debug, Default, Serialize)]
pub struct Figures {
    /// Cold boots.
    pub cold_ms: Vec<f64>,
    /// Restores from the state file.
    pub snapshot_ms: Vec<f64>,
    /// Pooled vms handed out.
    pub pool_ms: Vec<f64>,
    /// Restores from the state file of a shape with a network card
    /// (EGRESS), its stack started.
    pub egress_snapshot_ms: Vec<f64>,
    /// Pooled vms with a network card handed out, their stacks started.
    pub egress_pool_ms: Vec<f64>,
    /// RSS of qemu and virtiofsd per idle vm.
    pub idle_rss_mib: Vec<f64>,
    /// Host memory per idle vm with several idle at once (PSS: pages
    /// they share, qemu's binary and libraries, counted once), one entry
    /// per count in [`DENSITY`].
    pub density: Vec<Density>,
    /// Warm `sh -c 'echo hi'` through the agent of a booted vm.
    pub warm_exec_ms: Vec<f64>,
}

/// The PSS of one count of idle vms, each restored as the pool does and
/// given a sandbox (its writable disk, `/workspace` and virtiofsd).
#[derive(Debug, Default, Serialize)]
pub struct Density {
    /// How many vms were idle at once.
    pub vms: usize,
    /// Mean PSS of a vm's qemu, MiB.
    pub qemu_pss_mib: f64,
    /// Mean PSS of a vm's qemu and virtiofsd together, MiB.
    pub total_pss_mib: f64,
}

/// The counts of idle vms whose memory is measured together.
const DENSITY: [usize; 2] = [4, 16];

/// How many warm execs are timed (after [`EXEC_WARMUP`] untimed ones).
const EXEC_RUNS: usize = 50;
/// Untimed execs first: the guest's first runs of `sh` fill its page
/// cache (and, under TCG, qemu's translated code).
const EXEC_WARMUP: usize = 5;

fn failed(what: &str, e: impl std::fmt::Display) -> QemuError {
    QemuError::io(what.to_string(), std::io::Error::other(e.to_string()))
}

/// The pids' /proc directories of the processes whose command line contains `needle`.
fn procs_matching(needle: &str) -> Vec<PathBuf> {
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    procs
        .flatten()
        .map(|p| p.path())
        .filter(|p| {
            std::fs::read(p.join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).replace('\0', " ").contains(needle))
        })
        .collect()
}

fn rss_kib(proc_dir: &Path) -> u64 {
    kib_field(&proc_dir.join("status"), "VmRSS:")
}

/// The PSS of the process at `proc_dir`, in KiB.
fn pss_kib(proc_dir: &Path) -> u64 {
    kib_field(&proc_dir.join("smaps_rollup"), "Pss:")
}

/// The "`field` N kB" line of a /proc file, in KiB (0 if unreadable).
fn kib_field(file: &Path, field: &str) -> u64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()))
        })
        .unwrap_or(0)
}

/// Runs the benchmark on `layers` (an image's, bottom first), `runs`
/// samples of each restore figure and fewer cold boots, under `work`.
pub async fn run(layers: &[PathBuf], runs: usize, work: &Path) -> Result<Figures, QemuError> {
    let assets = Assets::for_this_helper()?;
    let mapper = IdMapper::detect().map_err(|e| failed("the id map", e))?;
    let accel = probe::detect(&assets, &work.join("probe"), &vm_dir().join(super::assets::ACCEL_MEMO)).await;
    let cache = vm_dir().join("disks");
    let layers = layers.iter().map(|l| disks::layer_disk(l, &cache, &mapper)).collect::<Result<Vec<_>, _>>()?;
    let plain = Shape {
        kernel: assets.kernel.clone(),
        initramfs: assets.initramfs.clone(),
        accel,
        layers,
        cpus: 1,
        memory_mib: 512,
        network: false,
    };
    let egress = Shape { network: true, ..plain.clone() };
    let cold_runs = runs.div_ceil(4).max(1);
    // Cold boots only without a card (a card adds nothing to a boot that
    // takes seconds); each restore figure with and without one.
    let mut plan = vec![(Sample::Cold, &plain); cold_runs];
    for shape in [&plain, &egress] {
        plan.extend(std::iter::repeat_n((Sample::Snapshot, shape), runs));
        plan.extend(std::iter::repeat_n((Sample::Pool, shape), runs));
    }
    let mut states = Vec::new();
    for (name, shape) in [("plain", &plain), ("egress", &egress)] {
        let template = Template::of(&work.join("templates"), shape);
        template.build(shape, &work.join(format!("template-{name}")), None).await?;
        states.push(template.current().ok_or_else(|| failed("the template", "no state was saved"))?);
    }
    let mut figures = Figures::default();
    for (i, (sample, shape)) in plan.into_iter().enumerate() {
        let state = &states[usize::from(shape.network)];
        let dir = work.join(format!("vm{i}"));
        let (upper, ws) = sandbox_disks(&dir, &mapper)?;
        let run_dir = dir.join("run");
        let (mut vm, t) = match sample {
            Sample::Cold | Sample::Snapshot => {
                let how = if sample == Sample::Cold { Start::Cold } else { Start::Restore(state) };
                let t = Instant::now();
                (Instance::start(shape, &run_dir, how, None).await?, t)
            }
            Sample::Pool => (pooled(shape, state, &run_dir).await?, Instant::now()),
        };
        let mux = vm.go(attach(&upper, &ws, &mapper), sample == Sample::Cold).await?;
        // As the driver does at hand-out: the card's stack, with a policy.
        let _net = match vm.take_network() {
            Some(card) => Some(
                card.serve(NetworkPolicy::default(), Arc::new(Events::default()))
                    .map_err(|e| failed("the vm's network stack", e))?,
            ),
            None => None,
        };
        let agent = pong(mux).await?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        let first = match (sample, shape.network) {
            (Sample::Cold, _) => push(&mut figures.cold_ms, ms),
            (Sample::Snapshot, false) => push(&mut figures.snapshot_ms, ms),
            (Sample::Pool, false) => push(&mut figures.pool_ms, ms),
            (Sample::Snapshot, true) => push(&mut figures.egress_snapshot_ms, ms),
            (Sample::Pool, true) => push(&mut figures.egress_pool_ms, ms),
        };
        if first && sample != Sample::Cold && !shape.network {
            // An idle restored vm, settled.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let qemu = vm.pid().map_or(0, |p| rss_kib(&PathBuf::from(format!("/proc/{p}"))));
            let virtiofsd: u64 = procs_matching(&format!("source={}", ws.display())).iter().map(|p| rss_kib(p)).sum();
            figures.idle_rss_mib.push((qemu + virtiofsd) as f64 / 1024.0);
        }
        if first && sample == Sample::Pool && !shape.network {
            for n in 0..EXEC_WARMUP + EXEC_RUNS {
                let t = Instant::now();
                echo_hi(&agent).await?;
                if n >= EXEC_WARMUP {
                    figures.warm_exec_ms.push(t.elapsed().as_secs_f64() * 1000.0);
                }
            }
        }
        vm.kill().await;
        let _ = std::fs::remove_dir_all(&dir);
    }
    for vms in DENSITY {
        let dir = work.join(format!("density{vms}"));
        figures.density.push(density(&plain, &states[0], vms, &dir, &mapper).await?);
    }
    Ok(figures)
}

/// A sandbox's writable disk and `/workspace` under `dir`.
fn sandbox_disks(dir: &Path, mapper: &IdMapper) -> Result<(PathBuf, PathBuf), QemuError> {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).map_err(|e| QemuError::io("create the bench's workspace", e))?;
    let (uid, gid) = mapper.id_map().host_root();
    let _ = nix::unistd::chown(&ws, Some(uid.into()), Some(gid.into()));
    let upper = dir.join("upper.ext4");
    disks::upper_disk(&upper, 1 << 30)?;
    Ok((upper, ws))
}

/// A vm of `shape` restored from `state` and its agent pinged, as the pool
/// keeps it until a sandbox takes it.
async fn pooled(shape: &Shape, state: &Path, run_dir: &Path) -> Result<Instance, QemuError> {
    let mut vm = Instance::start(shape, run_dir, Start::Restore(state), None).await?;
    vm.warm_agent().await?;
    Ok(vm)
}

/// What a bench sandbox hands its vm: its disk and `/workspace`, no cgroup.
fn attach<'a>(upper: &'a Path, ws: &'a Path, mapper: &'a IdMapper) -> Attach<'a> {
    Attach { hostname: "bench", upper, workspace: Some(ws), mapper, cgroup: None, limits: GuestLimits::default() }
}

/// `vms` vms of `shape` restored from `state` as the pool does, each handed
/// to a sandbox and pinged, then left idle together: their mean PSS.
async fn density(
    shape: &Shape,
    state: &Path,
    vms: usize,
    work: &Path,
    mapper: &IdMapper,
) -> Result<Density, QemuError> {
    let mut running = Vec::new();
    let measured = async {
        for i in 0..vms {
            let dir = work.join(format!("vm{i}"));
            let (upper, ws) = sandbox_disks(&dir, mapper)?;
            let mut vm = pooled(shape, state, &dir.join("run")).await?;
            let mux = vm.go(attach(&upper, &ws, mapper), false).await;
            running.push((vm, ws));
            pong(mux?).await?;
        }
        // Idle and settled: the last one's hand-out is over.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (mut qemu, mut total) = (0u64, 0u64);
        for (vm, ws) in &running {
            let q = vm.pid().map_or(0, |p| pss_kib(&PathBuf::from(format!("/proc/{p}"))));
            let v: u64 = procs_matching(&format!("source={}", ws.display())).iter().map(|p| pss_kib(p)).sum();
            qemu += q;
            total += q + v;
        }
        let mean = |kib: u64| kib as f64 / 1024.0 / vms as f64;
        Ok::<_, QemuError>(Density { vms, qemu_pss_mib: mean(qemu), total_pss_mib: mean(total) })
    }
    .await;
    for (mut vm, _) in running {
        vm.kill().await;
    }
    let _ = std::fs::remove_dir_all(work);
    measured
}

/// One create figure: how its vm starts and what the clock covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sample {
    /// The kernel boots: qemu's start to the Pong.
    Cold,
    /// Restored from the state file: qemu's start to the Pong.
    Snapshot,
    /// Restored and warmed untimed (as the pool does): hand-out to the Pong.
    Pool,
}

/// Adds `ms` to `samples`; whether it is the first.
fn push(samples: &mut Vec<f64>, ms: f64) -> bool {
    samples.push(ms);
    samples.len() == 1
}

async fn pong(mux: Mux) -> Result<Mux, QemuError> {
    let mut ping = mux.open(Frame::Ping).map_err(|e| failed("ping the agent", e))?;
    match tokio::time::timeout(Duration::from_secs(300), ping.next()).await {
        Ok(Ok(Some(Frame::Pong))) => Ok(mux),
        other => Err(failed("ping the agent", format!("{other:?}"))),
    }
}

/// `sh -c 'echo hi'` in the guest, to its exit status and output.
async fn echo_hi(agent: &Mux) -> Result<(), QemuError> {
    let argv = ["sh", "-c", "echo hi"].map(String::from).to_vec();
    let mut s = agent.open(Frame::Start(StartSpec::plain(argv))).map_err(|e| failed("exec in the guest", e))?;
    match tokio::time::timeout(Duration::from_secs(60), crate::guest::finish(&mut s)).await {
        Ok(Ok(f)) if f.status == ExitStatus::Code(0) && f.stdout == b"hi\n" => Ok(()),
        other => Err(failed("exec sh -c 'echo hi' in the guest", format!("{other:?}"))),
    }
}
