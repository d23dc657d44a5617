"""Shared tree-sitter-swift helpers for scripts/swift-api-list.py and scripts/check-swift.py.

Owns: the parser, the walk over declarations (types, members, parameters with
their argument labels) and the one line format of the committed API list
(swift/api/containerization-<version>.txt). Neither script compiles Swift:
they read syntax only, so what they prove is stated in each script's header.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Iterator

import tree_sitter
import tree_sitter_swift

LANGUAGE = tree_sitter.Language(tree_sitter_swift.language())

# Keywords tree-sitter-swift keeps as unnamed tokens of a class_declaration.
TYPE_KINDS = ("class", "struct", "enum", "extension", "actor")


def parser() -> tree_sitter.Parser:
    return tree_sitter.Parser(LANGUAGE)


# Swift takes `$` inside an identifier (`__swift_bridge__$LayerInfo`, C names swift-bridge's
# glue uses); tree-sitter-swift does not. Such a `$` becomes `_` before parsing: one byte for
# one, so every line and column stays where it was. A leading `$` (`$0`) is left alone.
_INNER_DOLLAR = re.compile(rb"(?<=[A-Za-z0-9_])\$")


def parse(source: bytes) -> tree_sitter.Tree:
    return parser().parse(_INNER_DOLLAR.sub(b"_", source))


def text(node: tree_sitter.Node | None) -> str:
    return "" if node is None else node.text.decode("utf-8", "replace")


def syntax_errors(tree: tree_sitter.Tree) -> Iterator[tuple[int, int, str]]:
    """(line, column, what) of every ERROR or MISSING node, 1-based, in source order."""
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.is_missing:
            yield node.start_point[0] + 1, node.start_point[1] + 1, f"missing {node.type!r}"
            continue
        if node.type == "ERROR":
            snippet = text(node).split("\n", 1)[0][:40]
            yield node.start_point[0] + 1, node.start_point[1] + 1, f"syntax error at {snippet!r}"
            continue
        if node.has_error:
            stack.extend(reversed(node.children))


def children_by_field(node: tree_sitter.Node, field: str) -> list[tree_sitter.Node]:
    return [c for i, c in enumerate(node.children) if node.field_name_for_child(i) == field]


def modifiers(node: tree_sitter.Node) -> set[str]:
    out: set[str] = set()
    for c in node.children:
        if c.type == "modifiers":
            out.update(text(c).replace("(", " ").replace(")", " ").split())
    return out


def decl_kind(node: tree_sitter.Node) -> str:
    for c in node.children:
        if not c.is_named and c.type in TYPE_KINDS:
            return c.type
    return "type"


def type_path(node: tree_sitter.Node | None) -> str:
    """`A.B` for a user_type (generic arguments dropped), else the node's text without spaces."""
    if node is None:
        return ""
    if node.type == "user_type":
        return ".".join(text(c) for c in node.children if c.type == "type_identifier")
    if node.type in ("optional_type", "implicitly_unwrapped_type"):
        return type_path(node.child_by_field_name("wrapped") or node.named_children[0])
    if node.type in ("existential_type", "opaque_type") and node.named_children:
        return type_path(node.named_children[-1])
    return "".join(text(node).split())


def simple_type(spelled: str) -> str:
    """The nominal type a spelled type names: `Foo?` -> `Foo`, `[Foo]` stays as is."""
    s = spelled.strip()
    for prefix in ("some ", "any ", "inout "):
        if s.startswith(prefix):
            s = s[len(prefix):]
    while s.endswith(("?", "!")):
        s = s[:-1]
    if "<" in s and not s.startswith("["):
        s = s[: s.index("<")]
    return s


@dataclasses.dataclass(frozen=True)
class Param:
    label: str  # the argument label at a call site, `_` when there is none
    defaulted: bool  # has a default value: a call may leave it out
    closure: bool  # its type is a function: a trailing closure can supply it

    def spell(self) -> str:
        return self.label + ("=" if self.defaulted else "") + ("{}" if self.closure else "") + ":"


