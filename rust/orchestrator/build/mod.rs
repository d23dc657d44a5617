//! `build_image`: running a parsed Containerfile step by step in build VMs.
//! Step k runs in a VM booted from the image committed after the last step
//! that touched the filesystem (RUN, COPY/ADD, WORKDIR); ENV, ARG, USER and
//! LABEL only change the state later steps and the image config get. The
//! last VM is committed directly under the final name (there is no rename),
//! every intermediate image and build VM is removed at the end, on failure,
//! and when the caller drops the build (cancellation).
use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use super::{
    containerfile::{self, ContainerfileError, Instruction, Op},
    exec::{self, Outcome},
    helper_client::{CommitConfig, HelperClient, HelperError, ImageConfig, ImageSummary, ProcessConfig, VmConfig},
    images::KIND_LABEL,
    isolation::Isolation,
    names::random_hex,
    network::Network,
    owner,
    sandbox::SandboxManager,
    tarstream,
    text::render,
};

mod context;
use context::{check_context, resolve_copy};

use sandbox_image::oci::Reference;

/// The driver build VMs run on.
const BUILD_ISOLATION: Isolation = Isolation::Namespaces;

/// Label on build VMs and intermediate images: the image being built.
pub const BUILD_LABEL: &str = "sandbox-mcp.build";
/// Label on build VMs and intermediate images: the server process running
/// the build (`<pid>:<start time>`), so a later server can tell a build
/// whose server died from one another live server is running.
const OWNER_LABEL: &str = "sandbox-mcp.build-owner";

/// Remove build VMs and intermediate images left by a server that died
/// mid-build. Builds of servers still running are left alone.
pub async fn remove_orphans(helper: &HelperClient) {
    let orphaned = |labels: &HashMap<String, String>| {
        labels.contains_key(BUILD_LABEL) && labels.get(OWNER_LABEL).is_none_or(|o| !owner::alive(o))
    };
    if let Ok(vms) = helper.list_vms().await {
        for vm in vms.iter().filter(|v| orphaned(&v.labels)) {
            tracing::info!(vm = %vm.id, "removing build VM left by a server that stopped mid-build");
            helper.delete_vm(&vm.id).await.ok();
        }
    }
    if let Ok(images) = helper.list_images().await {
        let steps = images.iter().filter(|i| i.labels.get(KIND_LABEL).map(String::as_str) == Some("build-step"));
        for image in steps.filter(|i| orphaned(&i.labels)) {
            tracing::info!(image = %image.name, "removing build image left by a server that stopped mid-build");
            helper.delete_image(&image.name).await.ok();
        }
    }
}

/// How long one RUN may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Output lines quoted from a failing RUN.
const TAIL_LINES: usize = 20;

