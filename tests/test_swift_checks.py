"""The Swift helper's Linux checks (issue 13): scripts/check-swift.py and scripts/swift-api-list.py.

No Swift toolchain runs here. These tests prove the checker itself: a syntax error fails naming
its place, a containerization symbol missing from the pinned version's list fails naming it (and
so do wrong argument labels, an ambiguous name and an unknown module), the committed tree passes,
and the list is made from a checkout by the committed script, saying how.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHECK = REPO / "scripts" / "check-swift.py"
LIST = REPO / "scripts" / "swift-api-list.py"
API = REPO / "swift" / "api" / "containerization-0.40.2.txt"
ALLOW = REPO / "swift" / "api" / "platform-allowlist.txt"

pytest.importorskip("tree_sitter")
pytest.importorskip("tree_sitter_swift")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)


def package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A Swift package pinned like the real one, with the real API list and allowlist."""
    root = tmp_path / "swift"
    (root / "api").mkdir(parents=True)
    shutil.copy(API, root / "api" / API.name)
    shutil.copy(ALLOW, root / "api" / ALLOW.name)
    (root / "Package.swift").write_text(
        '// swift-tools-version: 6.2\nimport PackageDescription\n'
        'let package = Package(name: "t", dependencies: [\n'
        '    .package(url: "https://github.com/apple/containerization.git", exact: "0.40.2")\n])\n'
    )
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


GOOD = """import Containerization
import Foundation

func boot(container: LinuxContainer) async throws -> FileHandle {
    var config = LinuxContainer.Configuration()
    config.cpus = 2
    config.process.arguments = ["/agent"]
    let rootfs = Mount.block(format: "ext4", source: "/r.ext4", destination: "/")
    _ = rootfs
    try await container.create()
    return try await container.dialVsock(port: 5)
}
"""


def test_the_committed_tree_passes() -> None:
    r = run(str(CHECK))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 problem(s), ok" in r.stdout
    # Every Swift file of the package was parsed, and the VM layer was checked.
    assert "Swift files parsed" in r.stdout


def test_a_clean_package_passes(tmp_path: Path) -> None:
    root = package(tmp_path, {"Sources/A/Good.swift": GOOD})
    r = run(str(CHECK), "--root", str(root))
    assert r.returncode == 0, r.stdout


def test_a_syntax_error_fails_naming_the_place(tmp_path: Path) -> None:
    bad = "struct S {\n    func f() {\n        let x = (1, \n    }\n}\n"
    root = package(tmp_path, {"Sources/A/Good.swift": GOOD, "Sources/A/Broken.swift": bad})
    r = run(str(CHECK), "--root", str(root))
    assert r.returncode == 1
    lines = [l for l in r.stdout.splitlines() if "Broken.swift:" in l]
    assert lines, r.stdout
    # path:line:column: what
    place = lines[0].split(": ", 1)[0]
    path, line, col = place.rsplit(":", 2)
    assert path.endswith("Sources/A/Broken.swift")
    assert int(line) >= 3 and int(col) >= 1
    assert "Good.swift" not in r.stdout


def test_a_symbol_not_in_the_list_fails_naming_it(tmp_path: Path) -> None:
    text = GOOD.replace("container.dialVsock(port: 5)", "container.dialVsocket(port: 5)")
    root = package(tmp_path, {"Sources/A/Uses.swift": text})
    r = run(str(CHECK), "--root", str(root))
    assert r.returncode == 1
    assert "Sources/A/Uses.swift:11:" in r.stdout
    assert "LinuxContainer has no public member dialVsocket in containerization 0.40.2" in r.stdout


def test_an_unknown_type_and_member_fail(tmp_path: Path) -> None:
    text = GOOD.replace("config.cpus = 2", "config.cpuCount = 2").replace(
        "func boot(container: LinuxContainer)", "func boot(container: LinuxContainr)"
    )
    root = package(tmp_path, {"Sources/A/Uses.swift": text})
    r = run(str(CHECK), "--root", str(root))
    assert r.returncode == 1
    assert "Uses.swift:4:" in r.stdout and "unknown type LinuxContainr" in r.stdout
    assert "Uses.swift:6:" in r.stdout and "LinuxContainer.Configuration has no public member cpuCount" in r.stdout


