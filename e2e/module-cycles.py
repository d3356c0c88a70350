#!/usr/bin/env python3
"""No module of any crate of the workspace refers to another in a circle (issue 30 item 7).

For each library crate (`<crate>/src/lib.rs` and the module files under it) the check reads every
module file's non-test code (up to its first `#[cfg(test)]` module with a body; comments
dropped), finds the paths it names (`crate::a::b`, `super::x`, `self::x`, a child module's bare
name, `use` groups expanded), resolves each to the module that defines what it names (through a
parent's `pub use child::Item` re-exports), and fails on a cycle in that graph, printing it.

A module's reference to one of its ancestors counts only when it names an item the ancestor
defines itself (not one it merely re-exports from a descendant, nor a path through it), so a
parent that declares and re-exports its children and a child that reaches a sibling through the
parent's path make no cycle; a child that uses its parent's own items while the parent uses the
child's does.

  module-cycles.py [ROOT]        check the workspace at ROOT (default: this file's repository)
  module-cycles.py --self-test   the resolver and the cycle finder on small fixtures
Exit 1 on a cycle (each printed as `crate: a -> b -> a`), 2 on a usage error.
"""

import os
import re
import sys

CRATES = ["core", "crds", "telemetry", "operator", "node-agent", "e2e"]


def strip(source):
    """Non-test code without comments."""
    m = None
    for m2 in re.finditer(r"#\[cfg\(test\)\]\s*(pub(\([a-z]+\))?\s+)?mod\s+\w+\s*\{", source):
        m = m2
        break
    if m:
        source = source[: m.start()]
    source = re.sub(r"/\*.*?\*/", "", source, flags=re.S)
    lines = []
    for line in source.splitlines():
        # A `//` outside a string literal (good enough: string literals with `//` are URLs in
        # comments' company, and a path never follows one on the same line).
        i = line.find("//")
        if i >= 0 and line[:i].count('"') % 2 == 0:
            line = line[:i]
        lines.append(line)
    return "\n".join(lines)


def module_files(src):
    """{module path (tuple): file} for a crate's library, from lib.rs down its `mod` lines."""
    modules = {}

    def walk(path, file, is_dir_owner):
        modules[path] = file
        with open(file, encoding="utf-8") as f:
            text = strip(f.read())
        base = os.path.dirname(file) if is_dir_owner else os.path.splitext(file)[0]
        for m in re.finditer(r"(?m)^\s*(?:pub(?:\([a-z:]+\))?\s+)?mod\s+(\w+)\s*;", text):
            name = m.group(1)
            for cand, owner in ((os.path.join(base, name + ".rs"), False),
                                (os.path.join(base, name, "mod.rs"), True)):
                if os.path.exists(cand):
                    walk(path + (name,), cand, owner)
                    break

    walk((), os.path.join(src, "lib.rs"), True)
    return modules


def expand_use_group(text):
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"]."""
    text = text.strip()
    i = text.find("{")
    if i < 0:
        return [text]
    head, body = text[:i], text[i + 1:]
    depth, item, items = 0, "", []
    for c in body:
        if c == "{":
            depth += 1
        elif c == "}":
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            items.append(item)
            item = ""
            continue
        item += c
    items.append(item)
    out = []
    for it in items:
        it = it.strip()
        if not it:
            continue
        for e in expand_use_group(it):
            out.append(head + e if e != "self" else head.rstrip(":"))
    return out


PATH = re.compile(r"(?<![\w:])((?:crate|super|self|[a-z_][a-z0-9_]*)(?:::(?:\{[^;]*?\}|[A-Za-z_][A-Za-z0-9_]*))+)")


def paths_in(text):
    """Every path (as a list of segments) the code names."""
    out = []
    for m in PATH.finditer(text):
        for p in expand_use_group(m.group(1)):
            segs = [s.strip() for s in p.split("::") if s.strip()]
            segs = [s.split(" as ")[0].strip() for s in segs]
            if segs:
                out.append(segs)
    return out


def absolute(module, segs, children):
    """The path from the crate root, or None when it does not start in this crate."""
    segs = list(segs)
    if segs[0] == "crate":
        return segs[1:]
    cur = list(module)
    if segs[0] in ("self", "super"):
        while segs and segs[0] in ("self", "super"):
            if segs[0] == "super":
                if not cur:
                    return None
                cur.pop()
            segs.pop(0)
        return cur + segs
    if segs[0] in children.get(tuple(module), ()):
        return list(module) + segs
    return None


