// A file system as a table, so the planner's tests need no disk.
import VMLayer

struct FakeFiles: FileProbe {
    var kinds: [String: FileKind] = [:]
    var listings: [String: [String]] = [:]

    func kind(_ path: String) -> FileKind { kinds[path] ?? FileKind.missing }
    func entries(_ path: String) -> [String] { listings[path] ?? [] }

    /// The assets of a host where everything is installed.
    static let assets = HostAssets(directory: "/vm")

    /// A host with the assets, a workspace and two layer archives.
    static func standard() -> FakeFiles {
        var files = FakeFiles()
        files.kinds[assets.kernel] = FileKind.file
        files.kinds[assets.agent] = FileKind.file
        files.kinds["/ws"] = FileKind.directory
        files.kinds["/store/l0.tar.gz"] = FileKind.file
        files.kinds["/store/l1.tar"] = FileKind.file
        return files
    }
}

func request(id: String = "vm1", layers: [String] = ["/store/l0.tar.gz", "/store/l1.tar"], network: Int32? = nil) -> BootInput {
    BootInput(
        id: id, hostname: "box", layers: layers, dir: "/vms/\(id)",
        mounts: [SharedDirectory(host: "/ws", guest: "/workspace", readOnly: false)],
        cpus: 2, memoryBytes: 1 << 30, pids: 1024, diskBytes: 4 << 30, network: network.map(card))
}

/// The card the Rust helper asks for (rust/helper/driver/swift/convert.rs, `network_card`).
func card(_ fd: Int32) -> NetworkPlan {
    NetworkPlan(fd: fd, mac: "52:54:00:0a:00:0f", address: "10.0.2.15/24", gateway: "10.0.2.2", nameserver: "10.0.2.3", mtu: 1500)
}