/// Why a build failed; shown after `Error building image: `.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The Containerfile cannot be run.
    #[error(transparent)]
    Containerfile(#[from] ContainerfileError),
    /// A bad request (name, context, base image).
    #[error("{0}")]
    Invalid(String),
    /// A step failed: (step, total, instruction, why).
    #[error("step {0}/{1} {2} {3}")]
    Step(usize, usize, String, String),
    /// The helper failed.
    #[error(transparent)]
    Helper(#[from] HelperError),
}

/// What to build.
#[derive(Debug, Clone, Default)]
pub struct BuildSpec {
    /// Name of the new image.
    pub name: String,
    /// Containerfile text.
    pub containerfile: String,
    /// Inline build context: relative path → file content.
    pub context: BTreeMap<String, String>,
    /// Replace an image of that name once the build succeeded.
    pub force: bool,
}

/// A finished build.
#[derive(Debug, Clone)]
pub struct Built {
    /// The image.
    pub image: ImageSummary,
    /// Instructions run.
    pub steps: usize,
    /// Wall-clock time.
    pub elapsed: Duration,
}

/// What the steps so far left for the next ones.
#[derive(Default)]
struct State {
    env: BTreeMap<String, String>,
    args: BTreeMap<String, String>,
    workdir: String,
    user: String,
    labels: HashMap<String, String>,
    /// What the base recorded beyond env, workdir and user (a pulled
    /// image's Entrypoint, Cmd, ports): kept, as no instruction sets them.
    recorded: ImageConfig,
}

/// The PATH a RUN step has when the image sets none: the agent's default
/// (`BASE_ENV` in `sandbox_agent::process`). `ENV PATH=/opt/bin:$PATH` must
/// extend it, not replace it with `/opt/bin:`.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl State {
    fn expand(&self, s: &str) -> String {
        containerfile::expand(s, &|k| {
            let default = (k == "PATH").then(|| DEFAULT_PATH.to_string());
            self.env.get(k).or_else(|| self.args.get(k)).cloned().or(default)
        })
    }

    fn config(&self) -> ImageConfig {
        ImageConfig {
            env: self.env.clone().into_iter().collect(),
            workdir: self.workdir.clone(),
            user: self.user.clone(),
            ..self.recorded.clone()
        }
    }

    /// Build args under the image env, as RUN sees them.
    fn run_env(&self) -> HashMap<String, String> {
        self.args.iter().chain(self.env.iter()).map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    fn path(&self, p: &str) -> String {
        let p = self.expand(p);
        if p.starts_with('/') { p } else { format!("{}/{p}", self.workdir.trim_end_matches('/')) }
    }
}

/// The VMs and images a build made, removed when it ends however it ends.
struct Job {
    helper: HelperClient,
    name: String,
    tag: String,
    base: String,
    vm: Option<String>,
    image: String,
    intermediates: Vec<String>,
    profile: (u32, u64),
}

impl Job {
    /// The VM for the next filesystem step: the current one committed and
    /// replaced by a fresh VM on that commit, or the first one.
    async fn vm(&mut self, state: &State, step: usize) -> Result<String, HelperError> {
        if let Some(vm) = self.vm.clone() {
            let image = format!("build-{}-{step}", self.tag);
            // Recorded before the commit, so a build dropped mid-commit still
            // removes both the VM and the image the helper goes on to make.
            self.intermediates.push(image.clone());
            let commit = CommitConfig {
                image: image.clone(),
                config: Some(state.config()),
                // The base, not the previous step: intermediates never
                // depend on each other, so they can go in any order.
                parent: self.base.clone(),
                labels: self.labels("build-step"),
            };
            let committed = self.helper.commit_vm(&vm, BUILD_ISOLATION, commit).await;
            self.helper.delete_vm(&vm).await.ok();
            self.vm = None;
            committed?;
            self.image = image;
        }
        let id = format!("build-{}", random_hex(12));
        let cfg = VmConfig {
            id: id.clone(),
            image: self.image.clone(),
            cpus: self.profile.0,
            memory_bytes: self.profile.1,
            pids: 0,
            mounts: Vec::new(),
            network: Network::default(),
            env: HashMap::new(),
            disk_bytes: 0,
            labels: HashMap::from([
                (BUILD_LABEL.to_string(), self.name.clone()),
                (OWNER_LABEL.to_string(), owner::me()),
            ]),
            clone_from: None,
            files: Vec::new(),
            isolation: BUILD_ISOLATION,
        };
        self.helper.create_vm(cfg).await?;
        self.vm = Some(id.clone());
        self.helper.start_vm(&id).await?;
        Ok(id)
    }

    fn labels(&self, kind: &str) -> HashMap<String, String> {
        let mut labels = HashMap::from([(KIND_LABEL.to_string(), kind.to_string())]);
        // The final image keeps no build labels: it is nobody's leftover.
        if kind == "build-step" {
            labels.insert(BUILD_LABEL.to_string(), self.name.clone());
            labels.insert(OWNER_LABEL.to_string(), owner::me());
        }
        labels
    }

    fn leftovers(&mut self) -> (Option<String>, Vec<String>) {
        (self.vm.take(), std::mem::take(&mut self.intermediates))
    }

    async fn cleanup(helper: HelperClient, vm: Option<String>, images: Vec<String>) {
        if let Some(vm) = vm {
            helper.delete_vm(&vm).await.ok();
        }
        for image in images {
            match helper.delete_image(&image).await {
                Ok(()) | Err(HelperError::NotFound(_)) => {}
                Err(e) => tracing::warn!(%image, "could not remove intermediate build image: {e}"),
            }
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let (vm, images) = self.leftovers();
        if vm.is_none() && images.is_empty() {
            return;
        }
        // Dropped mid-build (the client cancelled): clean up in the background.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(Self::cleanup(self.helper.clone(), vm, images));
        }
    }
}

impl SandboxManager {
    /// Build `spec`, calling `on_step(k, total, instruction)` as step k starts.
    pub async fn build_image(
        &self,
        spec: &BuildSpec,
        on_step: &(dyn Fn(usize, usize, &str) + Send + Sync),
    ) -> Result<Built, BuildError> {
        let started = Instant::now();
        let steps = containerfile::parse(&spec.containerfile)?;
        super::images::new_image_name(&spec.name).map_err(BuildError::Invalid)?;
        check_context(&spec.context, &steps)?;
        let images = self.helper.list_images().await?;
        if !spec.force && images.iter().any(|i| i.name == spec.name) {
            return Err(BuildError::Invalid(format!(
                "image '{}' already exists (pass force=true to replace it)",
                spec.name
            )));
        }
        let Some(Op::From(base)) = steps.first().map(|s| &s.op) else {
            return Err(BuildError::Invalid("the first instruction must be FROM".into()));
        };
        let base = match images.iter().find(|i| &i.name == base) {
            Some(local) => local.clone(),
            None => self.base_from_registry(base, steps[0].line, &images).await?,
        };
        let base = &base;
        let state = State {
            env: base.config.env.clone().into_iter().collect(),
            workdir: if base.config.workdir.is_empty() { "/".into() } else { base.config.workdir.clone() },
            user: base.config.user.clone(),
            recorded: base.config.clone(),
            ..State::default()
        };
        let config = self.config();
        let profile = config.defaults();
        let mut job = Job {
            helper: self.helper.clone(),
            name: spec.name.clone(),
            tag: random_hex(8),
            base: base.name.clone(),
            vm: None,
            image: base.name.clone(),
            intermediates: Vec::new(),
            profile: (profile.cpus, profile.memory_bytes),
        };
        let total = steps.len();
        let built = self.run_steps(&mut job, state, spec, &steps, on_step).await;
        // Failed or not, nothing of the build stays but the image.
        let (vm, intermediates) = job.leftovers();
        Job::cleanup(self.helper.clone(), vm, intermediates).await;
        let image = built?;
        tracing::info!(image = %spec.name, steps = total, "built image");
        Ok(Built { image, steps: total, elapsed: started.elapsed() })
    }

    /// The image a `FROM` that names no local image builds on: a registry
    /// reference (one with a registry, a path, a tag or a digest, so that a
    /// mistyped local name never reaches Docker Hub) is pulled as the name
    /// `pull_image` would give it, or taken as it is when an image of that
    /// name came from the same reference.
    async fn base_from_registry(
        &self,
        base: &str,
        line: usize,
        images: &[ImageSummary],
    ) -> Result<ImageSummary, BuildError> {
        let reference = base.contains([':', '/', '@']).then(|| Reference::parse(base).ok()).flatten();
        let Some(reference) = reference else {
            let local: Vec<&str> = images
                .iter()
                .filter(|i| i.labels.get(KIND_LABEL).map(String::as_str) != Some("build-step"))
                .map(|i| i.name.as_str())
                .collect();
            return Err(BuildError::Invalid(format!(
                "line {line}: FROM {base}: only local images or registry references (with a tag, digest or \
                 registry, e.g. python:3.12) can be built on, not FROM scratch; local images: {}",
                if local.is_empty() { "none".to_string() } else { local.join(", ") }
            )));
        };
        let name = reference.image_name();
        let pinned = format!("{reference}@");
        if let Some(pulled) = images.iter().find(|i| i.name == name) {
            if pulled.source.starts_with(&pinned) || reference.digest().is_some_and(|d| pulled.source.ends_with(d)) {
                return Ok(pulled.clone());
            }
            return Err(BuildError::Invalid(format!(
                "line {line}: FROM {base}: it would be pulled as image '{name}', which exists and did not come from \
                 it; delete that image or pull {base} under another name and build FROM that"
            )));
        }
        match self.pull_image(base, Some(&name), false, |_| {}).await {
            Ok(pulled) => Ok(pulled.image),
            Err(e) => Err(BuildError::Invalid(format!("line {line}: FROM {base}: pulling it failed: {e}"))),
        }
    }

    async fn run_steps(
        &self,
        job: &mut Job,
        mut state: State,
        spec: &BuildSpec,
        steps: &[Instruction],
        on_step: &(dyn Fn(usize, usize, &str) + Send + Sync),
    ) -> Result<ImageSummary, BuildError> {
        let total = steps.len();
        for (k, step) in steps.iter().enumerate() {
            on_step(k + 1, total, &step.text);
            let fail = |why: String| BuildError::Step(k + 1, total, step.text.clone(), why);
            run_step(job, &mut state, step, &spec.context, k + 1).await.map_err(|e| match e {
                StepError::Failed(why) => fail(why),
                StepError::Helper(e) => fail(format!("failed: {e}")),
            })?;
        }
        let vm = match job.vm.clone() {
            Some(vm) => vm,
            // Only metadata after FROM: the image is an empty layer on the base.
            None => job.vm(&state, total + 1).await?,
        };
        if spec.force {
            match self.helper.delete_image(&spec.name).await {
                Ok(()) | Err(HelperError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut labels = state.labels.clone();
        labels.extend(job.labels("built"));
        let commit =
            CommitConfig { image: spec.name.clone(), config: Some(state.config()), parent: job.base.clone(), labels };
        Ok(self.helper.commit_vm(&vm, BUILD_ISOLATION, commit).await?)
    }
}

enum StepError {
    Failed(String),
    Helper(HelperError),
}

impl From<HelperError> for StepError {
    fn from(e: HelperError) -> Self {
        Self::Helper(e)
    }
}

async fn run_step(
    job: &mut Job,
    state: &mut State,
    step: &Instruction,
    context: &BTreeMap<String, String>,
    k: usize,
) -> Result<(), StepError> {
    match &step.op {
        Op::From(_) => {}
        Op::Env(pairs) => {
            for (key, value) in pairs {
                let value = state.expand(value);
                state.env.insert(key.clone(), value);
            }
        }
        Op::Arg(name, default) => {
            if let Some(d) = default {
                let value = state.expand(d);
                state.args.insert(name.clone(), value);
            }
        }
        Op::Label(pairs) => {
            for (key, value) in pairs {
                let (key, value) = (state.expand(key), state.expand(value));
                state.labels.insert(key, value);
            }
        }
        Op::User(user) => state.user = state.expand(user),
        Op::Workdir(dir) => {
            state.workdir = state.path(dir);
            let vm = job.vm(state, k).await?;
            as_root(&job.helper, &vm, vec!["mkdir".into(), "-p".into(), state.workdir.clone()]).await?;
        }
        Op::Run { argv, stdin } => {
            let vm = job.vm(state, k).await?;
            let process = ProcessConfig {
                argv: argv.clone(),
                env: state.run_env(),
                cwd: state.workdir.clone(),
                create_cwd: true,
                user: state.user.clone(),
                secret: Vec::new(),
            };
            let input = stdin.as_deref().unwrap_or_default().as_bytes();
            let r = exec::run(&job.helper, &vm, process, input, RUN_TIMEOUT).await?;
            let tail = tail(&format!("{}{}", render(&r.stdout), render(&r.stderr)));
            match r.outcome {
                Outcome::TimedOut => {
                    return Err(StepError::Failed(format!("timed out after {}s:\n{tail}", RUN_TIMEOUT.as_secs())));
                }
                _ if r.exit_code() != 0 => {
                    return Err(StepError::Failed(format!("exited with code {}:\n{tail}", r.exit_code())));
                }
                _ => {}
            }
        }
        Op::Copy { sources, dest, chown, chmod, .. } => {
            let files = resolve_copy(state, context, sources, dest).map_err(StepError::Failed)?;
            let mode = chmod.as_deref().and_then(|m| u32::from_str_radix(m, 8).ok()).unwrap_or(0o644);
            let archive = tarstream::files_archive(files.iter().map(|(p, c)| (p.as_str(), c.as_bytes())), mode)
                .map_err(|e| StepError::Failed(format!("cannot archive: {e}")))?;
            let vm = job.vm(state, k).await?;
            job.helper.copy_in_archive(&vm, "/", archive).await?;
            if let Some(owner) = chown {
                let mut argv = vec!["chown".to_string(), state.expand(owner)];
                argv.extend(files.iter().map(|(p, _)| p.clone()));
                as_root(&job.helper, &vm, argv).await?;
            }
        }
    }
    Ok(())
}

async fn as_root(helper: &HelperClient, vm: &str, argv: Vec<String>) -> Result<(), StepError> {
    let what = argv.join(" ");
    let process = ProcessConfig { argv, cwd: "/".into(), user: "0".into(), ..ProcessConfig::default() };
    let r = exec::run(helper, vm, process, &[], RUN_TIMEOUT).await?;
    if r.exit_code() != 0 {
        return Err(StepError::Failed(format!("{what} failed: {}", tail(&render(&r.stderr)))));
    }
    Ok(())
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_extends_the_default_path() {
        let mut state = State::default();
        assert_eq!(state.expand("/opt/bin:$PATH"), format!("/opt/bin:{DEFAULT_PATH}"));
        state.env.insert("PATH".into(), "/x".into());
        assert_eq!(state.expand("${PATH}:/y $NOPE."), "/x:/y .");
    }
}
