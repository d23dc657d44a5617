// Spec translation, step one: a boot request becomes a plan, with every decision made and
// every refusal given before anything is created. Pure (the file system only through a
// FileProbe), so `swift test` covers it without a VM. ContainerSpec.swift turns a plan into
// containerization's configuration.
//
// The disks, as on the Linux vm driver but as ext4 images (there is no mke2fs on a Mac):
// - the root filesystem: one ext4 image of the image's layers, built once per set of layers
//   into the rootfs cache and copied per VM (an APFS clone: instant, copy-on-write); the files
//   the helper seeded into `DIR/upper` before a first boot are unpacked on top of a VM's own
//   copy. containerization mounts it read-only as the overlay's lower layer;
// - the writable disk: `DIR/writable.ext4`, the overlay's upper layer, kept across stops. A
//   snapshot is a copy of it (guest frozen), so a commit, a snapshot, a restore and a clone
//   are disk copies: a disk layer (a directory holding `writable.ext4`) seeds a new VM's
//   writable disk. The topmost disk layer holds every earlier one's changes (its VM started
//   from a copy of them), so lower disk layers are not used.
import Foundation

/// How a layer archive is compressed.
public enum LayerCompression: String, Sendable, Equatable {
    case none
    case gzip
    case zstd

    /// By the file's name: `.tar`, `.tar.gz`/`.tgz`, `.tar.zst`/`.tzst`; nil: not an archive.
    public static func of(path: String) -> LayerCompression? {
        let name = (path as NSString).lastPathComponent.lowercased()
        if name.hasSuffix(".tar") { return LayerCompression.none }
        if name.hasSuffix(".tar.gz") || name.hasSuffix(".tgz") { return LayerCompression.gzip }
        if name.hasSuffix(".tar.zst") || name.hasSuffix(".tzst") { return LayerCompression.zstd }
        return nil
    }
}

/// One read-only layer of the root filesystem.
public enum LayerSource: Sendable, Equatable {
    /// An OCI layer archive (whiteouts as `.wh.` entries).
    case archive(path: String, compression: LayerCompression)
    /// A directory of files (regular files, directories and symlinks are taken).
    case directory(path: String)
}

/// Where the root filesystem's files come from.
public enum RootfsSource: Sendable, Equatable {
    /// An OCI image pulled through containerization's ImageStore.
    case image(reference: String)
    /// The request's layers, bottom first.
    case layers([LayerSource])
}

/// How the writable disk comes to be.
public enum WritableDisk: Sendable, Equatable {
    /// It exists: the VM was booted before (a restart keeps its writable layer).
    case reuse(path: String)
    /// A copy of a snapshot's disk (a disk layer, or a clone's copy in `DIR/upper`).
    case seed(from: String, to: String)
    /// A new empty ext4 of that size.
    case fresh(path: String, bytes: UInt64)

    /// The disk's path once it exists.
    public var path: String {
        switch self {
        case .reuse(let path): return path
        case .seed(_, let to): return to
        case .fresh(let path, _): return path
        }
    }
}

/// The guest's network card on the helper's userspace stack. Every value is the helper's (the
/// bridge's LayerNetwork): the stack sends the guest's frames to `mac` and answers at
/// `gateway` and `nameserver`, as for the Linux drivers' guests.
public struct NetworkPlan: Sendable, Equatable {
    /// The datagram socket carrying Ethernet frames, one per datagram.
    public var fd: Int32
    /// The card's MAC, `xx:xx:xx:xx:xx:xx`.
    public var mac: String
    /// The guest's address with its prefix (`10.0.2.15/24`).
    public var address: String
    public var gateway: String
    public var nameserver: String
    /// The card's MTU (no offloads).
    public var mtu: UInt32

    public init(fd: Int32, mac: String, address: String, gateway: String, nameserver: String, mtu: UInt32) {
        self.fd = fd
        self.mac = mac
        self.address = address
        self.gateway = gateway
        self.nameserver = nameserver
        self.mtu = mtu
    }

    /// Six two-digit hex groups separated by colons (what VZMACAddress(string:) reads).
    public static func isMAC(_ s: String) -> Bool {
        let groups = s.split(separator: ":", omittingEmptySubsequences: false)
        return groups.count == 6 && groups.allSatisfy { $0.count == 2 && $0.allSatisfy(\.isHexDigit) }
    }
}

