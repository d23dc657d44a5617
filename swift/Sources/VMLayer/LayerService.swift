// The layer as the bridge sees it: an actor registry of VMs by id, the host's assets, and
// containerization's VM manager and image store, made on first use. Every seam call lands
// here (through BridgeExports.swift) and names its VM by the id the Rust helper booted it with;
// an unknown id is LayerFailure.notFound, the only place that kind is made.
import Containerization
import Foundation

/// What the layer can do on this host (the bridge's LayerCapabilities, in Swift's types).
/// Reported as the whole helper can do it, not this layer alone.
public struct LayerCapabilitySet: Sendable, Equatable {
    public var tty = true
    /// The guest's card is attached to the frame socket the Rust helper serves with its
    /// network stack (FileHandleInterface), under the sandbox's policy.
    public var networkEgress = true
    /// cpus and memory hold (the VM's size, the container's cgroup), the task limit does not:
    /// the three are one capability, so off (limitsNotEnforced says which).
    public var limits = false
    public var cgroups = ""
    public var seccomp = false
    public var ownKernel = true
    public var dial = true
    public var snapshot = true
    public var containers = false
    /// Images recorded as an OCI reference are pulled through containerization's ImageStore.
    public var pullImages = true

    public init() {}
}

/// The VMs of this helper process, by id.
public actor InstanceRegistry {
    private var machines: [String: VirtualMachine] = [:]

    public init() {}

    /// Adds a VM; an id in use is refused.
    public func add(_ machine: VirtualMachine) throws(LayerFailure) {
        let id = machine.plan.id
        guard machines[id] == nil else {
            throw LayerFailure.failed("vm \(id) is already booted")
        }
        machines[id] = machine
    }

    /// The VM with that id.
    public func get(_ id: String) throws(LayerFailure) -> VirtualMachine {
        guard let machine = machines[id] else {
            throw LayerFailure.notFound("no vm \(id)")
        }
        return machine
    }

    /// Forgets a VM.
    public func remove(_ id: String) -> VirtualMachine? {
        machines.removeValue(forKey: id)
    }

    /// Every VM, for release.
    public func all() -> [VirtualMachine] {
        Array(machines.values)
    }
}