def test_wrong_argument_labels_fail(tmp_path: Path) -> None:
    text = GOOD.replace('Mount.block(format: "ext4"', 'Mount.block(fs: "ext4"')
    root = package(tmp_path, {"Sources/A/Uses.swift": text})
    r = run(str(CHECK), "--root", str(root))
    assert r.returncode == 1
    assert "Mount.block(fs:source:destination:) fits no overload" in r.stdout
    assert "format:source:destination:options=:runtimeOptions=:" in r.stdout


def test_an_ambiguous_name_and_an_unknown_module_fail(tmp_path: Path) -> None:
    text = "import Containerization\nimport ContainerizationOCI\nimport ContainerizationGPU\n" + GOOD.split("\n", 1)[1]
    root = package(tmp_path, {"Sources/A/Uses.swift": text})
    r = run(str(CHECK), "--root", str(root))
    assert r.returncode == 1
    assert "module ContainerizationGPU is not a library of containerization 0.40.2" in r.stdout
    assert "Mount is ambiguous here (declared in Containerization and ContainerizationOCI" in r.stdout


def test_files_not_importing_containerization_are_only_parsed(tmp_path: Path) -> None:
    root = package(tmp_path, {"Sources/A/Good.swift": GOOD, "Sources/B/Other.swift": "func f() { Whatever.thing() }\n"})
    r = run(str(CHECK), "--root", str(root))
    assert r.returncode == 0, r.stdout


def test_a_package_without_a_pinned_version_fails(tmp_path: Path) -> None:
    root = package(tmp_path, {"Sources/A/Good.swift": GOOD})
    (root / "Package.swift").write_text('// swift-tools-version: 6.2\nimport PackageDescription\n')
    r = run(str(CHECK), "--root", str(root))
    assert r.returncode == 1
    assert "no `containerization.git\", exact:" in r.stdout


def test_the_list_says_how_it_was_made() -> None:
    head = API.read_text().splitlines()[:8]
    assert head[0].startswith("# apple/containerization 0.40.2 (commit 5796abeaea5c25da3a0f32b6edee9219c7754c5b)")
    assert any("scripts/swift-api-list.py CHECKOUT --tag 0.40.2 --commit 5796abea" in l for l in head)
    assert any(l.startswith("# Modules: Containerization ") for l in head)
    # Names and labels only: no line carries source code.
    for line in API.read_text().splitlines():
        if not line.startswith("#"):
            assert len(line.split("\t")) == 6, line
            assert "{" not in line.replace("{}", ""), line


def test_the_list_script_reads_public_declarations(tmp_path: Path) -> None:
    src = tmp_path / "co" / "Sources"
    for module in (
        "Containerization", "ContainerizationArchive", "ContainerizationEXT4", "ContainerizationError",
        "ContainerizationExtras", "ContainerizationIO", "ContainerizationNetlink", "ContainerizationOCI",
        "ContainerizationOS",
    ):
        (src / module).mkdir(parents=True)
    (src / "Containerization" / "Box.swift").write_text(
        "public struct Box: Sendable {\n"
        "    public var size: Int = 1\n"
        "    var hidden: Int = 0\n"
        "    public init(_ name: String, size: Int = 1, body: @escaping () -> Void) {}\n"
        "    public func open(at path: String) async throws -> Lid { Lid() }\n"
        "    public enum Kind { case small, large }\n"
        "}\n"
        "struct Internal { public func no() {} }\n"
        "extension Box: Equatable { public static func == (a: Box, b: Box) -> Bool { true } }\n"
    )
    r = run(str(LIST), str(tmp_path / "co"), "--tag", "9.9.9", "--commit", "abc")
    assert r.returncode == 0, r.stderr
    body = [l for l in r.stdout.splitlines() if not l.startswith("#")]
    assert "type\tContainerization\tBox\t-\tstruct\tSendable" in body
    assert "var\tContainerization\tBox.size\t-\tInt\t-" in body
    assert "init\tContainerization\tBox.init\t_:size=:body{}:\tBox\t-" in body
    assert "func\tContainerization\tBox.open\tat:\tLid\t-" in body
    assert "case\tContainerization\tBox.Kind.small\t-\tBox.Kind\t-" in body
    assert "conformance\tContainerization\tBox\t-\textension\tEquatable" in body
    assert not any("hidden" in l or "Internal" in l for l in body)
    assert r.stdout.startswith("# apple/containerization 9.9.9 (commit abc)")