/// Everything decided about one VM before it is created.
public struct BootPlan: Sendable, Equatable {
    public var id: String
    public var hostname: String
    public var rootfs: RootfsSource
    /// The VM's own root filesystem image (kept across stops).
    public var rootfsImage: String
    /// The shared image of these layers in the rootfs cache, copied to `rootfsImage`.
    public var rootfsCacheImage: String
    /// The root filesystem image's size, bytes (a sparse file).
    public var rootfsBytes: UInt64
    /// Seeded files unpacked on top of this VM's root filesystem at its first boot.
    public var seedDirectory: String?
    public var writable: WritableDisk
    /// Host directories shared in: the request's, then the agent's own directory.
    public var shares: [SharedDirectory]
    public var cpus: Int
    public var memoryBytes: UInt64
    public var network: NetworkPlan?
    /// The container's process: our agent, listening on vsock.
    public var agentArguments: [String]
    /// The vsock port the agent listens on (vminitd has 1024).
    public var agentPort: UInt32
    /// The guest console's log.
    public var bootLog: String
}

/// Why a request was refused before anything was created.
public enum PlanError: Error, Equatable, Sendable, CustomStringConvertible {
    case invalidID(String)
    case relativeGuestPath(String)
    case missingHostDirectory(String)
    case tooFewCPUs
    case tooLittleMemory(UInt64)
    case noLayers
    case unknownLayer(String)
    case badNetworkFD(Int32)
    case badNetworkMAC(String)

    public var description: String {
        switch self {
        case .invalidID(let id):
            return "vm id \(id.debugDescription) must be 1 to \(BootPlanner.maxIDLength) characters of [A-Za-z0-9_.-]"
        case .relativeGuestPath(let p):
            return "shared directory's guest path \(p.debugDescription) is not absolute"
        case .missingHostDirectory(let p):
            return "shared directory \(p) does not exist on the host"
        case .tooFewCPUs:
            return "a vm needs at least 1 cpu"
        case .tooLittleMemory(let bytes):
            return "a vm needs at least \(BootPlanner.minimumMemoryBytes >> 20) MiB of memory, not \(bytes >> 20) MiB"
        case .noLayers:
            return "the image has no layers"
        case .unknownLayer(let p):
            return "layer \(p) is neither a layer archive (.tar, .tar.gz, .tar.zst), a directory, nor a disk layer"
        case .badNetworkFD(let fd):
            return "network descriptor \(fd) is not a descriptor"
        case .badNetworkMAC(let mac):
            return "network card MAC \(mac.debugDescription) is not six hex pairs separated by colons"
        }
    }
}

/// Turns requests into plans.
public enum BootPlanner {
    /// containerization's limit on container ids (LinuxContainer.maxIDLength).
    public static let maxIDLength = 64
    /// The smallest VM, as on the Linux vm driver.
    public static let minimumMemoryBytes: UInt64 = 256 << 20
    /// The vsock port our agent listens on in the guest.
    public static let agentPort: UInt32 = 0x5A4D
    /// Where the agent's directory is shared in the guest (as the Linux guest binds its helper).
    public static let agentGuestDirectory = "/run/sandbox-mcp"
    /// A writable disk's file name, in a VM's directory and in a disk layer.
    public static let writableName = "writable.ext4"
    /// A VM's own root filesystem image.
    public static let rootfsName = "rootfs.ext4"
    /// A writable disk's size when the request names none (no disk quota): a sparse file.
    public static let defaultDiskBytes: UInt64 = 8 << 30
    /// The root filesystem's size: room for the image; the writable disk takes the writes.
    public static let rootfsBytes: UInt64 = 8 << 30

