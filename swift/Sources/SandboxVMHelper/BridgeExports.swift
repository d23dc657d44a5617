// The Swift functions the generated glue (Generated/sandbox-mcp.swift) calls for each
// `extern "Swift"` function of the bridge (rust/helper/driver/swift/bridge.rs). Thin: each
// converts the bridge's types to VMLayer's, calls LayerService, and converts back. Names,
// labels and types are the bridge's: the glue calls them as declared there.
//
// The bridge's synchronous calls come from the Rust helper's own threads: those that need the
// layer's actors (snapshot, host facts, limits) block that thread until the answer is there
// (blockingWait); stop, kill and cleanup return at once and finish on their own.
import Foundation
import VMLayer

// The glue declares LayerError bare; its `throws(LayerError)` needs an Error, and Error implies
// Sendable (its payload is a RustString, itself @unchecked Sendable in SwiftBridgeCore), as
// swift-bridge's own test app declares for its error enums.
extension LayerError: @unchecked Sendable {}
extension LayerError: Error {}

func layer_info() -> LayerInfo {
    let layer = LayerService.shared
    let caps = layer.capabilities()
    return LayerInfo(
        name: layer.name.intoRustString(),
        unavailable_reason: (layer.unavailableReason() ?? "").intoRustString(),
        capabilities: LayerCapabilities(
            tty: caps.tty,
            network_egress: caps.networkEgress,
            limits: caps.limits,
            cgroups: caps.cgroups.intoRustString(),
            seccomp: caps.seccomp,
            own_kernel: caps.ownKernel,
            dial: caps.dial,
            snapshot: caps.snapshot,
            containers: caps.containers,
            pull_images: caps.pullImages
        )
    )
}

func layer_boot(request: BootRequest) async throws(LayerError) {
    let input = bootInput(request)
    do {
        try await LayerService.shared.boot(input)
    } catch {
        throw layerError(ErrorMapping.layerFailure(error, doing: "boot vm \(input.id)"))
    }
}

func layer_dial_agent(id: RustString) async throws(LayerError) -> Int32 {
    let id = id.toString()
    do {
        return try await LayerService.shared.dialAgent(id)
    } catch {
        throw layerError(ErrorMapping.layerFailure(error, doing: "dial the agent of vm \(id)"))
    }
}

func layer_request_stop(id: RustString) {
    let id = id.toString()
    Task { await LayerService.shared.requestStop(id) }
}

func layer_kill(id: RustString) {
    let id = id.toString()
    Task { await LayerService.shared.kill(id) }
}

func layer_wait_exit(id: RustString) async -> String {
    await LayerService.shared.waitExit(id.toString())
}

/// `upper` is the Linux drivers' writable layer directory; here the writable layer is the
/// VM's ext4 disk, copied whole into `dst` (`dst/writable.ext4`, a disk layer).
func layer_snapshot(id: RustString, upper: RustString, dst: RustString) throws(LayerError) {
    let id = id.toString()
    let dst = dst.toString()
    let failure: LayerFailure? = blockingWait {
        do {
            try await LayerService.shared.snapshot(id, to: dst)
            return nil
        } catch {
            return ErrorMapping.layerFailure(error, doing: "snapshot vm \(id)")
        }
    }
    if let failure {
        throw layerError(failure)
    }
}

func layer_host_facts(id: RustString) -> LayerHostFacts {
    let id = id.toString()
    let facts = blockingWait { await LayerService.shared.hostFacts(id) }
    return LayerHostFacts(
        memory_limit_bytes: facts.memoryLimitBytes, pids_limit: facts.pidsLimit, oom_killed: facts.oomKilled)
}

/// A Mac's guests run their own kernel: none of their processes shows on the host.
func layer_host_processes(id: RustString) -> LayerHostProcesses {
    LayerHostProcesses(pid1: -1, agent: -1)
}

func layer_limits_not_enforced(id: RustString) -> String {
    let id = id.toString()
    return blockingWait { await LayerService.shared.limitsNotEnforced(id) }
}

func layer_cleanup(id: RustString) {
    let id = id.toString()
    Task { await LayerService.shared.cleanup(id) }
}

func layer_keep_warm() {
    Task { await LayerService.shared.keepWarm() }
}

func layer_release() async {
    await LayerService.shared.release()
}

/// The bridge's request in VMLayer's terms (the shared directories arrive as three lists of
/// one length: swift-bridge 0.1.59 has no Vec of shared structs).
func bootInput(_ request: BootRequest) -> BootInput {
    let hosts = request.mount_hosts.map { $0.as_str().toString() }
    let guests = request.mount_guests.map { $0.as_str().toString() }
    let readOnly = Array(request.mount_read_only)
    var mounts: [SharedDirectory] = []
    for i in 0..<min(hosts.count, guests.count, readOnly.count) {
        mounts.append(SharedDirectory(host: hosts[i], guest: guests[i], readOnly: readOnly[i]))
    }
    return BootInput(
        id: request.id.toString(),
        hostname: request.hostname.toString(),
        layers: request.layers.map { $0.as_str().toString() },
        dir: request.dir.toString(),
        mounts: mounts,
        cpus: request.cpus,
        memoryBytes: request.memory_bytes,
        pids: request.pids,
        diskBytes: request.disk_bytes,
        network: networkPlan(request.network),
        imageReference: request.image_reference.toString().isEmpty ? nil : request.image_reference.toString()
    )
}

/// The card the helper asks for, or nil (`fd` -1: no card).
func networkPlan(_ card: LayerNetwork) -> NetworkPlan? {
    guard card.fd != -1 else { return nil }
    return NetworkPlan(
        fd: card.fd,
        mac: card.mac.toString(),
        address: card.address.toString(),
        gateway: card.gateway.toString(),
        nameserver: card.nameserver.toString(),
        mtu: card.mtu
    )
}

/// VMLayer's failure as the bridge's error, kind for kind.
func layerError(_ failure: LayerFailure) -> LayerError {
    switch failure {
    case .unavailable(let message): return LayerError.Unavailable(message.intoRustString())
    case .notFound(let message): return LayerError.NotFound(message.intoRustString())
    case .failed(let message): return LayerError.Failed(message.intoRustString())
    }
}
