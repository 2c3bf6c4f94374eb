#!/usr/bin/env python3
"""Import graph of a Rust crate's source files, from its `crate::` paths.

    python3 scripts/import-graph.py [SRC_DIR]      # default: lock-runtime/src

Every `crate::a::b::Name` and `super::Name` path (in `use` lines, grouped `use crate::{..}`
trees and inline paths) becomes an arrow from the file it is written in to the file that defines module
`a::b` (a path that names a module file is resolved as deep as the tree goes). Test modules
(`#[cfg(test)] mod tests { .. }` to the end of the file, and `*/tests.rs`) are left out.
Prints the arrows' strongly connected components of more than one file (import circles) and
exits 1 when there is one; `--edges` prints every arrow too.
"""
import os
import re
import sys

args = [a for a in sys.argv[1:] if not a.startswith("--")]
src = args[0] if args else "lock-runtime/src"
show_edges = "--edges" in sys.argv

files = {}  # module path tuple -> file
for root, _, names in os.walk(src):
    for n in names:
        if not n.endswith(".rs"):
            continue
        rel = os.path.relpath(os.path.join(root, n), src)
        parts = rel[:-3].split(os.sep)
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        if parts and parts[-1] == "tests":
            continue
        files[tuple(parts)] = rel


def strip(text):
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
    cut = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)
    return text[: cut.start()] if cut else text


def expand(tree, prefix=()):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]"""
    out, depth, cur = [], 0, ""
    items = []
    for ch in tree:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    for it in items:
        it = it.strip()
        if not it:
            continue
        m = re.match(r"^([\w:]*?)(::)?\{(.*)\}$", it, flags=re.S)
        if m:
            head = tuple(p for p in m.group(1).split("::") if p)
            out += expand(m.group(3), prefix + head)
        else:
            it = re.sub(r"\s+as\s+\w+$", "", it)
            out.append(prefix + tuple(p for p in it.split("::") if p))
    return out


def resolve(path):
    path = tuple(p for p in path if p not in ("self",))
    for k in range(len(path), -1, -1):
        if path[:k] in files:
            return files[path[:k]]
    return None


edges = set()
for mod, rel in files.items():
    text = strip(open(os.path.join(src, rel), encoding="utf-8").read())
    paths = []
    def absolute(root, rest):
        # `super::` names the parent of this file's module (for `engine/local.rs`, `engine`)
        return (mod[:-1] if root == "super" else ()) + rest

    for m in re.finditer(r"\buse\s+(crate|super)::(\{.*?\}|[^;]*?);", text, flags=re.S):
        body = m.group(2)
        for p in expand(body[1:-1] if body.startswith("{") and body.endswith("}") else body):
            paths.append(absolute(m.group(1), p))
    for m in re.finditer(r"(?<!use )(?<![\w:])(crate|super)::((?:\w+::)*\w+)", text):
        paths.append(absolute(m.group(1), tuple(m.group(2).split("::"))))
    for p in paths:
        target = resolve(p)
        if target and target != rel:
            edges.add((rel, target))

graph = {}
for a, b in edges:
    graph.setdefault(a, set()).add(b)

# Tarjan's strongly connected components
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)


def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in graph.get(v, ()):
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        sccs.append(comp)


for v in sorted(files.values()):
    if v not in index:
        visit(v)

if show_edges:
    for a, b in sorted(edges):
        print(f"{a} -> {b}")
circles = [sorted(c) for c in sccs if len(c) > 1]
print(f"{len(files)} files, {len(edges)} arrows, {len(circles)} import circle(s)")
for c in circles:
    inner = sorted((a, b) for a, b in edges if a in c and b in c)
    print(f"circle of {len(c)} files: {' '.join(c)}")
    for a, b in inner:
        print(f"    {a} -> {b}")
sys.exit(1 if circles else 0)
