// One VM: a LinuxContainer whose process is our agent. Boots it from a plan, hands out
// connected vsock streams to the agent, stops, kills, reports how it ended, and copies its
// writable disk with the guest's filesystem frozen.
//
// The VM holds no protocol logic: exec, background processes, copies, dial and stats are the
// agent's, over the streams this hands to the Rust helper.
import Containerization
import ContainerizationError
import Foundation

/// One VM and its state.
public actor VirtualMachine {
    public nonisolated let plan: BootPlan
    public private(set) var state: VMState = VMState.booting
    /// Set once created; the container's calls check its own state too.
    private var container: LinuxContainer?
    /// Callers of `waitExit` before the VM ended.
    private var exitWaiters: [CheckedContinuation<String, Never>] = []
    /// How long the agent has to start listening after the container starts.
    static let agentDeadline: Duration = .seconds(30)

    public init(plan: BootPlan) {
        self.plan = plan
    }

    /// Makes the disks, creates and starts the container, and returns once the agent accepts
    /// a connection. On failure nothing of the VM runs and the state says why.
    public func boot(vmm: VZVirtualMachineManager, disks: Disks) async throws(LayerFailure) {
        do {
            // The card first: it takes the frame socket's descriptor, which the layer owns from
            // the call on, so a boot that fails later still closes it (with the card).
            var interface: FileHandleInterface? = nil
            if let network = plan.network {
                interface = try FileHandleInterface(plan: network)
            }
            let rootfs: Mount = try await disks.prepareRootfs(plan)
            try checkStillBooting()
            let writable: Mount = try disks.prepareWritable(plan)
            let config: LinuxContainer.Configuration = plan.containerConfiguration(network: interface)
            let container = try LinuxContainer(
                plan.id, rootfs: rootfs, writableLayer: writable, vmm: vmm, configuration: config, logger: nil)
            self.container = container
            try await container.create()
            try checkStillBooting()
            try await container.start()
            try await waitForAgent(container)
            try checkStillBooting()
            state = VMState.running
            Task { await self.watch(container) }
        } catch {
            let failure = ErrorMapping.layerFailure(error, doing: "boot vm \(plan.id)")
            if let container {
                try? await container.stop()
            }
            finish(VMState.failed(failure.message))
            throw failure
        }
    }

    /// Fails when a stop or kill came while the boot awaited (the actor is re-entered at every
    /// await): a pull or a disk build can take minutes, and what was killed must not start.
    private func checkStillBooting() throws(LayerFailure) {
        guard state == VMState.booting else {
            throw LayerFailure.failed("vm \(plan.id) was stopped while it booted")
        }
    }

    /// Dials the agent until it listens (it starts right after the container's init).
    private func waitForAgent(_ container: LinuxContainer) async throws {
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: VirtualMachine.agentDeadline)
        var lastError: (any Error)? = nil
        while clock.now < deadline {
            do {
                let handle: FileHandle = try await container.dialVsock(port: plan.agentPort)
                try handle.close()
                return
            } catch {
                lastError = error
                try await Task.sleep(for: .milliseconds(50))
            }
        }
        throw LayerFailure.failed(
            "the agent did not listen on vsock port \(plan.agentPort) within 30 s: \(String(describing: lastError))")
    }

    /// A new connected stream to the agent; the caller owns the descriptor.
    public func dialAgent() async throws(LayerFailure) -> Int32 {
        try state.check(VMOperation.dialAgent, id: plan.id)
        guard let container else { throw LayerFailure.failed("vm \(plan.id) has no container") }
        do {
            let handle: FileHandle = try await container.dialVsock(port: plan.agentPort)
            let fd = dup(handle.fileDescriptor)
            try? handle.close()
            guard fd >= 0 else {
                throw LayerFailure.failed("dial the agent of vm \(plan.id): dup: \(String(cString: strerror(errno)))")
            }
            return fd
        } catch {
            throw ErrorMapping.layerFailure(error, doing: "dial the agent of vm \(plan.id)")
        }
    }

    /// Asks the guest to shut down: TERM to the container's init, which passes it on.
    /// Returns at once; the end shows in `waitExit`.
    public func requestStop() {
        guard state.canRequestStop else { return }
        let wasRunning = state == VMState.running
        state = VMState.stopping
        guard wasRunning, let container else { return }
        Task {
            try? await container.kill(Signal(rawValue: SIGTERM))
        }
    }

    /// Ends the VM now: every guest process is killed and the VM stopped.
    public func kill() async {
        guard state.canKill else { return }
        if state != VMState.booting {
            state = VMState.stopping
        }
        guard let container else {
            // Killed before the container exists (its disks are still being made): it ends
            // here, and the boot stops at its next check instead of starting it.
            finish(VMState.exited("killed"))
            return
        }
        do {
            try await container.stop()
        } catch {
            // The VM itself, if the guest cleanup failed.
            try? await container.withVirtualMachineInstance { (vm: any VirtualMachineInstance) in
                try await vm.stop()
            }
        }
        finish(VMState.exited("killed"))
    }

    /// Resolves once the VM is gone, with how it ended.
    public func waitExit() async -> String {
        switch state {
        case .exited(let how):
            return how
        case .failed(let why):
            return "failed to boot: \(why)"
        case .booting, .running, .stopping:
            return await withCheckedContinuation { (continuation: CheckedContinuation<String, Never>) in
                exitWaiters.append(continuation)
            }
        }
    }

    /// Waits for the container's process (the agent) to end, then frees the VM.
    private func watch(_ container: LinuxContainer) async {
        let how: String
        do {
            let status: ExitStatus = try await container.wait()
            how = state == VMState.stopping ? "stopped" : "the agent exited with status \(status.exitCode)"
        } catch {
            how = "lost: \(ErrorMapping.layerFailure(error, doing: "wait").message)"
        }
        // stop() must follow wait(): it frees the VM and its guest mounts.
        try? await container.stop()
        finish(VMState.exited(how))
    }

    private func finish(_ end: VMState) {
        if !state.isGone {
            state = end
        }
        let how: String
        switch state {
        case .exited(let h): how = h
        case .failed(let why): how = "failed to boot: \(why)"
        default: how = "gone"
        }
        let waiters = exitWaiters
        exitWaiters = []
        for waiter in waiters {
            waiter.resume(returning: how)
        }
    }

    /// Copies the writable disk to `destination/writable.ext4` (a disk layer) as it is now:
    /// the guest's writable filesystem is frozen (FIFREEZE through vminitd: the guest flushes
    /// it, writers wait, readers go on), the disk copied (an APFS clone), then thawed.
    public func snapshot(to destination: String) async throws(LayerFailure) {
        try state.check(VMOperation.snapshot, id: plan.id)
        guard let container else { throw LayerFailure.failed("vm \(plan.id) has no container") }
        let source = plan.writable.path
        let target = URL(fileURLWithPath: destination).appendingPathComponent(BootPlanner.writableName).path
        // Where containerization 0.40.2 mounts a container's writable layer in the guest
        // (LinuxContainer's overlay upper): the filesystem to freeze.
        let frozen = "/run/container/\(plan.id)/upper"
        do {
            try FileManager.default.createDirectory(atPath: destination, withIntermediateDirectories: true)
            try await container.withVirtualMachineInstance { (vm: any VirtualMachineInstance) in
                let agent = try await vm.dialAgent()
                guard let vminitd = agent as? Vminitd else {
                    try? await agent.close()
                    throw ContainerizationError(ContainerizationError.Code.unsupported, message: "the guest agent is not vminitd")
                }
                try await vminitd.filesystemOperation(operation: FilesystemOperation.freeze, path: frozen)
                var copyError: (any Error)? = nil
                do {
                    try FileManager.default.copyItem(atPath: source, toPath: target)
                } catch {
                    copyError = error
                }
                try await vminitd.filesystemOperation(operation: FilesystemOperation.thaw, path: frozen)
                try? await vminitd.close()
                if let copyError {
                    throw copyError
                }
            }
        } catch {
            try? FileManager.default.removeItem(atPath: target)
            throw ErrorMapping.layerFailure(error, doing: "snapshot vm \(plan.id)")
        }
    }

    /// The VM's limits as the host sees them: its memory is the VM's size and the container's
    /// memory limit; containerization's spec sets no task limit.
    public func hostFacts() -> VMHostFacts {
        VMHostFacts(memoryLimitBytes: plan.memoryBytes, pidsLimit: 0, oomKilled: false)
    }

    /// Why some limits are not enforced; empty when all are.
    public func limitsNotEnforced() -> String {
        "the task limit is not enforced: containerization 0.40.2's container spec sets memory and cpu limits only"
    }

    /// Removes the VM's run files that are not kept across stops (the console log stays).
    public func cleanup() {
        container = nil
    }
}

/// A VM's limits and OOM kills as the host sees them (the bridge's LayerHostFacts).
public struct VMHostFacts: Sendable, Equatable {
    public var memoryLimitBytes: UInt64
    /// 0: no task limit is enforced.
    public var pidsLimit: UInt64
    public var oomKilled: Bool

    public init(memoryLimitBytes: UInt64, pidsLimit: UInt64, oomKilled: Bool) {
        self.memoryLimitBytes = memoryLimitBytes
        self.pidsLimit = pidsLimit
        self.oomKilled = oomKilled
    }
}