def parse_params(spelled: str) -> list[Param] | None:
    """Inverse of `Param.spell` over a whole list (`_:rootfs:writableLayer=:`); `-` is None."""
    if spelled == "-":
        return None
    out = []
    for part in spelled.split(":")[:-1]:
        closure = part.endswith("{}")
        part = part[:-2] if closure else part
        defaulted = part.endswith("=")
        out.append(Param(part[:-1] if defaulted else part, defaulted, closure))
    return out


def params_of(node: tree_sitter.Node) -> list[Param]:
    out = []
    children = node.children
    for i, c in enumerate(children):
        if c.type != "parameter":
            continue
        names = children_by_field(c, "name")
        external = c.child_by_field_name("external_name")
        label = text(external) if external is not None else (text(names[0]) if names else "_")
        ptype = names[-1] if len(names) > 1 else None
        closure = ptype is not None and (
            ptype.type == "function_type" or "->" in text(ptype)
        )
        # A default value follows its parameter as a sibling field, before the next parameter.
        defaulted = False
        for j in range(i + 1, len(children)):
            if children[j].type == "parameter":
                break
            if node.field_name_for_child(j) == "default_value":
                defaulted = True
                break
        out.append(Param(label, defaulted, closure))
    return out


def initializer_type(value: tree_sitter.Node | None) -> str:
    """`T` for a value spelled `T(...)` or `T.Nested(...)` (a type's initializer), else ``."""
    while value is not None and value.type in ("try_expression", "await_expression"):
        value = value.child_by_field_name("expr") or value.named_children[-1]
    if value is None or value.type != "call_expression":
        return ""
    callee = value.named_children[0]
    spelled = text(callee)
    if callee.type in ("simple_identifier", "navigation_expression") and spelled[:1].isupper():
        if all(part[:1].isupper() for part in spelled.split(".")):
            return spelled
    return ""


def result_type(node: tree_sitter.Node) -> str:
    """A function's declared result type (the `name` field after its parameters), or ``."""
    names = children_by_field(node, "name")
    for n in reversed(names):
        if n.type not in ("simple_identifier",) and n.start_byte > _params_end(node):
            return type_path(n)
    return ""


def _params_end(node: tree_sitter.Node) -> int:
    end = node.start_byte
    for c in node.children:
        if c.type == "parameter":
            end = c.end_byte
    # A function without parameters: its result type follows its name.
    name = node.child_by_field_name("name")
    return max(end, name.end_byte if name is not None else end)


@dataclasses.dataclass
class Decl:
    """One declaration: a type, or a member of one (or a free function or variable)."""

    kind: str  # type, func, init, var, case, typealias
    owner: str  # the qualified type it belongs to, `` at top level
    name: str  # its own name (`init` for initializers)
    params: list[Param] | None  # functions, initializers, cases with payloads
    result: str  # a function's result, a variable's type, a type's own kind
    inherits: list[str]  # a type's inheritance clause, as spelled
    public: bool
    static: bool
    line: int
    column: int

    @property
    def qualified(self) -> str:
        return f"{self.owner}.{self.name}" if self.owner else self.name


def declarations(tree: tree_sitter.Tree) -> list[Decl]:
    out: list[Decl] = []
    _walk(tree.root_node, "", True, False, out)
    return out


def declarations_of(node: tree_sitter.Node) -> list[Decl]:
    """The declarations one node makes (itself and what it holds)."""
    out: list[Decl] = []
    _decl(node, "", True, False, out)
    return out


def _walk(node: tree_sitter.Node, owner: str, owner_public: bool, in_protocol: bool, out: list[Decl]) -> None:
    for c in node.named_children:
        _decl(c, owner, owner_public, in_protocol, out)


def _is_public(mods: set[str]) -> bool:
    return "public" in mods or "open" in mods


