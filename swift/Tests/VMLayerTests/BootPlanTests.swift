// Spec translation, step one: requests to plans, and every refusal.
import Testing
import VMLayer

@Suite struct BootPlanTests {
    @Test func layersBecomeTheRootfsAndTheAgentIsTheProcess() throws {
        let plan = try BootPlanner.plan(request(), assets: FakeFiles.assets, files: FakeFiles.standard())
        #expect(plan.rootfs == RootfsSource.layers([
            LayerSource.archive(path: "/store/l0.tar.gz", compression: LayerCompression.gzip),
            LayerSource.archive(path: "/store/l1.tar", compression: LayerCompression.none),
        ]))
        #expect(plan.rootfsImage == "/vms/vm1/rootfs.ext4")
        #expect(plan.rootfsCacheImage.hasPrefix("/vm/rootfs/"))
        #expect(plan.writable == WritableDisk.fresh(path: "/vms/vm1/writable.ext4", bytes: 4 << 30))
        #expect(plan.cpus == 2)
        #expect(plan.memoryBytes == 1 << 30)
        #expect(plan.hostname == "box")
        #expect(plan.agentArguments == ["/run/sandbox-mcp/sandbox-vm-helper", "agent", "--listen", "vsock:\(BootPlanner.agentPort)"])
        #expect(plan.shares == [
            SharedDirectory(host: "/ws", guest: "/workspace", readOnly: false),
            SharedDirectory(host: "/vm/aarch64-linux-musl", guest: "/run/sandbox-mcp", readOnly: true),
        ])
        #expect(plan.network == nil)
        #expect(plan.seedDirectory == nil)
    }

    @Test func theSameLayersShareOneCachedImage() throws {
        let a = try BootPlanner.plan(request(id: "a"), assets: FakeFiles.assets, files: FakeFiles.standard())
        let b = try BootPlanner.plan(request(id: "b"), assets: FakeFiles.assets, files: FakeFiles.standard())
        let c = try BootPlanner.plan(request(id: "c", layers: ["/store/l0.tar.gz"]), assets: FakeFiles.assets, files: FakeFiles.standard())
        #expect(a.rootfsCacheImage == b.rootfsCacheImage)
        #expect(a.rootfsCacheImage != c.rootfsCacheImage)
    }

    @Test func aRestartKeepsItsWritableDisk() throws {
        var files = FakeFiles.standard()
        files.kinds["/vms/vm1/writable.ext4"] = FileKind.file
        let plan = try BootPlanner.plan(request(), assets: FakeFiles.assets, files: files)
        #expect(plan.writable == WritableDisk.reuse(path: "/vms/vm1/writable.ext4"))
    }

    @Test func aDiskLayerSeedsTheWritableDisk() throws {
        var files = FakeFiles.standard()
        files.kinds["/store/commit"] = FileKind.directory
        files.listings["/store/commit"] = ["writable.ext4"]
        files.kinds["/store/commit/writable.ext4"] = FileKind.file
        let plan = try BootPlanner.plan(request(layers: ["/store/l0.tar.gz", "/store/commit"]), assets: FakeFiles.assets, files: files)
        #expect(plan.rootfs == RootfsSource.layers([LayerSource.archive(path: "/store/l0.tar.gz", compression: LayerCompression.gzip)]))
        #expect(plan.writable == WritableDisk.seed(from: "/store/commit/writable.ext4", to: "/vms/vm1/writable.ext4"))
    }

    @Test func seededFilesGoOnTopOfAFirstBootsRootfs() throws {
        var files = FakeFiles.standard()
        files.kinds["/vms/vm1/upper"] = FileKind.directory
        files.listings["/vms/vm1/upper"] = ["etc"]
        let plan = try BootPlanner.plan(request(), assets: FakeFiles.assets, files: files)
        #expect(plan.seedDirectory == "/vms/vm1/upper")
        files.kinds["/vms/vm1/rootfs.ext4"] = FileKind.file
        let again = try BootPlanner.plan(request(), assets: FakeFiles.assets, files: files)
        #expect(again.seedDirectory == nil)
    }

    @Test func aClonesDiskCopyInUpperSeedsTheWritableDisk() throws {
        var files = FakeFiles.standard()
        files.kinds["/vms/vm1/upper"] = FileKind.directory
        files.listings["/vms/vm1/upper"] = ["writable.ext4"]
        files.kinds["/vms/vm1/upper/writable.ext4"] = FileKind.file
        let plan = try BootPlanner.plan(request(), assets: FakeFiles.assets, files: files)
        #expect(plan.writable == WritableDisk.seed(from: "/vms/vm1/upper/writable.ext4", to: "/vms/vm1/writable.ext4"))
        #expect(plan.seedDirectory == nil)
    }

    @Test func noDiskQuotaGetsTheDefaultDisk() throws {
        var input = request()
        input.diskBytes = 0
        let plan = try BootPlanner.plan(input, assets: FakeFiles.assets, files: FakeFiles.standard())
        #expect(plan.writable == WritableDisk.fresh(path: "/vms/vm1/writable.ext4", bytes: BootPlanner.defaultDiskBytes))
    }

    @Test func theNetworkIsTheCardTheHelperAsksFor() throws {
        let plan = try BootPlanner.plan(request(network: 7), assets: FakeFiles.assets, files: FakeFiles.standard())
        let network = try #require(plan.network)
        #expect(network == card(7))
    }

    @Test func macs() {
        #expect(NetworkPlan.isMAC("52:54:00:0a:00:0f"))
        for bad in ["", "52:54:00:0a:00", "52-54-00-0a-00-0f", "52:54:00:0a:00:0g", "525:4:00:0a:00:0f", "52:54:00:0a:00:0f:"] {
            #expect(!NetworkPlan.isMAC(bad), "\(bad)")
        }
    }

    @Test func refusals() {
        let files = FakeFiles.standard()
        let assets = FakeFiles.assets
        #expect(throws: PlanError.invalidID("a/b")) { try BootPlanner.plan(request(id: "a/b"), assets: assets, files: files) }
        var input = request()
        input.cpus = 0
        #expect(throws: PlanError.tooFewCPUs) { try BootPlanner.plan(input, assets: assets, files: files) }
        input = request()
        input.memoryBytes = 64 << 20
        #expect(throws: PlanError.tooLittleMemory(64 << 20)) { try BootPlanner.plan(input, assets: assets, files: files) }
        input = request()
        input.mounts = [SharedDirectory(host: "/ws", guest: "workspace", readOnly: false)]
        #expect(throws: PlanError.relativeGuestPath("workspace")) { try BootPlanner.plan(input, assets: assets, files: files) }
        input = request()
        input.mounts = [SharedDirectory(host: "/nowhere", guest: "/workspace", readOnly: false)]
        #expect(throws: PlanError.missingHostDirectory("/nowhere")) { try BootPlanner.plan(input, assets: assets, files: files) }
        #expect(throws: PlanError.noLayers) { try BootPlanner.plan(request(layers: []), assets: assets, files: files) }
        #expect(throws: PlanError.unknownLayer("/store/missing.tar")) {
            try BootPlanner.plan(request(layers: ["/store/missing.tar"]), assets: assets, files: files)
        }
        #expect(throws: PlanError.badNetworkFD(-3)) { try BootPlanner.plan(request(network: -3), assets: assets, files: files) }
        input = request(network: 5)
        input.network?.mac = "random"
        #expect(throws: PlanError.badNetworkMAC("random")) { try BootPlanner.plan(input, assets: assets, files: files) }
    }

    @Test func anImageReferenceIsPulledInsteadOfLayers() throws {
        var input = request(layers: [])
        input.imageReference = "docker.io/library/alpine:3.20"
        let plan = try BootPlanner.plan(input, assets: FakeFiles.assets, files: FakeFiles.standard())
        #expect(plan.rootfs == RootfsSource.image(reference: "docker.io/library/alpine:3.20"))
    }

    @Test func assetsAreFoundAsOnLinux() {
        #expect(HostAssets.directory(environment: ["SANDBOX_MCP_VM_DIR": "/x"], home: "/h") == "/x")
        #expect(HostAssets.directory(environment: ["XDG_DATA_HOME": "/d"], home: "/h") == "/d/sandbox-mcp/vm")
        #expect(HostAssets.directory(environment: [:], home: "/h") == "/h/.local/share/sandbox-mcp/vm")
        #expect(FakeFiles.assets.unavailableReason(files: FakeFiles.standard()) == nil)
        #expect(FakeFiles.assets.unavailableReason(files: FakeFiles())?.contains("no guest kernel") == true)
    }
}
