"""The layout rules of CONTRIBUTING.md, checked: no import circles between
the Rust files of crates/ (bench/check_import_circles.py, also run by
`make lint`), no source file over 600 lines before its tests, and a map
(docs/architecture.md) that names every crate and module directory."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "bench" / "check_import_circles.py"


def _crate(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        p = tmp_path / "crates" / "demo" / "src" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path / "crates"


def _check(crates: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECK), str(crates)], capture_output=True, text=True, timeout=60
    )


def test_the_checker_names_each_import_that_closes_a_circle(tmp_path):
    crates = _crate(
        tmp_path,
        {
            "lib.rs": "mod a;\nmod b;\nmod c;\npub use c::Thing;\n",
            "a.rs": "use crate::b::{self, helper as h};\npub const A: u8 = 1;\n",
            # b reaches a through c, and an inline path; strings and
            # comments do not count.
            "b.rs": 'pub fn helper() { let _ = "crate::a::A"; } // crate::a::A\n'
            "pub fn other() -> u8 { crate::Thing::make() }\n",
            "c.rs": "pub struct Thing;\nimpl Thing { pub fn make() -> u8 { super::a::A } }\n",
        },
    )
    out = _check(crates)
    assert out.returncode == 1, out.stdout
    assert "a.rs, crates/demo/src/b.rs, crates/demo/src/c.rs" in out.stdout.replace(
        str(tmp_path) + "/", ""
    )
    assert "b.rs uses crate::Thing" in out.stdout  # followed through lib.rs's re-export
    assert "c.rs uses super::a::A" in out.stdout
    assert "uses crate::a::A" not in out.stdout


def test_a_directory_module_and_its_files_may_use_each_other_and_tests_do_not_count(tmp_path):
    crates = _crate(
        tmp_path,
        {
            "lib.rs": "mod conn;\nmod shared;\n",
            "conn/mod.rs": "mod gets;\npub use gets::LIMIT;\npub struct Conn;\n",
            "conn/gets.rs": "use super::Conn;\npub const LIMIT: usize = 1;\n",
            "conn/gets_tests.rs": "use crate::shared::S;\n",
            "shared.rs": "use crate::conn::LIMIT;\npub struct S;\n"
            "#[cfg(test)]\nmod tests { use crate::conn::Conn; }\n",
        },
    )
    out = _check(crates)
    assert out.returncode == 0, out.stdout


def test_a_circle_through_a_directory_module_is_found(tmp_path):
    """x.rs uses conn/gets.rs, gets uses its conn/mod.rs (allowed alone),
    and conn/mod.rs uses x.rs: x and conn import each other."""
    crates = _crate(
        tmp_path,
        {
            "lib.rs": "mod conn;\nmod x;\n",
            "conn/mod.rs": "mod gets;\npub struct Conn;\nfn f() { crate::x::helper() }\n",
            "conn/gets.rs": "use super::Conn;\npub const LIMIT: usize = 1;\n",
            "x.rs": "use crate::conn::gets::LIMIT;\npub fn helper() {}\n",
        },
    )
    out = _check(crates)
    assert out.returncode == 1, out.stdout
    assert "x.rs uses crate::conn::gets::LIMIT" in out.stdout
    assert "mod.rs uses crate::x::helper" in out.stdout


def _module_dirs() -> list[str]:
    dirs = [f"crates/{c.name}/" for c in sorted((ROOT / "crates").iterdir()) if c.is_dir()]
    for src in sorted((ROOT / "crates").glob("*/src")):
        dirs += [str(d.relative_to(ROOT)) + "/" for d in sorted(src.rglob("*")) if d.is_dir()]
    for pkg in ("python/ferroplasma", "go/ferroplasma", "java", "bench"):
        dirs += [
            str(d.relative_to(ROOT)) + "/"
            for d in sorted((ROOT / pkg).iterdir())
            if d.is_dir()
            and not d.name.startswith((".", "__"))
            and d.name not in ("results", "data")
        ]
    return dirs


def test_the_architecture_map_names_every_crate_and_module_directory():
    """docs/architecture.md went stale (a cluster "on the same runtime", no
    shared table, no metrics or scan). It must name every crate and every
    module directory, so a new one cannot be added without a place on it."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    missing = [d for d in _module_dirs() if d not in doc]
    assert not missing, f"docs/architecture.md does not name {missing}"
    assert "DESIGN.md" not in doc  # not in this repository: say what it asked instead


def test_no_import_circle_under_crates():
    out = _check(ROOT / "crates")
    assert out.returncode == 0, out.stdout


def test_no_source_file_is_over_600_lines_before_its_tests():
    long = {}
    for f in sorted((ROOT / "crates").glob("*/src/**/*.rs")):
        if f.name.endswith("_tests.rs") or f.name == "testkit.rs":
            continue
        text = f.read_text()
        m = re.search(r"^#\[cfg\(test\)\]\n(#\[path[^\n]*\n)?mod tests\b", text, re.M)
        code = text[: m.start() if m else len(text)].count("\n")
        if code > 600:
            long[str(f.relative_to(ROOT))] = code
    assert not long, long