def _decl(c: tree_sitter.Node, owner: str, owner_public: bool, in_protocol: bool, out: list[Decl]) -> None:
    mods = modifiers(c)
    line, col = c.start_point[0] + 1, c.start_point[1] + 1
    static = "static" in mods or "class" in mods
    member_public = (_is_public(mods) and owner_public) or (in_protocol and owner_public)
    t = c.type
    if t == "ERROR":
        # tree-sitter-swift does not know every construct (`sending`, say):
        # declarations inside an error node are still read.
        _walk(c, owner, owner_public, in_protocol, out)
    elif t in ("class_declaration", "protocol_declaration"):
        kind = "protocol" if t == "protocol_declaration" else decl_kind(c)
        name_node = c.child_by_field_name("name")
        name = type_path(name_node)
        inherits = [type_path(s.child_by_field_name("inherits_from")) for s in c.children if s.type == "inheritance_specifier"]
        if kind == "extension":
            qualified = name  # an extension names its type in full
            public = _is_public(mods) or True  # members decide for themselves
            ext_default_public = _is_public(mods)
        else:
            qualified = f"{owner}.{name}" if owner else name
            public = _is_public(mods) and owner_public
            ext_default_public = False
            out.append(Decl("type", owner, name, None, kind, inherits, public, False, line, col))
        body = c.child_by_field_name("body")
        if body is None:
            return
        if kind == "extension":
            if inherits:
                out.append(Decl("conformance", "", qualified, None, "extension", inherits, True, False, line, col))
            for m in body.named_children:
                if ext_default_public and m.type != "ERROR" and not (modifiers(m) & {"private", "fileprivate", "internal", "package"}):
                    _decl_with_default_public(m, qualified, out)
                else:
                    _decl(m, qualified, True, False, out)
        else:
            _walk(body, qualified, public, kind == "protocol", out)
    elif t == "typealias_declaration":
        name = text(c.child_by_field_name("name"))
        names = children_by_field(c, "name")
        target = type_path(names[-1]) if len(names) > 1 else ""
        out.append(Decl("typealias", owner, name, None, target, [], member_public or (_is_public(mods) and not owner), False, line, col))
    elif t in ("function_declaration", "protocol_function_declaration"):
        name = text(c.child_by_field_name("name"))
        out.append(Decl("func", owner, name, params_of(c), result_type(c), [], member_public or (not owner and _is_public(mods)), static, line, col))
    elif t == "init_declaration":
        out.append(Decl("init", owner, "init", params_of(c), owner, [], member_public, False, line, col))
    elif t in ("property_declaration", "protocol_property_declaration"):
        names = children_by_field(c, "name")
        vtype = ""
        for a in c.children:
            if a.type == "type_annotation":
                vtype = type_path(a.child_by_field_name("name"))
        if not vtype:
            vtype = initializer_type(c.child_by_field_name("value"))
        for n in names:
            bound = n.child_by_field_name("bound_identifier")
            if bound is None:
                continue
            out.append(Decl("var", owner, text(bound).strip("`"), None, vtype, [], member_public or (not owner and _is_public(mods)), static, line, col))
    elif t == "enum_entry":
        children = c.children
        for i, n in enumerate(children):
            if c.field_name_for_child(i) != "name":
                continue
            payload = None
            if i + 1 < len(children) and children[i + 1].type == "enum_type_parameters":
                payload = []
                for item in children[i + 1].named_children:
                    payload.append(Param("_", False, False))
            out.append(Decl("case", owner, text(n).strip("`"), payload, owner, [], owner_public, True, line, col))
    elif t == "associatedtype_declaration":
        name = text(c.child_by_field_name("name"))
        bounds = [type_path(s.child_by_field_name("inherits_from") or s) for s in c.named_children
                  if s.type in ("inheritance_specifier", "user_type") and s is not c.child_by_field_name("name")]
        out.append(Decl("type", owner, name, None, "associatedtype", bounds, owner_public, False, line, col))
    elif t in ("statements", "class_body", "enum_class_body", "protocol_body"):
        _walk(c, owner, owner_public, in_protocol, out)


def _decl_with_default_public(m: tree_sitter.Node, owner: str, out: list[Decl]) -> None:
    """A member of a `public extension`: public unless it says otherwise."""
    before = len(out)
    _decl(m, owner, True, True, out)
    for d in out[before:]:
        d.public = True


# ---- the committed list -------------------------------------------------------------------------

LIST_COLUMNS = ("kind", "module", "name", "params", "result", "inherits")


def list_line(module: str, d: Decl) -> str:
    params = "-" if d.params is None else "".join(p.spell() for p in d.params)
    return "\t".join((d.kind, module, d.qualified, params, d.result or "-", ",".join(d.inherits) or "-"))


def source_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.swift") if ".build" not in p.parts)