def reexports(modules, texts):
    """{(module, item): absolute target path} from `pub use` lines."""
    out = {}
    for mod, text in texts.items():
        children = {m[-1] for m in modules if len(m) == len(mod) + 1 and m[: len(mod)] == mod}
        for m in re.finditer(r"pub(?:\([a-z:]+\))?\s+use\s+([^;]+);", text):
            for p in expand_use_group(m.group(1)):
                segs = [s.strip() for s in p.split("::") if s.strip()]
                alias = None
                if " as " in segs[-1]:
                    segs[-1], alias = [x.strip() for x in segs[-1].split(" as ")]
                ab = absolute(mod, segs, {mod: children})
                if ab:
                    out[(mod, alias or segs[-1])] = ab
    return out


def resolve(path, modules, rexp, depth=0):
    """The module that defines what `path` names, and whether the last module step was only
    passed through (the path goes on below it to an item of a descendant)."""
    best = ()
    for i in range(len(path), -1, -1):
        if tuple(path[:i]) in modules:
            best = tuple(path[:i])
            break
    rest = path[len(best):]
    if rest and (best, rest[0]) in rexp and depth < 8:
        return resolve(rexp[(best, rest[0])] + rest[1:], modules, rexp, depth + 1)
    return best


def graph_of(modules, texts):
    rexp = reexports(modules, texts)
    children = {}
    for m in modules:
        if m:
            children.setdefault(m[:-1], set()).add(m[-1])
    graph = {m: set() for m in modules}
    for mod, text in texts.items():
        for segs in paths_in(text):
            ab = absolute(mod, segs, children)
            if ab is None:
                continue
            target = resolve(ab, modules, rexp)
            if target == mod or target not in modules:
                continue
            # A path that ends at a module (names the module itself, `use super::child;`) is an
            # edge to it; one through an ancestor to nothing of its own is none.
            if mod[: len(target)] == target and len(ab) == len(target):
                continue
            graph[mod].add(target)
    return graph


def find_cycle(graph):
    marks, path = {}, []

    def visit(n):
        if marks.get(n) == "done":
            return None
        if marks.get(n) == "open":
            return path[path.index(n):] + [n]
        marks[n] = "open"
        path.append(n)
        for t in sorted(graph.get(n, ())):
            c = visit(t)
            if c:
                return c
        path.pop()
        marks[n] = "done"
        return None

    for n in sorted(graph):
        c = visit(n)
        if c:
            return c
    return None


def name(m):
    return "::".join(m) or "(crate root)"


def check(root):
    found = []
    for crate in CRATES:
        src = os.path.join(root, crate, "src")
        if not os.path.exists(os.path.join(src, "lib.rs")):
            continue
        modules = module_files(src)
        texts = {}
        for m, f in modules.items():
            with open(f, encoding="utf-8") as fh:
                texts[m] = strip(fh.read())
        graph = graph_of(modules, texts)
        # Every cycle, not only the first: remove one edge of each found and look again.
        while True:
            c = find_cycle(graph)
            if not c:
                break
            found.append(f"{crate}: {' -> '.join(name(m) for m in c)}")
            graph[c[0]].discard(c[1])
        edges = sum(len(v) for v in graph.values())
        print(f"module-cycles: {crate}: {len(modules)} modules, {edges} references between them")
    return found


def self_test():
    modules = {(): "", ("a",): "", ("a", "x"): "", ("b",): "", ("c",): ""}
    texts = {
        (): "pub mod a; pub mod b; pub mod c;",
        ("a",): "mod x; pub use x::Thing;",
        ("a", "x"): "use crate::b::f; pub struct Thing;",
        ("b",): "pub fn f() {} fn g() { crate::a::Thing; }",
        ("c",): "use super::{a::Thing, b};",
    }
    g = graph_of(modules, texts)
    assert g[("b",)] == {("a", "x")}, g  # through the re-export, to its definer
    assert g[("c",)] == {("a", "x"), ("b",)}, g
    assert g[("a",)] == {("a", "x")}, g
    c = find_cycle(g)
    assert c and set(c) == {("a", "x"), ("b",)}, c
    texts[("b",)] = "pub fn f() {}"
    assert find_cycle(graph_of(modules, texts)) is None
    assert expand_use_group("a::{b, c::{d, e as f}, self}") == ["a::b", "a::c::d", "a::c::e as f", "a"]
    assert strip("use a::b; // use c::d;\n#[cfg(test)]\nmod tests {\n use e::f;\n}") .strip() == "use a::b;"
    print("module-cycles: self-test passed")


def main(argv):
    if len(argv) > 1 and argv[1] == "--self-test":
        self_test()
        return 0
    if len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = check(root)
    for f in found:
        print(f"module-cycles: cycle in {f}", file=sys.stderr)
    if found:
        print(f"module-cycles: {len(found)} cycle(s); break each by moving what both sides need "
              f"below them (docs/architecture.md, \"Module layering\")", file=sys.stderr)
        return 1
    print("module-cycles: no module cycle in any crate")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
