"""A fresh virtual environment with only the wheel (`make wheel`) installed,
no extras: the core works, and each optional feature says in one line what
to install instead of failing with a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    wheels = sorted((ROOT / "target" / "wheels").glob(f"ferroplasma-*-{tag}-*.whl"))
    if not wheels:
        pytest.skip(f"no {tag} wheel in target/wheels: `make wheel` builds it (make test does)")
    d = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(d)], check=True)
    subprocess.run(
        [d / "bin" / "pip", "install", "-q", "--no-index", "--no-deps", str(wheels[-1])],
        check=True,
    )
    for module in ("numpy", "pandas", "pyarrow", "duckdb"):
        probe = subprocess.run([d / "bin" / "python", "-c", f"import {module}"])
        assert probe.returncode != 0, f"{module} should not be in the bare venv"
    return d


def run(venv: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]], capture_output=True, text=True, timeout=60, **kw
    )


def one_line_error(out: subprocess.CompletedProcess, *words: str) -> None:
    assert out.returncode == 1, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.parametrize(
    "argv, missing",
    [
        (["records", "gen", "--size", "1MB", "--out", "x"], "numpy"),
        (["dataframe", "sort", "--input", "t.parquet", "--by", "k"], "numpy"),
        (["scan-server", "--root", "."], "duckdb"),
    ],
)
def test_optional_commands_name_what_to_install(venv, argv, missing, tmp_path):
    out = run(venv, "ferroplasma", *argv, cwd=tmp_path)
    one_line_error(out, missing, "pip install", ".[", "not installed")


def test_optional_modules_raise_missing_dependency(venv):
    for code, extra in [
        ("import ferroplasma as fp; fp.scan.connect('127.0.0.1:9')", "scan"),
        ("import ferroplasma.jobs", "jobs"),
    ]:
        out = run(venv, "python", "-c", code)
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("ferroplasma.errors.MissingDependency:"), out.stderr
        assert f".[{extra}]" in last


def test_the_core_works_without_extras(venv, tmp_path):
    sock = tmp_path / "s.sock"
    store = subprocess.Popen(
        [venv / "bin" / "ferroplasma", "store", "-m", "64MiB", "-s", sock],
        stderr=subprocess.DEVNULL,
    )
    try:
        code = (
            "import sys, time, ferroplasma as fp, ferroplasma.plasma as plasma\n"
            "for _ in range(500):\n"
            "    try:\n"
            "        c = fp.connect(sys.argv[1]); break\n"
            "    except fp.StoreUnavailable:\n"
            "        time.sleep(0.02)\n"
            "oid = c.put({'a': [1, 2, 3], 'b': b'x' * 100_000})\n"
            "assert c.get(str(oid)) == {'a': [1, 2, 3], 'b': b'x' * 100_000}\n"
            "p = plasma.connect(sys.argv[1])\n"
            "assert p.get(p.put('plasma')) == 'plasma'\n"
            "print('ok')\n"
        )
        out = run(venv, "python", "-c", code, str(sock))
        assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    finally:
        store.terminate()
        assert store.wait(10) == 0
    assert not sock.exists()
    assert run(venv, "plasma_store", "--help").returncode == 0


def test_a_wheel_install_needs_no_rust(venv):
    # The installed package is the wheel's compiled module, not a build.
    out = run(venv, "python", "-c", "import ferroplasma._native as n; print(n.__file__)")
    assert out.returncode == 0 and str(venv) in out.stdout
    assert os.path.exists(out.stdout.strip())
    assert "manylinux" in sorted((ROOT / "target" / "wheels").glob("*.whl"))[-1].name


def test_the_store_executable_beside_the_installed_package(venv, tmp_path):
    site = next((venv / "lib").glob("python3*/site-packages/ferroplasma"))
    sock = tmp_path / "p.sock"
    proc = subprocess.Popen(
        [site / "plasma-store-server", "-m", "5000000", "-s", sock],
        env={"PATH": "/usr/bin:/bin"},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        code = "import sys, ferroplasma.plasma as p; print(p.connect(sys.argv[1]).store_capacity())"
        out = run(venv, "python", "-c", code, str(sock))
        assert out.stdout.strip() == "5000000", out.stderr
    finally:
        proc.terminate()
        assert proc.wait(10) == 0, proc.stderr.read()