    public static func plan(_ input: BootInput, assets: HostAssets, files: any FileProbe) throws(PlanError) -> BootPlan {
        try checkID(input.id)
        guard input.cpus >= 1 else { throw PlanError.tooFewCPUs }
        guard input.memoryBytes >= minimumMemoryBytes else { throw PlanError.tooLittleMemory(input.memoryBytes) }
        if let network = input.network {
            guard network.fd >= 0 else { throw PlanError.badNetworkFD(network.fd) }
            guard NetworkPlan.isMAC(network.mac) else { throw PlanError.badNetworkMAC(network.mac) }
        }
        for mount in input.mounts {
            guard mount.guest.hasPrefix("/") else { throw PlanError.relativeGuestPath(mount.guest) }
            guard files.kind(mount.host) == FileKind.directory else { throw PlanError.missingHostDirectory(mount.host) }
        }

        let dir = URL(fileURLWithPath: input.dir)
        let writablePath = dir.appendingPathComponent(writableName).path
        let upper = dir.appendingPathComponent("upper").path

        // The layers: archives and directories make the root filesystem; the topmost disk
        // layer, if any, seeds the writable disk.
        var sources: [LayerSource] = []
        var diskLayer: String? = nil
        for layer in input.layers {
            switch files.kind(layer) {
            case FileKind.file:
                guard let compression = LayerCompression.of(path: layer) else { throw PlanError.unknownLayer(layer) }
                sources.append(LayerSource.archive(path: layer, compression: compression))
            case FileKind.directory:
                if isDiskLayer(layer, files: files) {
                    diskLayer = URL(fileURLWithPath: layer).appendingPathComponent(writableName).path
                } else {
                    sources.append(LayerSource.directory(path: layer))
                }
            case FileKind.missing:
                throw PlanError.unknownLayer(layer)
            }
        }
        let rootfs: RootfsSource
        if let reference = input.imageReference, !reference.isEmpty {
            rootfs = RootfsSource.image(reference: reference)
        } else {
            guard !sources.isEmpty else { throw PlanError.noLayers }
            rootfs = RootfsSource.layers(sources)
        }

        // The writable disk: kept across stops; else a clone's copy in DIR/upper; else the
        // topmost disk layer; else a new one.
        let seededDisk = URL(fileURLWithPath: upper).appendingPathComponent(writableName).path
        let writable: WritableDisk
        if files.kind(writablePath) == FileKind.file {
            writable = WritableDisk.reuse(path: writablePath)
        } else if files.kind(seededDisk) == FileKind.file {
            writable = WritableDisk.seed(from: seededDisk, to: writablePath)
        } else if let diskLayer {
            writable = WritableDisk.seed(from: diskLayer, to: writablePath)
        } else {
            writable = WritableDisk.fresh(path: writablePath, bytes: input.diskBytes == 0 ? defaultDiskBytes : input.diskBytes)
        }

        // Files seeded into DIR/upper (other than a disk copy) go on top of this VM's root
        // filesystem, once: a VM booted before has them already.
        let rootfsImage = dir.appendingPathComponent(rootfsName).path
        let seeds = files.entries(upper).filter { $0 != writableName }
        let seedDirectory = (!seeds.isEmpty && files.kind(rootfsImage) == FileKind.missing) ? upper : nil

        let agentDirectory = (assets.agent as NSString).deletingLastPathComponent
        let agentInGuest = "\(agentGuestDirectory)/\(HostAssets.agentName)"
        var shares = input.mounts
        shares.append(SharedDirectory(host: agentDirectory, guest: agentGuestDirectory, readOnly: true))

        return BootPlan(
            id: input.id,
            hostname: input.hostname.isEmpty ? input.id : input.hostname,
            rootfs: rootfs,
            rootfsImage: rootfsImage,
            rootfsCacheImage: URL(fileURLWithPath: assets.rootfsCache).appendingPathComponent("\(cacheKey(rootfs)).ext4").path,
            rootfsBytes: rootfsBytes,
            seedDirectory: seedDirectory,
            writable: writable,
            shares: shares,
            cpus: Int(input.cpus),
            memoryBytes: input.memoryBytes,
            network: input.network,
            agentArguments: [agentInGuest, "agent", "--listen", "vsock:\(agentPort)"],
            agentPort: agentPort,
            bootLog: dir.appendingPathComponent("console.log").path
        )
    }

    /// A directory holding only a writable disk: a snapshot's copy.
    public static func isDiskLayer(_ path: String, files: any FileProbe) -> Bool {
        files.entries(path) == [writableName]
            && files.kind(URL(fileURLWithPath: path).appendingPathComponent(writableName).path) == FileKind.file
    }

    static func checkID(_ id: String) throws(PlanError) {
        let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
        guard !id.isEmpty, id.count <= maxIDLength, id.allSatisfy({ allowed.contains($0) }) else {
            throw PlanError.invalidID(id)
        }
    }

    /// A stable name for a root filesystem's sources (FNV-1a, 64 bits, over their paths).
    public static func cacheKey(_ rootfs: RootfsSource) -> String {
        var parts: [String] = []
        switch rootfs {
        case .image(let reference):
            parts = ["image", reference]
        case .layers(let layers):
            for layer in layers {
                switch layer {
                case .archive(let path, let compression): parts.append("archive:\(compression.rawValue):\(path)")
                case .directory(let path): parts.append("directory:\(path)")
                }
            }
        }
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in parts.joined(separator: "\n").utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x0000_0100_0000_01b3
        }
        return String(hash, radix: 16)
    }
}
