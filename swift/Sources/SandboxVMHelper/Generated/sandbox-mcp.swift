import SandboxHelperFFI
@_cdecl("__swift_bridge__$layer_info")
func __swift_bridge__layer_info () -> __swift_bridge__$LayerInfo {
    layer_info().intoFfiRepr()
}

@_cdecl("__swift_bridge__$layer_boot")
func __swift_bridge__layer_boot (_ callbackWrapper: UnsafeMutableRawPointer, _ onSuccess: @escaping @convention(c) (UnsafeMutableRawPointer) -> Void, _ onError: @escaping @convention(c) (UnsafeMutableRawPointer, __swift_bridge__$LayerError) -> Void, _ request: __swift_bridge__$BootRequest) {
    let __callbacks = __private__UncheckedSendable((callbackWrapper, onSuccess, onError))
    Task {
        let (callbackWrapper, onSuccess, onError) = __callbacks.value
        do {
            _ = try await layer_boot(request: request.intoSwiftRepr())
            onSuccess(callbackWrapper)
        } catch let error as LayerError {
            onError(callbackWrapper, error.intoFfiRepr())
        }
    }
}
func __swift_bridge__layer_boot__TypedThrowsCheck(_ request: __swift_bridge__$BootRequest, _: LayerError.Type) async throws(LayerError) {
    _ = try await layer_boot(request: request.intoSwiftRepr())
}

@_cdecl("__swift_bridge__$layer_dial_agent")
func __swift_bridge__layer_dial_agent (_ callbackWrapper: UnsafeMutableRawPointer, _ onSuccess: @escaping @convention(c) (UnsafeMutableRawPointer, Int32) -> Void, _ onError: @escaping @convention(c) (UnsafeMutableRawPointer, __swift_bridge__$LayerError) -> Void, _ id: UnsafeMutableRawPointer) {
    let __callbacks = __private__UncheckedSendable((callbackWrapper, onSuccess, onError))
    Task {
        let (callbackWrapper, onSuccess, onError) = __callbacks.value
        do {
            let result = try await layer_dial_agent(id: RustString(ptr: id))
            onSuccess(callbackWrapper, result)
        } catch let error as LayerError {
            onError(callbackWrapper, error.intoFfiRepr())
        }
    }
}
func __swift_bridge__layer_dial_agent__TypedThrowsCheck(_ id: UnsafeMutableRawPointer, _: LayerError.Type) async throws(LayerError) {
    _ = try await layer_dial_agent(id: RustString(ptr: id))
}

@_cdecl("__swift_bridge__$layer_request_stop")
func __swift_bridge__layer_request_stop (_ id: UnsafeMutableRawPointer) {
    layer_request_stop(id: RustString(ptr: id))
}

@_cdecl("__swift_bridge__$layer_kill")
func __swift_bridge__layer_kill (_ id: UnsafeMutableRawPointer) {
    layer_kill(id: RustString(ptr: id))
}

@_cdecl("__swift_bridge__$layer_wait_exit")
func __swift_bridge__layer_wait_exit (_ callbackWrapper: UnsafeMutableRawPointer, _ callback: @escaping @convention(c) (UnsafeMutableRawPointer, UnsafeMutableRawPointer) -> Void, _ id: UnsafeMutableRawPointer) {
    let __callbacks = __private__UncheckedSendable((callbackWrapper, callback))
    Task {
        let (callbackWrapper, callback) = __callbacks.value
        let result = await layer_wait_exit(id: RustString(ptr: id))
        callback(callbackWrapper, { let rustString = result.intoRustString(); rustString.isOwned = false; return rustString.ptr }())
    }
}

