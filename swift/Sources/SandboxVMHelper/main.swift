// The helper's entry point: the whole process is the shared Rust helper service (gRPC on a
// Unix socket, reflection, health, the agent protocol), given this process's arguments
// (`serve --socket PATH`, or `agent ...` and the others the Linux binary has). It runs on a
// thread of its own while the main thread serves Dispatch's main queue, which
// Virtualization.framework and Foundation may call back on; the process exits with the
// status the service returns.
import Foundation

let service = Thread {
    let arguments = RustVec<RustString>()
    for argument in CommandLine.arguments {
        arguments.push(value: argument.intoRustString())
    }
    exit(helper_main(arguments))
}
service.name = "sandbox-vm-helper service"
service.stackSize = 8 << 20
service.start()
dispatchMain()
