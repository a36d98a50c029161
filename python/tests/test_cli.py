"""The commands as a person at a terminal meets them: Ctrl-C, help, logs,
interrupted jobs, and the messages of the common mistakes."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

import ferroplasma as fp
from conftest import eventually

FP = [sys.executable, "-m", "ferroplasma"]


def _under_pty(argv: list[str], ready: bytes, tmp_path) -> tuple[int, str]:
    """Runs argv on a pseudo-terminal, types Ctrl-C once `ready` was printed;
    returns (exit code, everything printed)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec the command on the terminal
        os.chdir(tmp_path)
        os.execvp(argv[0], argv)
    out = b""
    deadline = time.monotonic() + 60
    sent = False
    while time.monotonic() < deadline:
        if not sent and ready in out:
            os.write(fd, b"\x03")  # what the terminal turns into SIGINT
            sent = True
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child is gone and the terminal closed
                break
            if not chunk:
                break
            out += chunk
    else:  # the deadline passed: do not wait for the child forever
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert sent, f"never saw {ready!r}: {out.decode(errors='replace')}"
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


@pytest.mark.parametrize("command", [["store"], ["plasma_store"]])
def test_ctrl_c_stops_the_store_cleanly(command, tmp_path):
    sock = tmp_path / "s.sock"
    if command == ["plasma_store"]:
        exe = os.path.join(os.path.dirname(sys.executable), "plasma_store")
        argv = [exe, "-m", "10000000", "-s", str(sock)]
    else:
        argv = [*FP, "store", "-m", "16MiB", "-s", str(sock)]
    code, out = _under_pty(argv, b"ready", tmp_path)
    assert code == 0, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    assert "SIGINT" in out
    # ferroplasma store removes its socket; plasma_store leaves it, as
    # Plasma's store did (programs written for it remove it themselves).
    assert sock.exists() == (command == ["plasma_store"])