@_cdecl("__swift_bridge__$layer_snapshot")
func __swift_bridge__layer_snapshot (_ id: UnsafeMutableRawPointer, _ upper: UnsafeMutableRawPointer, _ dst: UnsafeMutableRawPointer) -> __swift_bridge__$ResultVoidAndLayerError {
    do {
        try layer_snapshot(id: RustString(ptr: id), upper: RustString(ptr: upper), dst: RustString(ptr: dst))
        return __swift_bridge__$ResultVoidAndLayerError(tag: __swift_bridge__$ResultVoidAndLayerError$ResultOk, payload: __swift_bridge__$ResultVoidAndLayerError$Fields())
    } catch let error {
        return __swift_bridge__$ResultVoidAndLayerError(tag: __swift_bridge__$ResultVoidAndLayerError$ResultErr, payload: __swift_bridge__$ResultVoidAndLayerError$Fields(err: error.intoFfiRepr()))
    }
}
func __swift_bridge__layer_snapshot__TypedThrowsCheck(_ id: UnsafeMutableRawPointer, _ upper: UnsafeMutableRawPointer, _ dst: UnsafeMutableRawPointer, _: LayerError.Type) throws(LayerError) {
    _ = try layer_snapshot(id: RustString(ptr: id), upper: RustString(ptr: upper), dst: RustString(ptr: dst))
}

@_cdecl("__swift_bridge__$layer_host_facts")
func __swift_bridge__layer_host_facts (_ id: UnsafeMutableRawPointer) -> __swift_bridge__$LayerHostFacts {
    layer_host_facts(id: RustString(ptr: id)).intoFfiRepr()
}

@_cdecl("__swift_bridge__$layer_host_processes")
func __swift_bridge__layer_host_processes (_ id: UnsafeMutableRawPointer) -> __swift_bridge__$LayerHostProcesses {
    layer_host_processes(id: RustString(ptr: id)).intoFfiRepr()
}

@_cdecl("__swift_bridge__$layer_limits_not_enforced")
func __swift_bridge__layer_limits_not_enforced (_ id: UnsafeMutableRawPointer) -> UnsafeMutableRawPointer {
    { let rustString = layer_limits_not_enforced(id: RustString(ptr: id)).intoRustString(); rustString.isOwned = false; return rustString.ptr }()
}

@_cdecl("__swift_bridge__$layer_cleanup")
func __swift_bridge__layer_cleanup (_ id: UnsafeMutableRawPointer) {
    layer_cleanup(id: RustString(ptr: id))
}

@_cdecl("__swift_bridge__$layer_keep_warm")
func __swift_bridge__layer_keep_warm () {
    layer_keep_warm()
}

@_cdecl("__swift_bridge__$layer_release")
func __swift_bridge__layer_release (_ callbackWrapper: UnsafeMutableRawPointer, _ callback: @escaping @convention(c) (UnsafeMutableRawPointer) -> Void) {
    let __callbacks = __private__UncheckedSendable((callbackWrapper, callback))
    Task {
        let (callbackWrapper, callback) = __callbacks.value
        let _ = await layer_release()
        callback(callbackWrapper)
    }
}

public func helper_main<GenericIntoRustString: IntoRustString>(_ args: RustVec<GenericIntoRustString>) -> Int32 {
    __swift_bridge__$helper_main({ let val = args; val.isOwned = false; return val.ptr }())
}
public struct LayerCapabilities {
    public var tty: Bool
    public var network_egress: Bool
    public var limits: Bool
    public var cgroups: RustString
    public var seccomp: Bool
    public var own_kernel: Bool
    public var dial: Bool
    public var snapshot: Bool
    public var containers: Bool
    public var pull_images: Bool

    public init(tty: Bool,network_egress: Bool,limits: Bool,cgroups: RustString,seccomp: Bool,own_kernel: Bool,dial: Bool,snapshot: Bool,containers: Bool,pull_images: Bool) {
        self.tty = tty
        self.network_egress = network_egress
        self.limits = limits
        self.cgroups = cgroups
        self.seccomp = seccomp
        self.own_kernel = own_kernel
        self.dial = dial
        self.snapshot = snapshot
        self.containers = containers
        self.pull_images = pull_images
    }

