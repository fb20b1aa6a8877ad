#!/usr/bin/env python3
"""Checks the shape of fabric-msg's source tree (docs/architecture.md).

- No import cycle between files: an edge A -> B is any `crate::`, `super::`
  or child-module path in A's code, `use` trees with braces expanded (test
  modules at the end of a file are left out: they may use anything of their
  own file).
- No import cycle between modules either: under each folder, the folder's
  own file (mod.rs) and each child module (a file, or a folder taken whole)
  are the nodes, and an edge between two files anywhere below them is an
  edge between them. So `transport/event_loop -> transport/progress ->
  transport/event_loop` is a cycle even when no two files form one.
- No glob import (`use super::*`) outside test modules: it hides which
  items a file uses, and with them the edges above.
- Layers: error < libfabric < discovery < memory < transport < world. A file never names
  a layer above its own; the crate root (lib.rs) only declares and re-exports.
- No file over 600 lines.
- libfabric is called (`ffi::fi_*(...)`) only from `libfabric/`, which
  owns every libfabric object, and from `error/mod.rs` (`fi_strerror`).
- Every file in fabric-msg/tests/ and examples/tests/ runs: it is a module
  of its package's one integration binary (fabric-msg/tests/integration.rs,
  examples/tests/examples.rs) or a test of its own in Cargo.toml, which
  finds no test by itself (`autotests = false`).

Exits non-zero with one line per violation. Usage: ci/check-layers.py [SRC]
"""
import os
import re
import sys

SRC = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fabric-msg", "src")
SRC = os.path.normpath(SRC)
LAYERS = ["error", "libfabric", "discovery", "memory", "transport", "world", "async_loop"]
MAX_LINES = 600
FI_CALL = re.compile(r"\bffi::fi_[a-z_]+\s*\(")
FI_CALLERS = ("libfabric/", "error/mod.rs")

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_CHILD = re.compile(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?use\s+([a-z_][a-z0-9_]*)::")
USE_TREE = re.compile(r"\buse\s+([^;]*);", re.S)
MOD_DECL = re.compile(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_][a-z0-9_]*)\s*;")


def module_of(rel):
    """'transport/event_loop/post.rs' -> ['transport', 'event_loop', 'post']."""
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return parts


def file_of(module):
    """The file that defines the longest prefix of `module`."""
    for n in range(len(module), -1, -1):
        base = os.path.join(SRC, *module[:n]) if n else SRC
        for cand in (base + ".rs", os.path.join(base, "mod.rs")) if n else (os.path.join(SRC, "lib.rs"),):
            if os.path.isfile(cand):
                return os.path.relpath(cand, SRC)
    return None


