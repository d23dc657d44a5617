// Spec translation, step two: a plan in containerization's configuration (no VM is made).
import Containerization
import Testing
import VMLayer

@Suite struct ContainerSpecTests {
    func plan() throws -> BootPlan {
        try BootPlanner.plan(request(network: 9), assets: FakeFiles.assets, files: FakeFiles.standard())
    }

    @Test func cpusMemoryHostnameAndTheAgent() throws {
        let plan = try plan()
        let config: LinuxContainer.Configuration = plan.containerConfiguration(network: nil)
        #expect(config.cpus == 2)
        #expect(config.memoryInBytes == 1 << 30)
        #expect(config.hostname == "box")
        #expect(config.useInit)
        #expect(config.process.arguments == plan.agentArguments)
        #expect(config.process.workingDirectory == "/")
        #expect(config.interfaces.isEmpty)
        #expect(config.dns == nil)
    }

    @Test func theWorkspaceAndTheAgentAreVirtiofsShares() throws {
        let config: LinuxContainer.Configuration = try plan().containerConfiguration(network: nil)
        let shares = config.mounts.filter { $0.type == "virtiofs" }
        #expect(shares.map { $0.destination } == ["/workspace", "/run/sandbox-mcp"])
        #expect(shares.map { $0.source } == ["/ws", "/vm/aarch64-linux-musl"])
        #expect(shares[1].options == ["ro"])
        #expect(config.mounts.count == LinuxContainer.defaultMounts().count + 2)
    }

    @Test func theDisks() throws {
        let plan = try plan()
        let rootfs: Mount = plan.rootfsMount()
        #expect(rootfs.isBlock)
        #expect(rootfs.source == "/vms/vm1/rootfs.ext4")
        let writable: Mount = plan.writableMount()
        #expect(writable.isBlock)
        #expect(writable.type == "ext4")
        #expect(writable.source == "/vms/vm1/writable.ext4")
    }

    @Test func theNetworkAddresses() throws {
        let network = try #require(try plan().network)
        let (address, gateway) = try network.addresses()
        #expect(address.description == "10.0.2.15/24")
        #expect(gateway.description == "10.0.2.2")
    }
}