    @inline(__always)
    func intoFfiRepr() -> __swift_bridge__$LayerCapabilities {
        { let val = self; return __swift_bridge__$LayerCapabilities(tty: val.tty, network_egress: val.network_egress, limits: val.limits, cgroups: { let rustString = val.cgroups.intoRustString(); rustString.isOwned = false; return rustString.ptr }(), seccomp: val.seccomp, own_kernel: val.own_kernel, dial: val.dial, snapshot: val.snapshot, containers: val.containers, pull_images: val.pull_images); }()
    }
}
extension __swift_bridge__$LayerCapabilities {
    @inline(__always)
    func intoSwiftRepr() -> LayerCapabilities {
        { let val = self; return LayerCapabilities(tty: val.tty, network_egress: val.network_egress, limits: val.limits, cgroups: RustString(ptr: val.cgroups), seccomp: val.seccomp, own_kernel: val.own_kernel, dial: val.dial, snapshot: val.snapshot, containers: val.containers, pull_images: val.pull_images); }()
    }
}
extension __swift_bridge__$Option$LayerCapabilities {
    @inline(__always)
    func intoSwiftRepr() -> Optional<LayerCapabilities> {
        if self.is_some {
            return self.val.intoSwiftRepr()
        } else {
            return nil
        }
    }

    @inline(__always)
    static func fromSwiftRepr(_ val: Optional<LayerCapabilities>) -> __swift_bridge__$Option$LayerCapabilities {
        if let v = val {
            return __swift_bridge__$Option$LayerCapabilities(is_some: true, val: v.intoFfiRepr())
        } else {
            return __swift_bridge__$Option$LayerCapabilities(is_some: false, val: __swift_bridge__$LayerCapabilities())
        }
    }
}
public struct LayerInfo {
    public var name: RustString
    public var unavailable_reason: RustString
    public var capabilities: LayerCapabilities

    public init(name: RustString,unavailable_reason: RustString,capabilities: LayerCapabilities) {
        self.name = name
        self.unavailable_reason = unavailable_reason
        self.capabilities = capabilities
    }

    @inline(__always)
    func intoFfiRepr() -> __swift_bridge__$LayerInfo {
        { let val = self; return __swift_bridge__$LayerInfo(name: { let rustString = val.name.intoRustString(); rustString.isOwned = false; return rustString.ptr }(), unavailable_reason: { let rustString = val.unavailable_reason.intoRustString(); rustString.isOwned = false; return rustString.ptr }(), capabilities: val.capabilities.intoFfiRepr()); }()
    }
}
extension __swift_bridge__$LayerInfo {
    @inline(__always)
    func intoSwiftRepr() -> LayerInfo {
        { let val = self; return LayerInfo(name: RustString(ptr: val.name), unavailable_reason: RustString(ptr: val.unavailable_reason), capabilities: val.capabilities.intoSwiftRepr()); }()
    }
}
extension __swift_bridge__$Option$LayerInfo {
    @inline(__always)
    func intoSwiftRepr() -> Optional<LayerInfo> {
        if self.is_some {
            return self.val.intoSwiftRepr()
        } else {
            return nil
        }
    }

    @inline(__always)
    static func fromSwiftRepr(_ val: Optional<LayerInfo>) -> __swift_bridge__$Option$LayerInfo {
        if let v = val {
            return __swift_bridge__$Option$LayerInfo(is_some: true, val: v.intoFfiRepr())
        } else {
            return __swift_bridge__$Option$LayerInfo(is_some: false, val: __swift_bridge__$LayerInfo())
        }
    }
}
public struct LayerNetwork {
    public var fd: Int32
    public var mac: RustString
    public var address: RustString
    public var gateway: RustString
    public var nameserver: RustString
    public var mtu: UInt32

