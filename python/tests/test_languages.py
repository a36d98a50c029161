"""Every language reads the same bytes: C, C++, Go and Java programs (built
against libferroplasma, `make c-lib`; C++ also against the Arrow C++ library
that pyarrow ships, Java against Arrow Java, `make java`) read what Python
put, in place, and Python reads a table C++, Go or Java put, as a zero-copy
pyarrow.Table."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import ferroplasma as fp

ROOT = Path(__file__).resolve().parents[2]
C_OUT = ROOT / "target" / "c"
TESTS = ROOT / "crates" / "capi" / "tests"
GO_MODULE = ROOT / "go" / "ferroplasma"
GO = shutil.which("go") or "/usr/local/go/bin/go"
JAVA_OUT = ROOT / "target" / "java"


def go_build(package: str, out: Path) -> None:
    """Builds a package of go/ferroplasma with cgo against target/c."""
    if not Path(GO).exists():
        pytest.fail("Go is not installed: the Go client needs Go >= 1.25 (https://go.dev/dl)")
    env = dict(
        os.environ,
        PKG_CONFIG_PATH=str(C_OUT / "lib" / "pkgconfig"),
        CGO_LDFLAGS=f"-Wl,-rpath,{C_OUT / 'lib'}",
    )
    done = subprocess.run(
        [GO, "build", "-o", str(out), package],
        cwd=GO_MODULE,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def build(tmp: Path, compiler: str, source: Path, *extra: str) -> Path:
    lib = C_OUT / "lib"
    if not (lib / "libferroplasma.so").exists():
        pytest.fail("target/c has no libferroplasma.so: run `make c-lib` (make build does)")
    out = tmp / source.stem
    cmd = [
        compiler,
        str(source),
        f"-I{C_OUT / 'include'}",
        "-O1",
        "-Wall",
        "-Werror",
        "-o",
        str(out),
        *extra,
        f"-L{lib}",
        "-lferroplasma",
        f"-Wl,-rpath,{lib}",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out


def arrow_flags() -> list[str]:
    libdir = pa.get_library_dirs()[0]
    libarrow = sorted(Path(libdir).glob("libarrow.so.*"))[0]
    return [f"-I{pa.get_include()}", str(libarrow), f"-Wl,-rpath,{libdir}"]


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("languages")
    c = build(tmp, "cc", TESTS / "c" / "read_python.c", "-std=c11")
    cpp = build(tmp, "c++", TESTS / "cpp" / "arrow_exchange.cpp", "-std=c++20", *arrow_flags())
    return c, cpp


def python_table() -> pa.Table:
    n = 2000
    ints = [None if i % 11 == 0 else i * 5 for i in range(n)]
    floats = [None if i % 13 == 0 else i * 0.5 for i in range(n)]
    strings = [None if i % 17 == 0 else f"ünï {i}" * (i % 3) for i in range(n)]
    lists = [None if i % 19 == 0 else list(range(i % 5)) for i in range(n)]
    return pa.table(
        {
            "i": pa.array(ints, pa.int64()),
            "f": pa.array(floats, pa.float64()),
            "s": pa.array(strings, pa.string()),
            "l": pa.array(lists, pa.list_(pa.int32())),
        }
    )


def table_from_other_languages() -> pa.Table:
    """What the C++ and Go programs put (the same in both)."""
    rows = range(1000)
    return pa.table(
        {
            "i": pa.array([None if i % 7 == 0 else i * 3 for i in rows], pa.int64()),
            "s": pa.array([None if i % 7 == 0 else f"row {i}" for i in rows], pa.string()),
            "l": pa.array(
                [None if i % 7 == 0 else [i + j for j in range(i % 4)] for i in rows],
                pa.list_(pa.int32()),
            ),
        }
    )


def checksum(column: pa.ChunkedArray) -> str:
    values = [v for v in column.to_pylist() if v is not None]
    if pa.types.is_string(column.type):
        total = sum(len(v.encode()) for v in values)
    elif pa.types.is_list(column.type):
        total = sum(sum(v) for v in values)
    else:
        total = sum(values)
    return f"count={len(values)} nulls={column.null_count} sum={total:.3f}"


def test_c_and_cpp_read_what_python_put_without_copying(client, programs):
    c_prog, cpp_prog = programs
    table = python_table()
    arr = np.arange(12_000, dtype="<f8").reshape(300, 40) * 0.25
    tid, aid = client.put(table), client.put(arr)
    sock = client.socket

    out = subprocess.run(
        [str(cpp_prog), sock, "read", tid.hex(), aid.hex()], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    expected = [f"rows {table.num_rows}"]
    expected += [f"column {name} {checksum(table[name])}" for name in table.column_names]
    expected += [f"array <f8 ndim=2 shape=300x40 order=C sum={arr.sum():.3f}", "outside 0"]
    assert out.stdout.splitlines() == expected

    out = subprocess.run([str(c_prog), sock, tid.hex(), aid.hex()], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    [buf] = client.get_buffers([tid])
    view = memoryview(buf)
    p_off, p_len = int.from_bytes(view[16:24], "little"), int.from_bytes(view[24:32], "little")
    fnv = 1469598103934665603
    for byte in bytes(view[p_off : p_off + p_len]):
        fnv = ((fnv ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    del view, buf
    assert out.stdout.splitlines() == [
        f"table kind=1 ipc=1 inside=1 fnv={fnv:016x}",
        f"array <f8 ndim=2 shape=300x40 order=C sum={arr.sum():.3f} inside=1",
    ]


def test_python_reads_a_table_cpp_put_as_a_view_of_the_store(client, programs):
    _, cpp_prog = programs
    oid = fp.ObjectID.random()
    out = subprocess.run(
        [str(cpp_prog), client.socket, "put", oid.hex()], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == "put", out.stderr
    got = client.get(oid)
    expected = table_from_other_languages()
    assert isinstance(got, pa.Table) and got.equals(expected)
    [buf] = client.get_buffers([oid])
    for column in got.columns:
        for chunk in column.chunks:
            for b in chunk.buffers():
                if b is not None and b.size:
                    assert buf.address <= b.address < buf.address + len(buf), "copied"


@pytest.fixture(scope="module")
def go_program(tmp_path_factory):
    """go/ferroplasma/cmd/arrowexchange."""
    out = tmp_path_factory.mktemp("go") / "arrowexchange"
    go_build("./cmd/arrowexchange", out)
    return out


def test_go_reads_a_table_and_an_array_python_put_without_copying(client, go_program):
    table = python_table()
    arr = np.arange(12_000, dtype="<f8").reshape(300, 40) * 0.25
    tid, aid = client.put(table), client.put(arr)
    out = subprocess.run(
        [str(go_program), client.socket, "read", tid.hex(), aid.hex()],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    expected = [f"rows {table.num_rows}"]
    expected += [f"column {name} {checksum(table[name])}" for name in table.column_names]
    expected += [f"array <f8 ndim=2 shape=300x40 order=C sum={arr.sum():.3f}", "outside 0"]
    assert out.stdout.splitlines() == expected


def test_python_reads_a_table_go_put_as_a_view_of_the_store(client, go_program):
    oid = fp.ObjectID.random()
    out = subprocess.run(
        [str(go_program), client.socket, "put", oid.hex()], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == "put", out.stderr
    got = client.get(oid)
    expected = table_from_other_languages()
    assert isinstance(got, pa.Table) and got.equals(expected)


def test_the_go_example_in_docs_languages_md_runs(client, tmp_path):
    """docs/languages.md's Go program is go/ferroplasma/examples/hello, as written."""
    doc = (ROOT / "docs" / "languages.md").read_text()
    start = doc.index("```go\n") + len("```go\n")
    example = GO_MODULE / "examples" / "hello" / "main.go"
    assert doc[start : doc.index("```", start)] == example.read_text()
    go_build("./examples/hello", tmp_path / "hello")
    ran = subprocess.run([str(tmp_path / "hello"), client.socket], capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout == "hello\n", ran.stderr


def java_command(main: str) -> list[str]:
    """Runs a class of the Java client's tests (`make java` built them)."""
    classpath = JAVA_OUT / "classpath.txt"
    if not classpath.exists() or not (JAVA_OUT / "maven" / "test-classes").exists():
        pytest.fail("the Java client is not built: run `make java`")
    jars = classpath.read_text().strip()
    cp = f"{JAVA_OUT / 'maven' / 'classes'}:{JAVA_OUT / 'maven' / 'test-classes'}:{jars}"
    return ["java", "--add-opens=java.base/java.nio=ALL-UNNAMED", "-cp", cp, main]


JAVA_EXCHANGE = "io.ferroplasma.plasma.arrow.ArrowExchange"


def test_java_reads_a_table_and_an_array_python_put_without_copying(client):
    table = python_table()
    arr = np.arange(12_000, dtype="<f8").reshape(300, 40) * 0.25
    tid, aid = client.put(table), client.put(arr)
    out = subprocess.run(
        [*java_command(JAVA_EXCHANGE), client.socket, "read", tid.hex(), aid.hex()],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    expected = [f"rows {table.num_rows}"]
    expected += [f"column {name} {checksum(table[name])}" for name in table.column_names]
    expected += [f"array <f8 ndim=2 shape=300x40 order=C sum={arr.sum():.3f}", "outside 0"]
    assert out.stdout.splitlines() == expected


def test_python_reads_a_table_java_put_as_a_view_of_the_store(client):
    oid = fp.ObjectID.random()
    out = subprocess.run(
        [*java_command(JAVA_EXCHANGE), client.socket, "put", oid.hex()],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and out.stdout.strip() == "put", out.stdout + out.stderr
    got = client.get(oid)
    assert isinstance(got, pa.Table) and got.equals(table_from_other_languages())
    [buf] = client.get_buffers([oid])
    view = memoryview(buf)
    lo = np.frombuffer(view, dtype=np.uint8).ctypes.data
    for column in got.columns:
        for chunk in column.chunks:
            for b in chunk.buffers():
                if b is not None and b.size:
                    assert lo <= b.address < lo + len(view), "copied"


def test_the_java_example_in_docs_languages_md_runs(client):
    """docs/languages.md's Java program is java/src/test/java/Hello.java, as written."""
    doc = (ROOT / "docs" / "languages.md").read_text()
    start = doc.index("```java\n") + len("```java\n")
    example = ROOT / "java" / "src" / "test" / "java" / "Hello.java"
    assert doc[start : doc.index("```", start)] == example.read_text()
    before = len(client.list())
    ran = subprocess.run([*java_command("Hello"), client.socket], capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout == "hello\n", ran.stdout + ran.stderr
    assert len(client.list()) == before, "the example left its object behind"
