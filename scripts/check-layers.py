#!/usr/bin/env python3
"""The workspace's structure, checked (issue 27; README, "The crates").

1. Each crate depends only on crates of lower layers (cargo already forbids
   circles between crates; this keeps the order: the agent never reaches the
   helper, the orchestrator never the helper's internals, the MCP surface
   only the orchestrator).
2. No Rust file is longer than MAX_LINES.

Reads `cargo metadata`, prints the crates by layer, and exits 1 naming each
breach."""
import json
import pathlib
import subprocess
import sys

# Bottom first. A crate may use any crate of a lower layer, none of its own or above.
LAYERS = [
    ("foundations", ["sandbox-base", "sandbox-contract", "sandbox-ctl"]),
    ("building blocks", ["sandbox-agent", "sandbox-net", "sandbox-userns"]),
    ("guest and images", ["sandbox-guest", "sandbox-image"]),
    ("helper and orchestrator", ["sandbox-helper", "sandbox-orchestrator"]),
    ("surfaces", ["sandbox-mcp-tools", "sandbox-helper-ffi"]),
    ("binaries", ["sandbox-mcp"]),
]
MAX_LINES = 800
ROOT = pathlib.Path(__file__).resolve().parent.parent


def main() -> int:
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--quiet"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout)
    layer = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}
    ours = {p["name"]: p for p in meta["packages"]}
    problems = []
    for name in ours:
        if name not in layer:
            problems.append(f"{name}: a crate of the workspace in no layer of scripts/check-layers.py")
    for name, p in sorted(ours.items(), key=lambda kv: layer.get(kv[0], 99)):
        uses = sorted({d["name"] for d in p["dependencies"] if d["name"] in ours and d["kind"] != "dev"})
        for u in uses:
            if layer.get(u, 99) >= layer.get(name, -1):
                problems.append(f"{name} depends on {u}, which is not below it")
    for i, (title, names) in enumerate(LAYERS):
        print(f"layer {i} ({title}):")
        for n in names:
            uses = sorted({d["name"] for d in ours[n]["dependencies"] if d["name"] in ours} if n in ours else [])
            print(f"    {n}" + (f" -> {', '.join(uses)}" if uses else ""))
    for path in sorted(ROOT.glob("**/*.rs")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("target", ".git") or "target" in rel.parts:
            continue
        n = sum(1 for _ in path.open(encoding="utf-8", errors="replace"))
        if n > MAX_LINES:
            problems.append(f"{rel}: {n} lines (at most {MAX_LINES}: split it by responsibility)")
    for p in problems:
        print(f"check-layers: {p}", file=sys.stderr)
    if not problems:
        print(f"check-layers: every crate depends only on lower layers; no Rust file over {MAX_LINES} lines")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