    public init(fd: Int32,mac: RustString,address: RustString,gateway: RustString,nameserver: RustString,mtu: UInt32) {
        self.fd = fd
        self.mac = mac
        self.address = address
        self.gateway = gateway
        self.nameserver = nameserver
        self.mtu = mtu
    }

    @inline(__always)
    func intoFfiRepr() -> __swift_bridge__$LayerNetwork {
        { let val = self; return __swift_bridge__$LayerNetwork(fd: val.fd, mac: { let rustString = val.mac.intoRustString(); rustString.isOwned = false; return rustString.ptr }(), address: { let rustString = val.address.intoRustString(); rustString.isOwned = false; return rustString.ptr }(), gateway: { let rustString = val.gateway.intoRustString(); rustString.isOwned = false; return rustString.ptr }(), nameserver: { let rustString = val.nameserver.intoRustString(); rustString.isOwned = false; return rustString.ptr }(), mtu: val.mtu); }()
    }
}
extension __swift_bridge__$LayerNetwork {
    @inline(__always)
    func intoSwiftRepr() -> LayerNetwork {
        { let val = self; return LayerNetwork(fd: val.fd, mac: RustString(ptr: val.mac), address: RustString(ptr: val.address), gateway: RustString(ptr: val.gateway), nameserver: RustString(ptr: val.nameserver), mtu: val.mtu); }()
    }
}
extension __swift_bridge__$Option$LayerNetwork {
    @inline(__always)
    func intoSwiftRepr() -> Optional<LayerNetwork> {
        if self.is_some {
            return self.val.intoSwiftRepr()
        } else {
            return nil
        }
    }

    @inline(__always)
    static func fromSwiftRepr(_ val: Optional<LayerNetwork>) -> __swift_bridge__$Option$LayerNetwork {
        if let v = val {
            return __swift_bridge__$Option$LayerNetwork(is_some: true, val: v.intoFfiRepr())
        } else {
            return __swift_bridge__$Option$LayerNetwork(is_some: false, val: __swift_bridge__$LayerNetwork())
        }
    }
}
public struct BootRequest {
    public var id: RustString
    public var hostname: RustString
    public var layers: RustVec<RustString>
    public var dir: RustString
    public var mount_hosts: RustVec<RustString>
    public var mount_guests: RustVec<RustString>
    public var mount_read_only: RustVec<Bool>
    public var cpus: UInt32
    public var memory_bytes: UInt64
    public var pids: UInt32
    public var disk_bytes: UInt64
    public var network: LayerNetwork
    public var image_reference: RustString

    public init(id: RustString,hostname: RustString,layers: RustVec<RustString>,dir: RustString,mount_hosts: RustVec<RustString>,mount_guests: RustVec<RustString>,mount_read_only: RustVec<Bool>,cpus: UInt32,memory_bytes: UInt64,pids: UInt32,disk_bytes: UInt64,network: LayerNetwork,image_reference: RustString) {
        self.id = id
        self.hostname = hostname
        self.layers = layers
        self.dir = dir
        self.mount_hosts = mount_hosts
        self.mount_guests = mount_guests
        self.mount_read_only = mount_read_only
        self.cpus = cpus
        self.memory_bytes = memory_bytes
        self.pids = pids
        self.disk_bytes = disk_bytes
        self.network = network
        self.image_reference = image_reference
    }

