// swift-tools-version: 6.2
// The macOS helper: `sandbox-vm-helper`, a Swift executable whose `main` hands the process to
// the shared Rust helper service (a static library, through swift-bridge) and which implements
// that service's VM-layer seam on Apple's containerization.
//
// Targets:
// - SandboxHelperFFI: the C headers swift-bridge generates (committed by the Rust crate's
//   build.rs; never edited by hand) and the link to the Rust static library.
// - VMLayer: the VM layer on containerization, with no bridge types, so `swift test` runs it
//   without a VM and without the Rust library.
// - SandboxVMHelper: the executable: main.swift, the generated Swift glue, BridgeExports.swift.
import PackageDescription

/// Where `make helper` leaves the Rust static library (`cargo build --release -p
/// sandbox-helper-ffi --target aarch64-apple-darwin`); SANDBOX_MCP_RUST_LIB_DIR overrides it.
let rustLibDir =
    Context.environment["SANDBOX_MCP_RUST_LIB_DIR"]
    ?? "\(Context.packageDirectory)/../target/aarch64-apple-darwin/release"

/// The Rust crate's static library, lib<name>.a.
let rustLibName = Context.environment["SANDBOX_MCP_RUST_LIB_NAME"] ?? "sandbox_helper_ffi"

let package = Package(
    name: "sandbox-vm-helper",
    platforms: [.macOS("15.0")],
    products: [
        .executable(name: "sandbox-vm-helper", targets: ["SandboxVMHelper"]),
        .library(name: "VMLayer", targets: ["VMLayer"]),
    ],
    dependencies: [
        // The containerization release this helper is written and checked against: swift/api/
        // holds its public API list, and scripts/check-swift.py reads the version from this line.
        .package(url: "https://github.com/apple/containerization.git", exact: "0.40.2"),
        // FilePath, which containerization's EXT4 formatter takes (containerization's own floor).
        .package(url: "https://github.com/apple/swift-system.git", from: "1.6.4"),
    ],
    targets: [
        .target(
            name: "SandboxHelperFFI",
            path: "Sources/SandboxHelperFFI",
            linkerSettings: [
                .unsafeFlags(["-L", rustLibDir]),
                .linkedLibrary(rustLibName),
                // What a Rust static library of this crate needs from the system on macOS
                // (`cargo rustc --release -p sandbox-helper-ffi --target aarch64-apple-darwin -- --print
                // native-static-libs` prints the exact list).
                .linkedFramework("CoreFoundation"),
                .linkedFramework("Security"),
                .linkedFramework("SystemConfiguration"),
                .linkedLibrary("iconv"),
                .linkedLibrary("resolv"),
            ]
        ),
        .target(
            name: "VMLayer",
            dependencies: [
                .product(name: "Containerization", package: "containerization"),
                .product(name: "ContainerizationEXT4", package: "containerization"),
                .product(name: "ContainerizationOCI", package: "containerization"),
                .product(name: "ContainerizationArchive", package: "containerization"),
                .product(name: "ContainerizationExtras", package: "containerization"),
                .product(name: "SystemPackage", package: "swift-system"),
            ],
            path: "Sources/VMLayer"
        ),
        .executableTarget(
            name: "SandboxVMHelper",
            dependencies: ["SandboxHelperFFI", "VMLayer"],
            path: "Sources/SandboxVMHelper",
            // swift-bridge 0.1.59's glue captures its async calls' C-struct and pointer arguments
            // in `Task {}`, which Swift 6's region checks reject; the glue is generated, so this
            // target (glue and BridgeExports only) builds in Swift 5 mode. VMLayer stays in 6.
            swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .testTarget(
            name: "VMLayerTests",
            dependencies: [
                "VMLayer",
                .product(name: "Containerization", package: "containerization"),
            ],
            path: "Tests/VMLayerTests"
        ),
    ]
)
