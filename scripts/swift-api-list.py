#!/usr/bin/env python3
"""Writes the public API of apple/containerization, names only, from a checkout of one tag:

    scripts/swift-api-list.py CHECKOUT --tag 0.40.2 --commit SHA > swift/api/containerization-0.40.2.txt

CHECKOUT is a tree of that tag (`git archive TAG Sources | tar -x -C DIR`, or a clone). Every
.swift file under CHECKOUT/Sources/<Module>/ of the library modules below is parsed with
tree-sitter-swift, and each `public`/`open` declaration becomes one tab-separated line:

    kind  module  qualified name  params  result  inherits

- kind: type, func, init, var, case, typealias, conformance (an extension adding protocols).
- params: the argument labels at a call site, each `label:`, `=` before the colon when it has a
  default value, `{}` when it takes a function (a trailing closure may supply it); `-` when the
  declaration is not called.
- result: a function's result type, a variable's type (declared, or `T` of `= T(...)`), a type's
  kind (class, struct, enum, actor, protocol); `-` when not spelled.
- Members of `public` protocols and cases of `public` enums count as public; members of a
  `public extension` too, unless marked otherwise.

It lists names and labels, not types of parameters: it is data for scripts/check-swift.py, made
from the sources, never a copy of them. tree-sitter-swift does not parse every construct of
Swift 6.2 (`sending`, `nonisolated(unsafe) let`, `resume(returning: ())`); declarations inside
its error nodes are still read, and the header says how many files had them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import swift_syntax as ss  # noqa: E402

# The library products of Package.swift (cctl, the guest's VminitdCore and CloudHypervisor are
# not used by the helper).
MODULES = (
    "Containerization",
    "ContainerizationArchive",
    "ContainerizationEXT4",
    "ContainerizationError",
    "ContainerizationExtras",
    "ContainerizationIO",
    "ContainerizationNetlink",
    "ContainerizationOCI",
    "ContainerizationOS",
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", type=Path)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--commit", required=True)
    args = ap.parse_args()

    lines: list[str] = []
    files = with_errors = 0
    for module in MODULES:
        root = args.checkout / "Sources" / module
        if not root.is_dir():
            print(f"swift-api-list: no {root}", file=sys.stderr)
            return 1
        for path in ss.source_files(root):
            files += 1
            tree = ss.parse(path.read_bytes())
            if tree.root_node.has_error:
                with_errors += 1
            for d in ss.declarations(tree):
                if d.public:
                    lines.append(ss.list_line(module, d))

    out = sys.stdout
    out.write(f"# apple/containerization {args.tag} (commit {args.commit}): public API, names only.\n")
    out.write(f"# Made by: scripts/swift-api-list.py CHECKOUT --tag {args.tag} --commit {args.commit}\n")
    out.write(f"#   from `git archive {args.tag} Sources` of apple/containerization, parsed with\n")
    out.write(f"#   tree-sitter {version('tree-sitter')} and tree-sitter-swift {version('tree-sitter-swift')}.\n")
    out.write(f"# Modules: {' '.join(MODULES)}\n")
    out.write(f"# Files: {files}, of which {with_errors} had tree-sitter error nodes (declarations in them still read).\n")
    out.write("# Columns (tab-separated): " + " ".join(ss.LIST_COLUMNS) + " (see the script's header).\n")
    for line in sorted(set(lines)):
        out.write(line + "\n")
    return 0


def version(dist: str) -> str:
    from importlib.metadata import version as v

    return v(dist)


if __name__ == "__main__":
    sys.exit(main())