    @inline(__always)
    func intoFfiRepr() -> __swift_bridge__$BootRequest {
        { let val = self; return __swift_bridge__$BootRequest(id: { let rustString = val.id.intoRustString(); rustString.isOwned = false; return rustString.ptr }(), hostname: { let rustString = val.hostname.intoRustString(); rustString.isOwned = false; return rustString.ptr }(), layers: { let val = val.layers; val.isOwned = false; return val.ptr }(), dir: { let rustString = val.dir.intoRustString(); rustString.isOwned = false; return rustString.ptr }(), mount_hosts: { let val = val.mount_hosts; val.isOwned = false; return val.ptr }(), mount_guests: { let val = val.mount_guests; val.isOwned = false; return val.ptr }(), mount_read_only: { let val = val.mount_read_only; val.isOwned = false; return val.ptr }(), cpus: val.cpus, memory_bytes: val.memory_bytes, pids: val.pids, disk_bytes: val.disk_bytes, network: val.network.intoFfiRepr(), image_reference: { let rustString = val.image_reference.intoRustString(); rustString.isOwned = false; return rustString.ptr }()); }()
    }
}
extension __swift_bridge__$BootRequest {
    @inline(__always)
    func intoSwiftRepr() -> BootRequest {
        { let val = self; return BootRequest(id: RustString(ptr: val.id), hostname: RustString(ptr: val.hostname), layers: RustVec(ptr: val.layers), dir: RustString(ptr: val.dir), mount_hosts: RustVec(ptr: val.mount_hosts), mount_guests: RustVec(ptr: val.mount_guests), mount_read_only: RustVec(ptr: val.mount_read_only), cpus: val.cpus, memory_bytes: val.memory_bytes, pids: val.pids, disk_bytes: val.disk_bytes, network: val.network.intoSwiftRepr(), image_reference: RustString(ptr: val.image_reference)); }()
    }
}
extension __swift_bridge__$Option$BootRequest {
    @inline(__always)
    func intoSwiftRepr() -> Optional<BootRequest> {
        if self.is_some {
            return self.val.intoSwiftRepr()
        } else {
            return nil
        }
    }

    @inline(__always)
    static func fromSwiftRepr(_ val: Optional<BootRequest>) -> __swift_bridge__$Option$BootRequest {
        if let v = val {
            return __swift_bridge__$Option$BootRequest(is_some: true, val: v.intoFfiRepr())
        } else {
            return __swift_bridge__$Option$BootRequest(is_some: false, val: __swift_bridge__$BootRequest())
        }
    }
}
public struct LayerHostFacts {
    public var memory_limit_bytes: UInt64
    public var pids_limit: UInt64
    public var oom_killed: Bool

    public init(memory_limit_bytes: UInt64,pids_limit: UInt64,oom_killed: Bool) {
        self.memory_limit_bytes = memory_limit_bytes
        self.pids_limit = pids_limit
        self.oom_killed = oom_killed
    }

    @inline(__always)
    func intoFfiRepr() -> __swift_bridge__$LayerHostFacts {
        { let val = self; return __swift_bridge__$LayerHostFacts(memory_limit_bytes: val.memory_limit_bytes, pids_limit: val.pids_limit, oom_killed: val.oom_killed); }()
    }
}
extension __swift_bridge__$LayerHostFacts {
    @inline(__always)
    func intoSwiftRepr() -> LayerHostFacts {
        { let val = self; return LayerHostFacts(memory_limit_bytes: val.memory_limit_bytes, pids_limit: val.pids_limit, oom_killed: val.oom_killed); }()
    }
}
extension __swift_bridge__$Option$LayerHostFacts {
    @inline(__always)
    func intoSwiftRepr() -> Optional<LayerHostFacts> {
        if self.is_some {
            return self.val.intoSwiftRepr()
        } else {
            return nil
        }
    }

    @inline(__always)
    static func fromSwiftRepr(_ val: Optional<LayerHostFacts>) -> __swift_bridge__$Option$LayerHostFacts {
        if let v = val {
            return __swift_bridge__$Option$LayerHostFacts(is_some: true, val: v.intoFfiRepr())
        } else {
            return __swift_bridge__$Option$LayerHostFacts(is_some: false, val: __swift_bridge__$LayerHostFacts())
        }
    }
}
public struct LayerHostProcesses {
    public var pid1: Int32
    public var agent: Int32

