// The helper's entry point: the whole process is the shared Rust helper service (gRPC on a
// Unix socket, reflection, health, the agent protocol), given this process's arguments
// (`sandbox-vm-helper serve [--socket PATH]`; the guest's agent is the Linux build of the
// Rust binary, not this one). It runs on a
// thread of its own while the main thread serves Dispatch's main queue, which
// Virtualization.framework and Foundation may call back on; the process exits with the
// status the service returns.
import Foundation

// Rust's own `main` would ignore SIGPIPE; here Swift's is the process's main, so a write to a
// peer that hung up (a client, an agent stream) must not kill the helper.
signal(SIGPIPE, SIG_IGN)

// Every VM holds descriptors (its disks, frame socket, vsock streams, one per client stream):
// raise the soft limit (macOS refuses one above OPEN_MAX).
var limit = rlimit()
if getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max {
    limit.rlim_cur = min(limit.rlim_max, rlim_t(OPEN_MAX))
    _ = setrlimit(RLIMIT_NOFILE, &limit)
}

/// The service's thread: it owns the arguments it is given, and ends the process.
func serviceThread(_ args: [String]) -> Thread {
    let thread = Thread {
        let arguments = RustVec<RustString>()
        for argument in args {
            arguments.push(value: argument.intoRustString())
        }
        exit(helper_main(arguments))
    }
    thread.name = "sandbox-vm-helper service"
    thread.stackSize = 8 << 20
    return thread
}

serviceThread(CommandLine.arguments).start()
dispatchMain()
