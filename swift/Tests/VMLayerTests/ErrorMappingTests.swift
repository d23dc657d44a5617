// The one error mapping: containerization's, Virtualization's, the planner's and the file
// system's errors onto the bridge's three kinds.
import ContainerizationError
import Foundation
import Testing
import Virtualization
import VMLayer

@Suite struct ErrorMappingTests {
    @Test func containerizationCodes() {
        let unsupported = ContainerizationError(ContainerizationError.Code.unsupported, message: "no hotplug")
        #expect(ErrorMapping.layerFailure(unsupported, doing: "boot") == LayerFailure.unavailable("boot: no hotplug"))
        let invalid = ContainerizationError(ContainerizationError.Code.invalidArgument, message: "bad mac")
        #expect(ErrorMapping.layerFailure(invalid, doing: "boot") == LayerFailure.unavailable("boot: bad mac"))
        let state = ContainerizationError(ContainerizationError.Code.invalidState, message: "container must be running")
        #expect(ErrorMapping.layerFailure(state, doing: "dial") == LayerFailure.failed("dial: container must be running"))
        // A file containerization did not find is a failure, never "no such vm".
        let missing = ContainerizationError(ContainerizationError.Code.notFound, message: "rootfs mount not found")
        #expect(ErrorMapping.layerFailure(missing, doing: "boot") == LayerFailure.failed("boot: rootfs mount not found"))
        let timeout = ContainerizationError(ContainerizationError.Code.timeout, message: "agent")
        #expect(ErrorMapping.layerFailure(timeout, doing: "stop") == LayerFailure.failed("stop: agent: timed out"))
    }

    @Test func virtualizationWithoutTheEntitlementIsUnavailable() {
        let error = NSError(domain: VZErrorDomain, code: VZError.Code.invalidVirtualMachineConfiguration.rawValue, userInfo: [
            NSLocalizedDescriptionKey: "The process doesn't have the \"com.apple.security.virtualization\" entitlement."
        ])
        let failure = ErrorMapping.layerFailure(error, doing: "boot vm a")
        guard case .unavailable(let message) = failure else {
            Issue.record("expected unavailable, got \(failure)")
            return
        }
        #expect(message.contains("swift/entitlements.plist"))
        let internalError = NSError(domain: VZErrorDomain, code: VZError.Code.internalError.rawValue, userInfo: nil)
        guard case .failed = ErrorMapping.layerFailure(internalError, doing: "boot") else {
            Issue.record("an internal VZ error is a failure")
            return
        }
    }

    @Test func plannerRefusalsAreUnavailableAndLayerFailuresPassThrough() {
        #expect(ErrorMapping.layerFailure(PlanError.tooFewCPUs, doing: "boot vm a")
            == LayerFailure.unavailable("boot vm a: a vm needs at least 1 cpu"))
        #expect(ErrorMapping.layerFailure(LayerFailure.notFound("no vm a"), doing: "dial") == LayerFailure.notFound("no vm a"))
    }

    @Test func fileErrorsFail() {
        let error = NSError(domain: NSCocoaErrorDomain, code: NSFileNoSuchFileError, userInfo: nil)
        guard case .failed(let message) = ErrorMapping.layerFailure(error, doing: "snapshot vm a") else {
            Issue.record("expected failed")
            return
        }
        #expect(message.hasPrefix("snapshot vm a: "))
    }
}
