"""Fails when the Rust files under crates/ import each other in a circle.

    python bench/check_import_circles.py [crates]

Every `use crate::…`, `use super::…`, `use self::…` and inline `crate::…` /
`super::…` path in a crate's non-test code is an edge from its file to the
file of the module it names (`pub use` re-exports are followed to where the
item is defined). A circle is a set of files each reachable from the others.

One relation is allowed: a directory module's `mod.rs` (or `lib.rs`) and the
files directly inside it may use each other, since one type's `impl` is
often spread over them (`connection/mod.rs` defines `Connection`,
`connection/gets.rs` adds its gets). A circle that stays within such a
family is not reported; one that leaves it (a file outside uses a file of
the family, which, through its `mod.rs`, uses that file) is, and so is a
circle between two files of a family that does not pass through its
`mod.rs`. Each is reported with one line per import that closes it. Test
code (`#[cfg(test)]` modules and `*_tests.rs`, `tests.rs`, `testkit.rs`
files) is left out.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

TEST_FILES = re.compile(r"(^|_)tests?\.rs$|^testkit\.rs$")
USE = re.compile(r"\b(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.S)
INLINE = re.compile(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)")
CFG_TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
RAW_STRING = re.compile(r'b?r(#*)"')
CHAR = re.compile(r"b?'(?:\\.[^']*|[^\\'])'")
PATH_MOD = re.compile(r"#\[path\s*=\s*\"[^\"]+\"\]\s*mod\s+\w+\s*;")


def strip_comments(text: str) -> str:
    """The code without comments, and with string and char literals empty."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while depth and i < n:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif m := RAW_STRING.match(text, i):
            end = text.find('"' + m.group(1), m.end())
            out.append('""')
            i = n if end < 0 else end + 1 + len(m.group(1))
        elif c == '"' or text.startswith('b"', i):
            i += 2 if c == "b" else 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            out.append('""')
            i += 1
        elif m := CHAR.match(text, i):
            out.append("' '")
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_test_modules(text: str) -> str:
    while m := CFG_TEST_MOD.search(text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        text = text[: m.start()] + text[i:]
    return PATH_MOD.sub("", text)


def expand(tree: str) -> list[str]:
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e'] (`as` dropped)."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", tree))
    if "{" not in tree:
        return [tree]
    head, rest = tree.split("{", 1)
    body = rest[: rest.rindex("}")]
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    out = []
    for p in filter(None, parts):
        for e in expand(p):
            out.append(head + e if e != "self" else head.rstrip(":"))
    return out


class Crate:
    def __init__(self, src: Path) -> None:
        self.src = src
        self.files: dict[tuple[str, ...], Path] = {}
        for f in src.rglob("*.rs"):
            if TEST_FILES.search(f.name) or f.relative_to(src).parts == ("main.rs",):
                continue
            rel = f.relative_to(src).with_suffix("").parts
            if rel[-1] in ("lib", "main", "mod"):
                rel = rel[:-1]
            self.files[rel] = f
        self.text = {
            m: strip_test_modules(strip_comments(f.read_text())) for m, f in self.files.items()
        }
        self.reexports: dict[tuple[str, ...], dict[str, tuple[str, ...]]] = {}
        for m, t in self.text.items():
            names: dict[str, tuple[str, ...]] = {}
            for tree in re.findall(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", t):
                for path in expand(tree):
                    p = self.absolute(m, path.split("::"))
                    if p:
                        names[p[-1]] = p
            self.reexports[m] = names

    def absolute(self, m: tuple[str, ...], parts: list[str]) -> tuple[str, ...] | None:
        """The path `parts`, written in module `m`, from the crate root."""
        base = list(m)
        if parts[0] == "crate":
            base, parts = [], parts[1:]
        elif parts[0] == "super":
            base = list(m[:-1])
            parts = parts[1:]
            while parts and parts[0] == "super":
                base, parts = base[:-1], parts[1:]
        elif parts[0] == "self":
            parts = parts[1:]
        elif (*m, parts[0]) in self.files:
            pass  # a child module used by name (2018 paths)
        else:
            return None  # an external crate
        return tuple(base + [p for p in parts if p != "*"])

    def file_of(self, path: tuple[str, ...], seen: int = 0) -> tuple[str, ...] | None:
        for k in range(len(path), -1, -1):
            m = path[:k]
            if m in self.files:
                rest = path[k:]
                if rest and seen < 8 and rest[0] in self.reexports.get(m, {}):
                    target = self.reexports[m][rest[0]] + tuple(rest[1:])
                    if target[: len(m)] != m or len(target) > len(m):
                        found = self.file_of(target, seen + 1)
                        if found is not None and found != m:
                            return found
                return m
        return None

    def edges(self, family: bool = False) -> dict[tuple[str, ...], dict[tuple[str, ...], str]]:
        """File -> files it uses, each with one path that uses it; with
        `family` false, without the edges between a directory module and
        the files directly in it."""
        out: dict[tuple[str, ...], dict[tuple[str, ...], str]] = {}
        for m, t in self.text.items():
            paths = [p for tree in USE.findall(t) for p in expand(tree)]
            paths += INLINE.findall(USE.sub("", t))
            for path in paths:
                a = self.absolute(m, path.split("::"))
                if a is None:
                    continue
                f = self.file_of(a)
                if f is None or f == m:
                    continue
                if not family and (f[:-1] == m or m[:-1] == f):
                    continue  # a directory module and a file directly in it
                out.setdefault(m, {}).setdefault(f, path)
        return out


def circles(edges: dict) -> list[list]:
    """Strongly connected components of more than one file (Tarjan)."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on: set = set()
    found: list[list] = []
    counter = [0]

    def visit(v) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
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
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def one_family(comp: list) -> bool:
    """Whether the files are one directory module and files directly in it."""
    return any(all(m == p or m[:-1] == p for m in comp) for p in {m for m in comp})


def found(crate: Crate) -> list[tuple[list, dict]]:
    """The circles: among files, leaving out the edges between a directory
    module and its own files; and through those edges, unless the circle
    stays within one such family."""
    out = []
    full = crate.edges(family=True)
    for comp in circles(full):
        if not one_family(comp):
            out.append((comp, full))
    strict = crate.edges()
    for comp in circles(strict):
        if not any(set(comp) <= set(c) for c, _ in out):
            out.append((comp, strict))
    return out


def main(root: str = "crates") -> int:
    bad = 0
    for src in sorted(Path(root).glob("*/src")):
        crate = Crate(src)
        for comp, edges in found(crate):
            bad += 1
            names = [str(crate.files[m]) for m in comp]
            print(f"import circle in {src.parent.name}: {', '.join(names)}")
            for m in comp:
                for f, path in edges.get(m, {}).items():
                    if f in comp:
                        print(f"  {crate.files[m]} uses {path} ({crate.files[f]})")
    if bad:
        print(f"{bad} import circle(s): move what both sides need to one place (CONTRIBUTING.md)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
