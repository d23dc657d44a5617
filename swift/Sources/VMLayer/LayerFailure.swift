// Why a layer call failed, in the three kinds the Rust helper branches on (the bridge's
// LayerError: unavailable, not found, failed), and the one function that maps every other
// error (containerization's, Virtualization.framework's, the file system's, the planner's)
// onto them. BridgeExports converts a LayerFailure to the bridge's LayerError one to one.
import ContainerizationError
import Foundation
import Virtualization

/// A failed layer call.
public enum LayerFailure: Error, Equatable, Sendable {
    /// The layer cannot do that on this host: no entitlement, no kernel, a refused spec.
    /// The helper answers FAILED_PRECONDITION.
    case unavailable(String)
    /// No VM with that id.
    case notFound(String)
    /// The call was made and failed.
    case failed(String)

    /// What the user reads.
    public var message: String {
        switch self {
        case .unavailable(let m), .notFound(let m), .failed(let m): return m
        }
    }
}

/// The one mapping of errors onto LayerFailure.
public enum ErrorMapping {
    /// Virtualization.framework's error domain.
    static let virtualizationDomain: String = VZErrorDomain

    /// Virtualization.framework's codes for a host or configuration that cannot run a VM.
    static let unavailableVirtualizationCodes: Set<Int> = [
        VZError.Code.invalidVirtualMachineConfiguration.rawValue,
        VZError.Code.virtualMachineLimitExceeded.rawValue,
        VZError.Code.notSupported.rawValue,
    ]

    /// `error` as a LayerFailure, its message prefixed with what was being done.
    public static func layerFailure(_ error: any Error, doing what: String) -> LayerFailure {
        if let failure = error as? LayerFailure {
            return failure
        }
        if let plan = error as? PlanError {
            return LayerFailure.unavailable("\(what): \(plan.description)")
        }
        if let cz = error as? ContainerizationError {
            return fromContainerization(cz, doing: what)
        }
        let ns = error as NSError
        if ns.domain == virtualizationDomain {
            return fromVirtualization(ns, doing: what)
        }
        if ns.domain == NSCocoaErrorDomain || ns.domain == NSPOSIXErrorDomain {
            return LayerFailure.failed("\(what): \(ns.localizedDescription)")
        }
        return LayerFailure.failed("\(what): \(error)")
    }

    /// containerization's codes: what the caller may not ask for is unavailable, the rest failed.
    static func fromContainerization(_ error: ContainerizationError, doing what: String) -> LayerFailure {
        var message = "\(what): \(error.message)"
        if let cause = error.cause {
            message += " (\(cause))"
        }
        let code: ContainerizationError.Code = error.code
        if code == ContainerizationError.Code.unsupported || code == ContainerizationError.Code.invalidArgument {
            return LayerFailure.unavailable(message)
        }
        if code == ContainerizationError.Code.timeout {
            return LayerFailure.failed("\(message): timed out")
        }
        // notFound here is a file or mount inside containerization, not our VM id: the registry
        // alone reports LayerFailure.notFound.
        return LayerFailure.failed(message)
    }

    /// Virtualization.framework refuses a process without the entitlement, and a host or a
    /// configuration it cannot run: those are unavailable, with the fix when there is one.
    static func fromVirtualization(_ error: NSError, doing what: String) -> LayerFailure {
        let text = error.localizedDescription
        if text.contains("com.apple.security.virtualization") || text.lowercased().contains("entitlement") {
            return LayerFailure.unavailable(
                "\(what): \(text); sign the helper with swift/entitlements.plist (`make helper` does)")
        }
        if unavailableVirtualizationCodes.contains(error.code) {
            return LayerFailure.unavailable("\(what): \(text)")
        }
        return LayerFailure.failed("\(what): \(text)")
    }
}
