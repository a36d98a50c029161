"""Plasma's C++ client, on ferroplasma and on Plasma itself: the GoogleTest
suite crates/capi/tests/cpp/plasma_client_test.cc (the scenarios of Plasma's
own C++ client tests) is built twice from one source and run twice, each
build against its own store:

- against ferroplasma's Plasma compatibility headers, with the flags of
  `pkg-config --cflags --libs ferroplasma-plasma` only (as a Plasma user
  porting a program would), and the store `ferroplasma store`;
- against Plasma 11's own headers, libplasma and plasma-store-server (from
  the pyarrow 11.0.0 wheel, `make target/plasma-cpp/.extracted`), so that
  the suite is shown to test what Plasma did, not only what ferroplasma does.

Both must pass every test. A program in the style of Plasma's C++ tutorial
(crates/capi/tests/cpp/plasma_tutorial.cc: Arrow's readers and writers on
Plasma's buffers, arrow::Status macros) is built the same two ways and
prints the same on both. The pyarrow 11 wheel was built with the old C++
string ABI (manylinux2014), so Plasma's build compiles GoogleTest from
Debian's sources (libgtest-dev) with that ABI.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "crates" / "capi" / "tests" / "cpp" / "plasma_client_test.cc"
TUTORIAL = ROOT / "crates" / "capi" / "tests" / "cpp" / "plasma_tutorial.cc"
LIFETIMES = ROOT / "crates" / "capi" / "tests" / "cpp" / "plasma_lifetimes.cc"
C_OUT = ROOT / "target" / "c"
PLASMA = ROOT / "target" / "plasma-cpp" / "pyarrow"
GTEST_SRC = Path("/usr/src/googletest/googletest")
FERROPLASMA = ROOT / ".venv" / "bin" / "ferroplasma"


def need(path: Path, how: str) -> None:
    if not path.exists():
        pytest.fail(f"{path} is missing: {how}")


def compile_cmd(cmd: list[str], cwd: Path) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stderr[-4000:]}"


def run_suite(binary: Path, store_command: str) -> str:
    done = subprocess.run(
        [str(binary)],
        env=dict(os.environ, PLASMA_STORE_COMMAND=store_command),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    return done.stdout


def passed(out: str) -> int:
    m = re.search(r"\[  PASSED  \] (\d+) tests?\.", out)
    assert m, out[-2000:]
    return int(m.group(1))


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("plasma-cpp")


def ferroplasma_flags() -> list[str]:
    """`pkg-config --cflags --libs ferroplasma-plasma`, as a user runs it."""
    need(C_OUT / "lib" / "pkgconfig" / "ferroplasma-plasma.pc", "run `make c-lib`")
    env = dict(os.environ, PKG_CONFIG_PATH=str(C_OUT / "lib" / "pkgconfig"))
    return subprocess.run(
        ["pkg-config", "--cflags", "--libs", "ferroplasma-plasma"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


OLD_ABI = ["-std=c++17", "-O1", "-D_GLIBCXX_USE_CXX11_ABI=0", "-D_PLASMA_NO_DEPRECATE"]


def plasma_flags() -> list[str]:
    """Plasma 11's headers and libraries, from the pyarrow 11.0.0 wheel."""
    need(PLASMA / "plasma-store-server", "run `make target/plasma-cpp/.extracted`")
    return [
        f"-I{PLASMA / 'include'}",
        str(PLASMA / "libplasma.so.1100"),
        str(PLASMA / "libarrow.so.1100"),
        f"-Wl,-rpath,{PLASMA}",
    ]


def test_the_suite_passes_on_ferroplasma_built_with_pkg_config_flags_only(tmp):
    flags = ferroplasma_flags()
    need(Path("/usr/include/gtest/gtest.h"), "apt-get install libgtest-dev")
    binary = tmp / "suite-ferroplasma"
    cmd = ["c++", "-std=c++20", "-O1", "-Wall", "-Werror", str(SUITE), "-o", str(binary)]
    compile_cmd([*cmd, *flags, "-lgtest", "-lgtest_main", "-pthread"], tmp)
    out = run_suite(binary, f"{FERROPLASMA} store --socket {{socket}} --memory {{memory}}")
    assert passed(out) >= 26, out[-2000:]


def test_the_same_suite_passes_on_plasma_11(tmp):
    flags = plasma_flags()
    need(GTEST_SRC / "src" / "gtest-all.cc", "apt-get install libgtest-dev")
    if shutil.which("c++") is None:
        pytest.fail("no C++ compiler: apt-get install g++")
    gtest = [f"-I{GTEST_SRC / 'include'}", f"-I{GTEST_SRC}"]
    for src in ["gtest-all.cc", "gtest_main.cc"]:
        compile_cmd(["c++", *OLD_ABI, *gtest, "-c", str(GTEST_SRC / "src" / src)], tmp)
    binary = tmp / "suite-plasma"
    objects = ["gtest-all.o", "gtest_main.o"]
    cmd = ["c++", *OLD_ABI, *gtest, str(SUITE), *objects, "-o", str(binary)]
    compile_cmd([*cmd, *flags, "-pthread"], tmp)
    out = run_suite(binary, f"{PLASMA / 'plasma-store-server'} -s {{socket}} -m {{memory}}")
    assert passed(out) >= 26, out[-2000:]


def run_against(store: list[str], socket: Path, program: Path) -> str:
    """Runs `program SOCKET` against a store started by `store`."""
    proc = subprocess.Popen(store, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not socket.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        done = subprocess.run(
            [str(program), str(socket)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout
    finally:
        proc.kill()
        proc.wait()


def test_a_plasma_style_program_builds_unchanged_and_prints_the_same(tmp):
    ours, theirs = tmp / "tutorial-ferroplasma", tmp / "tutorial-plasma"
    strict = ["-O1", "-Wall", "-Werror", str(TUTORIAL)]
    compile_cmd(["c++", "-std=c++20", *strict, "-o", str(ours), *ferroplasma_flags()], tmp)
    compile_cmd(["c++", *OLD_ABI, str(TUTORIAL), "-o", str(theirs), *plasma_flags()], tmp)
    sock = tmp / "tutorial-fp.sock"
    got = run_against(
        [str(FERROPLASMA), "store", "--socket", str(sock), "--memory", "10000000"], sock, ours
    )
    sock = tmp / "tutorial-plasma.sock"
    want = run_against(
        [str(PLASMA / "plasma-store-server"), "-s", str(sock), "-m", "10000000"], sock, theirs
    )
    assert got == want
    assert "read: hello, plasma [text/plain]" in got and "again: exists=1" in got


def test_buffers_and_clients_live_as_long_as_their_uses_under_a_sanitizer(tmp):
    """crates/capi/tests/cpp/plasma_lifetimes.cc under AddressSanitizer and
    UBSan: a Get racing a Disconnect, buffers that outlive their thread and
    main. A use after free anywhere fails the run."""
    binary = tmp / "lifetimes"
    flags = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover"]
    cmd = ["c++", "-std=c++20", "-O1", "-g", *flags, str(LIFETIMES), "-o", str(binary)]
    compile_cmd([*cmd, *ferroplasma_flags(), "-pthread"], tmp)
    sock = tmp / "lifetimes.sock"
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0")
    proc = subprocess.Popen(
        [str(FERROPLASMA), "store", "--socket", str(sock), "--memory", "10000000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        done = subprocess.run(
            [str(binary), str(sock)], capture_output=True, text=True, timeout=60, env=env
        )
    finally:
        proc.kill()
        proc.wait()
    assert done.returncode == 0 and done.stdout == "ok\n", done.stdout + done.stderr[-4000:]
