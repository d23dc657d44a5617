// What the layer is asked to boot (the bridge's BootRequest in Swift's own types), and the
// host's assets every VM needs: the guest kernel, containerization's init filesystem
// (vminitd) and our agent built for the guest.
import Foundation

/// A host directory shared into the guest (virtiofs).
public struct SharedDirectory: Sendable, Equatable {
    /// Host path.
    public var host: String
    /// Absolute path inside the guest.
    public var guest: String
    /// Mounted read-only.
    public var readOnly: Bool

    public init(host: String, guest: String, readOnly: Bool) {
        self.host = host
        self.guest = guest
        self.readOnly = readOnly
    }
}

/// One boot request, as the Rust helper's driver seam describes a VM (BootSpec).
public struct BootInput: Sendable, Equatable {
    /// The VM id every later call names.
    public var id: String
    /// The guest's hostname.
    public var hostname: String
    /// The image's read-only layers, bottom first: OCI layer archives (tar, tar+gzip,
    /// tar+zstd), directories, or disk layers (a directory holding a writable disk copied by a
    /// snapshot, `writable.ext4`).
    public var layers: [String]
    /// The VM's own directory: its disks live here across stops; `upper` in it holds files the
    /// helper seeded before the first boot.
    public var dir: String
    /// Host directories shared in (`/workspace` among them).
    public var mounts: [SharedDirectory]
    /// CPUs.
    public var cpus: UInt32
    /// Memory, bytes.
    public var memoryBytes: UInt64
    /// Tasks (not enforced by containerization 0.40.2's container spec; see limitsNotEnforced).
    public var pids: UInt32
    /// The writable disk's size, bytes.
    public var diskBytes: UInt64
    /// The guest's network card on the helper's network stack (its frame socket, MAC and
    /// addresses, all the helper's); nil: no network card.
    public var network: NetworkPlan?
    /// An OCI reference to pull through containerization's ImageStore for the root filesystem;
    /// `layers` then hold only what was committed on it (`sandbox-mcp image pull` records one).
    public var imageReference: String?

    public init(
        id: String, hostname: String, layers: [String], dir: String, mounts: [SharedDirectory],
        cpus: UInt32, memoryBytes: UInt64, pids: UInt32, diskBytes: UInt64, network: NetworkPlan?,
        imageReference: String? = nil
    ) {
        self.id = id
        self.hostname = hostname
        self.layers = layers
        self.dir = dir
        self.mounts = mounts
        self.cpus = cpus
        self.memoryBytes = memoryBytes
        self.pids = pids
        self.diskBytes = diskBytes
        self.network = network
        self.imageReference = imageReference
    }
}

/// The files every VM boots with, under the vm assets directory (`make install` puts them
/// there): `SANDBOX_MCP_VM_DIR`, else `$XDG_DATA_HOME/sandbox-mcp/vm`, else
/// `~/.local/share/sandbox-mcp/vm`, as on Linux.
public struct HostAssets: Sendable, Equatable {
    /// The arm64 guest kernel (Kata's `vmlinux.container`, or one built with VIRTIO built in).
    public var kernel: String
    /// containerization's init filesystem (vminitd), an ext4 image.
    public var initfs: String
    /// Our agent, `sandbox-vm-helper` built for aarch64-unknown-linux-musl; its directory is
    /// shared read-only into every guest.
    public var agent: String
    /// Root filesystems built from layers, reused by every VM of the same layers.
    public var rootfsCache: String
    /// containerization's image store (pulled images).
    public var imageStore: String
    /// Where vminitd comes from when `initfs` is missing.
    public var initfsReference: String

    /// The name of the agent binary in its directory.
    public static let agentName = "sandbox-vm-helper"
    /// containerization publishes vminitd as an image per release.
    public static let defaultInitfsReference = "ghcr.io/apple/containerization/vminit:0.40.2"

    public init(directory: String, initfsReference: String = HostAssets.defaultInitfsReference) {
        let dir = URL(fileURLWithPath: directory)
        self.kernel = dir.appendingPathComponent("vmlinux").path
        self.initfs = dir.appendingPathComponent("initfs.ext4").path
        self.agent = dir.appendingPathComponent("aarch64-linux-musl").appendingPathComponent(HostAssets.agentName).path
        self.rootfsCache = dir.appendingPathComponent("rootfs").path
        self.imageStore = dir.appendingPathComponent("images").path
        self.initfsReference = initfsReference
    }

    /// The assets directory as the Linux helper finds its own.
    public static func directory(environment: [String: String], home: String) -> String {
        if let dir = environment["SANDBOX_MCP_VM_DIR"], !dir.isEmpty {
            return dir
        }
        let data = environment["XDG_DATA_HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? "\(home)/.local/share"
        return "\(data)/sandbox-mcp/vm"
    }

    /// The assets of this process's environment.
    public static func fromEnvironment(_ environment: [String: String] = ProcessInfo.processInfo.environment) -> HostAssets {
        let home = environment["HOME"] ?? NSHomeDirectory()
        let reference = environment["SANDBOX_MCP_VMINIT_REF"] ?? HostAssets.defaultInitfsReference
        return HostAssets(directory: directory(environment: environment, home: home), initfsReference: reference)
    }

    /// Why no VM can boot with these assets, or nil. The init filesystem may be missing: the
    /// layer pulls it on first use.
    public func unavailableReason(files: any FileProbe) -> String? {
        if files.kind(kernel) != FileKind.file {
            return "no guest kernel at \(kernel): run `make install` (it fetches one)"
        }
        if files.kind(agent) != FileKind.file {
            return "no guest agent at \(agent): run `make install` (it cross-compiles one for aarch64-unknown-linux-musl)"
        }
        return nil
    }
}

/// What is at a path, as the planner needs to know it.
public enum FileKind: Sendable, Equatable {
    case missing
    case file
    case directory
}

/// The file system as the planner sees it: the real one, or a table in tests.
public protocol FileProbe: Sendable {
    /// What is at `path`.
    func kind(_ path: String) -> FileKind
    /// The names in directory `path` (empty if it is none).
    func entries(_ path: String) -> [String]
}

/// The real file system.
public struct HostFiles: FileProbe {
    public init() {}

    public func kind(_ path: String) -> FileKind {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            return FileKind.missing
        }
        return isDirectory.boolValue ? FileKind.directory : FileKind.file
    }

    public func entries(_ path: String) -> [String] {
        (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []
    }
}
