// The lifecycle of one VM as the layer holds it, and which calls each state allows.
//
// Like containerization's own LinuxContainer state (initialized, created, started, stopped,
// errored), but in the seam's terms: a VM is booting until its agent answers, running until a
// stop is asked for or it ends, and then gone with the reason it ended. A call made in the
// wrong state fails naming the operation and the state, never silently.

/// The calls of the seam that depend on the VM's state.
public enum VMOperation: String, Sendable, CaseIterable {
    case dialAgent = "dial the agent"
    case requestStop = "stop"
    case kill = "kill"
    case snapshot = "snapshot the writable layer"
    case cleanup = "clean up"
}

/// Where one VM is in its life.
public enum VMState: Sendable, Equatable {
    /// The disks are being made and the VM started; the agent has not answered yet.
    case booting
    /// The agent answered: dial, snapshot, stop and kill are all valid.
    case running
    /// A stop was asked for; the guest is shutting down.
    case stopping
    /// The VM is gone; the string says how it ended (what `layer_wait_exit` reports).
    case exited(String)
    /// The boot failed; the string says why. Nothing runs.
    case failed(String)

    /// The agent can be dialled: only while running.
    public var canDialAgent: Bool { self == .running }

    /// A stop can be asked for: while booting (the boot is then abandoned) or running.
    public var canRequestStop: Bool {
        switch self {
        case .booting, .running: return true
        case .stopping, .exited, .failed: return false
        }
    }

    /// A kill ends the VM in any state in which something may still run.
    public var canKill: Bool { !isGone }

    /// The writable layer can be copied while the guest runs (frozen for the copy).
    public var canSnapshot: Bool { self == .running }

    /// What the VM held on the host can be released once nothing runs.
    public var canCleanup: Bool { isGone }

    /// Nothing of the VM runs any more.
    public var isGone: Bool {
        switch self {
        case .exited, .failed: return true
        case .booting, .running, .stopping: return false
        }
    }

    /// Whether `operation` is valid in this state.
    public func allows(_ operation: VMOperation) -> Bool {
        switch operation {
        case .dialAgent: return canDialAgent
        case .requestStop: return canRequestStop
        case .kill: return canKill
        case .snapshot: return canSnapshot
        case .cleanup: return canCleanup
        }
    }

    /// Fails with the operation and the state named when `operation` is not valid now.
    public func check(_ operation: VMOperation, id: String) throws(LayerFailure) {
        guard allows(operation) else {
            throw LayerFailure.failed("vm \(id) is \(description): cannot \(operation.rawValue)")
        }
    }

    /// The state in words, for messages.
    public var description: String {
        switch self {
        case .booting: return "booting"
        case .running: return "running"
        case .stopping: return "stopping"
        case .exited(let how): return "gone (\(how))"
        case .failed(let why): return "failed to boot (\(why))"
        }
    }
}
