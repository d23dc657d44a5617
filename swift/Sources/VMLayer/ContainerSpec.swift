// Spec translation, step two: a plan in containerization's terms. One container per VM
// (LinuxContainer: one VM, vminitd as its PID 1, our agent as the container's process):
// - the root filesystem image as `rootfs`, the writable disk as `writableLayer` (an overlay
//   in the guest, lower read-only);
// - each shared directory as a virtiofs share (`Mount.share`), `/workspace` among them, and
//   the agent's directory read-only at /run/sandbox-mcp;
// - cpus and memory as the container's, which containerization sizes the VM from (plus its
//   own overhead) and sets as the container's cgroup limits;
// - the agent, `sandbox-vm-helper agent --listen vsock:PORT`, as the process, run as root with
//   every capability (the guest's root owns its kernel, as on the Linux vm driver), behind
//   containerization's small init (useInit), which reaps orphans as the Linux guest init does;
// - the network card, when there is one, on the helper's stack (FileHandleInterface), with
//   the addresses and the resolver the Linux drivers give their guests.
import Containerization
import ContainerizationExtras
import Foundation

extension BootPlan {
    /// The root filesystem's block device.
    public func rootfsMount() -> Mount {
        Mount.block(format: "ext4", source: rootfsImage, destination: "/", options: ["ro"])
    }

    /// The writable disk's block device, written through to the file so a frozen guest's
    /// copy (snapshot) holds everything the guest flushed.
    public func writableMount() -> Mount {
        Mount.block(
            format: "ext4",
            source: writable.path,
            destination: "/",
            options: [],
            runtimeOptions: ["vzDiskImageCachingMode=uncached", "vzDiskImageSynchronizationMode=full"]
        )
    }

    /// The shared directories as virtiofs mounts.
    public func shareMounts() -> [Mount] {
        shares.map { share in
            Mount.share(source: share.host, destination: share.guest, options: share.readOnly ? ["ro"] : [])
        }
    }

    /// The agent as the container's process.
    public func agentProcess() -> LinuxProcessConfiguration {
        var process = LinuxProcessConfiguration()
        process.arguments = agentArguments
        process.workingDirectory = "/"
        process.environmentVariables = ["PATH=\(LinuxProcessConfiguration.defaultPath)", "HOME=/root"]
        process.capabilities = LinuxCapabilities.allCapabilities
        process.noNewPrivileges = false
        return process
    }

    /// The container's configuration; `network` is the card on the helper's stack, if any.
    public func containerConfiguration(network: (any Interface)?) -> LinuxContainer.Configuration {
        var config = LinuxContainer.Configuration()
        config.process = agentProcess()
        config.cpus = cpus
        config.memoryInBytes = memoryBytes
        config.hostname = hostname
        config.mounts = LinuxContainer.defaultMounts() + shareMounts()
        config.useInit = true
        config.bootLog = BootLog.file(path: URL(fileURLWithPath: bootLog), append: true)
        if let network, let plan = self.network {
            config.interfaces = [network]
            config.dns = DNS(nameservers: [plan.nameserver])
        }
        return config
    }
}

extension NetworkPlan {
    /// The guest's address and gateway in containerization's types.
    public func addresses() throws -> (CIDRv4, IPv4Address) {
        (try CIDRv4(address), try IPv4Address(gateway))
    }
}
