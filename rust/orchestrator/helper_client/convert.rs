//! Between the domain types ([`super::types`]) and the contract's proto
//! messages: the only place, with the client's calls, that sees both.

use sandbox_contract::v1 as pb;

use super::{
    BackgroundInfo, ExitStatus, HelperError, ImageConfig, ImageSummary, ProcessConfig, VmConfig, VmInfo, VmState,
};
use crate::isolation::Isolation;
use crate::names;
use crate::network::{EgressPolicy, Network};

impl From<VmConfig> for pb::VmSpec {
    fn from(cfg: VmConfig) -> Self {
        Self {
            id: cfg.id.clone(),
            image: cfg.image,
            cpus: cfg.cpus,
            memory_bytes: cfg.memory_bytes,
            pids_limit: cfg.pids,
            mounts: cfg
                .mounts
                .into_iter()
                .map(|(h, g, read_only)| pb::Mount {
                    host_path: h.to_string_lossy().into_owned(),
                    guest_path: g,
                    read_only,
                })
                .collect(),
            env: cfg.env,
            hostname: names::hostname(names::plain(&cfg.id)),
            network: pb::NetworkMode::from(&cfg.network) as i32,
            network_policy: Option::<pb::NetworkPolicy>::from(&cfg.network),
            labels: cfg.labels,
            clone_from: cfg.clone_from.unwrap_or_default(),
            disk_bytes: cfg.disk_bytes,
            files: cfg.files.into_iter().map(pb::RootfsFile::from).collect(),
            driver: cfg.isolation.as_str().into(),
        }
    }
}

impl From<&Network> for pb::NetworkMode {
    fn from(n: &Network) -> Self {
        match n {
            Network::None => Self::None,
            Network::Egress(_) => Self::Egress,
        }
    }
}

/// The policy to send: unset for `none` and for the default policy (the
/// contract's "unset means the default").
impl From<&Network> for Option<pb::NetworkPolicy> {
    fn from(n: &Network) -> Self {
        match n {
            Network::Egress(p) if !p.is_default() => {
                Some(pb::NetworkPolicy { allow: p.allow.clone(), deny: p.deny.clone() })
            }
            _ => None,
        }
    }
}

impl From<&pb::VmSpec> for Network {
    fn from(spec: &pb::VmSpec) -> Self {
        match pb::NetworkMode::try_from(spec.network) {
            Ok(pb::NetworkMode::None) => Self::None,
            _ => Self::Egress(
                spec.network_policy
                    .as_ref()
                    .map(|p| EgressPolicy { allow: p.allow.clone(), deny: p.deny.clone() })
                    .unwrap_or_default(),
            ),
        }
    }
}

pub(super) fn process_spec(vm_id: &str, p: ProcessConfig) -> pb::ProcessSpec {
    pb::ProcessSpec {
        vm_id: vm_id.into(),
        argv: p.argv,
        env: p.env,
        cwd: p.cwd,
        create_cwd: p.create_cwd,
        tty: false,
        tty_cols: 0,
        tty_rows: 0,
        user: p.user,
        secret: p.secret,
        secret_fd: 0,
    }
}

impl From<ImageConfig> for pb::ImageConfig {
    fn from(c: ImageConfig) -> Self {
        pb::ImageConfig {
            env: c.env,
            workdir: c.workdir,
            user: c.user,
            entrypoint: c.entrypoint,
            cmd: c.cmd,
            exposed_ports: c.exposed_ports,
        }
    }
}

impl From<pb::ImageConfig> for ImageConfig {
    fn from(c: pb::ImageConfig) -> Self {
        ImageConfig {
            env: c.env,
            workdir: c.workdir,
            user: c.user,
            entrypoint: c.entrypoint,
            cmd: c.cmd,
            exposed_ports: c.exposed_ports,
        }
    }
}

pub(super) fn image_summary(i: pb::Image) -> ImageSummary {
    ImageSummary {
        name: i.name,
        package_manager: i.package_manager,
        size_bytes: i.size_bytes,
        created_at_ms: i.created_at_ms,
        parent: i.parent,
        layer_count: i.layer_count,
        labels: i.labels,
        config: i.config.unwrap_or_default().into(),
        reference: i.reference,
        source: i.source,
    }
}

pub(super) fn vm_info(vm: Option<pb::Vm>) -> Result<VmInfo, HelperError> {
    let vm = vm.ok_or_else(|| HelperError::Other("helper answered without a VM".into()))?;
    let spec = vm.spec.unwrap_or_default();
    let state = match pb::VmState::try_from(vm.state) {
        Ok(pb::VmState::Created) => VmState::Created,
        Ok(pb::VmState::Running) => VmState::Running,
        Ok(pb::VmState::Stopped) => VmState::Stopped,
        _ => VmState::Unknown,
    };
    Ok(VmInfo {
        network: Network::from(&spec),
        id: spec.id,
        image: spec.image,
        labels: spec.labels,
        state,
        shell: if vm.shell.is_empty() { "/bin/sh".into() } else { vm.shell },
        cpus: spec.cpus,
        memory_bytes: spec.memory_bytes,
        started_at_ms: vm.started_at_ms,
        image_created_at_ms: vm.image_created_at_ms,
        limits_not_enforced: Some(vm.limits_not_enforced).filter(|r| !r.is_empty()),
        stop_reason: Some(vm.stop_reason).filter(|r| !r.is_empty()),
        driver: if spec.driver.is_empty() { Isolation::Namespaces.as_str().into() } else { spec.driver },
    })
}

pub(super) fn exit_status(e: Option<pb::Exited>) -> Option<ExitStatus> {
    e.and_then(|e| e.status).map(|s| match s {
        pb::exited::Status::Code(c) => ExitStatus::Code(c),
        pb::exited::Status::Signal(s) => ExitStatus::Signal(s),
    })
}

pub(super) fn background_info(p: Option<pb::BackgroundProcess>) -> Result<BackgroundInfo, HelperError> {
    let p = p.ok_or_else(|| HelperError::Other("helper answered without a process".into()))?;
    Ok(BackgroundInfo { name: p.name, pid: p.pid, argv: p.argv, running: p.running, exit: exit_status(p.exit) })
}
