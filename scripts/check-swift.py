#!/usr/bin/env python3
"""CI's checks of the Swift helper, on a machine with no Swift toolchain:

    scripts/check-swift.py [--root swift] [--api swift/api/containerization-VERSION.txt]

1. Syntax: every .swift file under ROOT (.build/ excepted) is parsed with tree-sitter-swift; any
   ERROR or MISSING node fails, named `file:line:column`.
2. The containerization API: in every file that imports a Containerization* module, each use of a
   name from that package must be in the committed list of the pinned version's public API
   (made by scripts/swift-api-list.py; the version is read from swift/Package.swift):
   - every type spelled (annotations, casts, inheritance, generic arguments, initializer calls,
     static member bases) must be the package's own (declared under ROOT), a platform name in
     swift/api/platform-allowlist.txt (Swift, Foundation, Virtualization, XCTest), or a public
     type of containerization;
   - every member used on a containerization type (static, or on a value whose type the checker
     can tell: declared, `= T(...)`, a member's declared result, `catch let e as T`, `if let`)
     must be public there, on the type or what it inherits from, and a call's argument labels
     must fit one of its overloads (defaults may be left out, trailing closures take the
     function parameters);
   - each imported Containerization* module must be one the list covers.
3. The bridge: every function swift-bridge's generated glue (a Generated/ directory) calls, one
   per `extern "Swift"` function of rust/helper/driver/swift/bridge.rs, must be declared in the
   package outside Generated/ with the argument labels the glue uses, `async` where the glue
   awaits it and `throws(E)` where the glue checks for typed throws.
   What it cannot see it does not check: a value of unknown type (an implicit member `.foo`,
   an untyped closure parameter). Write such uses with explicit types where it matters. It is
   a check of names, not a type checker: `swift build` on a Mac is the proof.

Failures print one line each, `path:line:column: message`, and the exit status is 1.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import swift_syntax as ss  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# Words tree-sitter-swift reads as type names in some positions (`@Sendable () async -> T`).
# Nodes that open a scope for the names declared in them.
SCOPES = {"function_declaration", "init_declaration", "lambda_literal", "computed_property", "deinit_declaration",
          "subscript_declaration"}
NOT_TYPES = {"async", "throws", "rethrows", "unchecked", "escaping", "sending", "isolated", "autoclosure"}


@dataclass
class Member:
    kind: str
    module: str
    params: list[ss.Param] | None
    result: str


@dataclass
class Api:
    version: str
    modules: set[str]
    types: dict[str, tuple[str, str, list[str]]]  # qualified -> (module, kind, inherits)
    modules_of: dict[str, set[str]]  # qualified type -> every module declaring it
    members: dict[str, list[Member]]  # "Type.member" -> overloads
    by_last: dict[str, set[str]] = field(default_factory=dict)  # last component -> qualified types

    @classmethod
    def load(cls, path: Path) -> "Api":
        version = re.sub(r"^containerization-|\.txt$", "", path.name)
        modules: set[str] = set()
        types: dict[str, tuple[str, str, list[str]]] = {}
        modules_of: dict[str, set[str]] = {}
        members: dict[str, list[Member]] = {}
        extra: dict[str, list[str]] = {}
        for line in path.read_text().splitlines():
            if line.startswith("# Modules:"):
                modules = set(line.split(":", 1)[1].split())
            if not line or line.startswith("#"):
                continue
            kind, module, name, params, result, inherits = line.split("\t")
            inh = [] if inherits == "-" else inherits.split(",")
            if kind == "type" or kind == "typealias":
                old = types.get(name)
                types[name] = (module, result if kind == "type" else "typealias", inh + (old[2] if old else []))
                modules_of.setdefault(name, set()).add(module)
            elif kind == "conformance":
                extra.setdefault(name, []).extend(inh)
            else:
                members.setdefault(name, []).append(
                    Member(kind, module, ss.parse_params(params), "" if result == "-" else result)
                )
        for name, inh in extra.items():
            if name in types:
                m, k, i = types[name]
                types[name] = (m, k, i + inh)
        api = cls(version, modules, types, modules_of, members)
        for q in types:
            api.by_last.setdefault(q.rsplit(".", 1)[-1], set()).add(q)
        return api

    def resolve(self, spelled: str, context: str = "") -> str | None:
        """The qualified containerization type `spelled` names, looked up from inside `context`."""
        parts = spelled.split(".")
        if parts[0] in self.modules and len(parts) > 1:
            rest = ".".join(parts[1:])
            if parts[0] in self.modules_of.get(rest, set()):
                return rest
            # A module and a type may share a name (ContainerizationError): try the type.
        scope = context
        while True:
            q = f"{scope}.{spelled}" if scope else spelled
            if q in self.types:
                return q
            if not scope:
                return None
            scope = scope.rsplit(".", 1)[0] if "." in scope else ""

    def lookup(self, type_q: str, member: str, seen: set[str] | None = None) -> tuple[str, list[Member]] | None:
        """(owner, overloads) of `member` on a type, its extensions, or what it inherits from."""
        seen = seen or set()
        if type_q in seen:
            return None
        seen.add(type_q)
        found = self.members.get(f"{type_q}.{member}")
        if found:
            return type_q, found
        if member in ("init",) and type_q in self.types and self.types[type_q][1] == "typealias":
            return None
        for parent in self.types.get(type_q, ("", "", []))[2]:
            pq = self.resolve(ss.simple_type(parent), type_q.rsplit(".", 1)[0] if "." in type_q else "")
            if pq:
                hit = self.lookup(pq, member, seen)
                if hit:
                    return hit
        return None

    def foreign_parents(self, type_q: str) -> bool:
        """Whether the type inherits from something outside the list (Error, Equatable...)."""
        for parent in self.types.get(type_q, ("", "", []))[2]:
            if self.resolve(ss.simple_type(parent)) is None:
                return True
        return False


@dataclass
class Allow:
    types: set[str]
    members: set[str]

    @classmethod
    def load(cls, path: Path) -> "Allow":
        types: set[str] = set()
        members: set[str] = set()
        section = types
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line == "[members]":
                section = members
            elif line == "[types]":
                section = types
            elif line:
                section.update(line.split())
        return cls(types, members)


def labels_fit(params: list[ss.Param], labels: list[str], trailing: int) -> bool:
    i = 0

    def take(fits) -> bool:
        """Moves past the next parameter that `fits`, skipping only defaulted ones."""
        nonlocal i
        while i < len(params) and not fits(params[i]):
            if not params[i].defaulted:
                return False
            i += 1
        if i == len(params):
            return False
        i += 1
        return True

    for lab in labels:
        if not take(lambda p, lab=lab: p.label == lab):
            return False
    for _ in range(trailing):
        if not take(lambda p: p.closure):
            return False
    return all(p.defaulted for p in params[i:])


def spell_call(labels: list[str], trailing: int) -> str:
    return "(" + "".join(f"{l}:" for l in labels) + ")" + (" {…}" * trailing)


class FileCheck:
    def __init__(self, path: Path, rel: str, tree, api: Api, allow: Allow, ours: set[str]):
        self.path, self.rel, self.tree = path, rel, tree
        self.api, self.allow, self.ours = api, allow, ours
        self.errors: list[str] = []
        # (scope, name) -> qualified cz type, None when ambiguous; scope is the id of the
        # enclosing function, initializer, closure or computed property, None at type level.
        self.vars: dict[tuple[int | None, str], str | None] = {}
        self.prev: dict[tuple[int | None, str], str | None] = {}  # the previous round's, while collecting
        self.generics: set[str] = set()
        self.done: set[int] = set()
        self.imports: set[str] = set()
        self.uses = 0  # containerization types and members checked
        self.seen: list[str] = []  # each of them, for --verbose
        for n in tree.root_node.named_children:
            if n.type == "import_declaration":
                self.imports.add(ss.text(n).split()[-1])

    def fail(self, node, msg: str) -> None:
        self.errors.append(f"{self.rel}:{node.start_point[0] + 1}:{node.start_point[1] + 1}: {msg}")

    # -- names -------------------------------------------------------------------------------

    def kind_of(self, spelled: str) -> str:
        """ours, platform, cz or unknown, by the first component (module-qualified aside)."""
        first = spelled.split(".")[0]
        if first in self.generics or first in ("Self", "Type", "Protocol"):
            return "ours"
        if first in self.ours:
            return "ours"
        if first in self.api.modules:
            return "cz" if self.api.resolve(spelled) else "unknown"
        if self.api.resolve(spelled):
            return "cz"
        if first in self.allow.types:
            return "platform"
        return "unknown"

    @staticmethod
    def scopes(node) -> list[int | None]:
        """The scopes a name used at `node` may come from, innermost first."""
        out: list[int | None] = []
        n = node.parent if node is not None else None
        while n is not None:
            if n.type in SCOPES:
                out.append(n.id)
            n = n.parent
        return out + [None]

    def note_var(self, name: str, qualified: str | None, node) -> None:
        if not name:
            return
        key = (self.scopes(node)[0], name)
        if key in self.vars and self.vars[key] != qualified:
            self.vars[key] = None  # declared twice in one scope with different types: not checked
        else:
            self.vars[key] = qualified

    def lookup_var(self, name: str, node) -> tuple[bool, str | None]:
        """(declared, qualified cz type) of a name used at `node`; `node` None: type level only."""
        for scope in (self.scopes(node) if node is not None else [None]):
            for table in (self.vars, self.prev):
                if (scope, name) in table:
                    return True, table[(scope, name)]
        return False, None

    def var(self, name: str, node) -> str | None:
        return self.lookup_var(name, node)[1]

    def is_var(self, name: str, node) -> bool:
        return self.lookup_var(name, node)[0]

    def cz_type(self, spelled: str) -> str | None:
        s = ss.simple_type(spelled)
        if not s or s.startswith("[") or s.startswith("("):
            return None
        return self.api.resolve(s) if self.kind_of(s) == "cz" else None

    # -- pass 1: declarations of values with a type the checker can tell ------------------------

    def collect(self) -> None:
        stack = [self.tree.root_node]
        while stack:
            n = stack.pop()
            stack.extend(n.named_children)
            if n.type == "type_parameter":
                for c in n.named_children:
                    if c.type == "type_identifier":
                        self.generics.add(ss.text(c))
                        break
        # In source order, twice: a value typed from one declared later in the file (a property
        # below the method using it) counts in the second round, which reads the first's table.
        for _ in range(2):
            self.prev, self.vars = self.vars, {}
            stack = [self.tree.root_node]
            while stack:
                n = stack.pop()
                stack.extend(reversed(n.named_children))
                self.collect_one(n)
        self.prev = {}

    def collect_one(self, n) -> None:
        t = n.type
        if t in ("parameter", "lambda_parameter"):
            names = ss.children_by_field(n, "name")
            if len(names) >= 2:
                self.note_var(ss.text(names[0]), self.cz_type(ss.type_path(names[-1])), n)
        elif t == "property_declaration":
            annotated = None
            for a in n.children:
                if a.type == "type_annotation":
                    annotated = ss.type_path(a.child_by_field_name("name"))
            value = n.child_by_field_name("value")
            for p in ss.children_by_field(n, "name"):
                bound = p.child_by_field_name("bound_identifier")
                if bound is None:
                    continue
                if annotated:
                    self.note_var(ss.text(bound), self.cz_type(annotated), n)
                elif value is not None:
                    self.note_var(ss.text(bound), self.expr_type(value), n)
        elif t == "catch_block":
            err = n.child_by_field_name("error")
            if err is not None:
                inner = [c for c in err.named_children if c.type == "pattern"]
                tnode = err.child_by_field_name("name")
                if inner and tnode is not None:
                    bound = inner[0].child_by_field_name("bound_identifier")
                    if bound is not None:
                        self.note_var(ss.text(bound), self.cz_type(ss.type_path(tnode)), n.named_children[-1] if n.named_children else n)
        elif t in ("if_statement", "guard_statement"):
            children = n.children
            for i, c in enumerate(children):
                if n.field_name_for_child(i) == "bound_identifier":
                    for j in range(i + 1, len(children)):
                        if n.field_name_for_child(j) == "condition" and children[j].is_named:
                            self.note_var(ss.text(c), self.expr_type(children[j]), n)
                            break

    # -- expression types ----------------------------------------------------------------------

    def unwrap(self, n):
        while n is not None and n.type in ("try_expression", "await_expression", "parenthesized_expression"):
            nxt = n.child_by_field_name("expr")
            n = nxt if nxt is not None else (n.named_children[-1] if n.named_children else None)
        return n

    def nav_parts(self, n) -> list[str] | None:
        """`A.b.c` of a navigation chain of plain names, else None."""
        if n.type == "simple_identifier":
            return [ss.text(n)]
        if n.type == "navigation_expression":
            target = n.child_by_field_name("target")
            suffix = n.child_by_field_name("suffix")
            if target is None or suffix is None:
                return None
            name = suffix.child_by_field_name("suffix")
            head = self.nav_parts(target)
            if head is None or name is None or name.type != "simple_identifier":
                return None
            return head + [ss.text(name)]
        if n.type == "user_type":
            return [ss.text(c) for c in n.named_children if c.type == "type_identifier"]
        return None

    def static_split(self, parts: list[str], node) -> tuple[str, list[str]] | None:
        """(qualified cz type, members after it) when a chain starts with a containerization type."""
        if not parts or self.kind_of(parts[0]) not in ("cz", "unknown") or self.is_var(parts[0], node):
            return None
        if not parts[0][:1].isupper():
            return None
        for k in range(len(parts), 0, -1):
            q = self.api.resolve(".".join(parts[:k]))
            if q:
                return q, parts[k:]
        return None

    def result_of(self, owner: str, overloads: list[Member]) -> str | None:
        results = {m.result for m in overloads}
        if len(results) != 1:
            return None
        r = ss.simple_type(results.pop())
        if r == "Self":
            return owner
        ctx = owner.rsplit(".", 1)[0] if "." in owner else ""
        return self.api.resolve(r, owner) or self.api.resolve(r, ctx)

    def expr_type(self, n) -> str | None:
        n = self.unwrap(n)
        if n is None:
            return None
        if n.type == "simple_identifier":
            return self.var(ss.text(n), n)
        if n.type == "as_expression":
            target = n.child_by_field_name("name")
            return self.cz_type(ss.type_path(target)) if target is not None else None
        if n.type == "navigation_expression":
            target = self.unwrap(n.child_by_field_name("target"))
            suffix = n.child_by_field_name("suffix")
            name = suffix.child_by_field_name("suffix") if suffix is not None else None
            if target is None or name is None:
                return None
            if target.type == "self_expression":
                return self.var(ss.text(name), None)
            parts = self.nav_parts(n)
            if parts:
                split = self.static_split(parts, n)
                if split and not split[1]:
                    return None  # a type, not a value
                if split:
                    return self.member_chain_type(split[0], split[1])
            base = self.expr_type(target)
            if base is None:
                return None
            hit = self.api.lookup(base, ss.text(name))
            return self.result_of(hit[0], hit[1]) if hit else None
        if n.type == "call_expression":
            callee = self.unwrap(n.named_children[0]) if n.named_children else None
            if callee is None:
                return None
            if callee.type == "call_expression":
                return self.expr_type(callee)
            parts = self.nav_parts(callee)
            if parts:
                split = self.static_split(parts, n)
                if split:
                    return split[0] if not split[1] else self.member_chain_type(split[0], split[1])
            if callee.type == "navigation_expression":
                return self.expr_type(callee)
        return None

    def member_chain_type(self, q: str, rest: list[str]) -> str | None:
        cur = q
        for m in rest:
            hit = self.api.lookup(cur, m)
            if not hit:
                return None
            cur = self.result_of(hit[0], hit[1])
            if cur is None:
                return None
        return cur

    # -- pass 2: checks ------------------------------------------------------------------------

    def check(self) -> None:
        stack = [self.tree.root_node]
        while stack:
            n = stack.pop()
            stack.extend(reversed(n.named_children))
            if n.type == "import_declaration":
                self.check_import(n)
            elif n.type == "user_type":
                self.check_type(n)
            elif n.type == "call_expression" and n.id not in self.done:
                self.check_call(n)
            elif n.type == "navigation_expression" and n.id not in self.done:
                self.check_navigation(n)

    def check_import(self, n) -> None:
        name = ss.text(n).split()[-1]
        if name.startswith("Containerization") and name not in self.api.modules:
            self.fail(n, f"module {name} is not a library of containerization {self.api.version}")

    @staticmethod
    def in_attribute(n) -> bool:
        while n is not None:
            if n.type == "attribute":
                return True
            n = n.parent
        return False

    def ambiguous(self, node, spelled: str) -> bool:
        """An unqualified name two imported containerization modules both declare."""
        first = spelled.split(".")[0]
        if first in self.ours or first in self.api.modules:
            return False
        both = self.api.modules_of.get(first, set()) & self.imports
        if len(both) > 1:
            self.fail(node, f"{first} is ambiguous here (declared in {' and '.join(sorted(both))}, both imported): "
                            f"write {sorted(both)[0]}.{first} or the other")
            return True
        return False

    def check_type(self, n) -> None:
        spelled = ss.type_path(n)
        if spelled in NOT_TYPES or self.in_attribute(n):
            return
        if self.ambiguous(n, spelled):
            return
        kind = self.kind_of(spelled)
        if kind == "cz":
            self.uses += 1
            self.seen.append(f"{self.rel}:{n.start_point[0] + 1}: type {spelled}")
        if kind == "unknown":
            self.fail(n, f"unknown type {spelled}: not declared in swift/, not in the platform allowlist, "
                         f"not public in containerization {self.api.version}")

    def call_args(self, call) -> tuple[list[str], int]:
        labels: list[str] = []
        trailing = 0
        for suffix in (c for c in call.named_children if c.type == "call_suffix"):
            for c in suffix.named_children:
                if c.type == "value_arguments":
                    for arg in (a for a in c.named_children if a.type == "value_argument"):
                        lab = arg.child_by_field_name("name")
                        labels.append(ss.text(lab).strip() if lab is not None else "_")
                elif c.type in ("lambda_literal", "annotated_lambda"):
                    trailing += 1
        return labels, trailing

    def check_call(self, call) -> None:
        callee = call.named_children[0] if call.named_children else None
        labels, trailing = self.call_args(call)
        inner = self.unwrap(callee)
        # `try T(...) { ... }`: tree-sitter hangs the trailing closure on the outer call.
        if inner is not None and inner.type == "call_expression" and inner is not callee:
            self.done.add(inner.id)
            il, it = self.call_args(inner)
            labels, trailing = il, it + trailing
            callee = inner.named_children[0] if inner.named_children else None
        elif inner is not None and inner.type == "call_expression" and callee.type == "call_expression":
            return
        if callee is None:
            return
        parts = self.nav_parts(callee)
        if parts:
            split = self.static_split(parts, callee)
            if split:
                q, rest = split
                self.mark_done(callee)
                if self.ambiguous(callee, ".".join(parts)):
                    return
                if not rest:
                    self.check_member(call, q, "init", labels, trailing, called=True)
                else:
                    cur = q
                    for k, m in enumerate(rest):
                        last = k == len(rest) - 1
                        hit = self.check_member(call, cur, m, labels if last else [], trailing if last else 0, called=last)
                        if not hit or last:
                            break
                        cur = self.result_of(hit[0], hit[1])
                        if cur is None:
                            break
                return
            if len(parts) == 1 and parts[0][:1].isupper() and self.kind_of(parts[0]) == "unknown":
                self.fail(callee, f"unknown type or function {parts[0]}: not declared in swift/, not in the "
                                  f"platform allowlist, not public in containerization {self.api.version}")
                return
        if callee.type == "navigation_expression":
            target, name = self.target_and_member(callee)
            if target is None or name is None:
                return
            base = self.expr_type(target)
            if base is not None:
                self.done.add(callee.id)
                self.check_member(call, base, ss.text(name), labels, trailing, called=True)

    def mark_done(self, n) -> None:
        while n is not None and n.type == "navigation_expression":
            self.done.add(n.id)
            n = n.child_by_field_name("target")

    def check_navigation(self, n) -> None:
        parts = self.nav_parts(n)
        if parts:
            split = self.static_split(parts, n)
            if split:
                self.mark_done(n)
                if self.ambiguous(n, ".".join(parts)):
                    return
                cur = split[0]
                for m in split[1]:
                    hit = self.check_member(n, cur, m, [], 0, called=False)
                    if not hit:
                        return
                    cur = self.result_of(hit[0], hit[1])
                    if cur is None:
                        return
                return
            if parts[0][:1].isupper() and not self.is_var(parts[0], n) and self.kind_of(parts[0]) == "unknown":
                self.mark_done(n)
                self.fail(n, f"unknown name {parts[0]}: not declared in swift/, not in the platform allowlist, "
                             f"not public in containerization {self.api.version}")
                return
        target, name = self.target_and_member(n)
        if target is None or name is None:
            return
        base = self.expr_type(target)
        if base is not None:
            self.check_member(n, base, ss.text(name), [], 0, called=False)

    def target_and_member(self, nav):
        """A navigation expression's target and its member's plain name node (either None when it has no such
        shape, e.g. a member named by a keyword or a tuple index)."""
        target = self.unwrap(nav.child_by_field_name("target"))
        suffix = nav.child_by_field_name("suffix")
        name = suffix.child_by_field_name("suffix") if suffix is not None else None
        if name is not None and name.type != "simple_identifier":
            name = None
        return target, name

    def check_member(self, node, q: str, member: str, labels, trailing, called: bool):
        self.uses += 1
        self.seen.append(f"{self.rel}:{node.start_point[0] + 1}: {q}.{member}")
        hit = self.api.lookup(q, member)
        if hit is None:
            if member in self.allow.members and self.api.foreign_parents(q):
                return None
            what = "initializer" if member == "init" else f"member {member}"
            self.fail(node, f"{q} has no public {what} in containerization {self.api.version}")
            return None
        owner, overloads = hit
        if called:
            callable_ = [m for m in overloads if m.params is not None]
            if callable_ and not any(labels_fit(m.params, labels, trailing) for m in callable_):
                shapes = ", ".join(
                    sorted({"(" + "".join(p.spell() for p in m.params) + ")" for m in callable_})
                )
                self.fail(node, f"{owner}.{member}{spell_call(labels, trailing)} fits no overload in "
                                f"containerization {self.api.version}: {shapes}")
        return hit


def check_bridge(parsed, root: Path) -> list[str]:
    """Every Swift function the generated glue calls (an `extern "Swift"` function of the bridge)
    must be declared outside Generated/ with the labels it is called with, `async` when the glue
    awaits it, and `throws(E)` when the glue checks for typed throws of E; and E must conform to
    Error somewhere in the package (the glue declares the enum bare, and `throws(E)` of a type
    that is no Error does not compile)."""
    generated = [(p, rel, t) for p, rel, t in parsed if "Generated" in p.relative_to(root).parts]
    if not generated:
        return []
    declared_in_glue: set[str] = set()
    for _, _, tree in generated:
        for d in ss.declarations(tree):
            if d.kind == "func" and not d.owner:
                declared_in_glue.add(d.name)
    wanted: dict[str, tuple[list[str], bool, str | None, str]] = {}
    for path, rel, tree in generated:
        for fn in (n for n in tree.root_node.named_children if n.type == "function_declaration"):
            fname = ss.text(fn.child_by_field_name("name"))
            if not fname.startswith("__swift_bridge__"):
                continue
            typed = None
            if fname.endswith("__TypedThrowsCheck"):
                m = re.search(r"throws\((\w+)\)", ss.text(fn))
                typed = m.group(1) if m else None
            stack = [fn.child_by_field_name("body")]
            while stack:
                n = stack.pop()
                if n is None:
                    continue
                stack.extend(n.named_children)
                if n.type != "call_expression" or not n.named_children:
                    continue
                callee = n.named_children[0]
                name = ss.text(callee)
                if callee.type != "simple_identifier" or name in declared_in_glue or not re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)+", name):
                    continue
                labels = []
                for suffix in (c for c in n.named_children if c.type == "call_suffix"):
                    for args in (c for c in suffix.named_children if c.type == "value_arguments"):
                        for arg in (a for a in args.named_children if a.type == "value_argument"):
                            lab = arg.child_by_field_name("name")
                            labels.append(ss.text(lab).strip() if lab is not None else "_")
                awaited = n.parent is not None and n.parent.type == "await_expression"
                old = wanted.get(name)
                where = f"{rel}:{n.start_point[0] + 1}:{n.start_point[1] + 1}"
                wanted[name] = (labels, awaited or (old[1] if old else False), typed or (old[2] if old else None), old[3] if old else where)
    declared: dict[str, list[tuple[list[str], str]]] = {}
    for path, rel, tree in parsed:
        if "Generated" in path.relative_to(root).parts:
            continue
        for fn in (n for n in tree.root_node.named_children if n.type == "function_declaration"):
            d = [x for x in ss.declarations_of(fn) if x.kind == "func"]
            if d:
                declared.setdefault(d[0].name, []).append(([p.label for p in d[0].params or []], ss.text(fn).split("{", 1)[0]))
    errors = []
    for name, (labels, awaited, typed, where) in sorted(wanted.items()):
        have = declared.get(name)
        want = name + "(" + "".join(f"{l}:" for l in labels) + ")"
        if not have:
            errors.append(f"{where}: the bridge's glue calls {want}, which no Swift file of the package declares")
            continue
        fits = [sig for labs, sig in have if labs == labels]
        if not fits:
            errors.append(f"{where}: the bridge's glue calls {want}; declared with other labels: "
                          + ", ".join(f"({''.join(l + ':' for l in labs)})" for labs, _ in have))
            continue
        sig = fits[0]
        if awaited and " async" not in sig:
            errors.append(f"{where}: the bridge's glue awaits {want}; its declaration is not async")
        if typed and f"throws({typed})" not in sig.replace(" ", ""):
            errors.append(f"{where}: the bridge's glue needs {want} to throw {typed} (typed throws); it is declared `{sig.strip()}`")
    texts = [ss.text(tree.root_node) for _, _, tree in parsed]
    for typed in sorted({t for _, _, t, _ in wanted.values() if t}):
        conforms = re.compile(rf"\b(?:extension|enum|struct|class)\s+{re.escape(typed)}\s*:[^{{]*\bError\b")
        if not any(conforms.search(t) for t in texts):
            where = next(w for _, _, t, w in wanted.values() if t == typed)
            errors.append(f"{where}: the bridge's glue throws {typed}, which conforms to Error nowhere in the package "
                          f"(add `extension {typed}: @unchecked Sendable {{}}` and `extension {typed}: Error {{}}`)")
    return errors


def pinned_version(root: Path) -> str | None:
    pkg = root / "Package.swift"
    if not pkg.exists():
        return None
    m = re.search(r'containerization\.git",\s*exact:\s*"([^"]+)"', pkg.read_text())
    return m.group(1) if m else None


def run(root: Path, api_path: Path | None, allow_path: Path | None, out=sys.stdout, verbose: bool = False) -> int:
    files = ss.source_files(root)
    errors: list[str] = []
    parsed = []
    for path in files:
        rel = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
        tree = ss.parse(path.read_bytes())
        for line, col, what in ss.syntax_errors(tree):
            errors.append(f"{rel}:{line}:{col}: {what}")
        parsed.append((path, rel, tree))

    if api_path is None:
        version = pinned_version(root)
        if version is None:
            errors.append(f"{root}/Package.swift: no `containerization.git\", exact: \"VERSION\"` dependency")
            return report(errors, len(files), 0, out)
        api_path = root / "api" / f"containerization-{version}.txt"
    if not api_path.exists():
        errors.append(f"{api_path}: no API list (make it with scripts/swift-api-list.py)")
        return report(errors, len(files), 0, out)
    api = Api.load(api_path)
    allow = Allow.load(allow_path or root / "api" / "platform-allowlist.txt")

    ours: set[str] = set()
    for _, _, tree in parsed:
        for d in ss.declarations(tree):
            if d.kind in ("type", "typealias") and not d.owner:
                ours.add(d.name)
    checked = uses = 0
    for path, rel, tree in parsed:
        src = path.read_bytes()
        if not re.search(rb"^\s*import\s+Containerization", src, re.M):
            continue
        checked += 1
        fc = FileCheck(path, rel, tree, api, allow, ours)
        fc.collect()
        fc.check()
        uses += fc.uses
        if verbose:
            for line in fc.seen:
                print(f"checked {line}", file=out)
        errors.extend(fc.errors)
    errors.extend(check_bridge(parsed, root))
    return report(errors, len(files), checked, out, api.version, uses)


def report(errors: list[str], files: int, checked: int, out, version: str = "?", uses: int = 0) -> int:
    for e in errors:
        print(e, file=out)
    status = "FAILED" if errors else "ok"
    print(f"check-swift: {files} Swift files parsed, {checked} checked against containerization "
          f"{version}'s public API ({uses} uses of its types and members): {len(errors)} problem(s), {status}",
          file=out)
    return 1 if errors else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=REPO / "swift")
    ap.add_argument("--api", type=Path, default=None)
    ap.add_argument("--allow", type=Path, default=None)
    ap.add_argument("--verbose", action="store_true", help="list every containerization use checked")
    args = ap.parse_args()
    return run(args.root.resolve(), args.api, args.allow, verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