/// The layer: boots, finds and ends VMs.
public actor LayerService {
    /// The one layer of this process (the bridge's functions are free functions).
    public static let shared = LayerService(assets: HostAssets.fromEnvironment(), files: HostFiles())

    public let assets: HostAssets
    let files: any FileProbe
    let registry = InstanceRegistry()
    /// containerization's VM manager (kernel plus vminitd), made at the first boot.
    private var vmm: VZVirtualMachineManager?
    private var disks: Disks?

    public init(assets: HostAssets, files: any FileProbe) {
        self.assets = assets
        self.files = files
    }

    /// The driver's name in GetInfo and in `isolation` settings: the Linux vm driver's, so a
    /// sandbox asking for `vm` gets a VM on either OS.
    public nonisolated var name: String { "vm" }

    /// Why no VM can boot here, or nil.
    public nonisolated func unavailableReason() -> String? {
        #if arch(arm64)
        return assets.unavailableReason(files: files)
        #else
        return "the macOS helper runs VMs on Apple silicon only"
        #endif
    }

    public nonisolated func capabilities() -> LayerCapabilitySet {
        LayerCapabilitySet()
    }

    /// Plans, registers and boots a VM; returns once its agent accepts connections.
    /// The frame socket's descriptor (`input.network`) is the layer's from the call on: it is
    /// closed here on every refusal before the VM takes it, and with the VM's card after.
    public func boot(_ input: BootInput) async throws(LayerFailure) {
        let machine: VirtualMachine
        let vmm: VZVirtualMachineManager
        let disks: Disks
        do throws(LayerFailure) {
            if let reason = unavailableReason() {
                throw LayerFailure.unavailable(reason)
            }
            let plan: BootPlan
            do {
                plan = try BootPlanner.plan(input, assets: assets, files: files)
            } catch {
                throw ErrorMapping.layerFailure(error, doing: "boot vm \(input.id)")
            }
            let made = try await manager()
            vmm = made.0
            disks = made.1
            machine = VirtualMachine(plan: plan)
            try await registry.add(machine)
        } catch {
            if let fd = input.network?.fd, fd >= 0 {
                close(fd)
            }
            throw error
        }
        let plan = machine.plan
        do {
            try await machine.boot(vmm: vmm, disks: disks)
        } catch {
            _ = await registry.remove(plan.id)
            throw ErrorMapping.layerFailure(error, doing: "boot vm \(plan.id)")
        }
    }

    /// The VM manager and disk maker, made once: vminitd's filesystem is pulled the first time.
    private func manager() async throws(LayerFailure) -> (VZVirtualMachineManager, Disks) {
        if let vmm, let disks {
            return (vmm, disks)
        }
        do {
            let store = try ImageStore(path: URL(fileURLWithPath: assets.imageStore))
            if !FileManager.default.fileExists(atPath: assets.initfs) {
                // Through a partial file: the unpacker writes at the path it is given and leaves
                // a half-written file when the pull fails, which the check above would take for
                // a good one at every later boot.
                let initImage: InitImage = try await store.getInitImage(reference: assets.initfsReference)
                try await makeInPlace(assets.initfs) { @Sendable partial in
                    _ = try await initImage.initBlock(at: URL(fileURLWithPath: partial), for: SystemPlatform.linuxArm)
                }
            }
            let initfs = Mount.block(format: "ext4", source: assets.initfs, destination: "/", options: ["ro"])
            let kernel = Kernel(path: URL(fileURLWithPath: assets.kernel), platform: SystemPlatform.linuxArm)
            let made = VZVirtualMachineManager(kernel: kernel, initialFilesystem: initfs)
            let madeDisks = Disks(imageStore: store)
            self.vmm = made
            self.disks = madeDisks
            return (made, madeDisks)
        } catch {
            throw ErrorMapping.layerFailure(error, doing: "prepare the vm layer")
        }
    }

    public func dialAgent(_ id: String) async throws(LayerFailure) -> Int32 {
        try await registry.get(id).dialAgent()
    }

    /// Asks the guest to stop; unknown ids are ignored (the seam's call cannot fail).
    public func requestStop(_ id: String) async {
        if let machine = try? await registry.get(id) {
            await machine.requestStop()
        }
    }

    public func kill(_ id: String) async {
        if let machine = try? await registry.get(id) {
            await machine.kill()
        }
    }

    /// How the VM ended; an unknown id has nothing to wait for.
    public func waitExit(_ id: String) async -> String {
        guard let machine = try? await registry.get(id) else {
            return "no vm \(id)"
        }
        return await machine.waitExit()
    }

    public func snapshot(_ id: String, to destination: String) async throws(LayerFailure) {
        try await registry.get(id).snapshot(to: destination)
    }

    public func hostFacts(_ id: String) async -> VMHostFacts {
        guard let machine = try? await registry.get(id) else {
            return VMHostFacts(memoryLimitBytes: 0, pidsLimit: 0, oomKilled: false)
        }
        return await machine.hostFacts()
    }

    public func limitsNotEnforced(_ id: String) async -> String {
        guard let machine = try? await registry.get(id) else {
            return ""
        }
        return await machine.limitsNotEnforced()
    }

    /// Forgets a VM once it is gone.
    public func cleanup(_ id: String) async {
        if let machine = await registry.remove(id) {
            await machine.cleanup()
        }
    }

    /// Nothing is kept warm yet: containerization boots a VM in about a second.
    public func keepWarm() {}

    /// Kills every VM (helper exit).
    public func release() async {
        for machine in await registry.all() {
            await machine.kill()
            _ = await registry.remove(machine.plan.id)
        }
    }
}

/// Runs async work from a synchronous call the Rust helper makes on one of its own threads
/// (never a Swift concurrency thread), blocking that thread until the work is done.
public func blockingWait<T: Sendable>(_ work: @escaping @Sendable () async -> T) -> T {
    let done = DispatchSemaphore(value: 0)
    let box = ResultBox<T>()
    Task {
        box.value = await work()
        done.signal()
    }
    done.wait()
    return box.value!
}

/// The result of blockingWait's task, written once before the semaphore is signalled.
final class ResultBox<T>: @unchecked Sendable {
    var value: T?
}
