"""The layout rules of CONTRIBUTING.md, checked: no import circles between
the Rust files of crates/ (bench/check_import_circles.py, also run by
`make lint`), no source file over 600 lines before its tests, and a map
(docs/architecture.md) that names every crate and module directory."""

from __future__ import annotations

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
