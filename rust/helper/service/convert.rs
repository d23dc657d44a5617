//! Proto ⇄ domain conversions for the service: VM specs, process specs,
//! exit statuses and background-process records.
use super::super::agent_link::AgentLink;
use super::super::error::HelperError;
use super::super::seed::{SeedFile, SeedKind};
use super::super::spec::{MountSpec, Network, VmConfig, check_env_key};
use super::super::vm::{VmInfo, VmManager, VmState};
use sandbox_agent::protocol::{BackgroundRecord, ExitStatus, StartSpec};
use sandbox_contract::v1 as pb;
use sandbox_net::policy::NetworkPolicy;
use std::sync::Arc;

/// Checks a process spec and turns it into what the agent runs, with the
/// image's and the VM's environment merged in first and the image's user as
/// the default; returns the VM's agent link too.
pub(super) fn start_spec(
    vms: &VmManager,
    p: pb::ProcessSpec,
    field: &str,
) -> Result<(Arc<AgentLink>, StartSpec), HelperError> {
    if p.argv.is_empty() || p.argv[0].is_empty() {
        return Err(HelperError::invalid(format!("{field}.argv"), "must not be empty"));
    }
    for key in p.env.keys() {
        check_env_key(&format!("{field}.env"), key)?;
    }
    if p.secret.len() > sandbox_agent::protocol::MAX_SECRET {
        return Err(HelperError::invalid(
            format!("{field}.secret"),
            format!("must be at most {} bytes", sandbox_agent::protocol::MAX_SECRET),
        ));
    }
    if !(p.secret.is_empty() || p.secret_fd == 0 || (3..=255).contains(&p.secret_fd)) {
        return Err(HelperError::invalid(format!("{field}.secret_fd"), "must be 0 or 3 to 255"));
    }
    let target = vms.exec_target(&p.vm_id)?;
    let mut env = target.env;
    let mut process_env: Vec<_> = p.env.into_iter().collect();
    process_env.sort();
    env.extend(process_env);
    let spec = StartSpec {
        argv: p.argv,
        env,
        cwd: p.cwd,
        create_cwd: p.create_cwd,
        tty: p.tty,
        tty_cols: u16::try_from(p.tty_cols).unwrap_or(u16::MAX),
        tty_rows: u16::try_from(p.tty_rows).unwrap_or(u16::MAX),
        user: if p.user.is_empty() { target.user } else { p.user },
        secret: p.secret,
        secret_fd: p.secret_fd,
    };
    Ok((target.agent, spec))
}

pub(super) fn background_to_proto(r: BackgroundRecord) -> pb::BackgroundProcess {
    pb::BackgroundProcess {
        name: r.name,
        pid: r.pid,
        argv: r.argv,
        started_at_ms: r.started_at_ms,
        running: r.exit.is_none(),
        exit: r.exit.map(exited),
    }
}

pub(super) fn exited(st: ExitStatus) -> pb::Exited {
    pb::Exited {
        status: Some(match st {
            ExitStatus::Code(c) => pb::exited::Status::Code(c),
            ExitStatus::Signal(s) => pb::exited::Status::Signal(s),
        }),
    }
}

/// A spec's files (`VmSpec.files`), kept apart from the config the VM keeps.
pub(super) fn seed_files(files: Vec<pb::RootfsFile>) -> Result<Vec<SeedFile>, HelperError> {
    files
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let kind = if f.symlink_target.is_empty() {
                SeedKind::File { content: f.content, mode: f.mode }
            } else if f.content.is_empty() {
                SeedKind::Link(f.symlink_target.into())
            } else {
                return Err(HelperError::invalid(format!("spec.files[{i}].content"), "must be empty for a symlink"));
            };
            Ok(SeedFile { path: f.path.into(), kind })
        })
        .collect()
}

