// The guest's network card on the helper's userspace network stack: a virtio-net device whose
// frames Virtualization.framework exchanges over a datagram socket the Rust helper handed
// over (VZFileHandleNetworkDeviceAttachment: one Ethernet frame per datagram). The stack
// applies the sandbox's egress policy (allow lists, DNS pinning, refusals), the same code as
// for namespace and qemu guests; containerization's own networking (vmnet NAT) is not used,
// since it would reach the host's network around that policy.
import Containerization
import ContainerizationExtras
import Foundation
import Virtualization

/// A network interface on a frame socket, for containerization's VZ backend (Interface, so
/// vminitd configures eth0's address and route; VZInterface, so the VM gets the device).
public final class FileHandleInterface: Interface, VZInterface, @unchecked Sendable {
    public let ipv4Address: CIDRv4
    public let ipv4Gateway: IPv4Address?
    public let macAddress: MACAddress?
    public let mtu: UInt32
    /// The frame socket; VZ reads and writes it for the VM's life.
    let socket: FileHandle

    /// Takes ownership of `fd`, a connected datagram socket: first, so that a plan refused
    /// below still closes it (the FileHandle goes with the half-made card).
    public init(plan: NetworkPlan) throws {
        self.socket = FileHandle(fileDescriptor: plan.fd, closeOnDealloc: true)
        let (address, gateway) = try plan.addresses()
        self.ipv4Address = address
        self.ipv4Gateway = gateway
        self.mtu = plan.mtu
        self.mac = plan.mac
        self.macAddress = try MACAddress(plan.mac)
    }

    /// The card's MAC as the helper's stack addresses it (never a random one: the stack sends
    /// the guest's frames to this address, and the guest drops frames for any other).
    let mac: String

    public func device() throws -> VZVirtioNetworkDeviceConfiguration {
        let attachment = VZFileHandleNetworkDeviceAttachment(fileHandle: socket)
        attachment.maximumTransmissionUnit = Int(mtu)
        let device = VZVirtioNetworkDeviceConfiguration()
        device.attachment = attachment
        guard let address = VZMACAddress(string: mac) else { throw PlanError.badNetworkMAC(mac) }
        device.macAddress = address
        return device
    }
}