GLUE = """import SandboxHelperFFI
@_cdecl("__swift_bridge__$layer_kill")
func __swift_bridge__layer_kill (_ id: UnsafeMutableRawPointer) {
    layer_kill(id: RustString(ptr: id))
}
@_cdecl("__swift_bridge__$layer_dial_agent")
func __swift_bridge__layer_dial_agent (_ cb: UnsafeMutableRawPointer, _ id: UnsafeMutableRawPointer) {
    Task {
        let result = try await layer_dial_agent(id: RustString(ptr: id))
        _ = result
    }
}
func __swift_bridge__layer_dial_agent__TypedThrowsCheck(_ id: UnsafeMutableRawPointer, _: LayerError.Type) async throws(LayerError) {
    _ = try await layer_dial_agent(id: RustString(ptr: id))
}
"""


def test_the_bridge_functions_the_glue_calls_must_be_declared_as_called(tmp_path: Path) -> None:
    good = (
        "extension LayerError: @unchecked Sendable {}\n"
        "extension LayerError: Error {}\n"
        "func layer_kill(id: RustString) {}\n"
        "func layer_dial_agent(id: RustString) async throws(LayerError) -> Int32 { 3 }\n"
    )
    root = package(tmp_path, {"Sources/H/Generated/glue.swift": GLUE, "Sources/H/BridgeExports.swift": good})
    r = run(str(CHECK), "--root", str(root))
    assert r.returncode == 0, r.stdout

    # The glue declares the error enum bare: typed throws of it need an Error conformance.
    (root / "Sources/H/BridgeExports.swift").write_text(good.split("\n", 2)[2])
    r = run(str(CHECK), "--root", str(root))
    assert r.returncode == 1
    assert "the bridge's glue throws LayerError, which conforms to Error nowhere in the package" in r.stdout

    bad = "func layer_kill(vm: RustString) {}\nfunc layer_dial_agent(id: RustString) throws -> Int32 { 3 }\n"
    (root / "Sources/H/BridgeExports.swift").write_text(bad)
    r = run(str(CHECK), "--root", str(root))
    assert r.returncode == 1
    assert "Generated/glue.swift:4:5: the bridge's glue calls layer_kill(id:); declared with other labels: (vm:)" in r.stdout
    assert "awaits layer_dial_agent(id:); its declaration is not async" in r.stdout
    assert "needs layer_dial_agent(id:) to throw LayerError (typed throws)" in r.stdout

    (root / "Sources/H/BridgeExports.swift").write_text("func layer_kill(id: RustString) {}\n")
    r = run(str(CHECK), "--root", str(root))
    assert "the bridge's glue calls layer_dial_agent(id:), which no Swift file of the package declares" in r.stdout


def test_dollar_identifiers_of_the_glue_parse() -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    import swift_syntax

    tree = swift_syntax.parse(b"func f() -> __swift_bridge__$LayerInfo { __swift_bridge__$x($0) }\n")
    assert list(swift_syntax.syntax_errors(tree)) == []


def test_names_are_typed_per_function_and_through_casts(tmp_path: Path) -> None:
    text = (
        "import Containerization\n"
        "func a(x: LinuxContainer) async throws { _ = try await x.dialVsok(port: 1) }\n"
        "func b(x: ImageStore) async throws { _ = try await x.get(reference: \"r\") }\n"
        "func c(agent: any VirtualMachineAgent) async throws {\n"
        "    guard let v = agent as? Vminitd else { return }\n"
        "    try await v.filesystemOp(operation: FilesystemOperation.freeze, path: \"/\")\n"
        "}\n"
    )
    root = package(tmp_path, {"Sources/A/Uses.swift": text})
    r = run(str(CHECK), "--root", str(root))
    assert r.returncode == 1
    assert "Uses.swift:2:" in r.stdout and "LinuxContainer has no public member dialVsok" in r.stdout
    assert "Uses.swift:3:" not in r.stdout
    assert "Uses.swift:6:" in r.stdout and "Vminitd has no public member filesystemOp" in r.stdout
