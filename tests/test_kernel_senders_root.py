"""Tier 3 (root, real kernel): the parent-death signal (PR_SET_PDEATHSIG) is flagged in the
kernel and read as such (issue 31 item 8): a process's worker thread, named by itself, starts
a child that asked for SIGKILL at its parent's death, and exits while the process lives on.
The child's verdict names the parent-death signal, and the sender is the process (its name),
not the worker thread's name."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from tests.recording import record
from tracer.events import Exit, Signal
from tracer.trace.reader import read_trace

pytestmark = pytest.mark.root

PARENT = r"""
import ctypes, signal, subprocess, threading, time
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_NAME, PR_SET_PDEATHSIG = 15, 1
def arm():
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
def worker():
    libc.prctl(PR_SET_NAME, b"wr-sig-worker", 0, 0, 0)
    child = subprocess.Popen(["sleep", "30"], preexec_fn=arm)
    print(child.pid, flush=True)
t = threading.Thread(target=worker)
t.start()
t.join()          # the thread that forked the child is gone: the kernel kills the child
time.sleep(1.0)   # while the process lives on
"""


def test_a_parent_death_signal_is_named_and_the_sender_is_the_process(tmp_path: Path) -> None:
    res = record(tmp_path, [sys.executable, "-c", PARENT])
    events = read_trace(str(res.path)).events
    child = next(e for e in events if isinstance(e, Exit) and e.comm == "sleep")
    assert child.wait.signal == signal.SIGKILL
    [kill] = [e for e in events if isinstance(e, Signal) and e.target_pid == child.pid]
    assert kill.sender_exiting and kill.sender_comm != "wr-sig-worker", kill
    [v] = [v for v in res.verdicts if v.pid == child.pid]
    assert v.cause == "signal_kill" and "PR_SET_PDEATHSIG" in v.summary, v.summary


def test_a_real_time_signal_that_kills_names_its_sender(tmp_path: Path) -> None:
    # (default action Term, as for SIGRTMAX = 64, which the kernel side once dropped)
    script = (
        "import os, signal, subprocess, sys\n"
        "for n in (signal.SIGRTMIN + 3, signal.SIGRTMAX):\n"
        "    p = subprocess.Popen(['sleep', '30'])\n"
        "    os.kill(p.pid, n)\n"
        "    p.wait()\n"
    )
    res = record(tmp_path, [sys.executable, "-c", script])
    deaths = [v for v in res.verdicts if v.comm == "sleep"]
    assert [v.signal for v in deaths] == [f"SIG{signal.SIGRTMIN + 3}", "SIGRTMAX"]
    assert all(v.cause == "signal_kill" and v.sender_comm.startswith("python") for v in deaths)