    public init(pid1: Int32,agent: Int32) {
        self.pid1 = pid1
        self.agent = agent
    }

    @inline(__always)
    func intoFfiRepr() -> __swift_bridge__$LayerHostProcesses {
        { let val = self; return __swift_bridge__$LayerHostProcesses(pid1: val.pid1, agent: val.agent); }()
    }
}
extension __swift_bridge__$LayerHostProcesses {
    @inline(__always)
    func intoSwiftRepr() -> LayerHostProcesses {
        { let val = self; return LayerHostProcesses(pid1: val.pid1, agent: val.agent); }()
    }
}
extension __swift_bridge__$Option$LayerHostProcesses {
    @inline(__always)
    func intoSwiftRepr() -> Optional<LayerHostProcesses> {
        if self.is_some {
            return self.val.intoSwiftRepr()
        } else {
            return nil
        }
    }

    @inline(__always)
    static func fromSwiftRepr(_ val: Optional<LayerHostProcesses>) -> __swift_bridge__$Option$LayerHostProcesses {
        if let v = val {
            return __swift_bridge__$Option$LayerHostProcesses(is_some: true, val: v.intoFfiRepr())
        } else {
            return __swift_bridge__$Option$LayerHostProcesses(is_some: false, val: __swift_bridge__$LayerHostProcesses())
        }
    }
}
public enum LayerError {
    case Unavailable(RustString)
    case NotFound(RustString)
    case Failed(RustString)
}
extension LayerError {
    func intoFfiRepr() -> __swift_bridge__$LayerError {
        switch self {
            case LayerError.Unavailable(let _0):
                return __swift_bridge__$LayerError(tag: __swift_bridge__$LayerError$Unavailable, payload: __swift_bridge__$LayerErrorFields(Unavailable: __swift_bridge__$LayerError$FieldOfUnavailable(_0: { let rustString = _0.intoRustString(); rustString.isOwned = false; return rustString.ptr }())))
            case LayerError.NotFound(let _0):
                return __swift_bridge__$LayerError(tag: __swift_bridge__$LayerError$NotFound, payload: __swift_bridge__$LayerErrorFields(NotFound: __swift_bridge__$LayerError$FieldOfNotFound(_0: { let rustString = _0.intoRustString(); rustString.isOwned = false; return rustString.ptr }())))
            case LayerError.Failed(let _0):
                return __swift_bridge__$LayerError(tag: __swift_bridge__$LayerError$Failed, payload: __swift_bridge__$LayerErrorFields(Failed: __swift_bridge__$LayerError$FieldOfFailed(_0: { let rustString = _0.intoRustString(); rustString.isOwned = false; return rustString.ptr }())))
        }
    }
}
extension __swift_bridge__$LayerError {
    func intoSwiftRepr() -> LayerError {
        switch self.tag {
            case __swift_bridge__$LayerError$Unavailable:
                return LayerError.Unavailable(RustString(ptr: self.payload.Unavailable._0))
            case __swift_bridge__$LayerError$NotFound:
                return LayerError.NotFound(RustString(ptr: self.payload.NotFound._0))
            case __swift_bridge__$LayerError$Failed:
                return LayerError.Failed(RustString(ptr: self.payload.Failed._0))
            default:
                fatalError("Unreachable")
        }
    }
}
extension __swift_bridge__$Option$LayerError {
    @inline(__always)
    func intoSwiftRepr() -> Optional<LayerError> {
        if self.is_some {
            return self.val.intoSwiftRepr()
        } else {
            return nil
        }
    }
    @inline(__always)
    static func fromSwiftRepr(_ val: Optional<LayerError>) -> __swift_bridge__$Option$LayerError {
        if let v = val {
            return __swift_bridge__$Option$LayerError(is_some: true, val: v.intoFfiRepr())
        } else {
            return __swift_bridge__$Option$LayerError(is_some: false, val: __swift_bridge__$LayerError())
        }
    }
}