def test_help_names_the_python_commands():
    for name in ("records", "scan-server", "dataframe"):
        r = subprocess.run([*FP, "help", name], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and f"ferroplasma {name}" in r.stdout, r.stderr


def _gen(tmp_path, size="60MB"):
    inp = tmp_path / "in"
    r = subprocess.run(
        [*FP, "records", "gen", "--size", size, "--files", "4", "--out", str(inp), "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return inp


def _interrupt_mid_map(argv: list[str], phase: str = "map") -> tuple[int, str]:
    """Starts argv in a process group of its own and, once `phase` reports
    progress, sends SIGINT to the whole group, as Ctrl-C does."""
    p = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, start_new_session=True)
    err = ""
    for line in p.stderr:
        err += line
        if line.startswith(f"{phase}:"):
            os.killpg(p.pid, signal.SIGINT)
            break
    err += p.stderr.read()
    return p.wait(60), err


def test_a_records_sort_interrupted_mid_map_leaves_nothing(tmp_path):
    inp, out = _gen(tmp_path), tmp_path / "out"
    sort = [
        *FP, "records", "sort", "--input", str(inp), "--output", str(out), "--partitions", "8",
        "--split-size", "2MiB", "--workers", "2", "--socket", str(tmp_path / "none.sock"),
    ]  # fmt: skip
    code, err = _interrupt_mid_map(sort)
    assert code == 130, err
    assert "Traceback" not in err and "Broken pipe" not in err, err
    assert err.strip().splitlines()[-1].endswith("interrupted; no part files were written")
    assert "started a private store" in err
    private_socket = err.split("(socket ")[1].split(",")[0]
    assert not os.path.exists(private_socket), "the private store was stopped"
    assert [f for f in os.listdir(out) if "part" in f] == []
    # The next run needs no --overwrite.
    r = subprocess.run([*sort, "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == [f"part-{p:05d}" for p in range(8)]


def test_a_records_sort_interrupted_mid_reduce_leaves_no_part_files(tmp_path):
    inp, out = _gen(tmp_path), tmp_path / "out"
    sort = [
        *FP, "records", "sort", "--input", str(inp), "--output", str(out), "--partitions", "32",
        "--split-size", "4MiB", "--workers", "2", "--socket", str(tmp_path / "none.sock"),
    ]  # fmt: skip
    code, err = _interrupt_mid_map(sort, phase="reduce")
    if code == 0:
        pytest.skip("the reduce finished before the interrupt arrived")
    assert code == 130 and "Traceback" not in err, err
    assert [f for f in os.listdir(out) if "part" in f] == []


def test_a_records_sort_on_a_shared_store_interrupted_leaves_the_store_empty(tmp_path):
    inp, out = _gen(tmp_path, "30MB"), tmp_path / "out"
    with fp.start_store("256MiB") as store:
        sort = [
            *FP, "records", "sort", "--input", str(inp), "--output", str(out),
            "--partitions", "4", "--split-size", "1MiB", "--workers", "2",
            "--socket", store.socket,
        ]  # fmt: skip
        code, err = _interrupt_mid_map(sort)
        assert code == 130 and "Traceback" not in err, err
        assert [f for f in os.listdir(out) if "part" in f] == []
        client = store.connect()
        # The workers' connections close asynchronously; what they held goes then.
        eventually(lambda: client.list() == {}, what="the job's objects deleted")


def test_a_records_gen_interrupted_leaves_no_partial_files(tmp_path):
    """Ctrl-C during `records gen` left full-size files, some all NUL bytes,
    that the next sort then failed on."""
    out = tmp_path / "g"
    gen = [*FP, "records", "gen", "--size", "300MB", "--files", "3", "--workers", "2"]
    gen += ["--out", str(out)]
    code, err = _interrupt_mid_map(gen, phase="gen")
    if code == 0:
        pytest.skip("the generation finished before the interrupt arrived")
    assert code == 130 and "Traceback" not in err, err
    assert os.listdir(out) == [], "partial files were left"


def test_progress_in_a_log_file_has_no_carriage_returns(tmp_path):
    log = tmp_path / "gen.log"
    with open(log, "w") as f:
        r = subprocess.run(
            [*FP, "records", "gen", "--size", "2MB", "--out", str(tmp_path / "g")],
            stderr=f,
            timeout=120,
        )
    assert r.returncode == 0
    text = log.read_text()
    assert "\r" not in text and "100%" in text


def test_dataframe_sort_of_objects_without_a_store_says_so(tmp_path):
    r = subprocess.run(
        [*FP, "dataframe", "sort", "--objects", "ab" * 20, "--by", "k",
         "--socket", str(tmp_path / "none.sock")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "no store answers" in r.stderr and "private" not in r.stderr


def test_an_object_larger_than_the_store_gets_the_right_advice():
    with fp.start_store("1MiB") as store:
        with pytest.raises(fp.StoreFull, match="more than the whole store") as e:
            store.connect().put(b"x" * (2 << 20))
        assert "release or delete" not in str(e.value)


def test_printed_ids_can_be_passed_back(client):
    oid = client.put("hello")
    assert client.get(str(oid)) == "hello"
    assert fp.ObjectID(str(oid)) == oid
    assert client.contains(str(oid)) and client.delete(str(oid)) == ["deleted"]
    with pytest.raises(fp.InvalidRequest, match="40 hex digits"):
        client.get("not an id")


def test_a_private_store_ends_with_the_program_that_started_it():
    # start_store's store runs in a session of its own (Ctrl-C does not hit
    # it), so it must notice its program is gone, even killed with SIGKILL.
    code = (
        "import ferroplasma as fp, sys, time\n"
        "with fp.start_store('16MiB') as s:\n"
        "    print(s.process.pid, s.socket, flush=True)\n"
        "    time.sleep(600)\n"
    )
    prog = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid, sock = prog.stdout.readline().split()
    prog.kill()
    prog.wait()
    deadline = time.monotonic() + 20
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = os.path.exists(f"/proc/{pid}") and "zombie" not in open(f"/proc/{pid}/status").read()
    if alive:
        os.kill(int(pid), signal.SIGKILL)
    assert not alive, "the store outlived the program that started it"
    assert not os.path.exists(sock), "and it removed its socket"


def test_stats_watch_prints_rates_as_lines_off_a_terminal(store, client):
    """Piped, each look is one line of key=value pairs; puts made between
    looks show as a rate; when the store goes, the watch says so and
    exits with an error."""
    watch = subprocess.Popen(
        [*FP, "stats", "--watch", "0.2", "--socket", store.socket],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        while len(lines) < 8:
            client.put(b"x" * 100)
            line = watch.stdout.readline()
            assert line, watch.stderr.read()
            lines.append(dict(kv.split("=", 1) for kv in line.split()))
        assert all("objects_per_s" in d and "evictions" in d for d in lines), lines
        assert max(float(d["objects_per_s"]) for d in lines) > 0, lines
        assert int(lines[-1]["objects"]) > int(lines[0]["objects"])
        store.process.terminate()
        assert watch.wait(30) != 0
        assert "stopped answering" in watch.stderr.read()
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()


def test_stats_watch_redraws_on_a_terminal_and_stops_on_ctrl_c(store, tmp_path):
    code, out = _under_pty(
        [*FP, "stats", "--watch", "0.2", "--socket", store.socket], b"restores", tmp_path
    )
    assert "\x1b[2J" in out and "rate" in out and "objects" in out, out
    assert "Traceback" not in out, out
    assert code == -signal.SIGINT, (code, out)  # Ctrl-C ended it at once


def test_stats_watch_of_a_cluster_shows_its_members(tmp_path):
    from conftest import member_address

    common = {"cluster_token": "t", "heartbeat_interval": "100ms", "peer_timeout": "2s"}
    with fp.start_store("16MiB", cluster_listen="127.0.0.1:0", **common) as a:
        seed = member_address(a.connect())
        with fp.start_store("16MiB", cluster_listen="127.0.0.1:0", join=seed, **common):
            watch = subprocess.Popen(
                [*FP, "stats", "--watch", "0.2", "--cluster", "--socket", a.socket],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                eventually(
                    lambda: "members_up=2" in watch.stdout.readline(),
                    what="both members up in the watch",
                )
            finally:
                watch.kill()
                watch.wait()


@pytest.mark.parametrize("command", [["list"], ["stats"], ["stats", "--watch", "0.05"]])
def test_a_command_piped_into_a_closed_reader_exits_quietly(command, client):
    """`ferroplasma list | head -5` printed a panic and a traceback."""
    for _ in range(3000):
        client.put(b"x")
    p = subprocess.Popen(
        [*FP, *command, "-s", client.socket],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdout.readline()
    p.stdout.close()  # what `head -1` does once it has its line
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert b"panicked" not in err and b"Traceback" not in err, err


def test_help_and_errors_point_a_wheel_user_at_what_they_have(tmp_path):
    """The package is on no index and a wheel user has no Makefile: help and
    errors say neither `pip install ferroplasma` nor `make run`."""
    top = subprocess.run([*FP, "--help"], capture_output=True, text=True, timeout=60)
    missing = subprocess.run(
        [*FP, "stats", "-s", str(tmp_path / "none.sock")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode != 0 and "ferroplasma store" in missing.stderr
    for text in (top.stdout, missing.stderr):
        assert "pip install ferroplasma" not in text and "make run" not in text, text
