//! The swift-bridge glue committed in the Swift package (swift/) is the
//! glue build.rs generates from rust/helper/driver/swift/bridge.rs. A
//! colleague's Swift builds against the committed copy, on a Mac, where
//! this crate is a static library: a bridge change that is not refreshed
//! there would break that build only, so it fails here.
//!
//! `make swift-glue` refreshes the copy (this test, with
//! `SANDBOX_MCP_WRITE_SWIFT_GLUE=1`).
use std::path::{Path, PathBuf};

/// Where build.rs writes the glue.
const GENERATED: &str = concat!(env!("OUT_DIR"), "/swift-glue");

/// SwiftPM has no bridging header: the Swift files import the C target.
const SWIFT_PRELUDE: &str = "import SandboxHelperFFI\n";

/// Each generated file, where the Swift package keeps it, and whether it
/// is Swift (gets the import).
fn glue() -> Vec<(PathBuf, PathBuf, bool)> {
    let generated = Path::new(GENERATED);
    let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("swift/Sources");
    let crate_name = env!("CARGO_PKG_NAME");
    let include = package.join("SandboxHelperFFI/include");
    let swift = package.join("SandboxVMHelper/Generated");
    vec![
        (generated.join("SwiftBridgeCore.h"), include.join("SwiftBridgeCore.h"), false),
        (generated.join(crate_name).join(format!("{crate_name}.h")), include.join(format!("{crate_name}.h")), false),
        (generated.join("SwiftBridgeCore.swift"), swift.join("SwiftBridgeCore.swift"), true),
        (
            generated.join(crate_name).join(format!("{crate_name}.swift")),
            swift.join(format!("{crate_name}.swift")),
            true,
        ),
    ]
}

fn expected(generated: &Path, is_swift: bool) -> String {
    let text = std::fs::read_to_string(generated).unwrap_or_else(|e| panic!("read {}: {e}", generated.display()));
    if is_swift { format!("{SWIFT_PRELUDE}{text}") } else { text }
}

#[test]
fn committed_swift_glue_is_the_generated_glue() {
    let write = std::env::var_os("SANDBOX_MCP_WRITE_SWIFT_GLUE").is_some();
    let mut stale = Vec::new();
    for (generated, committed, is_swift) in glue() {
        let want = expected(&generated, is_swift);
        if write {
            std::fs::create_dir_all(committed.parent().unwrap()).unwrap();
            std::fs::write(&committed, &want).unwrap_or_else(|e| panic!("write {}: {e}", committed.display()));
            continue;
        }
        match std::fs::read_to_string(&committed) {
            Ok(have) if have == want => {}
            Ok(_) => stale.push(format!("{} differs from the generated glue", committed.display())),
            Err(e) => stale.push(format!("{}: {e}", committed.display())),
        }
    }
    assert!(stale.is_empty(), "{}\nrun `make swift-glue` and commit the result", stale.join("\n"));
}

/// The C side of the glue compiles as C, as clang compiles it into the
/// Swift package's module: swift-bridge writes a struct's typedef where the
/// bridge declares it, so a shared struct used by another before its own
/// declaration leaves the other with a field of incomplete type, which
/// only a C compiler sees. Linux has one (`cc`, as every build of a
/// `-sys` crate needs).
#[test]
fn the_glues_c_headers_compile() {
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("swift/Sources/SandboxHelperFFI/include");
    let dir = std::env::temp_dir().join(format!("smcp-glue-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("glue.c");
    // The headers use these types without including their headers (Swift's
    // clang module imports them); a C file includes them first.
    std::fs::write(&source, "#include <stdint.h>\n#include <stdbool.h>\n#include \"SandboxHelperFFI.h\"\n").unwrap();
    let out = std::process::Command::new("cc")
        .args(["-fsyntax-only", "-Werror", "-I"])
        .arg(&include)
        .arg(&source)
        .output()
        .expect("run cc");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "the glue's headers do not compile:\n{}", String::from_utf8_lossy(&out.stderr));
}