pub(super) fn config_from_proto(spec: pb::VmSpec) -> Result<VmConfig, HelperError> {
    let network = match pb::NetworkMode::try_from(spec.network) {
        Ok(pb::NetworkMode::None) => Network::None,
        Ok(pb::NetworkMode::Unspecified | pb::NetworkMode::Egress) => Network::Egress,
        Err(_) => {
            return Err(HelperError::invalid("spec.network", format!("unknown network mode {}", spec.network)));
        }
    };
    let network_policy = match &spec.network_policy {
        None => NetworkPolicy::default(),
        Some(p) => NetworkPolicy::parse(&p.allow, &p.deny)
            .map_err(|e| HelperError::invalid("spec.network_policy", e.to_string()))?,
    };
    Ok(VmConfig {
        id: spec.id,
        image: spec.image,
        cpus: spec.cpus,
        memory_bytes: spec.memory_bytes,
        pids_limit: spec.pids_limit,
        mounts: spec
            .mounts
            .into_iter()
            .map(|m| MountSpec {
                host_path: m.host_path.into(),
                guest_path: m.guest_path.into(),
                read_only: m.read_only,
            })
            .collect(),
        env: spec.env.into_iter().collect(),
        hostname: spec.hostname,
        network,
        network_policy,
        labels: spec.labels.into_iter().collect(),
        clone_from: spec.clone_from,
        disk_bytes: spec.disk_bytes,
        driver: spec.driver,
    })
}

pub(super) fn vm_to_proto(vm: VmInfo) -> pb::Vm {
    let c = vm.config;
    pb::Vm {
        spec: Some(pb::VmSpec {
            id: c.id,
            image: c.image,
            cpus: c.cpus,
            memory_bytes: c.memory_bytes,
            pids_limit: c.pids_limit,
            mounts: c
                .mounts
                .into_iter()
                .map(|m| pb::Mount {
                    host_path: m.host_path.display().to_string(),
                    guest_path: m.guest_path.display().to_string(),
                    read_only: m.read_only,
                })
                .collect(),
            env: c.env.into_iter().collect(),
            hostname: c.hostname,
            clone_from: c.clone_from,
            network: match c.network {
                Network::None => pb::NetworkMode::None,
                Network::Egress => pb::NetworkMode::Egress,
            } as i32,
            labels: c.labels.into_iter().collect(),
            network_policy: (!c.network_policy.is_default()).then(|| pb::NetworkPolicy {
                allow: c.network_policy.allow().iter().map(ToString::to_string).collect(),
                deny: c.network_policy.deny().iter().map(ToString::to_string).collect(),
            }),
            disk_bytes: c.disk_bytes,
            driver: c.driver,
            files: Vec::new(),
        }),
        state: match vm.state {
            VmState::Created => pb::VmState::Created,
            VmState::Running => pb::VmState::Running,
            VmState::Stopped => pb::VmState::Stopped,
        } as i32,
        created_at_ms: vm.created_at_ms,
        started_at_ms: vm.started_at_ms,
        shell: vm.shell,
        stop_reason: vm.stop_reason,
        image_created_at_ms: vm.image_created_at_ms,
        limits_not_enforced: vm.limits_not_enforced,
    }
}

impl From<crate::netstack::events::Snapshot> for pb::NetworkEventsResponse {
    fn from(s: crate::netstack::events::Snapshot) -> Self {
        pb::NetworkEventsResponse {
            refused: s
                .refused
                .into_iter()
                .map(|r| pb::NetworkEvent {
                    at_ms: r.at_ms,
                    protocol: r.protocol.to_string(),
                    destination: r.destination,
                    name: r.name,
                    reason: r.reason,
                })
                .collect(),
            refused_total: s.refused_total,
            allowed_total: s.allowed_total,
        }
    }
}

/// A driver as GetInfo lists it; `is_default`: VMs boot with it.
pub(super) fn driver_to_proto(d: &dyn crate::driver::Driver, is_default: bool) -> pb::DriverInfo {
    let c = d.capabilities();
    let reason = d.unavailable_reason();
    pb::DriverInfo {
        name: d.name().into(),
        usable: reason.is_none(),
        unavailable_reason: reason.unwrap_or_default(),
        is_default,
        capabilities: Some(pb::DriverCapabilities {
            tty: c.tty,
            network_egress: c.network_egress,
            limits: c.limits,
            cgroups: c.cgroups.unwrap_or_default().into(),
            seccomp: c.seccomp,
            own_kernel: c.own_kernel,
            dial: c.dial,
            snapshot: c.snapshot,
            containers: c.containers,
            pull_images: c.pull_images,
        }),
    }
}
