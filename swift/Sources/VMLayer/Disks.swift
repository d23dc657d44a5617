// Making a plan's disks: the root filesystem image from the layers (or an image pulled
// through containerization's ImageStore), cached per set of layers and copied per VM, the
// seeded files on top of a VM's copy, and the writable disk (new, copied, or kept).
//
// This file imports ContainerizationOCI too, which has its own Mount and Image: the
// package's are written Containerization.Mount and Containerization.Image here.
//
// Copies use FileManager's copy, which APFS makes a clone (copy-on-write): a VM's root
// filesystem and a snapshot's disk cost no time and no space until written.
import Containerization
import ContainerizationArchive
import ContainerizationEXT4
import ContainerizationError
import ContainerizationOCI
import Foundation
import SystemPackage

/// Makes the file at `path` through a partial file beside it, moved into place once whole: a
/// make that fails leaves no half-written file at `path` for a later `fileExists` to take for a
/// good one. Another helper may have made it meanwhile: either copy is the same, and the first
/// one stays.
func makeInPlace(_ path: String, _ make: @Sendable (String) async throws -> Void) async throws {
    let fm = FileManager.default
    let partial = path + ".partial-\(ProcessInfo.processInfo.processIdentifier)"
    try? fm.removeItem(atPath: partial)
    do {
        try await make(partial)
    } catch {
        try? fm.removeItem(atPath: partial)
        throw error
    }
    if (try? fm.moveItem(atPath: partial, toPath: path)) == nil {
        try? fm.removeItem(atPath: partial)
    }
}

/// Makes the disks of plans.
public struct Disks: Sendable {
    /// containerization's image store, for `RootfsSource.image`.
    let imageStore: ImageStore

    public init(imageStore: ImageStore) {
        self.imageStore = imageStore
    }

    /// The VM's root filesystem image, made if it does not exist yet.
    public func prepareRootfs(_ plan: BootPlan) async throws -> Containerization.Mount {
        let fm = FileManager.default
        if !fm.fileExists(atPath: plan.rootfsImage) {
            try fm.createDirectory(
                atPath: (plan.rootfsImage as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            if let seeds = plan.seedDirectory {
                // Seeded files go on top of the layers, so this VM's image is its own build.
                try await build(plan.rootfs, extra: [LayerSource.directory(path: seeds)], at: plan.rootfsImage, bytes: plan.rootfsBytes)
            } else {
                if !fm.fileExists(atPath: plan.rootfsCacheImage) {
                    try fm.createDirectory(
                        atPath: (plan.rootfsCacheImage as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
                    try await makeInPlace(plan.rootfsCacheImage) { @Sendable partial in
                        try await build(plan.rootfs, extra: [], at: partial, bytes: plan.rootfsBytes)
                    }
                }
                try fm.copyItem(atPath: plan.rootfsCacheImage, toPath: plan.rootfsImage)
            }
        }
        return plan.rootfsMount()
    }

    /// The VM's writable disk, made, copied or kept as the plan says.
    public func prepareWritable(_ plan: BootPlan) throws -> Containerization.Mount {
        let fm = FileManager.default
        switch plan.writable {
        case .reuse:
            break
        case .seed(let from, let to):
            try fm.copyItem(atPath: from, toPath: to)
        case .fresh(let path, let bytes):
            let formatter = try EXT4.Formatter(FilePath(path), minDiskSize: bytes)
            try formatter.close()
        }
        return plan.writableMount()
    }

    /// Unpacks `rootfs` and then `extra` onto a new ext4 image at `path`.
    func build(_ rootfs: RootfsSource, extra: [LayerSource], at path: String, bytes: UInt64) async throws {
        var layers: [LayerSource] = []
        switch rootfs {
        case .layers(let given):
            layers = given
        case .image(let reference):
            layers = try await pulledLayers(reference)
        }
        layers += extra
        let formatter = try EXT4.Formatter(FilePath(path), minDiskSize: bytes)
        do {
            for layer in layers {
                try Task.checkCancellation()
                try await unpack(layer, onto: formatter)
            }
            try formatter.close()
        } catch {
            try? formatter.close()
            try? FileManager.default.removeItem(atPath: path)
            throw error
        }
    }

    /// The layer archives of an image for this host's guests (linux/arm64), pulled if missing:
    /// for that platform alone (`get(reference:pull:)` would pull every platform the image has).
    func pulledLayers(_ reference: String) async throws -> [LayerSource] {
        let platform = Platform(arch: "arm64", os: "linux")
        let image: Containerization.Image
        do {
            image = try await imageStore.get(reference: reference)
        } catch let error as ContainerizationError where error.isCode(ContainerizationError.Code.notFound) {
            image = try await imageStore.pull(reference: reference, platform: platform)
        }
        let manifest: Manifest = try await image.manifest(for: platform)
        var layers: [LayerSource] = []
        for layer in manifest.layers {
            let content = try await image.getContent(digest: layer.digest)
            let compression: LayerCompression =
                layer.mediaType.hasSuffix("zstd") ? LayerCompression.zstd
                : (layer.mediaType.hasSuffix("gzip") ? LayerCompression.gzip : LayerCompression.none)
            layers.append(LayerSource.archive(path: content.path.path, compression: compression))
        }
        return layers
    }

    func unpack(_ layer: LayerSource, onto formatter: EXT4.Formatter) async throws {
        switch layer {
        case .archive(let path, let compression):
            try await formatter.unpack(
                source: URL(fileURLWithPath: path), format: Format.paxRestricted, compression: filter(compression))
        case .directory(let path):
            // The formatter unpacks archives: a directory goes through a temporary tar.
            let tar = FileManager.default.temporaryDirectory.appendingPathComponent("smcp-layer-\(UUID().uuidString).tar")
            defer { try? FileManager.default.removeItem(at: tar) }
            let writer = try ArchiveWriter(format: Format.paxRestricted, filter: Filter.none, file: tar)
            try writer.archiveDirectory(URL(fileURLWithPath: path))
            try writer.finishEncoding()
            try await formatter.unpack(source: tar, format: Format.paxRestricted, compression: Filter.none)
        }
    }

    func filter(_ compression: LayerCompression) -> Filter {
        switch compression {
        case .none: return Filter.none
        case .gzip: return Filter.gzip
        case .zstd: return Filter.zstd
        }
    }
}
