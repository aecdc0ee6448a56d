"""Starting, reaping and reading the processes the bench runs; every one is killed at the end."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

CLK_TCK = os.sysconf("SC_CLK_TCK")

Popen = subprocess.Popen[bytes]
Output = IO[bytes] | int | None  # what Popen takes for stdout/stderr

LIVE: dict[int, Popen] = {}  # every process we started and not yet reaped


class HelperFailed(RuntimeError):
    """A workload or tool exited with an error (the message carries its stderr's tail)."""


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def boottime_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def spawn(
    cmd: list[str],
    *,
    stdout: Output = None,
    stderr: Output = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> Popen:
    # Own session: a Ctrl-C at the terminal reaches the bench only, which then kills the rest.
    p = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    LIVE[p.pid] = p
    return p


def reap(p: Popen, timeout: float) -> tuple[int | None, resource.struct_rusage | None, bool]:
    """Wait for p up to timeout seconds (SIGKILL after that) with wait4, for its rusage.

    Returns (exit status as Popen.returncode would have it, rusage, killed)."""
    deadline = time.monotonic() + timeout
    killed = False
    while True:
        try:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        except ChildProcessError:
            LIVE.pop(p.pid, None)
            return p.returncode, None, killed
        if pid:
            break
        if time.monotonic() >= deadline and not killed:
            killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
        elif time.monotonic() >= deadline:
            raise RuntimeError(f"process {p.pid} survives SIGKILL")
        time.sleep(0.005)
    p.returncode = os.waitstatus_to_exitcode(status)
    LIVE.pop(p.pid, None)
    return p.returncode, ru, killed


def kill_all() -> None:
    for pid, p in list(LIVE.items()):
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGCONT)  # (a SIGSTOPped one too)
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                p.wait(timeout=5)
        LIVE.pop(pid, None)


def proc_cpu_s(pid: int) -> float | None:
    """utime+stime of the whole process (all its threads) from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def proc_status_kb(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def tail(path: Path, n: int = 600) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode(errors="replace").strip()


def key_values(text: str) -> dict[str, str]:
    """The helpers' one-line `key=value ...` result."""
    return dict(item.split("=", 1) for item in text.split() if "=" in item)


def run_helper(
    cmd: list[str], tmp: Path, name: str, timeout: float, env: dict[str, str] | None = None
) -> dict[str, str]:
    """Run a C helper to its end; its key=value line (HelperFailed if it failed)."""
    out, err = tmp / f"{name}.out", tmp / f"{name}.err"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        p = spawn(cmd, stdout=fo, stderr=fe, env={**os.environ, **(env or {})})
        rc, _, killed = reap(p, timeout)
    if rc != 0 or killed:
        raise HelperFailed(f"{name} failed (rc {rc}): {tail(err)}")
    return key_values(out.read_text())
