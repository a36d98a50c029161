"""Every flag of every command, given the worst values a person or a script
could pass: no panic, no traceback, no hang; a refused value is a short
error and exit status 2.

The commands and their flags are read from ``--help``, so a flag added later
is fuzzed too."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

FP = [sys.executable, "-m", "ferroplasma"]
# Commands that serve until stopped: a value they accept leaves them running.
SERVERS = {"store", "scan-server"}
VALUES = ["0", "-3", "1e300", "99999999999999999999", "200000000000years", "", "127.0.0.1:99999"]
BAD_SIGNS = ("Traceback", "panicked", "PanicException", "RUST_BACKTRACE")


def _help(argv: list[str]) -> str:
    out = subprocess.run([*FP, *argv, "--help"], capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


def _subcommands(text: str) -> list[str]:
    """Names listed under a 'Commands:' heading (clap) or in '{a,b}' (argparse)."""
    names: list[str] = []
    for block in re.finditer(r"Commands[^\n]*:\n((?:  +\S.*\n?)+)", text):
        names += [ln.split()[0] for ln in block.group(1).splitlines() if ln.strip()]
    # argparse lists subcommands as a positional '{a,b}' at a line's start
    # (a flag's choices follow the flag).
    brace = re.search(r"(?m)^ +\{([a-z][a-z,-]+)\}", text)
    if brace:
        names += brace.group(1).split(",")
    return [n for n in dict.fromkeys(names) if n != "help"]


def _commands() -> list[tuple[list[str], list[str]]]:
    """(command words, its long flags) for every command and subcommand."""
    found = []
    top = _help([])
    todo = [[c] for c in _subcommands(top)]
    assert "scan-server" in todo[-3:] or ["scan-server"] in todo, todo
    while todo:
        cmd = todo.pop()
        text = _help(cmd)
        subs = _subcommands(text)
        todo += [[*cmd, s] for s in subs if s not in cmd]
        flags = sorted(set(re.findall(r"(?m)^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", text)))
        flags = [f for f in flags if f not in ("--help", "--version")]
        if flags:
            found.append((cmd, flags))
    return found


def _try(cmd: list[str], flag: str, value: str) -> str | None:
    """Runs one command with one flag's value; returns what went wrong."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(
            os.environ,
            FERROPLASMA_SOCKET=os.path.join(tmp, "s.sock"),
            FERROPLASMA_LOG="warn",
            PYTHONUNBUFFERED="1",
        )
        argv = [*FP, *cmd, f"{flag}={value}"]
        if cmd[0] == "scan-server" and flag != "--root":
            argv += ["--root", tmp]
        p = subprocess.Popen(
            argv, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        # Servers run until stopped: 2.5 s shows they started. Anything else
        # must end; 30 s tells a hang from a slow start on a loaded machine.
        wait = 2.5 if cmd[0] in SERVERS else 30
        try:
            out, err = p.communicate(timeout=wait)
            running = False
        except subprocess.TimeoutExpired:
            running = True
            p.send_signal(signal.SIGTERM)
            try:
                out, err = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                return f"{argv}: ignored SIGTERM"
        text = out + err
        if any(s in text for s in BAD_SIGNS):
            return f"{argv}: {text[-800:]}"
        if running and cmd[0] not in SERVERS:
            return f"{argv}: still running after {wait} s (a hang)"
        if not running and p.returncode not in (0, 1, 2):
            return f"{argv}: exit status {p.returncode}: {text[-400:]}"
        if not running and p.returncode == 2 and not err.strip():
            return f"{argv}: refused without a word"
    return None


def test_no_flag_value_panics_hangs_or_prints_a_traceback():
    cases = [(cmd, f, v) for cmd, flags in _commands() for f in flags for v in VALUES]
    assert len(cases) > 100, cases
    with ThreadPoolExecutor(4) as pool:
        problems = [p for p in pool.map(lambda c: _try(*c), cases) if p]
    assert not problems, "\n".join(problems)
