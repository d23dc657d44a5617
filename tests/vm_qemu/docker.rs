//! Docker in the guest: dockerd started at boot builds and runs a
//! `FROM scratch` image, and the VM is a privileged container's boundary.
use super::*;

/// An image with Docker Engine starts dockerd at boot (guest init's
/// containers module): `docker build` of a `FROM scratch` image holding the
/// image's static busybox, and `docker run` of it, work with no registry.
/// A privileged container with the root bound in sees the VM's root and
/// kernel, never the host's: the VM is the boundary. Needs the docker test
/// image (`make test-image-docker`); skips without it.
#[tokio::test]
async fn dockerd_in_the_guest_builds_and_runs_a_scratch_image() {
    let Some(assets) = assets() else { return };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let name = std::env::var("SANDBOX_MCP_DOCKER_TEST_IMAGE").unwrap_or_else(|_| "mcp-docker".into());
    let dir = TempDir::new("docker");
    let Some((layers, upper)) = disks_for_image(&dir.0, &mapper, &name) else {
        eprintln!("SKIP: no image {name} in SANDBOX_MCP_TEST_IMAGE_STORE (make test-image-docker)");
        return;
    };
    let workspace = workspace_dir(&dir.0, &mapper);
    let accel = tcg();
    let spec = BootSpec {
        memory_mib: 1024,
        ..boot_spec("docker", &dir.0, &assets, &accel, &mapper, (layers, upper), Some(workspace))
    };
    let (mut vm, agent) = Instance::boot(spec).await.expect("boot");
    ping(&agent).await;
    let sh = |script: &str| ["sh".to_string(), "-c".into(), format!("exec 2>&1; {script}")];
    let run = |script: &str| {
        let argv = sh(script);
        let agent = &agent;
        async move { exec(agent, &argv.iter().map(String::as_str).collect::<Vec<_>>()).await }
    };
    // Within exec's 120 s between frames; dockerd's log says why not.
    let (code, out) = run("end=$(($(date +%s) + 90)); while [ $(date +%s) -lt $end ]; do \
         docker info >/dev/null 2>&1 && exit 0; sleep 1; done; \
         echo dockerd did not answer within 90 s; cat /var/log/dockerd.log; exit 1")
    .await;
    assert_eq!(code, 0, "{out}");
    let (code, out) = run(
        "mkdir -p /workspace/ctx && cp /bin/busybox /workspace/ctx/ && cd /workspace/ctx && \
         printf 'FROM scratch\\nCOPY busybox /bin/sh\\nCOPY busybox /bin/busybox\\nCMD [\"/bin/sh\", \"-c\", \"echo hello from scratch\"]\\n' > Dockerfile && \
         docker build -t scratch-test . && docker run --rm scratch-test",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.trim_end().ends_with("hello from scratch"), "{out}");
    std::fs::write(dir.0.join("host-only"), "on the host").unwrap();
    let (code, out) = run(&format!(
        "docker run --rm --privileged -v /:/host scratch-test /bin/busybox sh -c \
         'busybox uname -r; busybox ls /host/run/sandbox-mcp >/dev/null && echo guest-root; \
          busybox ls /host{} 2>/dev/null || echo no-host-file'",
        dir.0.join("host-only").display()
    ))
    .await;
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, [assets.release.as_str(), "guest-root", "no-host-file"], "{out}");
    vm.kill().await;
}