def expand(tree):
    """'super::{a, b::{c, d}}' -> ['super::a', 'super::b::c', 'super::b::d']."""
    tree = " ".join(tree.split())
    i = tree.find("{")
    if i < 0:
        return [tree.split(" as ")[0].strip()]
    prefix, inner = tree[:i], tree[i + 1 : tree.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [prefix + e for p in parts if p.strip() for e in expand(p)]


def cycles(nodes, edges):
    """Every cycle a depth-first search meets, as lists of nodes."""
    found = []
    colour = {n: 0 for n in nodes}
    for start in sorted(nodes):
        if colour[start]:
            continue
        stack = [(start, iter(sorted(edges.get(start, ()))))]
        path = [start]
        colour[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = 2
                stack.pop()
                path.pop()
                continue
            if colour[nxt] == 1:
                found.append(path[path.index(nxt) :] + [nxt])
            elif colour[nxt] == 0:
                colour[nxt] = 1
                stack.append((nxt, iter(sorted(edges.get(nxt, ())))))
                path.append(nxt)
    return found


def code_lines(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip().startswith("#[cfg(test)]"):
                break
            stripped = line.split("//", 1)[0]
            out.append(stripped)
    return out


def unlisted_tests(tests, harness, label):
    """Files in `tests` (`label`) that no test binary compiles: neither a
    `mod NAME;` of the binary `harness` nor a [[test]] path of Cargo.toml."""
    if not os.path.isdir(tests):
        return []
    text = open(os.path.join(tests, harness)).read()
    manifest = open(os.path.join(tests, "..", "Cargo.toml")).read()
    listed = {f"{m}.rs" for m in re.findall(r"^mod ([a-z0-9_]+);", text, re.M)}
    listed |= {os.path.basename(p) for p in re.findall(r'^path = "tests/([a-z0-9_]+\.rs)"', manifest, re.M)}
    return [
        f"{label}/{f} is in no test binary: add it to {label}/{harness} (`mod NAME;`) or to Cargo.toml ([[test]])"
        for f in sorted(os.listdir(tests))
        if f.endswith(".rs") and f not in listed
    ]


def untested_tools(bins):
    """Tools in `bins` (examples/src/bin) that Cargo.toml does not list with
    `test = false`: `cargo test` would build each one again as an empty
    test harness (the tools' tests are the library's and the integration
    tests'). A tool with `#[test]`s of its own is listed without it."""
    if not os.path.isdir(bins):
        return []
    manifest = open(os.path.join(bins, "..", "..", "Cargo.toml")).read()
    untested = set(re.findall(r'^\[\[bin\]\]\nname = "([a-z0-9_]+)"\ntest = false$', manifest, re.M))
    problems = []
    for f in sorted(os.listdir(bins)):
        path = os.path.join(bins, f)
        name = f[:-3] if f.endswith(".rs") else f
        if not (f.endswith(".rs") or os.path.isfile(os.path.join(path, "main.rs"))):
            continue
        sources = [path] if f.endswith(".rs") else []
        sub = path[:-3] if f.endswith(".rs") else path
        if os.path.isdir(sub):
            sources += [os.path.join(r, n) for r, _, ns in os.walk(sub) for n in ns if n.endswith(".rs")]
        tested = any("#[test]" in open(s_, encoding="utf-8").read() for s_ in sources)
        if tested and name in untested:
            problems.append(f"examples/src/bin/{f} has #[test]s, but Cargo.toml says `test = false` for it")
        elif not tested and name not in untested:
            problems.append(
                f"examples/src/bin/{f}: list it in examples/Cargo.toml as [[bin]] name = \"{name}\" test = false"
            )
    return problems


def main():
    files = []
    for root, _, names in os.walk(SRC):
        for n in names:
            if n.endswith(".rs"):
                files.append(os.path.relpath(os.path.join(root, n), SRC))
    files.sort()
    problems = []
    edges = {f: set() for f in files}
    for f in files:
        lines = open(os.path.join(SRC, f), encoding="utf-8").read().count("\n")
        if lines > MAX_LINES:
            problems.append(f"{f}: {lines} lines (at most {MAX_LINES})")
        here = module_of(f)
        code = code_lines(os.path.join(SRC, f))
        children = {m.group(1) for l in code if (m := MOD_DECL.match(l))}
        text = "\n".join(code)
        if not f.startswith(FI_CALLERS) and (call := FI_CALL.search(text)):
            problems.append(f"{f}: calls libfabric (`{call.group(0)}`); go through the owned objects in libfabric/")
        uses = [p for m in USE_TREE.finditer(text) for p in expand(m.group(1))]
        for u in uses:
            if u.endswith("*"):
                problems.append(f"{f}: glob import `use {u}`; name the items it uses")
                glob_edge = u[:-1].rstrip(":") + "::__glob__"
                uses.append(glob_edge)
        for l in code + [u + " " for u in uses]:
            targets = []
            for m in PATH.finditer(l):
                root, rest = m.group(1), [p for p in m.group(2).split("::") if p]
                if root == "crate":
                    targets.append(rest)
                elif root == "self":
                    targets.append(here + rest)
                else:
                    up = here[:-1]
                    while rest and rest[0] == "super":
                        up, rest = up[:-1], rest[1:]
                    targets.append(up + rest)
            m = USE_CHILD.match(l) or re.match(r"^([a-z_][a-z0-9_]*)::", l)
            if m and m.group(1) in children:
                targets.append(here + [m.group(1)] + l.split("::")[1:2])
            for t in targets:
                if t and t[0] == "ffi":
                    continue
                t = [p for p in t if p != "__glob__"]
                target = file_of(t)
                if target and target != f:
                    edges[f].add(target)
    # Layers.
    for f, outs in edges.items():
        if f == "lib.rs":
            continue
        mine = LAYERS.index(module_of(f)[0]) if module_of(f)[0] in LAYERS else None
        for t in outs:
            top = module_of(t)[0] if module_of(t) else "lib"
            if t == "lib.rs":
                problems.append(f"{f} names the crate root; import from the layer that defines the item")
                continue
            if mine is not None and top in LAYERS and LAYERS.index(top) > mine:
                problems.append(f"{f} ({LAYERS[mine]}) imports {t} ({top}): a lower layer must not use a higher one")
    # File cycles.
    for c in cycles(files, edges):
        problems.append("import cycle: " + " -> ".join(c))
    # Module cycles: under each folder, its own file and its children.
    folders = {tuple(module_of(f)[:-1]) for f in files if module_of(f)} | {()}
    folders |= {tuple(module_of(f)) for f in files if f.endswith("mod.rs")}
    for folder in sorted(folders):
        depth = len(folder)

        def node(f):
            m = module_of(f)
            if m[:depth] != list(folder):
                return None
            return "/".join(m[: depth + 1]) if len(m) > depth else ("/".join(folder) or "lib") + " (own file)"

        nodes, medges = set(), {}
        for f, outs in edges.items():
            a = node(f)
            if a is None:
                continue
            nodes.add(a)
            for t in outs:
                b = node(t)
                if b is not None and b != a:
                    nodes.add(b)
                    medges.setdefault(a, set()).add(b)
        for c in cycles(nodes, medges):
            if len(c) > 2 or c[0] != c[-1]:
                problems.append("module cycle: " + " -> ".join(c))
    problems += unlisted_tests(os.path.join(os.path.dirname(SRC), "tests"), "integration.rs", "fabric-msg/tests")
    examples = os.path.join(os.path.dirname(os.path.dirname(SRC)), "examples", "tests")
    problems += unlisted_tests(examples, "examples.rs", "examples/tests")
    problems += untested_tools(os.path.join(os.path.dirname(examples), "src", "bin"))
    for p in problems:
        print(p)
    print(f"check-layers: {len(files)} files, {sum(len(e) for e in edges.values())} imports, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
